#!/usr/bin/env bash
# The row split's plain kernels (RowSplitTraits' kMaskAndSoftcap false: no user mask, no
# softcap, the score scale folded into the exponentials' FFMA; O rescaled between the S and
# P V issues), one device call (~4 min): the GPU suites and memcheck on the build that has
# them, then small_d_ab.py's TFLOP/s beside cuDNN, BUILD and BASE twice, the others once, interleaved.
#   run.sh BUILD BASE [LIB...]   (unpacked scripts/pack_build.sh folders: BUILD with the
#                                 plain kernels, BASE the commit before them)
# LIB: limited builds weighed beside them (instances 64, 128, 256; README.md says how they
# are made), default gpu_carry/plain-d (BUILD with 176 keys at D 128, FA3's non-causal
# tile). Others made: plain-a (the fold alone, O rescaled where BASE does), plain-b (plain-a
# with 176 keys at D 128), plain-e (BUILD with three consumers at D 64, 192 x 128 tiles).
# Writes run.log and raw.tgz under $OUT.
set -uo pipefail
B=${1:?unpacked build folder} BASE=${2:?unpacked base build folder}
shift 2
libs=("$@")
[ ${#libs[@]} -gt 0 ] || libs=(gpu_carry/plain-d)
RAW=${OUT:-/tmp/out}/raw
. scripts/device_steps.sh
step "GPU tests: forward, serving, value dims, NaN, split-KV (D <= 256: the plain kernels where no mask or softcap)"
# TESTS: another filter (a short call: fewer cases), MEMCHECK=0: no memcheck.
gtest 150 tests "$B/tests/ffpa_gpu_tests" \
  --gtest_filter="${TESTS:-*GpuForward*D64*:*GpuForward*D128*:*GpuForward*D256*:*GpuServing*_d128:*GpuServing*_d256:*Nan*}"
if [ "${MEMCHECK:-1}" = 1 ]; then
  step "memcheck: forward and serving at D 64 / 128 / 256"
  gtest 60 memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/ffpa_gpu_tests" \
    --gtest_filter='Small/GpuServing.*_d64:Small/GpuServing.*_d128:Small/GpuServing.*_d256:*GpuForward*D128*' --gtest_brief=1
fi
step "plain kernels: ${libs[*]}, BUILD, BASE"
cases=${CASES:-64:8192:0,128:8192:0,128:8192:1,256:8192:0}
n=0
for lib in "$B" "$BASE" "${libs[@]}" "$B" "$BASE"; do
  n=$((n + 1))
  ab 120 "$lib" "plain_$n.json" --rounds 2 --iters 10 --cases "$cases"
done
step done
