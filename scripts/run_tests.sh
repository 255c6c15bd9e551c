#!/usr/bin/env bash
# The README's test command: the C++ tests of a build (ctest), then the Python
# package's tests against that build's library. pytest comes from the Python
# that has it (with torch, on a GPU machine, the torch tests run too), else
# from a venv in the build folder made on first use (needs PyPI once).
#
#   bash scripts/run_tests.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ -d "$BUILD" ] || { echo "run_tests: no build folder '$BUILD' (cmake -S . -B $BUILD -G Ninja && cmake --build $BUILD)" >&2; exit 2; }

ctest --test-dir "$BUILD" --output-on-failure

PYTHON=python3
if ! "$PYTHON" -c "import pytest" 2>/dev/null; then
  VENV=$BUILD/pytest-venv
  if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import pytest" 2>/dev/null; then
    echo "run_tests: no pytest for $PYTHON; installing it into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q pytest
  fi
  PYTHON=$VENV/bin/python
fi
export FFPA_LIBRARY=${FFPA_LIBRARY:-$(cd "$BUILD" && pwd)/libffpa.so}
"$PYTHON" -m pytest python/tests -q -rs
