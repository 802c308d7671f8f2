#!/bin/bash
# Detection power of the disk store's crash tests: plants each deliberate durability bug of
# scripts/plant_durability_bug.py in src/disk, rebuilds the unit tests, runs the power-cut
# tests (DiskPowerCut.*) and the kill -9 tests (DiskCrash.*, CacheStore.AProcessKilled*)
# against it, and reverts it. Prints one line per bug: which tests failed (caught it).
# Needs a clean src/disk (it is reset with git checkout after each bug). ~10 min on 2 cores.
set -u
cd "$(dirname "$0")/.."
if ! git diff --quiet -- src/disk; then echo "src/disk has changes: commit or stash them" >&2; exit 2; fi
PRESET=${PRESET:-default}
logs=$(mktemp -d)
for bug in gap_mkdir gap_data journal_before_data slot_reuse rename_unsynced_tmp \
           rename_no_dir_fsync torn_tail_kept; do
  scripts/plant_durability_bug.py "$bug" || exit 1
  if ! cmake --build --preset "$PRESET" -j2 --target radixtier_tests > "$logs/build.txt" 2>&1; then
    echo "$bug: build failed ($logs/build.txt)"; git checkout -q -- src/disk; continue
  fi
  build/$PRESET/bin/radixtier_tests --gtest_filter='DiskPowerCut.*' > "$logs/$bug.power.txt" 2>&1
  build/$PRESET/bin/radixtier_tests --gtest_filter='DiskCrash.*:CacheStore.AProcessKilled*' \
    > "$logs/$bug.kill.txt" 2>&1
  caught() { grep -o '^\[  FAILED  \] [A-Za-z]*\.[A-Za-z_0-9]*' "$1" | sort -u | sed 's/.* //' | tr '\n' ' '; }
  echo "$bug: power-cut caught by [ $(caught "$logs/$bug.power.txt")] kill -9 caught by [ $(caught "$logs/$bug.kill.txt")]"
  git checkout -q -- src/disk
done
cmake --build --preset "$PRESET" -j2 --target radixtier_tests > "$logs/build.txt" 2>&1
echo "logs: $logs"
