"""The binding of ffpa_device_support: whether the library runs its kernels on a
CUDA device, asked once per device and impl, the answer an FFPAError (returned,
not raised) or None. Torch-free: CI without a GPU meets a real "no": no driver.
The drop-in's use of it: test_never_break.py."""

import ctypes

import pytest

from ffpa_attn import _library
from ffpa_attn._library import FFPAError, Impl

FFPA_OK, FFPA_IMPL_UNAVAILABLE = 0, 15  # ffpa_status


class CountingDll:
    """Stands in for the C library's ffpa_device_support and ffpa_status_name."""

    def __init__(self, status: int, message: bytes) -> None:
        self.status, self.message, self.calls = status, message, []

    def ffpa_device_support(self, device, impl, message, size):
        self.calls.append((device, impl))
        ctypes.memmove(message, self.message + b"\0", len(self.message) + 1)
        return self.status

    def ffpa_status_name(self, status):
        return {FFPA_OK: b"ok", FFPA_IMPL_UNAVAILABLE: b"impl_unavailable"}[status]


def library_with(dll: CountingDll) -> _library.Library:
    library = _library.Library.__new__(_library.Library)  # no file: the entry points are the double's
    library._dll = dll
    library._device_support = {}
    return library


def test_answer_is_asked_once_per_device_and_impl():
    dll = CountingDll(FFPA_IMPL_UNAVAILABLE, b"impl auto: no GPU kernel of this build runs on device 1: ...")
    library = library_with(dll)
    first = library.device_support(1)
    assert isinstance(first, FFPAError) and first.status_name == "impl_unavailable"
    assert "no GPU kernel" in first.message
    assert library.device_support(1) is first
    library.device_support(1, Impl.SM90_WGMMA)
    library.device_support(0)
    assert dll.calls == [(1, Impl.AUTO), (1, Impl.SM90_WGMMA), (0, Impl.AUTO)]


def test_a_device_that_runs_the_kernels_is_none():
    library = library_with(CountingDll(FFPA_OK, b""))
    assert library.device_support(0) is None
    assert library.device_support(0, Impl.SM80_SPLIT_D) is None


def loaded_library() -> _library.Library:
    try:
        return _library.load_library()
    except _library.LibraryNotFoundError as error:
        pytest.skip(f"the ffpa C library does not load (build it, or set FFPA_LIBRARY): {error}")


def test_the_library_answers_for_device_0():
    # Without a GPU (CI): impl_unavailable, saying why; with one, None or the reason.
    loaded_library()
    for impl in (Impl.AUTO, Impl.SM80_SPLIT_D, Impl.SM90_WGMMA):
        error = _library.device_support(0, impl)
        assert error is None or error.status_name == "impl_unavailable", error
        if error is not None:
            name = "auto" if impl == Impl.AUTO else impl.name.lower()
            assert f"impl {name}" in error.message, error.message


def test_a_host_impl_is_not_a_device_question():
    error = loaded_library().device_support(0, Impl.CPU_REFERENCE)
    assert error is not None and error.status_name == "invalid_option", error
