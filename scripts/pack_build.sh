#!/usr/bin/env bash
# Packs what the GPU machine needs from a build made here (the shared library,
# the GPU test binary, ffpa-bench) into one xz tarball under a folder that the
# device tool carries, since a session's carry is 64 MiB and a full build's
# binaries are ~125 MB unpacked (~10 MB packed).
#
#   scripts/pack_build.sh BUILD_DIR CARRY_DIR [NAME]
#
# Writes CARRY_DIR/NAME.tar.xz (NAME defaults to "build") holding NAME/libffpa.so*,
# NAME/tests/ffpa_gpu_tests, NAME/tests/ffpa_gpu_kernel_tests, NAME/tools/ffpa-bench and NAME/tools/ffpa-fp8-accuracy (those the build has).
# On the device, from the repository root:
#   tar -xJf CARRY_DIR/NAME.tar.xz -C CARRY_DIR && bash scripts/gpu_check.sh --only tests CARRY_DIR/NAME
# (CARRY_DIR must be ignored by git, e.g. listed in .git/info/exclude, and named in the run's carry.)
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,14p' "$0"; exit 2; }
build=$1 carry=$2 name=${3:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name/tests" "$stage/$name/tools" "$carry"
found=0
for f in "$build"/libffpa.so*; do
  [ -e "$f" ] || continue
  cp -P "$f" "$stage/$name/"
  found=1
done
[ -f "$build/tests/ffpa_gpu_tests" ] && cp "$build/tests/ffpa_gpu_tests" "$stage/$name/tests/" && found=1
[ -f "$build/tests/ffpa_gpu_kernel_tests" ] && cp "$build/tests/ffpa_gpu_kernel_tests" "$stage/$name/tests/" && found=1
[ -f "$build/tools/ffpa-bench" ] && cp "$build/tools/ffpa-bench" "$stage/$name/tools/" && found=1
[ -f "$build/tools/ffpa-fp8-accuracy" ] && cp "$build/tools/ffpa-fp8-accuracy" "$stage/$name/tools/"
[ "$found" = 1 ] || { echo "pack_build: nothing to pack in $build" >&2; exit 1; }
tar -cJf "$carry/$name.tar.xz" -C "$stage" "$name"
echo "pack_build: $carry/$name.tar.xz ($(du -h "$carry/$name.tar.xz" | cut -f1))"
