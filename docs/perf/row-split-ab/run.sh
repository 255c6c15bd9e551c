#!/usr/bin/env bash
# The row split's first device call (issue 32; README.md), in three sizes by
# the device time left:
#   run.sh BUILD [full|min|tiny]
#   full (~8 min): the wgmma kernel tests (WgmmaRs), the forward GPU suite
#        (every case under impl sm90_wgmma too), bench/small_d_ab.py's default
#        cases, the three schedules at D 128 (limited builds ab0, ab1 and the
#        build: 0 1 2 0 1), D 256's row split (ab256k64) against the column
#        split, memcheck of the D 72 / 128 cases;
#   min  (~3 min): the kernel tests, the D 72 / 128 forward cases, D 128 N 8192
#        for the three schedules;
#   tiny (~2 min): the kernel tests, the D 128 forward cases, D 128 N 8192 for
#        the build's schedule.
set -uo pipefail
B=${1:?unpacked build folder}
SIZE=${2:-full}
case "$SIZE" in full | min | tiny) ;; *) echo "run.sh: size is full, min or tiny, not $SIZE" >&2; exit 2 ;; esac
. scripts/device_steps.sh
step "wgmma kernel tests"
gtest 30 kernel_tests "$B/tests/ffpa_gpu_kernel_tests"
step "forward GPU tests"
case "$SIZE" in
  full) gtest 150 tests "$B/tests/ffpa_gpu_tests" --gtest_filter='*GpuForward*:*GpuValueDim*:*Nan*:*SplitKv*' ;;
  min) gtest 60 tests "$B/tests/ffpa_gpu_tests" --gtest_filter='Small/GpuForward.*D128*:Small/GpuForward.*D72*:GpuForwardSmall.*' ;;
  tiny) gtest 40 tests "$B/tests/ffpa_gpu_tests" --gtest_filter='Small/GpuForward.*D128*' ;;
esac
D128="--rounds 2 --iters 10 --cases 128:8192:0,128:8192:1"
if [ "$SIZE" = tiny ]; then
  step "D 128: the build's schedule (ping-pong)"
  ab 45 "$B" d128.json $D128
  step done
  exit 0
fi
if [ "$SIZE" = full ]; then
  step "small-D beside cuDNN (the build's schedule: ping-pong)"
  ab 100 "$B" small_d_ab.json
  D128="--rounds 2 --cases 128:2048:0,128:2048:1,128:8192:0,128:8192:1"
fi
# The schedules: serial (ab0), overlap (ab1), ping-pong (the build), each its
# own process with cuDNN beside it.
n=0
for lib in gpu_carry/ab0 gpu_carry/ab1 "$B" gpu_carry/ab0 gpu_carry/ab1; do
  n=$((n + 1))
  [ "$SIZE" = min ] && [ $n -gt 3 ] && break
  step "schedule A/B $n: $lib"
  ab 60 "$lib" "schedule_ab_$n.json" $D128
done
if [ "$SIZE" = full ]; then
  # D 256: the column split (the build) against the row split with KV blocks of 64 (ab256k64).
  n=0
  for lib in gpu_carry/ab256k64 "$B" gpu_carry/ab256k64; do
    n=$((n + 1))
    step "D 256 A/B $n: $lib"
    ab 60 "$lib" "d256_ab_$n.json" --rounds 2 --cases 256:2048:0,256:2048:1,256:8192:0,256:8192:1
  done
  step "memcheck: D 72 and 128 cases"
  gtest 60 memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/ffpa_gpu_tests" \
    --gtest_filter='Small/GpuForward.*D128*:Small/GpuForward.*D72*' --gtest_brief=1
  tail -n 4 "$OUT/memcheck.log" | tee -a "$log"
fi
step done
