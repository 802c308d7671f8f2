#!/usr/bin/env bash
# Line coverage of the cache sources by fuzz inputs, with clang's source-based coverage:
#   tests/fuzz/coverage.sh BUILD_DIR INPUT_DIR_OR_FILE...
# BUILD_DIR is the fuzz-coverage preset's build (make fuzz-coverage builds it and runs this).
# Prints llvm-cov's per-file report for src/cache/ and the admission re-checks of
# try_admit_at (prefix_cache_requests.cpp) with their execution counts.
set -euo pipefail
build=$1
shift
profdata=llvm-profdata-14 cov=llvm-cov-14
exe=$build/bin/radixtier_cache_fuzz_replay
src=$(cd "$(dirname "$0")/../.." && pwd)/src/cache
rm -f "$build"/cov-*.profraw
LLVM_PROFILE_FILE="$build/cov-%p.profraw" "$exe" "$@" 2>/dev/null
"$profdata" merge -sparse "$build"/cov-*.profraw -o "$build/cov.profdata"
"$cov" report "$exe" -instr-profile="$build/cov.profdata" "$src"/*.cpp
echo
echo "try_admit_at, from the room it makes to its re-checks (count | line | source):"
"$cov" show "$exe" -instr-profile="$build/cov.profdata" "$src/prefix_cache_requests.cpp" \
  -show-line-counts -use-color=false |
  awk '/std::optional<Admission> PrefixCache::try_admit_at/ {on = 1}
       on && /make_gpu_page_room\(need_pages\)/ {show = 1}
       show {print}
       show && /PendingBatch promote;/ {exit}'
