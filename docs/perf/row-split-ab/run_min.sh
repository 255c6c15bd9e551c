#!/usr/bin/env bash
# The short form of run.sh for a call with little device time left: the RS
# wgmma test, the D <= 128 forward GPU cases, the row split (ping-pong)
# beside cuDNN and sm80_split_d at D 128, then serial and overlap.
set -uo pipefail
B=${1:?unpacked build folder}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/bench FFPA_LIBRARY=$PWD/$B/libffpa.so
log=$OUT/run.log
step() { echo "== $1 ($(date +%T))" | tee -a "$log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$log"
step "wgmma kernel tests"
timeout 30 "$B/tests/ffpa_gpu_kernel_tests" > "$OUT/kernel_tests.log" 2>&1
echo "exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED' "$OUT/kernel_tests.log" | head -10 | tee -a "$log"
step "forward GPU tests, D 72 / 128"
timeout 60 "$B/tests/ffpa_gpu_tests" --gtest_filter='Small/GpuForward.*D128*:Small/GpuForward.*D72*:GpuForwardSmall.*' \
  > "$OUT/tests.log" 2>&1
echo "exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED' "$OUT/tests.log" | head -20 | tee -a "$log"
for lib in "$B" gpu_carry/ab0 gpu_carry/ab1; do
  step "D 128: $lib"
  FFPA_LIBRARY=$PWD/$lib/libffpa.so timeout 40 python3 bench/small_d_ab.py --rounds 2 --iters 10 \
    --cases 128:8192:0,128:8192:1 --json "$OUT/d128_$(basename "$lib").json" 2>&1 | tee -a "$log"
done
step done
