"""The Python reference engine: the demo's scenarios (scaled to 1/2) through radixtier, every
output with reuse bit-identical to the same request recomputed from scratch, promotions,
demotions and failed copies included."""

import numpy as np
import pytest
import torch

from reference_engine import scenarios
from reference_engine.demo import format_table, run_scenario
from reference_engine.engine import reference_run, Request
from reference_engine.model import HybridModel, ModelConfig


@pytest.fixture(scope="module")
def model():
    return HybridModel(ModelConfig())


def _check(rep):
    print(format_table(rep))
    assert rep.all_identical, format_table(rep)
    for res in rep.results.values():
        assert not res.error, res.error
    return {r.label: rep.results[r.id] for r in rep.scenario.requests}


def test_model_is_bit_identical_across_chunkings_and_page_tables(model):
    tokens = scenarios.synth(42, 200, model.cfg.vocab)
    pages = model.pages_for(200)
    kv1, s1 = torch.zeros(pages, *model.kv_shape), model.new_state()
    whole = model.forward(tokens, 0, torch.arange(pages), kv1, s1)
    kv2, s2 = torch.zeros(pages, *model.kv_shape), model.new_state()
    perm = torch.randperm(pages, generator=torch.Generator().manual_seed(3))
    pos = 0
    for cut in (16, 17, 64, 130, 199, 200):
        last = model.forward(tokens[pos:cut], pos, perm, kv2, s2)
        pos = cut
    assert torch.equal(whole.view(torch.int32), last.view(torch.int32))
    assert torch.equal(s1.view(torch.int32), s2.view(torch.int32))
    assert torch.equal(kv1.view(torch.int32), kv2[perm].view(torch.int32))


def test_churn(model):
    r = _check(run_scenario(scenarios.make("churn", model=model), model))
    assert r["turn 2"].cached_tokens >= len(scenarios.synth(1, 750, 97)) // 16 * 16
    assert r["turn 2"].recomputed_tokens < 50


def test_flush_demotes_and_promotes(model):
    rep = run_scenario(scenarios.make("flush", model=model), model)
    r = _check(rep)
    assert r["turn 2"].host_cached_tokens > 0  # promoted from host
    assert rep.stats["bytes_d2h"] > 0 and rep.stats["bytes_h2d"] > 0


def test_compaction_replay_resumes_inside_the_first_prompt(model):
    rep = run_scenario(scenarios.make("compaction", model=model), model)
    r = _check(rep)
    assert r["replay"].cached_tokens > 0 and r["replay"].host_cached_tokens > 0
    assert r["replay"].cached_tokens < len(rep.scenario.requests[2].prompt)


def test_agent_with_requests_in_flight(model):
    rep = run_scenario(scenarios.make("agent", model=model), model)
    r = _check(rep)
    assert sum(x.cached_tokens for x in r.values()) > 0
    assert rep.scenario.engine.max_running == 3


def test_failed_copies_degrade_to_recompute(model):
    rep = run_scenario(scenarios.make("faults", model=model), model)
    r = _check(rep)
    assert rep.stats["transfers_failed"] > 0
    assert r["turn 2"].transfer_failures >= 1  # its promotion failed: admitted again


def test_every_chunk_policy_and_write_through(model):
    import radixtier as rt

    s = scenarios.make("compaction", scale=0.25, policy="every-chunk", model=model)
    s.engine.write_policy = rt.WritePolicy.WRITE_THROUGH
    # Dense snapshots in a host tier smaller than the prompt: with one shared host pool the
    # cost-aware orders keep snapshots over the KV the replay needs (docs/results.md, "not
    # met"); the fixed split of the baselines keeps the replay.
    s.engine.snapshot_eviction = rt.SnapshotEviction.LRU
    s.engine.check_invariants = True
    rep = run_scenario(s, model)
    r = _check(rep)
    assert r["replay"].cached_tokens > 0
    assert r["long prompt"].snapshots_kept > 2


def test_reference_run_is_deterministic(model):
    req = Request(id=1, prompt=np.arange(40, dtype=np.int32) % 97, max_new_tokens=5)
    a, b = reference_run(model, req), reference_run(model, req)
    assert a.output == b.output and torch.equal(a.final_logits, b.final_logits)


def test_submit_refuses_prompts_the_model_cannot_embed(model):
    # Found mid-run, a bad token left the request running with its lock and pages held.
    from reference_engine.engine import Engine, EngineConfig

    e = Engine(model, EngineConfig(page_size=model.page_size, check_invariants=True))
    vocab = model.cfg.vocab
    bad = {
        "past the vocabulary": Request(1, np.array([5] * 20 + [vocab] * 5), 2),
        "negative": Request(2, np.array([5, -1, 7]), 2),
        "not integers": Request(3, np.array([1.5, 2.0]), 2),
        "two-dimensional": Request(4, np.ones((2, 3), dtype=np.int32), 2),
        "negative output": Request(5, np.array([5, 6, 7]), -3),
    }
    for what, request in bad.items():
        with pytest.raises(ValueError, match=f"request {request.id}"):
            e.submit(request)
    assert not e.queue and not e.running, "a refused request changes nothing"
    good = Request(6, np.array([5] * 20), 2)
    e.submit(good)
    results = e.run()
    assert not results[6].error
    assert results[6].output == reference_run(model, good).output
