"""ffpa_attn: exact attention for large head dims (D up to 1024) as a drop-in for PyTorch SDPA.

    from ffpa_attn import ffpa_attn_func, CUDABackend, monkey_patch
    from ffpa_attn import flash_attn_varlen_func, flash_attn_with_kvcache  # FlashAttention's serving calls

ffpa_attn.config and ffpa_attn.decisions work without PyTorch (CI without torch
tests them); the names that need torch raise ImportError when it is missing.
"""

from ._library import library_info, library_path
from ._version import __version__
from .config import CUDABackend

_NEEDS_TORCH = ("ffpa_attn_func", "explain", "monkey_patch", "unpatch", "flash_attn_varlen_func", "flash_attn_with_kvcache")
__all__ = [*_NEEDS_TORCH, "CUDABackend", "library_info", "library_path", "__version__"]

try:
    import torch  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "torch":
        raise  # torch is there but broken: say so
    _torch_missing = error
else:
    from .flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache
    from .functional import explain, ffpa_attn_func
    from .patching import monkey_patch, unpatch


def __getattr__(name: str) -> object:
    # Reached only for names not set above: those that need torch when it is missing.
    if name in _NEEDS_TORCH:
        raise ImportError(
            f"ffpa_attn.{name} needs PyTorch, which is not installed: install the torch build for your "
            "CUDA driver (pytorch.org), or PyPI's default with pip install 'ffpa-kernels[torch]'"
        ) from _torch_missing
    raise AttributeError(f"module 'ffpa_attn' has no attribute {name!r}")
