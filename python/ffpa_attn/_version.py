"""The package's version. Its one source is CMakeLists.txt's project(ffpa VERSION x.y.z),
which the C library reports too (python -m ffpa_attn.info compares the two).

A wheel carries it in _build_version.py, written by the build from that line
(pyproject.toml, [[tool.scikit-build.generate]]); a source checkout (python/ on
PYTHONPATH, FFPA_LIBRARY set, as CI's tests run) reads CMakeLists.txt itself.
"""

from __future__ import annotations

import re
from pathlib import Path

# The regex of pyproject.toml's metadata.version.regex (python/tests/test_version.py checks they agree).
CMAKE_VERSION_REGEX = r"project\(ffpa\s+VERSION\s+(?P<value>[0-9]+\.[0-9]+\.[0-9]+)"
SOURCE_CMAKELISTS = Path(__file__).resolve().parents[2] / "CMakeLists.txt"
UNKNOWN = "0+unknown"  # neither a wheel nor a checkout: differs from every library's version


def source_tree_version(cmakelists: Path = SOURCE_CMAKELISTS) -> str:
    """The version in a checkout's CMakeLists.txt, or UNKNOWN when there is none."""
    try:
        match = re.search(CMAKE_VERSION_REGEX, cmakelists.read_text(encoding="utf-8"))
    except OSError:
        return UNKNOWN
    return match.group("value") if match else UNKNOWN


try:
    from ._build_version import version as __version__
except ModuleNotFoundError:
    __version__ = source_tree_version()
