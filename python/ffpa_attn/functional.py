"""ffpa_attn_func: SDPA's signature and semantics, served by the ffpa library where it can be.

Calls the library cannot serve (see decisions.py) go to the SDPA that was
installed when this module was first imported, so a monkey-patched SDPA never
calls itself.
"""

from __future__ import annotations

import logging
import math

import torch

from . import _library, ops  # noqa: F401  (ops registers torch.ops.ffpa_attn.forward)
from ._library import Accumulation, Causal, FFPAError, Impl
from .config import CUDABackend
from .decisions import CallSpec, Limits, fallback_reason

logger = logging.getLogger("ffpa_attn")

_sdpa = torch.nn.functional.scaled_dot_product_attention
_DEFAULT_BACKEND = CUDABackend()
_SEED_BOUND = 2**63 - 1  # seeds travel as int64


def _library_limits() -> Limits | None:
    """The loaded library's head-dim limits; None when no library loads (see fallback_reason)."""
    try:
        return _library.limits()
    except _library.LibraryNotFoundError:
        return None


# Asked once, at import, so that torch.compile never traces the library's loading.
_LIBRARY_LIMITS = _library_limits()


def ffpa_attn_func(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    backend: CUDABackend | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.functional.scaled_dot_product_attention, with the ffpa library serving what it can.

    The SDPA arguments mean what they mean for SDPA (is_causal: key j <= query
    i, top-left aligned even when Nq != Nkv; bool mask True = attend; float mask
    added to the scores). Extras:
      backend: a CUDABackend (implementation, accumulation, causal alignment,
          dropout seed and offset); None means CUDABackend().
      return_lse: also return the log-sum-exp of the scaled, masked scores,
          fp32 [B, Hq, Nq] (-inf for a row with no attended key): (out, lse).
    A call the library cannot serve goes to SDPA when backend.impl is "auto"
    (the reason is logged at DEBUG on the "ffpa_attn" logger) and raises
    NotImplementedError with the reason for an explicit impl.
    """
    backend = _DEFAULT_BACKEND if backend is None else backend
    if not isinstance(backend, CUDABackend):
        raise TypeError(f"backend must be a CUDABackend or None, got {type(backend).__name__}")
    if not all(isinstance(t, torch.Tensor) for t in _given_tensors(query, key, value, attn_mask)):
        # Not ours to judge: SDPA raises its own error for these.
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if backend.accumulation == "f16" and query.dtype == torch.bfloat16:
        raise ValueError("backend.accumulation = 'f16' needs float16 inputs, but query.dtype is torch.bfloat16")
    if (invalid := _invalid_sdpa_arguments(query, key, dropout_p)) is not None:
        raise RuntimeError(f"ffpa_attn_func: {invalid}")

    reason = fallback_reason(
        _call_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa), _LIBRARY_LIMITS
    )
    if reason is not None:
        if backend.impl != "auto":
            raise NotImplementedError(f"ffpa_attn: backend.impl = {backend.impl!r} cannot serve this call: {reason}")
        if not torch.compiler.is_compiling():
            logger.debug("ffpa_attn: SDPA serves this call: %s", reason)
        return _sdpa_fallback(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend.causal_alignment, return_lse
        )

    try:
        out, lse = torch.ops.ffpa_attn.forward(
            query,
            key,
            value,
            attn_mask,
            float(dropout_p),
            Causal[backend.causal_alignment.upper()] if is_causal else Causal.NONE,
            1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale),
            Accumulation[backend.accumulation.upper()],
            Impl[backend.impl.upper()],
            _dropout_seed(backend, dropout_p),
            backend.dropout_offset,
            return_lse,
        )
    except FFPAError as error:
        # An explicit impl the library cannot route this call to: the documented refusal.
        if error.status_name == "impl_unavailable" and backend.impl != "auto":
            raise NotImplementedError(
                f"ffpa_attn: backend.impl = {backend.impl!r} cannot serve this call: {error.message}"
            ) from error
        raise
    return (out, lse) if return_lse else out


def _invalid_sdpa_arguments(query: torch.Tensor, key: torch.Tensor, dropout_p: float) -> str | None:
    """Arguments SDPA rejects, checked here instead of passed on: on CUDA, PyTorch
    2.11's SDPA fails inside cuDNN for them, and a second such call crashes the
    process. RuntimeError, the type SDPA raises, keeps callers' handlers working."""
    if query.shape[-1] != key.shape[-1]:
        return f"query and key must have the same head dim (last dim), got {query.shape[-1]} and {key.shape[-1]}"
    if not 0.0 <= dropout_p <= 1.0:
        return f"dropout_p must be in [0, 1], got {dropout_p!r}"
    return None


def _call_spec(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> CallSpec:
    tensors = _given_tensors(query, key, value, attn_mask)
    return CallSpec(
        device_type=query.device.type,
        same_device=all(t.device == query.device for t in tensors),
        dtype=_dtype_name(query.dtype),
        kv_dtypes_match=key.dtype == query.dtype and value.dtype == query.dtype,
        q_shape=tuple(query.shape),
        k_shape=tuple(key.shape),
        v_shape=tuple(value.shape),
        mask_dtype=None if attn_mask is None else _dtype_name(attn_mask.dtype),
        mask_shape=None if attn_mask is None else tuple(attn_mask.shape),
        dropout_p=dropout_p,
        enable_gqa=enable_gqa,
        needs_grad=torch.is_grad_enabled() and any(t.requires_grad for t in tensors),
        nested=any(t.is_nested for t in tensors),
        is_causal=is_causal,
        scale=scale,
    )


def _given_tensors(query: object, key: object, value: object, attn_mask: object) -> tuple:
    return (query, key, value) + (() if attn_mask is None else (attn_mask,))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dropout_seed(backend: CUDABackend, dropout_p: float) -> int:
    if backend.dropout_seed is not None:
        return backend.dropout_seed
    if dropout_p == 0:
        return 0  # no draw: a call without dropout leaves torch's RNG untouched
    # Drawn here, not inside the op, so a captured or compiled op sees a plain int.
    return int(torch.randint(0, _SEED_BOUND, (), dtype=torch.int64).item())


def _sdpa_fallback(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    causal_alignment: str,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SDPA, given bottom-right causal alignment as a mask, plus the fp32 LSE when asked."""
    if (
        is_causal
        and causal_alignment == "bottom_right"
        and attn_mask is None
        and query.dim() >= 2
        and key.dim() >= 2
        and query.shape[-2] != key.shape[-2]  # equal lengths: both alignments are SDPA's is_causal
    ):
        attn_mask = _causal_mask(query.shape[-2], key.shape[-2], "bottom_right", query.device)
        is_causal = False
    out = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    if not return_lse:
        return out
    return out, _lse_float32(query, key, attn_mask, is_causal, scale, enable_gqa)


def _causal_mask(seq_q: int, seq_kv: int, alignment: str, device: torch.device) -> torch.Tensor:
    """Bool [Nq, Nkv], True = attend: j <= i (top_left) or j <= i + Nkv - Nq (bottom_right)."""
    diagonal = 0 if alignment == "top_left" else seq_kv - seq_q
    return torch.ones(seq_q, seq_kv, dtype=torch.bool, device=device).tril(diagonal)


def _lse_float32(
    query: torch.Tensor,
    key: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> torch.Tensor:
    """The log-sum-exp of SDPA's scaled, masked scores, in float32 on upcast inputs."""
    q, k = query.float(), key.float()
    if enable_gqa and k.size(-3) != q.size(-3):
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)) if scale is None else scale)
    if is_causal:
        scores = scores.masked_fill(~_causal_mask(q.size(-2), k.size(-2), "top_left", q.device), -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask.float()
    return torch.logsumexp(scores, dim=-1)
