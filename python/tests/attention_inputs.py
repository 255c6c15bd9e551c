"""Random attention inputs for the torch tests.

q is uniform in [-2, 2), k and v in [-1, 1): the scores are far from uniform, so
a wrong scale, mask or key order shows in the output. Inputs come in three
memory layouts of the logical [B, H, N, D] tensor, and masks in every broadcast
pattern SDPA accepts.
"""

from __future__ import annotations

from typing import Callable

import torch

# Memory layouts of a logical [B, H, N, D] input.
LAYOUTS = ("bhnd", "bnhd", "padded-rows")
ROW_PAD = 8  # elements between rows of "padded-rows": keeps 16-byte alignment for fp16/bf16

# Storage shape of each mask pattern, from (B, H, Nq, Nkv); "expanded" is a stride-0
# view of its storage expanded to [B, H, Nq, Nkv].
MASK_PATTERNS: dict[str, Callable[[int, int, int, int], tuple[int, ...]]] = {
    "2d": lambda b, h, nq, nkv: (nq, nkv),
    "keys": lambda b, h, nq, nkv: (1, 1, 1, nkv),
    "batch-keys": lambda b, h, nq, nkv: (b, 1, 1, nkv),
    "batch-rows": lambda b, h, nq, nkv: (b, 1, nq, nkv),
    "full": lambda b, h, nq, nkv: (b, h, nq, nkv),
    "expanded": lambda b, h, nq, nkv: (1, 1, nq, nkv),
}
# Mask dtypes: boolean, additive in the inputs' dtype, additive in float32.
MASK_KINDS = ("bool", "same-dtype", "float32")
BOOL_ATTEND_PROBABILITY = 0.85
ADDITIVE_EXCLUDED_PROBABILITY = 0.1  # entries set to -inf in an additive mask


def uniform(shape: tuple[int, ...], low: float, high: float, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.float32, device=device).uniform_(low, high).to(dtype)


def attention_input(
    shape: tuple[int, int, int, int], low: float, high: float, dtype: torch.dtype, device, layout: str = "bhnd"
) -> torch.Tensor:
    """A logical [B, H, N, D] tensor in `layout`: contiguous, the transpose(1, 2) of a
    contiguous [B, N, H, D] tensor, or rows ROW_PAD elements apart beyond D."""
    b, h, n, d = shape
    if layout == "bhnd":
        return uniform(shape, low, high, dtype, device)
    if layout == "bnhd":
        return uniform((b, n, h, d), low, high, dtype, device).transpose(1, 2)
    if layout == "padded-rows":
        return uniform((b, h, n, d + ROW_PAD), low, high, dtype, device)[..., :d]
    raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")


def random_qkv(
    batch: int,
    heads_q: int,
    heads_kv: int,
    seq_q: int,
    seq_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    device,
    layout: str = "bhnd",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = attention_input((batch, heads_q, seq_q, head_dim), -2.0, 2.0, dtype, device, layout)
    k = attention_input((batch, heads_kv, seq_kv, head_dim), -1.0, 1.0, dtype, device, layout)
    v = attention_input((batch, heads_kv, seq_kv, head_dim), -1.0, 1.0, dtype, device, layout)
    return q, k, v


def mask_dtype(kind: str, input_dtype: torch.dtype) -> torch.dtype:
    return {"bool": torch.bool, "same-dtype": input_dtype, "float32": torch.float32}[kind]


def identity_values(batch: int, heads: int, seq_kv: int, head_dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """v whose key j is the unit vector e_j (Nkv <= D): o[..., j] is then the probability of
    key j after dropout, 0 exactly where the keep-mask drops it."""
    assert seq_kv <= head_dim, "one unit vector per key"
    eye = torch.eye(seq_kv, head_dim, dtype=dtype, device=device)
    return eye.expand(batch, heads, seq_kv, head_dim).contiguous()


def random_mask(
    pattern: str, dtype: torch.dtype, batch: int, heads: int, seq_q: int, seq_kv: int, device
) -> torch.Tensor:
    """A mask of `pattern` (see MASK_PATTERNS): bool (True = attend, with probability
    BOOL_ATTEND_PROBABILITY) or additive in `dtype` (uniform in [-2, 2), some -inf)."""
    shape = MASK_PATTERNS[pattern](batch, heads, seq_q, seq_kv)
    if dtype == torch.bool:
        mask = torch.rand(shape, device=device) < BOOL_ATTEND_PROBABILITY
    else:
        mask = uniform(shape, -2.0, 2.0, torch.float32, device)
        mask[torch.rand(shape, device=device) < ADDITIVE_EXCLUDED_PROBABILITY] = float("-inf")
        mask = mask.to(dtype)
    if pattern == "expanded":
        mask = mask.expand(batch, heads, seq_q, seq_kv)
    return mask


def odd_length(rng, low: int, high: int) -> int:
    """An odd sequence length in [low, high]: never a multiple of a tile size."""
    return rng.randrange(low | 1, high + 1, 2)
