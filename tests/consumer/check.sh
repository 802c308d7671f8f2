#!/usr/bin/env bash
# Consumer test: install the package from BUILD_DIR to a prefix, build the consumer project
# against it with find_package, run it, and check with nm that only the layers it asked for
# came along.
#   check.sh core|cuda|disk|shared|events|metrics BUILD_DIR CONSUMER_SRC CXX
set -euo pipefail
mode=$1 build=$2 src=$3 cxx=$4
work=$build/consumer-$mode
prefix=$work/prefix
rm -rf "$work"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=Release -DCONSUMER_CUDA=$([ "$mode" = cuda ] && echo ON || echo OFF) \
  -DCONSUMER_DISK=$([ "$mode" = disk ] && echo ON || echo OFF) \
  -DCONSUMER_SHARED=$([ "$mode" = shared ] && echo ON || echo OFF) \
  -DCONSUMER_EVENTS=$([ "$mode" = events ] && echo ON || echo OFF) \
  -DCONSUMER_METRICS=$([ "$mode" = metrics ] && echo ON || echo OFF) >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
exe=$work/build/consumer$([ "$mode" = core ] || echo "_$mode")
"$exe"

# What must never reach an engine that links the cache: the internal layers (namespaces
# radixtier::sim, ::demo, ::index_tier, ::model, ::workload, ::cli) and, for the core alone,
# the reference scheduler.
internal='radixtier::(sim|demo|index_tier|model|workload|cli)::'
fail=0
symbols() { nm -C --defined-only "$1" 2>/dev/null; }
check_absent() {  # FILE PATTERN WHAT [ALLOWED: a pattern the check lets through]
  local hits
  hits=$(symbols "$1" | grep -Ev "${4:-^$}" | grep -E "$2" | head -5 || true)
  if [ -n "$hits" ]; then echo "FAIL: $(basename "$1") holds $3:"; echo "$hits"; fail=1; fi
}
check_present() {  # FILE PATTERN WHAT (a positive control: nm and the patterns work)
  symbols "$1" | grep -E "$2" >/dev/null || { echo "FAIL: $(basename "$1") lacks $3"; fail=1; }
}
lib=$(find "$prefix" -name libradixtier.a | head -1)
[ -n "$lib" ] || { echo "FAIL: libradixtier.a was not installed"; exit 1; }
check_present "$lib" 'radixtier::PrefixCache::admit' "the cache"
check_absent "$lib" "$internal|radixtier::sched::" "internal or scheduler symbols"
if [ "$mode" = core ]; then
  check_present "$exe" 'radixtier::PrefixCache::admit' "the cache"
elif [ "$mode" = events ] || [ "$mode" = metrics ]; then
  obslib=$(find "$prefix" -name "libradixtier_$mode.a" | head -1)
  [ -n "$obslib" ] || { echo "FAIL: libradixtier_$mode.a was not installed"; exit 1; }
  [ -e "$prefix/include/radixtier/$mode" ] || { echo "FAIL: the $mode headers were not installed"; fail=1; }
  if [ "$mode" = events ]; then what='radixtier::ZmqPublisher::create'; else what='radixtier::MetricsServer::create'; fi
  check_present "$exe" "$what" "the $mode library"
  check_absent "$obslib" "$internal|radixtier::sched::" "internal or scheduler symbols"
elif [ "$mode" = disk ]; then
  disklib=$(find "$prefix" -name libradixtier_disk.a | head -1)
  [ -n "$disklib" ] || { echo "FAIL: libradixtier_disk.a was not installed"; exit 1; }
  check_present "$exe" 'radixtier::disk::DiskStore::open' "the disk store"
  check_absent "$disklib" "$internal|radixtier::sched::" "internal or scheduler symbols"
elif [ "$mode" = shared ]; then
  sharedlib=$(find "$prefix" -name libradixtier_shared.a | head -1)
  [ -n "$sharedlib" ] || { echo "FAIL: libradixtier_shared.a was not installed"; exit 1; }
  check_present "$exe" 'radixtier::shared::RedisCluster::connect' "the Redis Cluster client"
  # SharedTier implements the scheduler's SharedHook interface: its vtable and typeinfo
  # (weak, emitted where it is implemented) are the only scheduler symbols allowed.
  check_absent "$sharedlib" "$internal|radixtier::sched::|LocalCluster" "internal symbols" \
    "(vtable|typeinfo|typeinfo name) for radixtier::sched::SharedHook"
else
  check_present "$exe" 'radixtier::cuda::CudaTransferEngine::create' "the CUDA engine"
fi
check_absent "$exe" "$internal" "internal symbols"
sched=$(find "$prefix" -name libradixtier_scheduler.a | head -1)
[ -n "$sched" ] || { echo "FAIL: libradixtier_scheduler.a was not installed"; exit 1; }
check_absent "$sched" "$internal" "internal symbols"
if [ "$mode" = core ]; then
  check_absent "$exe" 'radixtier::sched::' "scheduler symbols"
  for h in sim demo baseline model workload index_tier; do
    [ ! -e "$prefix/include/radixtier/$h" ] || { echo "FAIL: internal headers $h installed"; fail=1; }
  done
elif [ "$mode" = cuda ]; then
  cudalib=$(find "$prefix" -name libradixtier_cuda.a | head -1)
  [ -n "$cudalib" ] || { echo "FAIL: libradixtier_cuda.a was not installed"; exit 1; }
  check_present "$cudalib" 'radixtier::cuda::CudaTransferEngine::create' "the CUDA engine"
  check_absent "$cudalib" "$internal|radixtier::sched::" "internal or scheduler symbols"
fi
[ $fail -eq 0 ] && echo "consumer $mode: package and symbols ok"
exit $fail
