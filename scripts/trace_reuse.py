#!/usr/bin/env python3
"""Where does reuse happen in a Mooncake-format trace (infinite cache, block hashes)?

For each request: the longest prefix of its full blocks (below its last token) that an
earlier request shared, classified by where it resumes relative to earlier prompts:
at the last full block of an earlier prompt, at a point where an earlier request already
left that path, or at a first-time divergence inside an earlier prompt.
  usage: scripts/trace_reuse.py TRACE.jsonl [BLOCK_TOKENS=512]
"""
import collections
import json
import sys


def main() -> None:
    path = sys.argv[1]
    block = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    seen, prompt_ends, branch_points = set(), set(), set()
    tokens = collections.Counter()
    requests = collections.Counter()
    total = 0
    for line in open(path):
        r = json.loads(line)
        length = r["input_length"]
        total += length
        chain, h = [], 0
        for x in r["hash_ids"]:
            h = hash((h, x))
            chain.append(h)
        usable = min((length - 1) // block, len(chain))  # the last token is always computed
        m = 0
        while m < usable and chain[m] in seen:
            m += 1
        if m > 0:
            key = chain[m - 1]
            if key in prompt_ends:
                kind = "the last full block of an earlier prompt"
            elif key in branch_points:
                kind = "a point where an earlier request left the path"
            else:
                kind = "a first-time divergence inside an earlier prompt"
            tokens[kind] += m * block
            requests[kind] += 1
            if m < len(chain):
                branch_points.add(key)
        seen.update(chain)
        if length // block > 0:
            prompt_ends.add(chain[length // block - 1])
    reused = sum(tokens.values())
    print(f"{sum(1 for _ in open(path))} requests, {total} input tokens, {reused} reusable")
    for kind, n in tokens.most_common():
        print(f"{n / reused:6.1%} of reusable tokens ({requests[kind]} requests) resume at {kind}")


if __name__ == "__main__":
    main()
