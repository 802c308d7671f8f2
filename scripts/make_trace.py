#!/usr/bin/env python3
"""Writes a synthetic multi-turn trace in the Mooncake format (one JSON object per line:
timestamp in ms, input_length, output_length, hash_ids of 512-token blocks), for trying the
simulator on arrival rates and lengths other than the shipped trace's.

Conversations arrive as a Poisson process; each has 1..--max-turns turns; a turn's prompt is
the previous prompt plus the previous output plus a new message, so its full blocks extend the
previous turn's full blocks and its input_length covers the previous prompt and output: the
structure the simulator's token-faithful replay rebuilds (docs/simulator.md). With
--system-prompts K, each conversation starts with one of K shared system prompts of
--system-tokens tokens (whole blocks shared across conversations: the replay's hubs).
Deterministic for a given --seed.

  scripts/make_trace.py --out /tmp/t.jsonl --conversations 400 --rate 0.5 \
      --first 2000:30000 --message 200:4000 --output 50:800 --max-turns 8
"""
import argparse
import json
import random


def span(text):
    lo, hi = (int(x) for x in text.split(":"))
    if lo <= 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"'{text}': expected LO:HI with 0 < LO <= HI")
    return lo, hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--conversations", type=int, default=400)
    ap.add_argument("--rate", type=float, default=0.5, help="conversations per second")
    ap.add_argument("--first", type=span, default=(2000, 30000), help="first prompt tokens")
    ap.add_argument("--message", type=span, default=(200, 4000), help="new tokens per turn")
    ap.add_argument("--output", type=span, default=(50, 800), help="output tokens per turn")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--think", type=span, default=(5, 60), help="seconds between turns")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--system-prompts", type=int, default=0,
                    help="shared system prompts (0: none)")
    ap.add_argument("--system-tokens", type=int, default=2048,
                    help="tokens of each system prompt (a multiple of 512)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    block = 512
    if a.system_prompts < 0 or a.system_tokens <= 0 or a.system_tokens % block:
        ap.error("--system-prompts must be >= 0 and --system-tokens a positive multiple of 512")
    if a.conversations < 1:
        ap.error("--conversations must be at least 1")
    if not a.rate > 0 or a.rate == float("inf"):
        ap.error("--rate must be a positive number of conversations per second")
    if a.max_turns < 1:
        ap.error("--max-turns must be at least 1")
    next_id = 0
    systems = []
    for _ in range(a.system_prompts):
        systems.append(list(range(next_id, next_id + a.system_tokens // block)))
        next_id += a.system_tokens // block
    requests = []
    t = 0.0
    for _ in range(a.conversations):
        t += rng.expovariate(a.rate)
        at = t
        ids = list(rng.choice(systems)) if systems else []
        length = len(ids) * block
        for turn in range(rng.randint(1, a.max_turns)):
            length += rng.randint(*(a.first if turn == 0 else a.message))
            while len(ids) < length // block:
                ids.append(next_id)
                next_id += 1
            tail = [next_id] if length % block else []
            next_id += len(tail)
            out = rng.randint(*a.output)
            requests.append({"timestamp": int(at * 1000), "input_length": length,
                             "output_length": out, "hash_ids": ids + tail})
            length += out
            at += rng.randint(*a.think)
    requests.sort(key=lambda r: r["timestamp"])
    with open(a.out, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
