"""The demo's scenarios (src/demo/scenarios.cpp) for the Python reference engine.

Same shapes as the C++ demo, token counts scaled by `scale` (1.0 = the demo's sizes, page 16
tokens; the tests run 1/2 so the pure-Python per-token model stays quick). Pools scale with
the prompts so each scenario still forces what it is about:

  churn       turn 1, ten distinct short auxiliary calls through 4 GPU snapshot slots, then
              turn 2 = turn 1 + its output + a new message: the turn-1 snapshot must survive
              (on host) and the prefix comes back.
  flush       turn 1, then two long distinct prompts through a GPU pool that cannot hold them
              and the conversation: every conversation page is demoted, then promoted.
  compaction  a long prompt, an unrelated session that pushes most of it to host, then a
              replay of a prefix ending inside the first prompt plus an instruction.
  agent       four turns, each sending the conversation 2-3 times with different tails (3 in
              flight), the next turn diverging before the previous end, side requests
              replaying shorter prefixes of earlier prompts.
  faults      churn with failing copies: the affected prefixes degrade to recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reference_engine.engine import EngineConfig, Request, reference_run
from reference_engine.model import HybridModel, ModelConfig

MASK64 = (1 << 64) - 1


def mix(x: int) -> int:
    """splitmix64 finaliser (workload::mix in C++)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def synth(seed: int, n: int, vocab: int) -> np.ndarray:
    """n deterministic tokens of stream `seed`, as the C++ demo's synth()."""
    return np.array([mix(seed * 1000003 + i) % vocab for i in range(n)], dtype=np.int32)


@dataclass
class Scenario:
    name: str
    description: str
    model: ModelConfig
    engine: EngineConfig
    requests: list[Request] = field(default_factory=list)
    failing_submissions: list[int] = field(default_factory=list)
    fail_at_admission: dict[int, list[int]] = field(default_factory=dict)

    def add(self, label: str, prompt, out: int, at: float = 0.0) -> None:
        self.requests.append(Request(id=len(self.requests) + 1, label=label,
                                     prompt=np.asarray(prompt, dtype=np.int32),
                                     max_new_tokens=out, arrival_s=at))


def _tokens(n: float, page: int = 1) -> int:
    return max(page, int(round(n)))


def _pages(tokens: float, page_size: int) -> int:
    return max(1, int(round(tokens)) // page_size)


def _base(name, description, scale, policy):
    mc = ModelConfig()
    p = mc.page_size
    ec = EngineConfig(page_size=p, gpu_pages=_pages(2048 * scale, p),
                      host_pages=_pages(16384 * scale, p), gpu_snapshot_slots=4,
                      host_snapshot_slots=32, slice_pages=32,
                      chunk_tokens=max(p, _tokens(128 * scale) // p * p), max_running=1,
                      policy=policy)
    return Scenario(name, description, mc, ec)


def continuation(model: HybridModel, prompt: np.ndarray, out: int, message) -> np.ndarray:
    """Turn 2: turn 1's prompt, the output the model produces for it, a new message."""
    res = reference_run(model, Request(id=0, prompt=prompt, max_new_tokens=out))
    return np.concatenate([prompt, np.array(res.output, dtype=np.int32),
                           np.asarray(message, dtype=np.int32)])


def churn(scale=0.5, policy="budgeted", flush=False, model: HybridModel | None = None):
    s = _base("flush" if flush else "churn",
              "turn 1, two distinct long prompts through a small GPU pool, then turn 2"
              if flush else "turn 1, 10 distinct auxiliary calls, then turn 2", scale, policy)
    v = s.model.vocab
    turn1 = synth(1, _tokens(1500 * scale), v)
    s.add("turn 1", turn1, 12)
    if flush:
        s.engine.gpu_pages = _pages(6144 * scale, s.engine.page_size)
        s.add("flush A", synth(100, _tokens(4096 * scale), v), 2)
        s.add("flush B", synth(101, _tokens(4096 * scale), v), 2)
    else:
        for i in range(10):
            s.add(f"aux {i + 1}", synth(10 + i, _tokens(94 * scale), v), 2)
    model = model or HybridModel(s.model)
    s.add("turn 2", continuation(model, turn1, 12, synth(2, 19, v)), 12)
    return s


def compaction(scale=0.5, policy="budgeted", model: HybridModel | None = None):
    s = _base("compaction", "a long prompt, an unrelated session, then a replay of a prefix "
              "ending inside the first prompt + an instruction", scale, policy)
    p, v = s.engine.page_size, s.model.vocab
    s.engine.gpu_pages = _pages(4096 * scale, p)
    s.engine.host_pages = _pages(4096 * scale, p)
    prompt = synth(3, _tokens(3850 * scale), v)
    s.add("long prompt", prompt, 4)
    s.add("other session", synth(4, _tokens(3000 * scale), v), 4)
    replay = np.concatenate([prompt[:_tokens(2971 * scale)], synth(5, 16, v)])
    s.add("replay", replay, 4)
    return s


def agent(scale=0.5, policy="budgeted", model: HybridModel | None = None):
    """workload::agent_requests with the demo's AgentShape."""
    s = _base("agent", "4 turns x 2-3 sends with different tails (3 in flight), diverging "
              "turns, side requests replaying shorter prefixes", scale, policy)
    p, v = s.engine.page_size, s.model.vocab
    s.engine.gpu_pages = _pages(4096 * scale, p)
    s.engine.host_pages = _pages(8192 * scale, p)
    s.engine.gpu_snapshot_slots = 8
    s.engine.host_snapshot_slots = 16
    s.engine.max_running = 3
    s.engine.chunk_tokens = max(p, _tokens(64 * scale) // p * p)
    system, first, turns, interval = _tokens(400 * scale), _tokens(200 * scale), 4, 10.0
    tail, tail_step, send_out, side_out = _tokens(20 * scale), _tokens(13 * scale), 6, 4
    grow_min, grow_max = _tokens(150 * scale), _tokens(249 * scale)
    diverge_min, diverge_max = _tokens(44 * scale), _tokens(148 * scale)
    seed = 1000
    conv = np.concatenate([synth(seed, system, v), synth(seed + 1, first, v)])
    seed += 2
    earlier = []
    for turn in range(turns):
        at = interval * turn
        sends = 3 if turn % 2 == 0 else 2
        for k in range(sends):
            prompt = np.concatenate([conv, synth(seed, tail + tail_step * k, v)])
            seed += 1
            s.add(f"turn {turn + 1} send {k + 1}", prompt, send_out, at)
            earlier.append(prompt)
        if turn > 0:  # a side request: an exact prefix of an earlier, longer prompt
            src = earlier[mix(seed) % (len(earlier) - sends)]
            length = len(src) // 2 + mix(seed + 1) % (len(src) // 2)
            s.add(f"turn {turn + 1} side", src[:length], side_out, at + 1.0)
            seed += 1
        diverge = diverge_min + mix(seed) % (diverge_max - diverge_min + 1)
        seed += 1
        conv = conv[:len(conv) - diverge]
        grow = grow_min + mix(seed) % (grow_max - grow_min + 1)
        conv = np.concatenate([conv, synth(seed, grow, v)])
        seed += 1
    return s


def faults(scale=0.5, policy="budgeted", model: HybridModel | None = None):
    """flush with failing copies: some demotions fail (their victims keep the GPU copy and the
    next victim makes the room), and turn 2's first promotion fails (it resumes lower and
    recomputes; the host copy stays): every copy submitted from its first admission on fails
    (the demotions that make GPU room, each victim tried once and then dropped, then the
    promotion), 64 being more copies than the rest of the run submits."""
    s = churn(scale, policy, flush=True, model=model)
    s.name = "faults"
    s.description = "flush with failing copies: failed demotions and a failed promotion recompute"
    s.failing_submissions = [1, 3, 6]
    s.fail_at_admission = {s.requests[-1].id: list(range(64))}
    return s


SCENARIOS = {"churn": churn, "flush": lambda **kw: churn(flush=True, **kw),
             "compaction": compaction, "agent": agent, "faults": faults}


def make(name: str, **kw) -> Scenario:
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")
    return SCENARIOS[name](**kw)
