"""ffpa_attn_func and explain: SDPA's signature and semantics, served by the ffpa library where it can be.

A thin entry: a call asks decide.py once where it runs and why (decide.decide_cached on plain tensors
in eager mode, decide.decide otherwise) and runs there: on the library's op (ops.py; in eager mode its
fast launch path), or on the SDPA that was installed when this module was first imported, so that a
monkey-patched SDPA never calls itself.
"""

from __future__ import annotations

import logging
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import decide, ops  # noqa: F401  (ops registers torch.ops.ffpa_attn.forward)
from ._library import FFPAError
from .config import CUDABackend

logger = logging.getLogger("ffpa_attn")

_sdpa = torch.nn.functional.scaled_dot_product_attention
_SEED_BOUND = 2**63 - 1  # seeds travel as int64
# The eager path's names from decide, bound once (a global lookup each, as the rest of the path).
_DEFAULT_BACKEND = decide.DEFAULT_BACKEND
_decide_cached = decide.decide_cached


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
          dropout seed and offset, precision "input" or "fp8" and FP8's
          knobs); None means CUDABackend().
      return_lse: also return the log-sum-exp of the scaled, masked scores,
          fp32 [B, Hq, Nq] (-inf for a row with no attended key): (out, lse).
    With backend.impl "auto" a call runs where it is fastest and correct
    (decide.py, routing.py): on ffpa's kernels, or on PyTorch's SDPA where
    SDPA's kernels are measured faster (D <= 256) and the call asks for nothing
    only ffpa gives and is one SDPA runs (SDPA would raise for it: ffpa serves
    it), and on SDPA when the library cannot serve it: arguments it does not
    take, no library loaded, a GPU it has no kernel for or a driver too old
    (asked of the library once per device), or, in eager mode, a launch that
    fails on the device (status impl_unavailable); the reason is logged at
    DEBUG on the "ffpa_attn" logger, and explain(...) tells it without
    running. Another impl never hands the call to SDPA: it raises
    NotImplementedError with the reason where it cannot serve it. A call with
    backend.precision "fp8" under "auto" goes to SDPA (computing in the
    inputs' precision, the reason saying so) only where the library cannot
    serve it: never for speed.
    """
    if backend is None:
        backend = _DEFAULT_BACKEND
    elif not isinstance(backend, CUDABackend):
        raise TypeError(f"backend must be a CUDABackend or None, got {type(backend).__name__}")
    compiling = _is_compiling()
    # Plain tensors in eager mode: the decision is looked up by the call's metadata.
    plain = (
        not compiling
        and type(query) is _TENSOR
        and type(key) is _TENSOR
        and type(value) is _TENSOR
        and (attn_mask is None or type(attn_mask) is _TENSOR)
    )
    plan = None
    if plain:
        decision, plan = _decide_cached(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse
        )
    elif not all(isinstance(t, torch.Tensor) for t in decide.given_tensors(query, key, value, attn_mask)):
        # Not ours to judge: SDPA raises its own error for these.
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    else:
        decision = decide.decide(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse
        )
    if decision.error is not None:
        error_type, message = decision.error
        raise error_type(message)
    if decision.path == "sdpa":
        if decision.refusal is not None:
            raise NotImplementedError(decision.refusal)
        if not compiling:
            logger.debug("ffpa_attn: SDPA serves this call: %s", decision.reason)
        return _sdpa_fallback(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            backend.causal_alignment,
            return_lse,
            decision.sdpa_backends,
        )

    dropout_seed, dropout_offset = _dropout_seed_and_offset(backend, dropout_p, query, key, compiling)
    try:
        result = None
        if plan is not None and not _profiler_enabled() and not _dispatch_modes():
            # The op's body without the dispatcher, whose host time is most of a
            # small call's (docs/perf/h200-2026-11-30-dropin/): nothing needs it
            # here (plain tensors, no tracing, mode or profiler). None: inputs
            # the library reads only through copies, which the op makes.
            result = ops.launch(plan, query, key, value, attn_mask, return_lse, dropout_seed, dropout_offset)
        if result is None:
            result = torch.ops.ffpa_attn.forward(
                query,
                key,
                value,
                attn_mask,
                decision.dropout_p,
                decision.causal,
                decision.scale,
                decision.accumulation,
                decision.impl,
                _as_int64(dropout_seed),
                _as_int64(dropout_offset),
                # The backward reads the forward's lse: asked for whenever autograd records the call.
                return_lse or decision.needs_grad,
                decision.precision,
                decision.fp8_qk_format,
                decision.fp8_qk_scales,
                decision.fp8_smooth_k,
                decision.fp8_early_rows,
                decision.fp8_v_scales,
                decision.fp8_smooth_v,
            )
        out, lse = result
    except FFPAError as error:
        if error.status_name != "impl_unavailable":
            raise
        # The library declined the call or could not launch it on this device (no
        # kernel image, a driver too old, a launch without the resources it needs):
        # an explicit impl refuses, as documented; impl="auto" never breaks a model.
        if backend.impl != "auto":
            raise NotImplementedError(decide.refusal(backend, error.message)) from error
        # Eager only: under torch.compile the path is fixed while tracing (where a device the library
        # runs no kernel on already went to SDPA), and such a failure inside a compiled graph raises.
        # A dropout seed drawn for the failed call stays drawn.
        logger.debug("ffpa_attn: SDPA serves this call: %s", decision.launch_failure_reason(error.message, backend))
        return _sdpa_fallback(
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            backend.causal_alignment,
            return_lse,
            decision.sdpa_backends,
        )
    return (out, lse) if return_lse else out


def explain(
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
) -> str:
    """What ffpa_attn_func would run for these arguments, and why, in one line (runs nothing).

    Only the tensors' metadata is read (fake CUDA tensors work; "meta" tensors
    are not CUDA tensors, so they get the answer for a CPU call).
    """
    backend = _DEFAULT_BACKEND if backend is None else backend
    decision = decide.decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse)
    return decide.explanation(decision, backend)


# The number of active TorchDispatchModes and whether the profiler records (C
# calls); where this torch lacks them, "some" and "yes": the op path.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_profiler_enabled = getattr(torch.autograd, "_profiler_enabled", lambda: True)
_is_compiling = torch.compiler.is_compiling
_TENSOR = torch.Tensor


def _dropout_seed_and_offset(
    backend: CUDABackend, dropout_p: float, query: torch.Tensor, key: torch.Tensor, compiling: bool
) -> tuple[int, int]:
    """The (seed, offset) of a call's dropout keep-mask in the library's stream, SDPA's.

    An explicit backend.dropout_seed: it and backend.dropout_offset. Else, in
    eager mode on CUDA: torch's CUDA generator, read and advanced as SDPA's
    memory-efficient kernel does (docs/kernels/sdpa_dropout.md), so that after
    torch.manual_seed(s) the call keeps exactly the elements SDPA keeps and
    leaves the generator where SDPA leaves it. While tracing or capturing a
    CUDA graph: a seed drawn from torch's default CPU generator (reading the
    CUDA generator's offset there would freeze one mask into the graph).
    """
    if backend.dropout_seed is not None:
        return backend.dropout_seed, backend.dropout_offset
    if dropout_p == 0:
        return 0, 0  # no draw: a call without dropout leaves torch's RNG untouched
    if not compiling and query.is_cuda and not torch.cuda.is_current_stream_capturing():
        generator = torch.cuda.default_generators[query.get_device()]
        seed, offset = generator.initial_seed(), generator.get_offset()
        batch, heads_q, seq_q, _ = query.shape
        words = batch * heads_q * seq_q * key.shape[-2]
        generator.set_offset(offset + (words + 3) // 4 * 4)  # SDPA's advance: its words, rounded up to 4
        return seed, offset
    # Drawn here, not inside the op, so a captured or compiled op sees a plain int.
    return int(torch.randint(0, _SEED_BOUND, (), dtype=torch.int64).item()), backend.dropout_offset


def _as_int64(value: int) -> int:
    """A uint64 as the int64 with its bits (the op's integer arguments are int64;
    torch's CUDA generator seeds take all 64 bits)."""
    return value - 2**64 if value >= 2**63 else value


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
    backends: tuple[str, ...] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SDPA, given bottom-right causal alignment as a mask, plus the fp32 LSE when asked.

    backends: the SDPA backends allowed (routing.sdpa_backends: those that
    compute the call correctly), or None for SDPA's own choice.
    """
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
    if backends is None:
        out = _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    else:
        with sdpa_kernel([getattr(SDPBackend, name) for name in backends]):
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
