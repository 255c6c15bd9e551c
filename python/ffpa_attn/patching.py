"""monkey_patch / unpatch: ffpa_attn_func as torch.nn.functional.scaled_dot_product_attention.

Code that looks SDPA up as F.scaled_dot_product_attention at call time (nn.MultiheadAttention,
most model code) gets ffpa_attn_func; a reference bound earlier
(`from torch.nn.functional import scaled_dot_product_attention`) keeps the original.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.nn.functional as F

from .config import CUDABackend
from .functional import ffpa_attn_func

_replaced: Callable | None = None  # what monkey_patch replaced; unpatch puts it back


def monkey_patch(backend: CUDABackend | None = None) -> None:
    """Installs ffpa_attn_func as F.scaled_dot_product_attention (a no-op when installed).

    backend: the CUDABackend every patched call uses (e.g. CUDABackend(impl="ffpa") to train on ffpa's
    backward); None: the default, impl "auto". Patching again with another backend replaces the first.
    """
    global _replaced
    if backend is not None and not isinstance(backend, CUDABackend):
        raise TypeError(f"backend must be a CUDABackend or None, got {type(backend).__name__}")
    if _is_ours(F.scaled_dot_product_attention):
        F.scaled_dot_product_attention = _replaced  # a re-patch: start from what the first one replaced
    else:
        _replaced = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = (
        ffpa_attn_func if backend is None else functools.wraps(ffpa_attn_func)(functools.partial(ffpa_attn_func, backend=backend))
    )


def unpatch() -> None:
    """Restores what monkey_patch replaced (a no-op when not installed)."""
    global _replaced
    if _is_ours(F.scaled_dot_product_attention) and _replaced is not None:
        F.scaled_dot_product_attention = _replaced
    _replaced = None


def _is_ours(function: Callable) -> bool:
    return function is ffpa_attn_func or getattr(function, "func", None) is ffpa_attn_func
