"""monkey_patch / unpatch: ffpa_attn_func as torch.nn.functional.scaled_dot_product_attention.

Code that looks SDPA up as F.scaled_dot_product_attention at call time (nn.MultiheadAttention,
most model code) gets ffpa_attn_func; a reference bound earlier
(`from torch.nn.functional import scaled_dot_product_attention`) keeps the original.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F

from .functional import ffpa_attn_func

_replaced: Callable | None = None  # what monkey_patch replaced; unpatch puts it back


def monkey_patch() -> None:
    """Installs ffpa_attn_func as F.scaled_dot_product_attention (a no-op when installed)."""
    global _replaced
    if F.scaled_dot_product_attention is ffpa_attn_func:
        return
    _replaced = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = ffpa_attn_func


def unpatch() -> None:
    """Restores what monkey_patch replaced (a no-op when not installed)."""
    global _replaced
    if F.scaled_dot_product_attention is ffpa_attn_func and _replaced is not None:
        F.scaled_dot_product_attention = _replaced
    _replaced = None
