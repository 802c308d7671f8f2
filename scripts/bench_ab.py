#!/usr/bin/env python3
"""A/B of radixtier_bench before/after, interleaved rounds in one run; prints after/before
ratios of the median cpu_time per benchmark (below 1: after is faster)."""
import json, subprocess, statistics, sys
BEFORE, AFTER = sys.argv[1], sys.argv[2]
FILTER = sys.argv[3] if len(sys.argv) > 3 else 'BM_(Match|AdmitRelease|EvictOneVictim|InsertDuplicate)/'
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3
res = {BEFORE: {}, AFTER: {}}
for r in range(ROUNDS):
    for b in ([BEFORE, AFTER] if r % 2 == 0 else [AFTER, BEFORE]):
        out = subprocess.run([b, f'--benchmark_filter={FILTER}', '--benchmark_min_time=0.2',
                              '--benchmark_format=json'], capture_output=True, text=True, cwd='/tmp').stdout
        for bm in json.loads(out)['benchmarks']:
            res[b].setdefault(bm['name'], []).append(bm['cpu_time'])
print(f"{'benchmark':60s} {'before':>12s} {'after':>12s} {'after/before':>12s}")
for name, before in res[BEFORE].items():
    after = res[AFTER][name]
    mb, ma = statistics.median(before), statistics.median(after)
    print(f"{name:60s} {mb:12.1f} {ma:12.1f} {ma / mb:12.3f}")
