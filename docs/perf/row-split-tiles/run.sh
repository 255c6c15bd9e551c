#!/usr/bin/env bash
# The row split's tile shapes (issue 32's milestone 4) and the routing build's
# GPU checks, one device call (~5 min; README.md says how the libraries are built):
#   run.sh BUILD
# BUILD: the hopper preset packed by scripts/pack_build.sh (the row split at
# D 64 / 128 / 256, impl auto taking it); beside it, in gpu_carry/, limited
# builds of one instance each with other KV blocks: ab128n176 / ab128n144
# (D 128), ab64n192 / ab64n256 (D 64), ab256n80 (D 256). Writes run.log and
# raw.tgz (the JSON of every step, the logs) under $OUT.
set -uo pipefail
B=${1:?unpacked build folder}
RAW=${OUT:-/tmp/out}/raw
. scripts/device_steps.sh
step "GPU tests: forward, serving (the row split at D 64 / 128 / 256 under impl auto and sm90_wgmma)"
gtest 240 tests "$B/tests/ffpa_gpu_tests" --gtest_filter='*GpuForward*:*GpuServing*:*GpuValueDim*:*Nan*:*SplitKv*'
step "memcheck: serving at D 64 / 128 / 256"
gtest 90 memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/ffpa_gpu_tests" \
  --gtest_filter='Small/GpuServing.*_d64:Small/GpuServing.*_d128:Small/GpuServing.*_d256' --gtest_brief=1
step "small-D beside cuDNN (the build)"
ab 100 "$B" small_d_ab.json --rounds 2
step "D 128 KV blocks: 176, 144, the build's 128"
interleave 128:8192:0,128:8192:1,128:2048:0 d128_tiles gpu_carry/ab128n176 gpu_carry/ab128n144 "$B"
step "D 64 KV blocks: 192, 256, the build's 128"
interleave 64:8192:0,64:8192:1,64:2048:0 d64_tiles gpu_carry/ab64n192 gpu_carry/ab64n256 "$B"
step "D 256 KV blocks: 80, the build's 64"
interleave 256:8192:0,256:8192:1 d256_tiles gpu_carry/ab256n80 "$B"
step "ncu: the row split at D 128, N 8192"
timeout 120 ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section Occupancy -k regex:forward_kernel -c 1 python3 bench/small_d_ab.py --cases 128:8192:0 --rounds 1 --iters 1 \
  --warmup 0 > "$RAW/ncu_d128.txt" 2>&1
echo "exit $?" | tee -a "$log"
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Warp Cycles Per Issued|Stall|No Eligible|Registers" "$RAW/ncu_d128.txt" | head -30 | tee -a "$log"
step done
