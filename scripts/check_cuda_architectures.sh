#!/usr/bin/env bash
# Configures the project (nothing is built) with each way of choosing the CUDA
# architectures and checks what the build would compile and what
# ffpa_library_info would report: the default (sm_80 + sm_90a SASS, compute_80
# PTX), -DCMAKE_CUDA_ARCHITECTURES, the CUDAARCHS environment variable, the
# FFPA_CUDA_ARCHITECTURES alias, native (the default with a warning on a
# machine without a GPU) and all (entries below sm_80 left out).
#   scripts/check_cuda_architectures.sh [WORK_DIR]     (default: build/arch-check)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/arch-check}
rm -rf "$work"
mkdir -p "$work"
failures=0

# configure NAME [ENV=VALUE] -- CMAKE ARGS...
configure() {
  local name=$1 env_setting=$2
  shift 3
  local dir="$work/$name"
  if ! env ${env_setting:+"$env_setting"} cmake -S . -B "$dir" -G Ninja -DFFPA_BUILD_TESTS=OFF \
      -DFFPA_BUILD_TOOLS=OFF -DFFPA_HEAD_DIMS=128 -DFFPA_SM90_HEAD_DIMS=512 "$@" >"$dir.log" 2>&1; then
    echo "arch-check: $name: configure failed:"; cat "$dir.log"; failures=$((failures + 1)); return 1
  fi
}

# expect NAME RESOLVED REPORTED SPLIT_D_CODE SM90(yes|no)
expect() {
  local name=$1 resolved=$2 reported=$3 split_d_code=$4 sm90=$5 dir="$work/$1" problems=()
  grep -qF -- "ffpa: CUDA architectures: $resolved " "$dir.log" ||
    problems+=("resolved: $(grep -o 'ffpa: CUDA architectures: .*' "$dir.log"), expected $resolved")
  grep -qE -- "FFPA_CUDA_ARCHITECTURE_LIST=$reported( |\$)" "$dir/build.ninja" ||
    problems+=("reported: $(grep -o 'FFPA_CUDA_ARCHITECTURE_LIST=[0-9,]*' "$dir/build.ninja" | head -1), expected $reported")
  local flags
  flags=$(grep -A3 "^build CMakeFiles/ffpa_objects.dir/generated/sm80_split_d_d128.cu.o" "$dir/build.ninja" |
          grep -o 'generate-code=arch=[^ ]*' | tr '\n' ' ')
  [ "$flags" = "$split_d_code" ] || problems+=("split-D code: '$flags', expected '$split_d_code'")
  local has_sm90=no
  grep -q "^build CMakeFiles/ffpa_sm90_objects.dir/generated/sm90_wgmma_d512.cu.o" "$dir/build.ninja" && has_sm90=yes
  [ "$has_sm90" = "$sm90" ] || problems+=("sm90 family built: $has_sm90, expected $sm90")
  if [ ${#problems[@]} -gt 0 ]; then
    for problem in "${problems[@]}"; do echo "arch-check: $name: $problem"; done
    failures=$((failures + 1))
  else
    echo "arch-check: $name: $resolved (reported $reported) ok"
  fi
}

sm80_with_ptx='generate-code=arch=compute_80,code=[compute_80,sm_80] '
sm80='generate-code=arch=compute_80,code=[sm_80] '
sm90a='generate-code=arch=compute_90a,code=[sm_90a] '
sm90='generate-code=arch=compute_90,code=[sm_90] '

# CUDAARCHS from the caller's environment would change the default: not here.
unset CUDAARCHS

configure default "" -- && expect default "80;90a-real" 80,90 "$sm80_with_ptx$sm90a" yes
configure cmake-variable "" -- -DCMAKE_CUDA_ARCHITECTURES=80-real && expect cmake-variable 80-real 80 "$sm80" no
configure cudaarchs CUDAARCHS=90a-real -- && expect cudaarchs 90a-real 90 "$sm90a" yes
configure alias "" -- "-DFFPA_CUDA_ARCHITECTURES=80-real;90-real" &&
  expect alias "80-real;90-real" 80,90 "$sm80$sm90" yes
if configure native "" -- -DCMAKE_CUDA_ARCHITECTURES=native; then
  if grep -q "found no GPU" "$work/native.log"; then
    expect native "80;90a-real" 80,90 "$sm80_with_ptx$sm90a" yes
  else
    echo "arch-check: native: $(grep -o 'ffpa: CUDA architectures: .*' "$work/native.log") (this machine's GPUs)"
  fi
fi
if configure all "" -- -DCMAKE_CUDA_ARCHITECTURES=all; then
  if grep -o 'ffpa: CUDA architectures: [^(]*' "$work/all.log" | grep -qE '(^|[ ;:])([1-7][0-9])(-real|-virtual|[a-z])?(;| |$)'; then
    echo "arch-check: all: an architecture below sm_80 is built"; failures=$((failures + 1))
  else
    echo "arch-check: all: $(grep -o 'ffpa: CUDA architectures: .*' "$work/all.log") ok"
  fi
fi

if [ "$failures" -gt 0 ]; then
  echo "arch-check: $failures failed" >&2
  exit 1
fi
