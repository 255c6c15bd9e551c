"""Reference attention for the torch tests, and the error checks against it.

The oracle is SDPA's math backend in float32 on upcast inputs (as the issue asks);
where SDPA cannot express the call (dropout with the library's keep-mask) the same
math is written out here in float32, and the log-sum-exp in float64.
"""

from __future__ import annotations

import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# The built-in SDPA: F.scaled_dot_product_attention may be patched while a test runs.
ORIGINAL_SDPA = torch._C._nn.scaled_dot_product_attention

# Relative L2 error of o against the float32 reference: fp16/bf16 as the core library's
# GPU tests; float32 for the fallback path, which SDPA computes in float32 itself.
O_TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 1e-5}
# |lse - ref| <= LSE_TOLERANCE * max(1, |ref|), as the core library's GPU tests.
LSE_TOLERANCE = 2e-3

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def causal_mask(seq_q: int, seq_kv: int, alignment: str, device) -> torch.Tensor:
    """Bool [Nq, Nkv], True = attend: key j <= i (top_left) or j <= i + Nkv - Nq (bottom_right)."""
    shift = 0 if alignment == "top_left" else seq_kv - seq_q
    rows = torch.arange(seq_q, device=device).unsqueeze(1)
    keys = torch.arange(seq_kv, device=device).unsqueeze(0)
    return keys <= rows + shift


def upcast_mask(attn_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return attn_mask if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask.to(dtype)


def sdpa_float32(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False) -> torch.Tensor:
    """SDPA's math backend in float32 on upcast inputs. Rows with no attended key give 0."""
    with sdpa_kernel(SDPBackend.MATH):
        return ORIGINAL_SDPA(
            q.float(),
            k.float(),
            v.float(),
            attn_mask=upcast_mask(attn_mask, torch.float32),
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )


def repeat_kv_heads(x: torch.Tensor, heads_q: int) -> torch.Tensor:
    """GQA: query head h reads kv head h / (Hq / Hkv)."""
    return x.repeat_interleave(heads_q // x.shape[1], dim=1)


def attention_scores(q, k, attn_mask=None, causal: str | None = None, scale=None, dtype=torch.float64) -> torch.Tensor:
    """Scaled, masked scores [B, Hq, Nq, Nkv] in `dtype`; excluded entries are -inf."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q.to(dtype) @ repeat_kv_heads(k.to(dtype), q.shape[1]).transpose(-1, -2) * scale
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(dtype)
    if causal is not None:
        scores = scores.masked_fill(~causal_mask(q.shape[2], k.shape[2], causal, q.device), float("-inf"))
    return scores


def logsumexp_float64(q, k, attn_mask=None, causal: str | None = None, scale=None) -> torch.Tensor:
    """Natural log of the softmax denominator [B, Hq, Nq], float64; -inf for rows with no key."""
    return torch.logsumexp(attention_scores(q, k, attn_mask, causal, scale, torch.float64), dim=-1)


def dropout_attention_float32(
    q, k, v, keep: torch.Tensor, dropout_p: float, attn_mask=None, causal: str | None = None, scale=None
) -> torch.Tensor:
    """Attention whose probabilities are multiplied by keep / (1 - p), in float32."""
    scores = attention_scores(q, k, attn_mask, causal, scale, torch.float32)
    # A row with no attended key is all -inf: softmax gives NaN there, the library 0.
    probabilities = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    probabilities = probabilities * keep.to(probabilities.device) / (1.0 - dropout_p)
    return probabilities @ repeat_kv_heads(v.float(), q.shape[1])


def relative_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-300)).item()


def assert_output_close(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """No NaN, the expected shape, and relative L2 error within the tolerance of `dtype`."""
    assert out.shape == expected.shape, f"shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    assert not out.isnan().any(), "the output holds NaN"
    error, tolerance = relative_l2(out, expected), O_TOLERANCE[dtype]
    assert error <= tolerance, f"relative L2 error {error:.3e} > {tolerance:.0e} ({dtype})"


def assert_lse_close(lse: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32 [B, Hq, Nq]; -inf exactly where the reference is; within LSE_TOLERANCE elsewhere."""
    assert lse.dtype == torch.float32, f"lse dtype {lse.dtype}, expected torch.float32"
    assert lse.shape == expected.shape, f"lse shape {tuple(lse.shape)}, expected {tuple(expected.shape)}"
    assert not lse.isnan().any(), "lse holds NaN"
    lse, expected = lse.double(), expected.to(lse.device)
    empty = expected == float("-inf")
    assert torch.equal(lse == float("-inf"), empty), "lse is -inf exactly on rows with no attended key"
    error = (lse - expected).abs()[~empty]
    bound = LSE_TOLERANCE * expected.abs().clamp_min(1.0)[~empty]
    worst = (error / bound).max().item() if error.numel() else 0.0
    assert worst <= 1.0, f"lse error up to {worst:.2f} x the tolerance {LSE_TOLERANCE:.0e} * max(1, |lse|)"
