#!/usr/bin/env bash
# Checks tests/gpu/check.sh itself on a machine without a GPU: stand-in programs print what
# the GPU programs print, and the script must pass only when every test passed and every goal
# is met, fail when a goal is missed, a GOAL line is missing, a run fails, the contexts test
# fails, the stream_wait capture test fails or the Python check fails or is absent, write every
# goal as MET or MISSED in summary.txt, and hand its options to the benchmark.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
FAILS=0

# make_bin GOAL_STATE [TESTS_TAIL] [CONTEXTS_RC] [GOAL_LINES] [D2D_STATE] [CAPTURE_RESULT]
#   GOAL_LINES: how many of the 4 per-size lines the benchmark prints.
make_bin() {
  local goal=$1 tail=${2:-"40 passed, 0 failed"} contexts_rc=${3:-0} lines=${4:-4}
  local d2d=${5:-MET} capture=${6:-ok}
  rm -rf "${WORK:?}/bin" && mkdir -p "$WORK/bin"
  cat > "$WORK/bin/radixtier_gpu_transfer_tests" <<EOF
#!/usr/bin/env bash
echo "radixtier_gpu_transfer_tests: CUDA driver 13.0 (13000), runtime 13.0 (13000)"
if [[ "\${1:-}" == --fatal ]]; then echo "1 passed, 0 failed"; exit 0; fi
if [[ "\${1:-}" == --contexts ]]; then echo "3 passed, 0 failed"; exit $contexts_rc; fi
echo "[capture] submit and poll while the compute stream is captured"
echo "  ok"
echo "[stream_wait capture] stream_wait into a captured stream is refused"
echo "  refused: stream_wait: the stream is being captured"
echo "  $capture"
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
              "GOAL overlap \$p B pieces: promotions add 3% to a compute kernel -> MET (goal <= 10%)" \\
              "GOAL gemm-overlap \$p B pieces: promotions add 4% to a full-occupancy GEMM-like kernel -> MET (goal <= 10%)"; do
    n=\$((n + 1))
    [[ \$n -le $lines ]] && echo "\$line"
  done
done
echo "GOAL D2D snapshot copy (qwen3-next, slot copy kernel): 1.2 times a contiguous cudaMemcpyAsync of the same bytes -> $d2d (goal <= 1.5x)"
exit 0
EOF
  chmod +x "$WORK/bin/"*
}

# make_python RC [GOAL_STATE]: a stand-in Python check (none: absent).
make_python() {
  rm -f "$WORK/python_check.py"
  [[ $1 == none ]] && return
  cat > "$WORK/python_check.py" <<EOF
import sys
print("python check, output", sys.argv[1])
print("GOAL torch reuse bit-identical to recompute -> ${2:-MET}")
sys.exit($1)
EOF
}

# expect WANT_RC DESCRIPTION [check.sh options]
expect() {
  local want=$1 what=$2
  shift 2
  RADIXTIER_GPU_BIN="$WORK/bin" RADIXTIER_GPU_PYTHON_CHECK="$WORK/python_check.py" \
    bash "$ROOT/tests/gpu/check.sh" "$WORK/out" "$@" > "$WORK/log" 2>&1
  local rc=$?
  if [[ ( $want -eq 0 && $rc -ne 0 ) || ( $want -ne 0 && $rc -eq 0 ) ]]; then
    echo "FAIL: $what: exit $rc, expected $([[ $want -eq 0 ]] && echo 0 || echo non-zero)"
    tail -n 12 "$WORK/log"
    FAILS=$((FAILS + 1))
  else
    echo "ok: $what (exit $rc)"
  fi
}

# summary_has PATTERN DESCRIPTION: summary.txt has a line matching PATTERN (grep -E).
summary_has() {
  if ! grep -Eq -- "$1" "$WORK/out/summary.txt"; then
    echo "FAIL: summary.txt: $2"
    cat "$WORK/out/summary.txt"
    FAILS=$((FAILS + 1))
  fi
}

make_python 0
make_bin MET
expect 0 "every test passed, every goal met"
summary_has '^goals: 12 of 12 met$' "12 goals: 4 per piece size (2 sizes), D2D, capture, python, python's own"
summary_has '^MET +GOAL D2D snapshot copy' "the D2D goal MET"
summary_has '^MET +stream_wait into a captured stream' "the capture goal MET"
summary_has '^MET +python: GOAL torch reuse' "the Python check's own goal"
summary_has '^RESULT: passed$' "passed"
make_bin "NOT MET"
expect 1 "a bandwidth goal missed"
summary_has '^MISSED +GOAL H2D 65536 B pieces' "the missed goal named MISSED"
summary_has '^RESULT: FAILED$' "failed"
make_bin MET "40 passed, 0 failed" 0 4 "NOT MET"
expect 1 "the device-to-device goal missed"
summary_has '^MISSED +GOAL D2D snapshot copy' "the D2D goal MISSED"
make_bin MET "40 passed, 0 failed" 0 4 MET FAILED
expect 1 "the stream_wait capture test failed"
summary_has '^MISSED +stream_wait into a captured stream' "the capture goal MISSED"
make_bin MET "39 passed, 1 failed"
expect 1 "a failed test"
make_bin MET "40 passed, 0 failed" 1
expect 1 "the contexts test failed"
make_bin MET "40 passed, 0 failed" 0 3
expect 1 "a GOAL line missing"
summary_has '^MISSED +GOAL gemm-overlap 8192 B pieces \(0 lines reported\)' "the missing line"
make_bin MET
make_python none
expect 1 "no Python check"
summary_has '^MISSED +Python binding on the GPU .*not present' "the absent Python check"
make_python 1
expect 1 "the Python check failed"
make_python 0 "NOT MET"
expect 1 "a goal of the Python check missed"
make_python 0
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
