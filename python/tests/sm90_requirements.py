"""The module-level skip of the tests that need the library's sm90 kernels on this machine's GPU
(the FP8 path): a CUDA device of compute capability 9.0, the library loaded, and its sm90 family
runnable there (asked of the library)."""

from __future__ import annotations

import pytest


def require_sm90_kernels() -> None:
    """Skips the calling test module unless the library runs its sm90 kernels on the current GPU."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(
            f"FP8 runs on the sm90 family: needs compute capability 9.0, not {torch.cuda.get_device_capability()}",
            allow_module_level=True,
        )
    from ffpa_attn import _library
    from ffpa_attn._library import Impl

    try:
        unsupported = _library.device_support(torch.cuda.current_device(), Impl.SM90_WGMMA)
    except _library.LibraryNotFoundError as error:
        pytest.skip(f"the ffpa C library does not load (set FFPA_LIBRARY): {error}", allow_module_level=True)
    if unsupported is not None:
        pytest.skip(f"the library runs no sm90 kernel on this GPU: {unsupported.message}", allow_module_level=True)
