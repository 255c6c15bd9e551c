"""ffpa_attn_func: SDPA's signature and semantics, served by the ffpa library where it can be.

Calls the library cannot serve (see decisions.py) go to the SDPA that was
installed when this module was first imported, so a monkey-patched SDPA never
calls itself.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import _library, ops  # noqa: F401  (ops registers torch.ops.ffpa_attn.forward)
from ._library import Accumulation, Causal, FFPAError, Fp8QkFormat, Fp8QkScales, Fp8VScales, Impl, Precision
from .config import CUDABackend
from .decisions import CallSpec, Limits, fallback_reason, precision_fallback_reason
from .routing import route, sdpa_backends, widest_head_dim

logger = logging.getLogger("ffpa_attn")

_sdpa = torch.nn.functional.scaled_dot_product_attention
_DEFAULT_BACKEND = CUDABackend()
_SEED_BOUND = 2**63 - 1  # seeds travel as int64
# CUDABackend.impl -> the C ABI's: "auto" and "ffpa" both let the library pick its kernel.
_LIBRARY_IMPLS = {"auto": Impl.AUTO, "ffpa": Impl.AUTO, "sm80_split_d": Impl.SM80_SPLIT_D, "sm90_wgmma": Impl.SM90_WGMMA}


def _library_limits() -> tuple[Limits | None, str | None]:
    """The loaded library's head-dim limits, or None and why no library loads (see fallback_reason)."""
    try:
        return _library.limits(), None
    except _library.LibraryNotFoundError as error:
        return None, str(error)


# Asked once, at import, so that torch.compile never traces the library's loading.
_LIBRARY_LIMITS, _LIBRARY_MISSING = _library_limits()
# The head dims the library's Hopper family has its own instance for (empty without a library), its
# FP8 instances (each serves every D up to it) and its backward instances (each serves every D and Dv up to it).
_SM90_HEAD_DIMS = () if _LIBRARY_MISSING is not None else _library.library_info().sm90_wgmma_head_dims
_SM90_FP8_HEAD_DIMS = () if _LIBRARY_MISSING is not None else _library.library_info().sm90_fp8_head_dims
_SM90_BACKWARD_HEAD_DIMS = () if _LIBRARY_MISSING is not None else _library.library_info().sm90_backward_head_dims


def _fp8_head_dim_refusal(head_dim: int) -> str | None:
    """Why the library's FP8 kernels cannot serve head dim `head_dim` (asked of ffpa_library_info, so that
    tracing routes the call instead of failing in the graph), or None."""
    if not _SM90_FP8_HEAD_DIMS:
        return "the ffpa library was built without FP8 kernels"
    if head_dim > max(_SM90_FP8_HEAD_DIMS):
        return f"head dim {head_dim} is above {max(_SM90_FP8_HEAD_DIMS)}, the largest FP8 instance of the ffpa library"
    return None


@torch.compiler.assume_constant_result
def _device_unsupported(device_index: int, impl: str) -> str | None:
    """Why the library runs no kernel of backend.impl `impl` on CUDA device
    `device_index`, or None when it does: asked of the library (ffpa_device_support:
    no kernel image for the GPU's architecture, a driver older than the library's
    CUDA runtime), which answers once per device. torch.compile calls this while
    tracing and keeps the answer (it is fixed for the process).

    Raises FFPAError for a status other than impl_unavailable (a binding error).
    """
    error = _library.device_support(device_index, _LIBRARY_IMPLS[impl])
    if error is None:
        return None
    if error.status_name != "impl_unavailable":
        raise error
    return f"the ffpa library runs no kernel on cuda:{device_index}: {error.message}"


def _hopper_family_serves(spec, device_index: int | None) -> bool:
    """Whether the library runs its Hopper family at exactly the call's head dim on its device (routing.py's
    FFPA_FASTER_HOPPER_* rows hold only there): the build has that instance and its kernels run on the GPU."""
    head_dim = spec.q_shape[-1] if spec.q_shape else 0
    if spec.device_type != "cuda" or device_index is None or head_dim not in _SM90_HEAD_DIMS:
        return False
    return _sm90_kernels_run(device_index)


def _hopper_backward_serves(spec, device_index: int | None) -> bool:
    """Whether the library runs its Hopper backward (kernels/sm90_backward) for the call's gradients on its
    device (routing.py's training rows measured on it hold only there): the call needs grad, the build has
    an instance as wide as max(D_qk, D_v) and the family's kernels run on the GPU."""
    if not spec.needs_grad or spec.device_type != "cuda" or device_index is None or not spec.q_shape:
        return False
    width = widest_head_dim(spec)
    if not any(head_dim >= width for head_dim in _SM90_BACKWARD_HEAD_DIMS):
        return False
    return _sm90_kernels_run(device_index)


def _sm90_kernels_run(device_index: int) -> bool:
    """Whether the library runs its sm_90a kernels on CUDA device `device_index` (asked of the library)."""
    try:
        return _device_unsupported(device_index, "sm90_wgmma") is None
    except _library.FFPAError:
        return False


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
    (routing.py): on ffpa's kernels, or on PyTorch's SDPA where SDPA's kernels
    are measured faster (D <= 256) and the call asks for nothing only ffpa
    gives, and on SDPA when the library cannot serve it: arguments it does not
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
        decision, plan = _cached_decision(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse
        )
    elif not all(isinstance(t, torch.Tensor) for t in _given_tensors(query, key, value, attn_mask)):
        # Not ours to judge: SDPA raises its own error for these.
        return _sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    else:
        decision = _decision(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse)
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
                return_lse or _needs_grad(query, key, value, attn_mask),
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
            raise NotImplementedError(_refusal(backend, error.message)) from error
        return _sdpa_after_failure(
            error, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse
        )
    return (out, lse) if return_lse else out


def _sdpa_after_failure(
    error: FFPAError,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    backend: CUDABackend,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """SDPA for a call the library failed with impl_unavailable under impl="auto".

    Eager only: under torch.compile the path is fixed while tracing (where a device
    the library runs no kernel on already went to SDPA), and such a failure inside
    a compiled graph raises. A dropout seed drawn for the failed call stays drawn.
    """
    reason = precision_fallback_reason(f"the ffpa library could not run the call: {error.message}", backend.precision)
    backends, why = sdpa_backends(_call_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa))
    logger.debug("ffpa_attn: SDPA serves this call: %s", reason if why is None else f"{reason}; {why}")
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
        backends,
    )


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
    decision = _decision(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse)
    if decision.error is not None:
        return f"raises {decision.error[0].__name__}: {decision.error[1]}"
    if decision.refusal is not None:
        return f"raises NotImplementedError: {decision.refusal}"
    if decision.path == "sdpa":
        backends = "its own choice" if decision.sdpa_backends is None else ", ".join(decision.sdpa_backends)
        return f"PyTorch SDPA ({backends}): {decision.reason}"
    precision = ", precision fp8" if backend.precision == "fp8" else ""
    return f"ffpa (impl {backend.impl}{precision}): {decision.reason}"


@dataclass(frozen=True)
class _Decision:
    """Where a call goes (routing.Route's path, reason, SDPA backends) and, for ffpa, the op's enum arguments."""

    path: str
    reason: str
    sdpa_backends: tuple[str, ...] | None = None
    refusal: str | None = None  # an explicit impl that cannot serve the call: the NotImplementedError message
    error: tuple[type, str] | None = None  # invalid arguments: the exception to raise
    causal: int = 0
    accumulation: int = 0
    impl: int = 0
    scale: float = 0.0
    dropout_p: float = 0.0
    # The op's precision arguments (ops.INPUT_PRECISION's order): the C ABI's enums, smooth-K, early rows
    # (-1: default), V's scales, smooth-V.
    precision: int = 0
    fp8_qk_format: int = 0
    fp8_qk_scales: int = 0
    fp8_smooth_k: bool = True
    fp8_early_rows: int = -1
    fp8_v_scales: int = 0
    fp8_smooth_v: bool = False

    @property
    def op_options(self) -> tuple:
        """The op's options as ops.plan_for takes them."""
        return (
            self.dropout_p,
            self.causal,
            self.scale,
            self.accumulation,
            self.impl,
            self.precision,
            self.fp8_qk_format,
            self.fp8_qk_scales,
            self.fp8_smooth_k,
            self.fp8_early_rows,
            self.fp8_v_scales,
            self.fp8_smooth_v,
        )


# Decisions of recent calls by their metadata: a pure function's values, so
# that an eager call pays for a tuple and a lookup, not for CallSpec and the
# rules (decisions.py, routing.py). Bounded; cleared when full.
_DECISIONS: dict = {}
_MAX_DECISIONS = 4096


def _cached_decision(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    backend: CUDABackend,
    return_lse: bool,
) -> tuple[_Decision, object]:
    """_decision of a call on plain tensors and, for ffpa, the op's plan of its
    layout (ops.plan_for), looked up together by the call's metadata."""
    if query.is_nested or key.is_nested or value.is_nested:
        decision = _decision(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse)
        return decision, None
    cache_key = (
        query.shape, query.stride(), key.shape, key.stride(), value.shape, value.stride(),
        query.dtype, key.dtype, value.dtype, query.get_device(), key.get_device(), value.get_device(),
        None if attn_mask is None else (
            attn_mask.shape, attn_mask.stride(), attn_mask.dtype, attn_mask.get_device(), attn_mask.is_nested
        ),
        dropout_p, is_causal, scale, enable_gqa, None if backend is _DEFAULT_BACKEND else backend, return_lse,
        _grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
            or (attn_mask is not None and attn_mask.requires_grad)
        ),
    )  # fmt: skip
    entry = _DECISIONS.get(cache_key)
    if entry is None:
        decision = _decision(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse)
        plan = None
        # A call that needs gradients goes through the op (its autograd), never the plan's fast path.
        if decision.path == "ffpa" and decision.error is None and not cache_key[-1]:
            plan = ops.plan_for(query, key, value, attn_mask, return_lse, decision.op_options)
        entry = (decision, plan)
        if len(_DECISIONS) >= _MAX_DECISIONS:
            _DECISIONS.clear()
        _DECISIONS[cache_key] = entry
    return entry


def _decision(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    backend: CUDABackend,
    return_lse: bool,
) -> _Decision:
    """Where a call goes and why, from its metadata only (the rules of decisions.py and routing.py)."""
    if backend.accumulation == "f16" and query.dtype == torch.bfloat16:
        message = "backend.accumulation = 'f16' needs float16 inputs, but query.dtype is torch.bfloat16"
        return _Decision("ffpa", message, error=(ValueError, message))
    if (invalid := _invalid_sdpa_arguments(query, key, dropout_p)) is not None:
        return _Decision("ffpa", invalid, error=(RuntimeError, f"ffpa_attn_func: {invalid}"))
    spec = _call_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    reason = fallback_reason(spec, _LIBRARY_LIMITS) or _no_gradient_reason(spec, backend)
    if reason is not None:
        if backend.impl != "auto":
            return _Decision("sdpa", reason, refusal=_refusal(backend, reason))
        reason = precision_fallback_reason(reason, backend.precision)
        backends, why = sdpa_backends(spec)
        return _Decision("sdpa", reason if why is None else f"{reason}; {why}", backends)
    device_index = query.device.index
    chosen = route(
        spec,
        backend,
        return_lse,
        _hopper_family_serves(spec, device_index),
        hopper_backward=_hopper_backward_serves(spec, device_index),
    )
    if chosen.path == "sdpa":
        backends, why = sdpa_backends(spec)
        return _Decision("sdpa", chosen.reason if why is None else f"{chosen.reason}; {why}", backends)
    # The library can serve the call: whether it runs at all here (loads; has a kernel for the GPU).
    fp8 = backend.precision == "fp8"
    if _LIBRARY_MISSING is not None:
        unusable = f"no ffpa library loads: {_LIBRARY_MISSING}"
    else:
        # FP8 runs on the sm90 family only, whichever impl names it, up to its largest instance.
        unusable = _device_unsupported(query.device.index, "sm90_wgmma" if fp8 else backend.impl)
        if unusable is None and fp8:
            unusable = _fp8_head_dim_refusal(query.shape[-1])
    if unusable is not None:
        if backend.impl != "auto":
            return _Decision("sdpa", unusable, refusal=_refusal(backend, unusable))
        unusable = precision_fallback_reason(unusable, backend.precision)
        backends, why = sdpa_backends(spec)
        return _Decision("sdpa", unusable if why is None else f"{unusable}; {why}", backends)
    return _Decision(
        "ffpa",
        chosen.reason,
        causal=Causal[backend.causal_alignment.upper()] if is_causal else Causal.NONE,
        accumulation=Accumulation[backend.accumulation.upper()],
        impl=_LIBRARY_IMPLS[backend.impl],
        scale=1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale),
        dropout_p=float(dropout_p),
        **(_fp8_arguments(backend) if fp8 else {}),  # else the defaults: the library reads them with FP8 only
    )


def _no_gradient_reason(spec: CallSpec, backend: CUDABackend) -> str | None:
    """Why the library cannot give this call's gradients (it needs them), or None."""
    if not spec.needs_grad:
        return None
    if backend.precision == "fp8":
        return "an input requires grad and precision='fp8' has no backward"
    if backend.accumulation == "f16":
        return "an input requires grad and fp16 accumulation has no backward (it accumulates in fp32)"
    return None


def _fp8_arguments(backend: CUDABackend) -> dict:
    """_Decision's precision fields of a backend with precision "fp8" (the C ABI's values)."""
    return dict(
        precision=Precision.FP8,
        fp8_qk_format=Fp8QkFormat[backend.fp8_qk.upper()],
        fp8_qk_scales=Fp8QkScales[backend.fp8_qk_scales.upper()],
        fp8_smooth_k=backend.fp8_smooth_k,
        fp8_early_rows=-1 if backend.fp8_early_rows is None else backend.fp8_early_rows,
        fp8_v_scales=Fp8VScales[backend.fp8_v_scales.upper()],
        fp8_smooth_v=backend.fp8_smooth_v,
    )


def _refusal(backend: CUDABackend, reason: str) -> str:
    """The NotImplementedError message of an explicit impl that cannot serve a call."""
    precision = " with precision='fp8'" if backend.precision == "fp8" else ""
    return f"ffpa_attn: backend.impl = {backend.impl!r}{precision} cannot serve this call: {reason}"


# The number of active TorchDispatchModes and whether the profiler records (C
# calls); where this torch lacks them, "some" and "yes": the op path.
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)
_profiler_enabled = getattr(torch.autograd, "_profiler_enabled", lambda: True)
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_TENSOR = torch.Tensor


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
        needs_grad=_needs_grad(query, key, value, attn_mask),
        nested=any(t.is_nested for t in tensors),
        is_causal=is_causal,
        scale=scale,
    )


def _needs_grad(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in _given_tensors(query, key, value, attn_mask))


def _given_tensors(query: object, key: object, value: object, attn_mask: object) -> tuple:
    return (query, key, value) + (() if attn_mask is None else (attn_mask,))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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
