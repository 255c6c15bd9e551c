#!/usr/bin/env bash
# Issue 32's H200 figures, one device call (~9 min; prepared 2026-12-07, not yet run: the
# eighth session had H100s only, the ninth no GPU): the GPU suites at D <= 256 (forward, serving, backward:
# the row split under impl auto), then the whole compass (bench/compass.py: the rows
# d64 / d128 / d256 / d128-causal / d256-causal / d192-128 / bwd-d128 / bwd-d256 among
# them, ffpa_impl_* the library's own kernel) and the serving compass merged into it
# (bench/compass_serving.py: d256-window1024 runs the row split now, and issue 31's paged
# rows were never measured on an H200).
#   run.sh BUILD     (BUILD: scripts/pack_build.sh's folder of the hopper preset, unpacked)
# As a device call (carry gpu_carry; s12: scripts/pack_build.sh build-hopper gpu_carry s12 at the
# ninth session's HEAD, or a newer build):
#   cd gpu_carry && tar -xJf s12.tar.xz && cd .. && bash docs/perf/issue32-h200/run.sh gpu_carry/s12
# Writes run.log, compass.json (copy it to docs/perf/compass.json when the GPU is an H200),
# compass.md, compass_serving.md and raw.tgz (the test logs) under $OUT.
set -uo pipefail
B=${1:?unpacked build folder}
RAW=${OUT:-/tmp/out}/raw
. scripts/device_steps.sh
step "GPU tests at D <= 256"
gtest 200 tests "$B/tests/ffpa_gpu_tests" \
  --gtest_filter='*GpuForward*D64*:*GpuForward*D72*:*GpuForward*D128*:*GpuForward*D256*:*GpuServing*_d64:*GpuServing*_d128:*GpuServing*_d256:*GpuBackward*:*Nan*'
step "compass (every case)"
timeout 300 python3 bench/compass.py --out "$OUT/compass.json" --markdown "$OUT/compass.md" 2>&1 | tail -60 | tee -a "$log"
step "serving compass, merged"
timeout 180 python3 bench/compass_serving.py --out "$OUT/compass.json" --markdown "$OUT/compass_serving.md" 2>&1 | tail -30 | tee -a "$log"
step done
