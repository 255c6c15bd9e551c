#!/usr/bin/env bash
# Seventh session's device call: the RS wgmma GPU test (issue 32, milestone
# 1), the GPU suite's forward cases (every case under impl sm90_wgmma too: D
# <= 128 now runs the row-split instance), memcheck of its D 72 / 128 cases,
# then bench/small_d_ab.py (the row split beside sm80_split_d, cuDNN and FA2).
set -uo pipefail
B=${1:?unpacked build folder}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/bench FFPA_LIBRARY=$PWD/$B/libffpa.so
log=$OUT/run.log
step() { echo "== $1 ($(date +%T))" | tee -a "$log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$log"
step "wgmma kernel tests"
timeout 60 "$B/tests/ffpa_gpu_kernel_tests" > "$OUT/kernel_tests.log" 2>&1
echo "exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED' "$OUT/kernel_tests.log" | head -20 | tee -a "$log"
step "forward GPU tests"
timeout 150 "$B/tests/ffpa_gpu_tests" --gtest_filter='*GpuForward*:*GpuValueDim*:*Nan*:*SplitKv*' \
  --gtest_output="json:$OUT/gpu_tests.json" > "$OUT/tests.log" 2>&1
echo "exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED' "$OUT/tests.log" | head -30 | tee -a "$log"
step "small-D beside cuDNN (the build's schedule: ping-pong)"
timeout 100 python3 bench/small_d_ab.py --json "$OUT/small_d_ab.json" 2>&1 | tee -a "$log"
# The row split's schedules: serial (ab0), overlap (ab1), ping-pong (the
# build), each its own process with cuDNN beside it, in the order 0 1 2 0 1.
n=0
for lib in gpu_carry/ab0 gpu_carry/ab1 "$B" gpu_carry/ab0 gpu_carry/ab1; do
  n=$((n + 1))
  step "schedule A/B $n: $lib"
  FFPA_LIBRARY=$PWD/$lib/libffpa.so timeout 60 python3 bench/small_d_ab.py --rounds 2 \
    --cases 128:2048:0,128:2048:1,128:8192:0,128:8192:1 --json "$OUT/schedule_ab_$n.json" 2>&1 | tee -a "$log"
done
# D 256: the column split (the build) against the row split with KV blocks
# of 64 (ab256k64, no spills).
n=0
for lib in gpu_carry/ab256k64 "$B" gpu_carry/ab256k64; do
  n=$((n + 1))
  step "D 256 A/B $n: $lib"
  FFPA_LIBRARY=$PWD/$lib/libffpa.so timeout 60 python3 bench/small_d_ab.py --rounds 2 \
    --cases 256:2048:0,256:2048:1,256:8192:0,256:8192:1 --json "$OUT/d256_ab_$n.json" 2>&1 | tee -a "$log"
done
step "memcheck: D 72 and 128 cases"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/ffpa_gpu_tests" \
  --gtest_filter='Small/GpuForward.*D128*:Small/GpuForward.*D72*' --gtest_brief=1 > "$OUT/memcheck.log" 2>&1
echo "exit $?" | tee -a "$log"
tail -n 4 "$OUT/memcheck.log" | tee -a "$log"
step done
