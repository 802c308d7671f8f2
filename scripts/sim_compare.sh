#!/usr/bin/env bash
# Usage: scripts/sim_compare.sh BEFORE AFTER (two OUTDIRs of sim_snapshot.sh) — diff of the simulator JSONs, wall-clock fields removed.
set -u
strip() { sed -E 's/"wall_s":[0-9.e+-]+,?//g; s/"requests_per_s":[0-9.e+-]+,?//g' "$1"; }
bad=0
for f in "$1"/*.json; do
  n=$(basename "$f")
  if ! cmp -s <(strip "$f") <(strip "$2/$n"); then echo "DIFFERS: $n"; bad=1; fi
done
[ $bad = 0 ] && echo "all $(ls "$1"/*.json | wc -l) JSONs identical (wall_s removed)"
