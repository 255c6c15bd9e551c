"""__version__ has one source, CMakeLists.txt's project(ffpa VERSION ...): the
package (from a wheel or a checkout) reports it, and pyproject.toml reads it
with the same regex as the checkout fallback."""

from pathlib import Path

import pytest

import ffpa_attn
from ffpa_attn import _version

REPOSITORY = Path(__file__).resolve().parents[2]


def test_package_reports_the_cmake_project_version():
    assert ffpa_attn.__version__ == _version.source_tree_version(REPOSITORY / "CMakeLists.txt")
    assert ffpa_attn.__version__ != _version.UNKNOWN


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
