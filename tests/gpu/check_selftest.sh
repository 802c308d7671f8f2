#!/usr/bin/env bash
# Checks tests/gpu/check.sh itself on a machine without a GPU: stand-in programs print what
# the GPU programs print, and the script must pass only when every test passed and every goal
# is met, fail when a goal is missed, a GOAL line is missing, a run fails or the contexts test
# fails, and hand its options to the benchmark.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILS=0

# make_bin GOAL_STATE [TESTS_TAIL] [CONTEXTS_RC] [GOAL_LINES]
make_bin() {
  local goal=$1 tail=${2:-"40 passed, 0 failed"} contexts_rc=${3:-0} lines=${4:-3}
  rm -rf "$WORK/bin" && mkdir -p "$WORK/bin"
  cat > "$WORK/bin/radixtier_gpu_transfer_tests" <<EOF
#!/usr/bin/env bash
echo "radixtier_gpu_transfer_tests: CUDA driver 13.0 (13000), runtime 13.0 (13000)"
if [[ "\${1:-}" == --fatal ]]; then echo "1 passed, 0 failed"; exit 0; fi
if [[ "\${1:-}" == --contexts ]]; then echo "3 passed, 0 failed"; exit $contexts_rc; fi
echo "$tail"
[[ "$tail" == *" 0 failed" ]]
EOF
  cat > "$WORK/bin/radixtier_gpu_transfer_bench" <<EOF
#!/usr/bin/env bash
echo "args: \$*" > "$WORK/bench_args"
IFS=, read -r -a sizes <<< "\$(echo "\$*" | sed -n 's/.*--pieces \([0-9,]*\).*/\1/p')"
for p in "\${sizes[@]}"; do
  n=0
  for line in "GOAL D2H \$p B pieces, slice 128, auto (dma): 95% of contiguous -> MET (goal >= 90%)" \\
              "GOAL H2D \$p B pieces, slice 128, auto (dma): 93% of contiguous -> $goal (goal >= 90%)" \\
              "GOAL overlap \$p B pieces: promotions add 3% to a compute kernel -> MET (goal <= 10%)"; do
    n=\$((n + 1))
    [[ \$n -le $lines ]] && echo "\$line"
  done
done
exit 0
EOF
  chmod +x "$WORK/bin/"*
}

# expect WANT_RC DESCRIPTION [check.sh options]
expect() {
  local want=$1 what=$2
  shift 2
  RADIXTIER_GPU_BIN="$WORK/bin" bash "$ROOT/tests/gpu/check.sh" "$WORK/out" "$@" > "$WORK/log" 2>&1
  local rc=$?
  if [[ ( $want -eq 0 && $rc -ne 0 ) || ( $want -ne 0 && $rc -eq 0 ) ]]; then
    echo "FAIL: $what: exit $rc, expected $([[ $want -eq 0 ]] && echo 0 || echo non-zero)"
    tail -n 12 "$WORK/log"
    FAILS=$((FAILS + 1))
  else
    echo "ok: $what (exit $rc)"
  fi
}

make_bin MET
expect 0 "every test passed, every goal met"
make_bin "NOT MET"
expect 1 "a bandwidth goal missed"
make_bin MET "39 passed, 1 failed"
expect 1 "a failed test"
make_bin MET "40 passed, 0 failed" 1
expect 1 "the contexts test failed"
make_bin MET "40 passed, 0 failed" 0 2
expect 1 "a GOAL line missing"
make_bin MET
expect 0 "options handed to the benchmark" --reps 3 --pieces 16384 --pages 512 --slices 64,128
if ! grep -q -- "--reps 3 --pages 512 --slices 64,128 --pieces 16384" "$WORK/bench_args"; then
  echo "FAIL: the benchmark got: $(cat "$WORK/bench_args")"
  FAILS=$((FAILS + 1))
fi
expect 1 "a malformed option" --reps many

if [[ $FAILS -eq 0 ]]; then
  echo "check.sh self-test: all passed"
else
  echo "check.sh self-test: $FAILS failed"
fi
[[ $FAILS -eq 0 ]]
