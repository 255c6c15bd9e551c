#!/usr/bin/env bash
# The one command for the GPU machine. From a build directory made on the CPU
# machine it runs, stage by stage: the GPU test suite, the Python package's
# pytest suite, compute-sanitizer
# (memcheck, racecheck) on the suite's small cases, ffpa-bench on a few
# shapes, and bench/attention_bench.py (ffpa_attn side by side with every
# PyTorch SDPA backend, from python/ and the build's library: no install
# needed); then it writes $OUT/report.json and prints a short summary as its
# last lines.
#
#   scripts/gpu_check.sh [--quick] [--only tests|sanitizer|bench|serving] [BUILD_DIR]
#
#   BUILD_DIR  default: build (relative to the repository root)
#   --quick    small benchmark shapes instead of the full sweeps
#   --only S   run one stage group: tests, sanitizer, bench, or serving (the
#              serving API's GPU tests and pytest files, memcheck of its
#              small cases, bench/paged_decode_sweep.py and
#              bench/compass_serving.py; not part of "all")
#
# Each stage runs under a time limit so that the whole script ends well
# within 9 minutes; a stage that fails or times out is recorded and the next
# one runs. The attention benchmark rewrites its JSON after every case, so a
# timed-out run still leaves the cases it measured. The GPU tests name their
# small cases with "Small" in the test name: the sanitizer runs
# --gtest_filter='*Small*'.
#
# Files under $OUT (./gpu_check_out when OUT is unset), eight at most and
# two folders deep at most, which is what a lent GPU machine sends back:
#   gpu_check.log      every stage's output in order, compute-sanitizer's too
#   gpu_tests.json     GoogleTest's report of the GPU suite
#   ffpa_bench.jsonl   ffpa-bench, one JSON object per point
#   attention_bench.json, attention_bench.md
#                      bench/attention_bench.py's report and tables
#   charts/*.png       its charts: two, one with --quick
#   report.json        every stage's status, time and numbers
#   --only serving instead: gpu_check.log, gpu_tests.json, sweep.json,
#   compass_serving.json (rows to merge into docs/perf/compass.json),
#   compass_serving.md, report.json
# Exit status: 0 when every stage that ran passed, 1 otherwise, 2 for a bad
# command line.
set -u -o pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu_check.sh [--quick] [--only tests|sanitizer|bench|serving] [BUILD_DIR]
  BUILD_DIR  the build made on the CPU machine (default: build)
  --quick    small benchmark shapes instead of the full sweeps
  --only S   run one stage group: tests, sanitizer, bench or serving
EOF
}

QUICK=0
ONLY=all
BUILD=build
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --only)
      [ $# -ge 2 ] || { echo "gpu_check: --only needs tests, sanitizer, bench or serving" >&2; usage >&2; exit 2; }
      ONLY=$2
      shift
      ;;
    --only=*) ONLY=${1#--only=} ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) BUILD=$1 ;;
  esac
  shift
done
case "$ONLY" in
  all | tests | sanitizer | bench | serving) ;;
  *) echo "gpu_check: --only takes tests, sanitizer, bench or serving, not '$ONLY'" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
OUT=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUT" || exit 2
LOG=$OUT/gpu_check.log
: >"$LOG"
WORK=$(mktemp -d) || exit 2
trap 'rm -rf "$WORK"' EXIT
RECORDS=$WORK/stages.tsv
: >"$RECORDS"
# compute-sanitizer's output, memcheck then racecheck, for the report; it
# also goes into $LOG, so that $OUT keeps within its file count.
SANITIZER_LOG=$WORK/sanitizer.log
: >"$SANITIZER_LOG"
REPORT_TOOL="python3 $ROOT/scripts/gpu_check_report.py"

TESTS=$BUILD/tests/ffpa_gpu_tests
KERNEL_TESTS=$BUILD/tests/ffpa_gpu_kernel_tests
BENCH=$BUILD/tools/ffpa-bench
LIBRARY=$BUILD/libffpa.so
# A carried build may hold the versioned file without its symbolic links.
if [ ! -e "$LIBRARY" ]; then LIBRARY=$(find "$BUILD" -maxdepth 1 -name 'libffpa.so.*' 2>/dev/null | sort | tail -n 1); fi
SMALL_FILTER='*Small*'

# Time limits in seconds: with the device stage and the kill grace periods
# they add up to about 8 minutes at worst. The attention benchmark gets what
# the stages before it left of BUDGET_SECONDS, and at least
# LIMIT_ATTENTION_MIN: its full sweeps take about a minute on an H200 and
# the earlier stages rarely use their whole limits.
LIMIT_DEVICE=30
LIMIT_TESTS=140
LIMIT_PYTEST=200
LIMIT_SANITIZER=60  # each of memcheck and racecheck
LIMIT_FFPA_BENCH=80
LIMIT_ATTENTION_MIN=100
BUDGET_SECONDS=480

# ffpa-bench points: word-split on purpose (no globs in them).
if [ "$QUICK" = 1 ]; then
  BENCH_POINTS=(
    "--seq-q 2048 --dims 128,512"
    "--batch 2 --heads-q 8 --heads-kv 2 --seq-q 777 --seq-kv 1029 --head-dim 320 --mask key-add --causal bottom_right --dropout 0.1 --lse --layout bnhd"
    "--backward --seq-q 2048 --head-dim 512"
  )
  ATTENTION_ARGS=(--cases smoke)
else
  BENCH_POINTS=(
    "--dims 512,1024"
    "--head-dim 512 --causal top_left"
    "--batch 2 --heads-q 8 --heads-kv 2 --seq-q 777 --seq-kv 1029 --head-dim 320 --mask key-add --causal bottom_right --dropout 0.1 --lse --layout bnhd"
    "--dtype f16 --accum f16 --heads-q 16 --seq-q 4096 --head-dim 384 --mask full-bool"
    "--backward --head-dim 512"
    "--backward --head-dim 1024 --seq-q 4096"
  )
  ATTENTION_ARGS=()
fi

# record NAME STATUS SECONDS DETAIL: one line of the stage table (no tabs in DETAIL).
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RECORDS"
  printf '== %-10s %-9s %4ss  %s\n' "$1" "$2" "$3" "$4"
}

# limited SECONDS STDOUT_FILE STDERR_FILE CMD...: runs CMD under a time limit,
# appending its output to the files; sets RC (124 or 137: timed out).
limited() {
  local limit=$1 stdout=$2 stderr=$3
  shift 3
  printf '\n##### %s\n' "$*" >>"$stderr"
  timeout --kill-after=10 "$limit" "$@" >>"$stdout" 2>>"$stderr"
  RC=$?
  if [ "$RC" = 124 ] || [ "$RC" = 137 ]; then echo "##### timed out after ${limit}s" >>"$stderr"; fi
}

status_of() {  # RC [DETAIL_RC] -> passed / timed-out / failed
  if [ "$1" = 124 ] || [ "$1" = 137 ]; then echo timed-out
  elif [ "$1" = 0 ] && [ "${2:-0}" = 0 ]; then echo passed
  else echo failed; fi
}

# Shows the end of the log after a failure, so the reply carries the cause.
show_tail() { echo "-- last lines of $(basename "$1"):"; tail -n "${2:-15}" "$1" | sed 's/^/   /'; }

stage_device() {
  local start=$SECONDS smi=$WORK/nvidia-smi.txt
  echo "gpu_check: build $BUILD, output $OUT, quick=$QUICK, only=$ONLY"
  limited "$LIMIT_DEVICE" "$smi" "$LOG" nvidia-smi
  local rc=$RC
  cat "$smi"
  cat "$smi" >>"$LOG"
  DEVICE_NAME=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>>"$LOG" | head -n 1)
  record device "$(status_of "$rc")" $((SECONDS - start)) "${DEVICE_NAME:-no device found}"
}

stage_tests() {
  local start=$SECONDS
  if [ ! -x "$TESTS" ]; then record tests failed 0 "missing $TESTS"; return; fi
  rm -f "$OUT/gpu_tests.json"
  limited "$LIMIT_TESTS" "$LOG" "$LOG" "$TESTS" --gtest_output="json:$OUT/gpu_tests.json"
  local rc=$RC detail detail_rc
  detail=$($REPORT_TOOL tests "$OUT/gpu_tests.json" 2>&1)
  detail_rc=$?
  # The 8-bit wgmma wrappers' own test (a build with sm_90a has it).
  if [ -x "$KERNEL_TESTS" ]; then
    limited 60 "$LOG" "$LOG" "$KERNEL_TESTS" --gtest_brief=1
    detail="$detail; ffpa_gpu_kernel_tests exit $RC"
    if [ "$RC" != 0 ]; then rc=$RC; fi
  fi
  record tests "$(status_of "$rc" "$detail_rc")" $((SECONDS - start)) "$detail (exit $rc)"
  if [ "$rc" != 0 ] || [ "$detail_rc" != 0 ]; then show_tail "$LOG"; fi
}

# The Python package's suite (python/tests) against this build's library, from
# the source tree (PYTHONPATH) so nothing is installed; 4 workers when
# pytest-xdist is there.
stage_pytest() {
  local start=$SECONDS pytest_log=$WORK/pytest.log workers=()
  if [ ! -f "$LIBRARY" ]; then record pytest failed 0 "missing $BUILD/libffpa.so"; return; fi
  if python3 -c "import xdist" 2>/dev/null; then workers=(-n 4); fi
  : >"$pytest_log"
  limited "$LIMIT_PYTEST" "$pytest_log" "$pytest_log" env PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
    FFPA_LIBRARY="$LIBRARY" python3 -m pytest "$ROOT/python/tests" -q -rs -p no:cacheprovider ${workers[@]+"${workers[@]}"}
  local rc=$RC
  cat "$pytest_log" >>"$LOG"
  record pytest "$(status_of "$rc")" $((SECONDS - start)) "$(grep -E '(passed|failed|error)' "$pytest_log" | tail -n 1) (exit $rc)"
  if [ "$rc" != 0 ]; then show_tail "$pytest_log" 25; fi
}

stage_sanitizer() {
  local tool
  if [ ! -x "$TESTS" ]; then record sanitizer failed 0 "missing $TESTS"; return; fi
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || command -v /usr/local/cuda/bin/compute-sanitizer)
  if [ -z "$sanitizer" ]; then record sanitizer failed 0 "compute-sanitizer not found"; return; fi
  for tool in memcheck racecheck; do
    local start=$SECONDS tool_log=$WORK/$tool.log extra=()
    if [ "$tool" = memcheck ]; then extra=(--leak-check full); fi
    : >"$tool_log"
    printf '\n##### compute-sanitizer --tool %s\n' "$tool" >>"$SANITIZER_LOG"
    limited "$LIMIT_SANITIZER" "$tool_log" "$tool_log" "$sanitizer" --tool "$tool" ${extra[@]+"${extra[@]}"} --error-exitcode 1 \
      "$TESTS" --gtest_filter="$SMALL_FILTER" --gtest_brief=1
    local rc=$RC detail detail_rc
    cat "$tool_log" >>"$SANITIZER_LOG"
    cat "$tool_log" >>"$LOG"
    detail=$($REPORT_TOOL sanitizer "$tool_log" 2>&1)
    detail_rc=$?
    record "$tool" "$(status_of "$rc" "$detail_rc")" $((SECONDS - start)) "$detail (exit $rc)"
    if [ "$rc" != 0 ] || [ "$detail_rc" != 0 ]; then show_tail "$tool_log"; fi
  done
}

stage_bench() {
  local start=$SECONDS failed=0 point
  if [ ! -x "$BENCH" ]; then
    record ffpa-bench failed 0 "missing $BENCH"
  else
    rm -f "$OUT/ffpa_bench.jsonl"
    local deadline=$((SECONDS + LIMIT_FFPA_BENCH))
    for point in "${BENCH_POINTS[@]}"; do
      local left=$((deadline - SECONDS))
      if [ "$left" -le 0 ]; then failed=124; echo "##### out of time before: $point" >>"$LOG"; break; fi
      # shellcheck disable=SC2086  # the points are word-split on purpose
      limited "$left" "$OUT/ffpa_bench.jsonl" "$LOG" "$BENCH" $point --json
      [ "$RC" = 0 ] || failed=$RC
    done
    local detail
    detail=$($REPORT_TOOL bench-rows "$OUT/ffpa_bench.jsonl" 2>&1)
    record ffpa-bench "$(status_of "$failed")" $((SECONDS - start)) "$detail"
    if [ "$failed" != 0 ]; then show_tail "$LOG"; fi
  fi

  start=$SECONDS
  if [ ! -f "$LIBRARY" ]; then record attn-bench failed 0 "missing $BUILD/libffpa.so"; return; fi
  rm -rf "$OUT/attention_bench.json" "$OUT/attention_bench.md" "$OUT/charts"
  local limit=$((BUDGET_SECONDS - SECONDS))
  if [ "$limit" -lt "$LIMIT_ATTENTION_MIN" ]; then limit=$LIMIT_ATTENTION_MIN; fi
  limited "$limit" "$LOG" "$LOG" env PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
    FFPA_LIBRARY="$LIBRARY" python3 "$ROOT/bench/attention_bench.py" --json "$OUT/attention_bench.json" \
    --markdown "$OUT/attention_bench.md" --charts "$OUT/charts" ${ATTENTION_ARGS[@]+"${ATTENTION_ARGS[@]}"}
  local rc=$RC detail detail_rc
  detail=$($REPORT_TOOL attention-rows "$OUT/attention_bench.json" "$OUT/charts" 2>&1)
  detail_rc=$?
  record attn-bench "$(status_of "$rc" "$detail_rc")" $((SECONDS - start)) "$detail (exit $rc, limit ${limit}s)"
  if [ "$rc" != 0 ] || [ "$detail_rc" != 0 ]; then show_tail "$LOG"; fi
}

# The serving API (issue 31; docs/serving.md): its GPU tests, pytest files
# and memcheck of its small cases, then the decode sweep by page size and
# the compass's serving rows (compass_serving.json: merge its rows into
# docs/perf/compass.json by hand, keeping that file's top-level fields).
SERVING_FILTER='*Serving*:*Sequence*:*Plan*:GpuNan*:*SplitKv*'
SERVING_MEMCHECK_FILTER='GpuServingSmall.*:*/GpuServingSm90Pages.*:*/GpuServingSm90Codes.*'
stage_serving() {
  local start=$SECONDS
  if [ ! -x "$TESTS" ] || [ ! -f "$LIBRARY" ]; then record serving failed 0 "missing $TESTS or the library"; return; fi
  rm -f "$OUT/gpu_tests.json"
  limited 200 "$LOG" "$LOG" "$TESTS" --gtest_filter="$SERVING_FILTER" --gtest_output="json:$OUT/gpu_tests.json"
  local rc=$RC detail detail_rc
  detail=$($REPORT_TOOL tests "$OUT/gpu_tests.json" 2>&1)
  detail_rc=$?
  record serving-tests "$(status_of "$rc" "$detail_rc")" $((SECONDS - start)) "$detail (exit $rc)"
  if [ "$rc" != 0 ] || [ "$detail_rc" != 0 ]; then show_tail "$LOG"; fi
  local python_env=(env PYTHONUNBUFFERED=1 PYTHONPATH="$ROOT/python:$ROOT/bench${PYTHONPATH:+:$PYTHONPATH}" FFPA_LIBRARY="$LIBRARY")
  start=$SECONDS
  local pytest_log=$WORK/serving_pytest.log
  : >"$pytest_log"
  limited 120 "$pytest_log" "$pytest_log" "${python_env[@]}" python3 -m pytest "$ROOT/python/tests/test_serving_gpu.py" \
    "$ROOT/python/tests/test_nan_inputs_gpu.py" -q -rs -p no:cacheprovider
  rc=$RC
  cat "$pytest_log" >>"$LOG"
  record serving-pytest "$(status_of "$rc")" $((SECONDS - start)) "$(grep -E '(passed|failed|error)' "$pytest_log" | tail -n 1) (exit $rc)"
  start=$SECONDS
  local sanitizer tool_log=$WORK/serving_memcheck.log
  sanitizer=$(command -v compute-sanitizer || command -v /usr/local/cuda/bin/compute-sanitizer)
  if [ -z "$sanitizer" ]; then sanitizer=compute-sanitizer; fi  # not found: the stage fails and says so
  : >"$tool_log"
  printf '\n##### compute-sanitizer --tool memcheck\n' >>"$SANITIZER_LOG"
  limited 150 "$tool_log" "$tool_log" "$sanitizer" --tool memcheck --error-exitcode 1 "$TESTS" \
    --gtest_filter="$SERVING_MEMCHECK_FILTER" --gtest_brief=1
  rc=$RC
  cat "$tool_log" >>"$SANITIZER_LOG"
  cat "$tool_log" >>"$LOG"
  detail=$($REPORT_TOOL sanitizer "$tool_log" 2>&1)
  detail_rc=$?
  record serving-memcheck "$(status_of "$rc" "$detail_rc")" $((SECONDS - start)) "$detail (exit $rc)"
  start=$SECONDS
  limited 80 "$LOG" "$LOG" "${python_env[@]}" python3 "$ROOT/bench/paged_decode_sweep.py" --pages 1,4,8,16,32,64 \
    --rounds 3 --out "$OUT/sweep.json"
  record paged-sweep "$(status_of "$RC")" $((SECONDS - start)) "bench/paged_decode_sweep.py (exit $RC)"
  start=$SECONDS
  rm -f "$OUT/compass_serving.json"
  limited 150 "$LOG" "$LOG" "${python_env[@]}" python3 "$ROOT/bench/compass_serving.py" \
    --out "$OUT/compass_serving.json" --markdown "$OUT/compass_serving.md"
  record compass-serving "$(status_of "$RC")" $((SECONDS - start)) "bench/compass_serving.py (exit $RC)"
}

stage_device
case "$ONLY" in serving) stage_serving ;; esac
case "$ONLY" in all | tests) stage_tests; stage_pytest ;; esac
case "$ONLY" in all | sanitizer) stage_sanitizer ;; esac
case "$ONLY" in all | bench) stage_bench ;; esac

$REPORT_TOOL report --out "$OUT" --stages "$RECORDS" --sanitizer-log "$SANITIZER_LOG" --build "$BUILD" \
  --quick "$QUICK" --only "$ONLY"
