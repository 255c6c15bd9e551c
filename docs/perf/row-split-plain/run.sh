#!/usr/bin/env bash
# The row split's plain kernels (RowSplitTraits' kMaskAndSoftcap false: no user mask, no
# softcap, the score scale folded into the exponentials' FFMA; O rescaled between the S and
# P V issues), one device call (~7 min): the GPU suites and memcheck on the build that has
# them, then small_d_ab.py's TFLOP/s beside cuDNN, each library twice, interleaved.
#   run.sh BUILD BASE   (unpacked scripts/pack_build.sh folders: BUILD with the plain
#                        kernels, BASE the commit before them)
# Limited builds beside them (instances 64, 128, 256; README.md says how they are made):
#   gpu_carry/plain-a: plain kernels at BASE's KV blocks (D 64 192, D 128 128, D 256 80),
#                      O rescaled where BASE does (after P V)
#   gpu_carry/plain-b: plain-a with 176 keys at D 128 (FA3's non-causal tile)
# Writes run.log and raw.tgz under $OUT.
set -uo pipefail
B=${1:?unpacked build folder} BASE=${2:?unpacked base build folder}
RAW=${OUT:-/tmp/out}/raw
. scripts/device_steps.sh
step "GPU tests: forward, serving, value dims, NaN, split-KV (D <= 256: the plain kernels where no mask or softcap)"
gtest 240 tests "$B/tests/ffpa_gpu_tests" --gtest_filter='*GpuForward*:*GpuServing*:*GpuValueDim*:*Nan*:*SplitKv*'
step "memcheck: forward and serving at D 64 / 128 / 256"
gtest 120 memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/ffpa_gpu_tests" \
  --gtest_filter='Small/GpuServing.*_d64:Small/GpuServing.*_d128:Small/GpuServing.*_d256:*GpuForward*D128*' --gtest_brief=1
step "plain kernels: fold (plain-a), 176 keys at D 128 (plain-b), O's rescale moved (BUILD), BASE"
cases=64:8192:0,64:8192:1,128:8192:0,128:8192:1,128:2048:0,256:8192:0,256:8192:1
n=0
for lib in gpu_carry/plain-a gpu_carry/plain-b "$B" "$BASE" gpu_carry/plain-a gpu_carry/plain-b "$B" "$BASE"; do
  n=$((n + 1))
  ab 120 "$lib" "plain_$n.json" --rounds 2 --iters 10 --cases "$cases"
done
step done
