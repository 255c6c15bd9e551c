"""__version__ has one source, CMakeLists.txt's project(ffpa VERSION ...): the
package (from a wheel or a checkout) reports it, and pyproject.toml reads it
with the same regex as the checkout fallback."""

from pathlib import Path

import pytest

import ffpa_attn
from ffpa_attn import _version

REPOSITORY = Path(__file__).resolve().parents[2]

# The first two compare the package with the checkout's files; tests run against
# an installed wheel (copied out of the checkout) have none, and
# scripts/check_package.sh checks the installed version there.
in_source_tree = pytest.mark.skipif(
    not (REPOSITORY / "CMakeLists.txt").is_file() or not (REPOSITORY / "pyproject.toml").is_file(),
    reason="not run from a source tree (the installed package's version: scripts/check_package.sh)",
)


@in_source_tree
def test_package_reports_the_cmake_project_version():
    assert ffpa_attn.__version__ == _version.source_tree_version(REPOSITORY / "CMakeLists.txt")
    assert ffpa_attn.__version__ != _version.UNKNOWN


@in_source_tree
def test_pyproject_reads_the_version_with_the_fallback_regex():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))
    version = pyproject["tool"]["scikit-build"]["metadata"]["version"]
    assert version == {
        "provider": "scikit_build_core.metadata.regex",
        "input": "CMakeLists.txt",
        "regex": _version.CMAKE_VERSION_REGEX,
    }


def test_fallback_without_a_version_line_is_unknown(tmp_path):
    assert _version.source_tree_version(tmp_path / "absent.txt") == _version.UNKNOWN
    (tmp_path / "CMakeLists.txt").write_text("project(other VERSION 9.9.9)\n")
    assert _version.source_tree_version(tmp_path / "CMakeLists.txt") == _version.UNKNOWN
    (tmp_path / "CMakeLists.txt").write_text("project(ffpa VERSION 1.22.333 LANGUAGES CXX)\n")
    assert _version.source_tree_version(tmp_path / "CMakeLists.txt") == "1.22.333"
