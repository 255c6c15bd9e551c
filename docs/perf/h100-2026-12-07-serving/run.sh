#!/usr/bin/env bash
# The session's one device call (device time was short: 530 s after a failed
# start): the serving GPU tests, the compass's paged serving rows (page 16,
# 1, 64 and the mixed batch, each beside its dense reference) and memcheck of
# the page-group cases, each under its own limit, outputs in $OUT. From the
# repository root:
#   bash docs/perf/h100-2026-12-07-serving/run.sh gpu_carry/NAME
set -uo pipefail
B=${1:?the unpacked build folder, scripts/pack_build.sh NAME}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/bench FFPA_LIBRARY=$PWD/$B/libffpa.so
log=$OUT/run.log
step() { echo "== $1 ($(date +%T))" | tee -a "$log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$log"
step "compass serving rows"
timeout 90 python3 bench/compass_serving.py --cases 'paged-decode-*,mixed-batch-d512' \
  --out "$OUT/compass_serving.json" --markdown "$OUT/compass_serving.md" >> "$log" 2>&1
echo "exit $?" | tee -a "$log"
step "serving GPU tests"
timeout 150 "$B/tests/ffpa_gpu_tests" --gtest_filter='*Serving*:*Sequence*:*Plan*:GpuNan*:*SplitKv*' \
  --gtest_output="json:$OUT/gpu_tests.json" > "$OUT/tests.log" 2>&1
echo "exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tee -a "$log"
grep -E '^\[  FAILED  \]' "$OUT/tests.log" | head -20 | tee -a "$log"
step "memcheck: the page-group cases"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/ffpa_gpu_tests" \
  --gtest_filter='Grouped/GpuServingSm90Pages.*' --gtest_brief=1 > "$OUT/memcheck.log" 2>&1
echo "exit $?" | tee -a "$log"
tail -n 4 "$OUT/memcheck.log" | tee -a "$log"
step done
