"""python -m ffpa_attn.info (torch-free parts run in CI): the report without a GPU,
and the refusal when the package and the library disagree on the version."""

import pytest

from ffpa_attn import _library, info


def library_or_skip():
    try:
        return _library.load_library()
    except _library.LibraryNotFoundError as error:
        pytest.skip(f"no ffpa library to report on: {error}")


def test_report_names_versions_path_and_instances(capsys):
    library = library_or_skip()
    assert info.main([]) == 0
    out = capsys.readouterr().out
    assert f"library: {library.info.version} at {library.path}" in out
    assert "sm80_split_d instances:" in out and "head dims accepted" in out


def test_version_mismatch_is_refused(capsys, monkeypatch):
    library_or_skip()
    monkeypatch.setattr(info, "__version__", "0.0.0-other")
    assert info.main([]) == 1
    assert "differ" in capsys.readouterr().err


def test_shape_argument_is_checked():
    with pytest.raises(SystemExit):
        info.main(["--shape", "1,2,3"])
