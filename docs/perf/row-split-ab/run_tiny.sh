#!/usr/bin/env bash
# The smallest form (a call with ~2 minutes of device time): the RS wgmma
# test, the D 128 forward GPU cases, the row split (ping-pong) at D 128 beside
# cuDNN, FA2 and sm80_split_d.
set -uo pipefail
B=${1:?unpacked build folder}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/bench FFPA_LIBRARY=$PWD/$B/libffpa.so
log=$OUT/run.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$log"
timeout 25 "$B/tests/ffpa_gpu_kernel_tests" > "$OUT/kernel_tests.log" 2>&1
echo "kernel tests exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED' "$OUT/kernel_tests.log" | head -10 | tee -a "$log"
timeout 40 "$B/tests/ffpa_gpu_tests" --gtest_filter='Small/GpuForward.*D128*' > "$OUT/tests.log" 2>&1
echo "forward tests exit $?" | tee -a "$log"
grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED' "$OUT/tests.log" | head -20 | tee -a "$log"
timeout 45 python3 bench/small_d_ab.py --rounds 2 --iters 10 --cases 128:8192:0,128:8192:1 \
  --json "$OUT/d128.json" 2>&1 | tee -a "$log"
