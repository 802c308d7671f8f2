#!/usr/bin/env bash
# Usage: [TRACE=file.jsonl] scripts/sim_snapshot.sh BIN OUTDIR
# The simulator's JSON (--json --rows) for 36 node-cache configurations: every scenario under
# cost-aware, LRU and write-through, the disk tier, priorities, the snapshot cap, and the trace
# (default: the shipped one) at 0/16/64/256 GiB of host on two models. Two OUTDIRs, from the
# binaries before and after a change, compared by scripts/sim_compare.sh: behaviour unchanged.
set -euo pipefail
BIN=$1; OUT=$2; mkdir -p "$OUT"
T=${TRACE:-$(dirname "$0")/../../shared/traces/mooncake_synthetic_trace.jsonl}
run() { local name=$1; shift; "$BIN" sim --json --rows "$@" > "$OUT/$name.json"; }
for s in churn flush restart compaction compaction-turns agent admission-128k; do
  run "$s" --scenario $s --cache node
  run "$s-lru" --scenario $s --cache node --eviction lru
  run "$s-wt" --scenario $s --cache node --write-through
done
run restart-disk --scenario restart --cache node --disk-gib 4
run flush-disk --scenario flush --cache node --disk-gib 4 --host-gib 0.25
run agent-prio --scenario agent --cache node --side-priority 35
run compaction-cap --scenario compaction --cache node --max-snapshots-per-path 2
for g in 0 16 64 256; do
  run trace-h200-$g --scenario trace --cache node --trace $T --hardware h200-gen5 --host-gib $g
  run trace-seed-$g --scenario trace --cache node --trace $T --model seed-hybrid --hardware h200-gen5 --gpu-kv-tokens 200000 --host-gib $g
done
run trace-h200-utility --scenario trace --cache node --trace $T --hardware h200-gen5 --eviction utility
run trace-h200-disk --scenario trace --cache node --trace $T --hardware h200-gen5 --host-gib 4 --disk-gib 64
run trace-h200-router --scenario trace --cache node --trace $T --hardware h200-gen5 --instances 4 --router session
