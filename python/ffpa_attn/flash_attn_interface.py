"""FlashAttention's serving functions, served by the ffpa library: a user changes one import.

    from ffpa_attn.flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache

Each argument FlashAttention 2 (flash_attn/flash_attn_interface.py) names means what it means there, in
its position; what FlashAttention 3 (hopper/flash_attn_interface.py) and vLLM's vllm_flash_attn add, and
what ffpa adds, is keyword-only. An argument the library cannot serve (ALiBi, dropout, rotary embedding,
a left-padded cache, a q descale) raises NotImplementedError naming it: none is ignored. The calls run on
ffpa or raise (no other kernel serves them): on CUDA tensors they first ask decide.library_refusal; CPU
tensors run on the library's CPU reference (exact, slow: for tests).

Layouts are FlashAttention's and reach the library as views (no copies): packed q [total_q, Hq, D] is
the library's [1, Hq, total_q, D]; batched q [B, Nq, Hq, D] its [B, Hq, Nq, D]; a paged cache
[num_blocks, page_size, Hkv, D] its [num_blocks, Hkv, page_size, D]. causal=True is bottom-right per
sequence (FlashAttention's), window_size=(left, right) with -1 unbounded, softcap 0 none. The outputs
have q's layout; the LSE is FlashAttention's: [Hq, total_q] (varlen), [B, Hq, Nq] (kvcache), -inf for a
row with no attended key.
"""

from __future__ import annotations

import math

import torch

from . import decide, serving_ops  # noqa: F401  (serving_ops registers torch.ops.ffpa_attn.serving_*)
from ._library import Causal, FFPAError


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int | torch.Tensor,
    max_seqlen_k: int | torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | None = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: torch.Tensor | None = None,
    *,
    seqused_k: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    impl: str = "auto",
):
    """Attention over a batch of sequences of different lengths (FlashAttention's flash_attn_varlen_func).

    q [total_q, Hq, D], sequence b's queries rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] (int32 [B + 1]).
    Keys, either packed, k [total_k, Hkv, D] and v [total_k, Hkv, Dv] with cu_seqlens_k, or, with
    block_table (int32 [B, max_blocks]), a paged cache k [num_blocks, page_size, Hkv, D] (cu_seqlens_k,
    when given, then only gives the lengths). Hq a multiple of Hkv (GQA). max_seqlen_q / max_seqlen_k:
    bounds on the lengths (a tensor, as transformers passes, lets the library derive them: reading it
    would synchronize the host). dropout_p must be 0 and alibi_slopes None (not served);
    deterministic: the library's forward and backward are deterministic whatever its value.

    Returns out [total_q, Hq, Dv] (q's layout); with return_attn_probs (out, softmax_lse [Hq, total_q]
    f32, None) as FlashAttention 2 with no dropout. Keyword-only (vLLM's and FlashAttention 3's names):
    seqused_k (int32 [B], the keys each sequence uses), out (written: [total_q, Hq, Dv], no gradients),
    s_aux (attention sinks, [Hq], converted to f32), k_descale / v_descale (f32 [B, Hkv] with
    float8_e4m3fn k and v), return_softmax_lse ((out, softmax_lse)); and ffpa's impl ("auto",
    "sm80_split_d", "sm90_wgmma").

    Gradients flow to q, k and v of a packed call where the library's backward takes a sequence batch
    (serving_ops.BACKWARD_TAKES_SEQUENCES); until then backward() raises NotImplementedError.
    """
    _refuse(
        "flash_attn_varlen_func", dropout_p=dropout_p, alibi_slopes=alibi_slopes, q_descale=q_descale,
    )  # fmt: skip
    _check_rank("flash_attn_varlen_func", q=(q, 3), k=(k, 4 if block_table is not None else 3))
    if cu_seqlens_k is None and block_table is None:
        raise ValueError("flash_attn_varlen_func: cu_seqlens_k is None without a block_table (packed keys need it)")
    q_view = _packed(q)
    k_view, v_view = (_paged(k), _paged(v)) if block_table is not None else (_packed(k), _packed(v))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if out is not None and needs_grad:
        raise NotImplementedError("flash_attn_varlen_func: out= is for inference: its call has no gradients")
    _ask_library("flash_attn_varlen_func", q, v, impl, needs_grad)
    arguments = (
        cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, _sinks(s_aux), k_descale, v_descale,
        _bound(max_seqlen_q), _bound(max_seqlen_k), _scale(softmax_scale, q),
        Causal.BOTTOM_RIGHT if causal else Causal.NONE, *_window(window_size), float(softcap),
        decide.LIBRARY_IMPLS[impl] if impl in decide.LIBRARY_IMPLS else _bad_impl(impl),
    )  # fmt: skip
    return_lse = return_attn_probs or return_softmax_lse
    try:
        if out is not None:
            lse = torch.ops.ffpa_attn.serving_forward_out(q_view, k_view, v_view, _packed(out), *arguments, return_lse)
            result = out
        else:
            # The backward reads the forward's lse: asked for whenever autograd records the call.
            o, lse = torch.ops.ffpa_attn.serving_forward(q_view, k_view, v_view, *arguments, return_lse or needs_grad)
            result = o[0].transpose(0, 1)
    except FFPAError as error:
        raise _unserved("flash_attn_varlen_func", error) from error
    if return_attn_probs:
        return result, lse[0], None
    if return_softmax_lse:
        return result, lse[0]
    return result


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: int | torch.Tensor | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | None = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    num_splits: int = 0,
    return_softmax_lse: bool = False,
    *,
    s_aux: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    impl: str = "auto",
):
    """Attention of new queries over a KV cache (FlashAttention's flash_attn_with_kvcache), inference only.

    q [B, Nq, Hq, D]; the cache either batched, k_cache [B_cache, N_cache, Hkv, D] (row cache_batch_idx[b],
    int32 [B], else row b, serves sequence b), or paged, k_cache [num_blocks, page_size, Hkv, D] read
    through block_table (int32 [B, max_blocks]). cache_seqlens (int or int32 [B]): the keys in the cache
    before this call (None: all of them). k, v [B, S_new, Hkv, D]: appended in place at positions
    cache_seqlens[b] .. + S_new (through the block table for a paged cache), then attended. Queries are
    the last Nq tokens of their sequence (causal=True: bottom-right). num_splits is FlashAttention's
    scheduling hint: the library plans its own splits, so no value changes the result. rotary_cos /
    rotary_sin, cache_leftpad and alibi_slopes raise NotImplementedError (rotary_interleaved is read with
    rotary only, as there).

    Returns out [B, Nq, Hq, Dv]; with return_softmax_lse (out, softmax_lse [B, Hq, Nq] f32).
    Keyword-only: s_aux (sinks [Hq]), k_descale / v_descale (f32 [B, Hkv] with float8_e4m3fn caches) and
    ffpa's impl.
    """
    _refuse(
        "flash_attn_with_kvcache", rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_leftpad=cache_leftpad,
        alibi_slopes=alibi_slopes, q_descale=q_descale,
    )  # fmt: skip
    _check_rank("flash_attn_with_kvcache", q=(q, 4), k_cache=(k_cache, 4), v_cache=(v_cache, 4))
    if cache_batch_idx is not None and block_table is not None:
        raise ValueError("flash_attn_with_kvcache: cache_batch_idx and block_table exclude each other")
    if (k is None) != (v is None):
        raise ValueError("flash_attn_with_kvcache: k and v are given together or not at all")
    batch = q.shape[0]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    table = block_table
    if cache_batch_idx is not None:
        # Cache row cache_batch_idx[b] as sequence b's one page of N_cache keys.
        table = cache_batch_idx.to(torch.int32).view(batch, 1)
    _ask_library("flash_attn_with_kvcache", q, v_cache, impl, needs_grad=False)
    with torch.no_grad():  # as FlashAttention's: no autograd through a cache
        seqused_k = cache_seqlens
        if k is not None:
            if cache_seqlens is None:
                raise ValueError("flash_attn_with_kvcache: appending k and v needs cache_seqlens")
            _append(k_cache, v_cache, k, v, cache_seqlens, table)
            seqused_k = (cache_seqlens + k.shape[1]).to(torch.int32)
        try:
            o, lse = torch.ops.ffpa_attn.serving_forward(
                q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                None, None, table, seqused_k, _sinks(s_aux), k_descale, v_descale, 0, 0, _scale(softmax_scale, q),
                Causal.BOTTOM_RIGHT if causal else Causal.NONE, *_window(window_size), float(softcap),
                decide.LIBRARY_IMPLS[impl] if impl in decide.LIBRARY_IMPLS else _bad_impl(impl), return_softmax_lse,
            )  # fmt: skip
        except FFPAError as error:
            raise _unserved("flash_attn_with_kvcache", error) from error
    out = o.transpose(1, 2)
    return (out, lse) if return_softmax_lse else out


def _append(k_cache, v_cache, k, v, cache_seqlens, table) -> None:
    """k, v [B, S_new, Hkv, D] written into the caches at positions cache_seqlens[b] + i (device ops: no
    host synchronization, so a CUDA graph captures them)."""
    positions = cache_seqlens.to(torch.int64)[:, None] + torch.arange(k.shape[1], device=k.device)
    if table is None:
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(positions)
        k_cache[rows, positions] = k
        v_cache[rows, positions] = v
        return
    page_size = k_cache.shape[1]
    pages = table.to(torch.int64).gather(1, positions // page_size)
    k_cache[pages, positions % page_size] = k
    v_cache[pages, positions % page_size] = v


def _unserved(function: str, error: FFPAError) -> Exception:
    """A call no implementation serves (impl_unavailable: e.g. an explicit impl without a serving variant,
    an e4m3 cache on the GPU) as NotImplementedError with the library's reason, as the SDPA drop-in's
    explicit impls; other statuses (bad input) stay FFPAError."""
    if error.status_name != "impl_unavailable":
        return error
    return NotImplementedError(f"{function}: {error.message}")


def _packed(t: torch.Tensor) -> torch.Tensor:
    """[total, H, D] as the library's [1, H, total, D] (a view)."""
    return t.unsqueeze(0).transpose(1, 2)


def _paged(t: torch.Tensor) -> torch.Tensor:
    """A paged cache [num_blocks, page_size, H, D] as the library's [num_blocks, H, page_size, D] (a view)."""
    return t.transpose(1, 2)


def _refuse(function: str, **arguments) -> None:
    """NotImplementedError naming the first argument given that the library cannot serve."""
    for name, value in arguments.items():
        unserved = value != 0.0 if name == "dropout_p" else value is not None
        if unserved:
            raise NotImplementedError(f"{function}: {name} is not served by the ffpa library (got {_brief(value)})")


def _brief(value) -> str:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else repr(value)


def _check_rank(function: str, **tensors) -> None:
    for name, (t, rank) in tensors.items():
        if t.dim() != rank:
            raise ValueError(f"{function}: {name} must have {rank} dims, got shape {tuple(t.shape)}")


def _ask_library(function: str, q: torch.Tensor, v: torch.Tensor, impl: str, needs_grad: bool) -> None:
    """NotImplementedError with the library's reason where it cannot run the call on q's CUDA device
    (decide.library_refusal); host tensors are the CPU reference's, which validates them itself."""
    if q.device.type != "cuda":
        return
    dtype = str(q.dtype).removeprefix("torch.")
    reason = decide.library_refusal(q.device.index, dtype, q.shape[-1], v.shape[-1], impl, needs_grad)
    if reason is not None:
        raise NotImplementedError(f"{function}: {reason}")


def _sinks(s_aux: torch.Tensor | None) -> torch.Tensor | None:
    # The library reads f32 sinks; transformers hands FlashAttention the model's dtype.
    return None if s_aux is None else s_aux.to(torch.float32)


def _bound(max_seqlen: int | torch.Tensor) -> int:
    # A tensor bound stays on the device: 0 lets the library derive the loosest bound.
    return 0 if isinstance(max_seqlen, torch.Tensor) else int(max_seqlen)


def _scale(softmax_scale: float | None, q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)


def _window(window_size: tuple[int, int] | None) -> tuple[int, int]:
    if window_size is None:
        return -1, -1
    # FlashAttention takes any negative bound as unbounded; the library's unbounded is -1.
    left, right = (int(bound) for bound in window_size)
    return max(left, -1), max(right, -1)


def _bad_impl(impl: str):
    raise ValueError(f"impl must be one of {list(decide.LIBRARY_IMPLS)}, got {impl!r}")
