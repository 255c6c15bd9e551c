"""Where a call of ffpa_attn's entry points runs, and why: the package's one place that decides.

Every entry point asks here, once per call: the SDPA drop-in (functional.ffpa_attn_func and explain;
monkey_patch and a transformers AttentionInterface call the drop-in) asks decide (decide_cached on plain
tensors in eager mode); an entry point that runs on ffpa or raises, with no SDPA to fall back on (the
FlashAttention-style functions), asks library_refusal for its device, dtype and head dims (the
library's answers below). A decision reads the call's metadata only (fake tensors while
torch.compile traces) and puts together:
  - whether the library serves such a call at all: decisions.py's torch-free rules, with the library's
    own limits (ffpa_library_info);
  - what the library answers for the call's device and head dims: whether its kernels run there
    (ffpa_device_support), which Hopper instances it has (ffpa_library_info) and which backward it runs
    (ffpa_backward_route), each fixed for the process, so asked once and, while tracing, taken as
    constants (assume_constant_result);
  - where a call the library serves is faster and right, and where SDPA would raise for it: routing.py's
    torch-free measured tables and rules, and the SDPA backends that compute a call going to SDPA right.
"""

from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import torch

from . import _library, ops, serving_ops
from ._library import Accumulation, Causal, DType, Fp8QkFormat, Fp8QkScales, Fp8VScales, Impl, Precision
from .config import CUDABackend
from .decisions import SERVED_DTYPES, CallSpec, Limits, fallback_reason, head_dims_reason, precision_fallback_reason
from .routing import route, sdpa_backends

DEFAULT_BACKEND = CUDABackend()
# CUDABackend.impl -> the C ABI's: "auto" and "ffpa" both let the library pick its kernel.
LIBRARY_IMPLS = {"auto": Impl.AUTO, "ffpa": Impl.AUTO, "sm80_split_d": Impl.SM80_SPLIT_D, "sm90_wgmma": Impl.SM90_WGMMA}
# torch's dtype names (CallSpec.dtype) of the inputs the library's GPU kernels take -> the C ABI's.
_LIBRARY_DTYPES = {"float16": DType.F16, "bfloat16": DType.BF16}


def _library_limits() -> tuple[Limits | None, str | None]:
    """The loaded library's head-dim limits, or None and why no library loads (see fallback_reason)."""
    try:
        return _library.limits(), None
    except _library.LibraryNotFoundError as error:
        return None, str(error)


# Asked once, at import, so that torch.compile never traces the library's loading.
_LIBRARY_LIMITS, _LIBRARY_MISSING = _library_limits()
# The head dims the library's Hopper family has its own instance for (empty without a library) and its
# FP8 instances (each serves every D up to it).
_SM90_HEAD_DIMS = () if _LIBRARY_MISSING is not None else _library.library_info().sm90_wgmma_head_dims
_SM90_FP8_HEAD_DIMS = () if _LIBRARY_MISSING is not None else _library.library_info().sm90_fp8_head_dims


# --- the library's answers ------------------------------------------------------------------------------


@torch.compiler.assume_constant_result
def device_unsupported(device_index: int, impl: str) -> str | None:
    """Why the library runs no kernel of backend.impl `impl` on CUDA device `device_index`, or None when
    it does: asked of the library (ffpa_device_support: no kernel image for the GPU's architecture, a
    driver older than the library's CUDA runtime), which answers once per device. torch.compile calls
    this while tracing and keeps the answer (it is fixed for the process).

    Raises FFPAError for a status other than impl_unavailable (a binding error).
    """
    error = _library.device_support(device_index, LIBRARY_IMPLS[impl])
    if error is None:
        return None
    if error.status_name != "impl_unavailable":
        raise error
    return f"the ffpa library runs no kernel on cuda:{device_index}: {error.message}"


@torch.compiler.assume_constant_result
def backward_refusal(device_index: int, dtype: str, head_dim: int, value_dim: int) -> str | None:
    """Why the library runs no backward for a call of `dtype` (torch's name: "float16", "bfloat16") with
    head dims `head_dim` (q, k) and `value_dim` (v) on CUDA device `device_index`, or None when it does:
    the library's own plan answers (ffpa_backward_route, impl auto), once per arguments; fixed for the
    process, so a constant while tracing. Raises FFPAError for a status other than impl_unavailable."""
    answer = _library.backward_route(device_index, _LIBRARY_DTYPES[dtype], head_dim, value_dim)
    if isinstance(answer, Impl):
        return None
    if answer.status_name != "impl_unavailable":
        raise answer
    return f"the ffpa library runs no backward for this call on cuda:{device_index}: {answer.message}"


@torch.compiler.assume_constant_result
def hopper_backward_runs(device_index: int, dtype: str, head_dim: int, value_dim: int) -> bool:
    """Whether the backward the library runs for such a call (backward_refusal's) is its Hopper one
    (kernels/sm90_backward), where routing.py's training rows measured on it hold: ffpa_backward_route."""
    return _library.backward_route(device_index, _LIBRARY_DTYPES[dtype], head_dim, value_dim) == Impl.SM90_WGMMA


def hopper_family_serves(head_dim: int, device_index: int) -> bool:
    """Whether the library runs its Hopper family (sm90_wgmma) at exactly `head_dim` on CUDA device
    `device_index` (routing.py's FFPA_FASTER_HOPPER_* rows hold only there): the build has that instance
    (ffpa_library_info) and the family's kernels run on the GPU (ffpa_device_support)."""
    if head_dim not in _SM90_HEAD_DIMS:
        return False
    try:
        return device_unsupported(device_index, "sm90_wgmma") is None
    except _library.FFPAError:
        return False


def library_unusable(device_index: int, impl: str, precision: str = "input", head_dim: int = 0) -> str | None:
    """Why the library cannot run a forward of backend.impl `impl` on CUDA device `device_index`, or None:
    no library loads, it runs no kernel there (device_unsupported), or precision "fp8" (the sm90 family
    only, whichever impl names it) at a head dim above the build's largest FP8 instance (asked of
    ffpa_library_info, so that tracing routes such a call instead of failing in the graph)."""
    if _LIBRARY_MISSING is not None:
        return f"no ffpa library loads: {_LIBRARY_MISSING}"
    fp8 = precision == "fp8"
    unsupported = device_unsupported(device_index, "sm90_wgmma" if fp8 else impl)
    if unsupported is not None or not fp8:
        return unsupported
    if not _SM90_FP8_HEAD_DIMS:
        return "the ffpa library was built without FP8 kernels"
    if head_dim > max(_SM90_FP8_HEAD_DIMS):
        return f"head dim {head_dim} is above {max(_SM90_FP8_HEAD_DIMS)}, the largest FP8 instance of the ffpa library"
    return None


def library_refusal(
    device_index: int, dtype: str, head_dim: int, value_dim: int, impl: str = "auto", needs_grad: bool = False
) -> str | None:
    """Why the library cannot run a call of `dtype` (torch's name) with head dims `head_dim` (q, k) and
    `value_dim` (v) on CUDA device `device_index` under backend.impl `impl`, nor its backward with
    `needs_grad`, or None: what an entry point that runs on ffpa or raises (no SDPA to fall back on, e.g.
    FlashAttention-style functions) asks before it runs, its own arguments' checks aside."""
    if _LIBRARY_MISSING is not None:
        return f"no ffpa library loads: {_LIBRARY_MISSING}"
    if dtype not in SERVED_DTYPES:
        return f"dtype {dtype} is not served ({', '.join(SERVED_DTYPES)})"
    if (reason := head_dims_reason(head_dim, value_dim, _LIBRARY_LIMITS)) is not None:
        return reason
    if (reason := library_unusable(device_index, impl)) is not None or not needs_grad:
        return reason
    return backward_refusal(device_index, dtype, head_dim, value_dim)


@torch.compiler.assume_constant_result
@functools.cache
def packed_backward_refusal(window: bool, softcap: bool) -> str | None:
    """Why the library gives no gradients of a packed sequence batch (flash_attn_varlen_func) with a
    sliding window (`window`) or a logit softcap (`softcap`), or None when it does: this binding's
    ffpa_backward_params must have the sequence batch, and the library's own validation answers for
    the options (ffpa_backward_workspace_size of a one-row packed call on host memory). Fixed for the
    process: asked once per arguments, a constant while tracing."""
    if _LIBRARY_MISSING is not None:
        return f"no ffpa library loads: {_LIBRARY_MISSING}"
    if not serving_ops.BACKWARD_TAKES_SEQUENCES:
        return "the ffpa library's backward takes no sequence batch (ffpa_backward_params has no `sequences`)"
    head_dim = _LIBRARY_LIMITS.min_head_dim
    cu_seqlens = torch.tensor([0, 1], dtype=torch.int32)
    batch = serving_ops.sequence_batch(cu_seqlens, cu_seqlens, None, None, 1, 1)
    # One packed row per tensor, each its own buffer (the library refuses outputs that overlap inputs).
    rows = {name: torch.zeros((1, 1, 1, head_dim)) for name in ("q", "k", "v", "o", "d_o", "d_q", "d_k", "d_v")}
    lse = torch.zeros((1, 1, 1))
    params = _library.FfpaBackwardParams(
        **{name: serving_ops.describe(name, t) for name, t in rows.items()},
        lse=serving_ops.describe("lse", lse),
        options=serving_ops.options(1.0, Causal.BOTTOM_RIGHT, 0 if window else -1, -1, 1.0 if softcap else 0.0, 0),
    )
    params.sequences = ctypes.pointer(batch)
    try:
        _library.backward_workspace_size(params)
    except _library.FFPAError as error:
        return f"the ffpa library's backward refuses such a call: {error}"
    return None


# --- the decision ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """Where a call goes ("ffpa" or "sdpa") and why and, for ffpa, the op's enum arguments.

    sdpa_backends / sdpa_backends_why: the SDPA backends that compute the call right (names of
    torch.nn.attention.SDPBackend; None: SDPA's own choice) and why they are restricted: the call's
    on path "sdpa", and the fallback's of an ffpa call whose launch fails on the device (eager only).
    """

    path: str
    reason: str
    sdpa_backends: tuple[str, ...] | None = None
    sdpa_backends_why: str | None = None
    refusal: str | None = None  # an explicit impl that cannot serve the call: the NotImplementedError message
    error: tuple[type, str] | None = None  # invalid arguments: the exception to raise
    needs_grad: bool = False  # grad mode on and an input requires grad: the op records the call for autograd
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

    def launch_failure_reason(self, failure: str, backend: CUDABackend) -> str:
        """Why SDPA serves an ffpa call whose launch failed with impl_unavailable (`failure`: the library's
        message), with the SDPA backends' restriction."""
        reason = precision_fallback_reason(f"the ffpa library could not run the call: {failure}", backend.precision)
        return reason if self.sdpa_backends_why is None else f"{reason}; {self.sdpa_backends_why}"


def decide(
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
) -> Decision:
    """Where ffpa_attn_func runs a call and why, from its metadata only (ffpa_attn_func's arguments)."""
    if backend.accumulation == "f16" and query.dtype == torch.bfloat16:
        message = "backend.accumulation = 'f16' needs float16 inputs, but query.dtype is torch.bfloat16"
        return Decision("ffpa", message, error=(ValueError, message))
    if (invalid := _invalid_sdpa_arguments(query, key, dropout_p)) is not None:
        return Decision("ffpa", invalid, error=(RuntimeError, f"ffpa_attn_func: {invalid}"))
    spec = call_spec(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    backends, backends_why = sdpa_backends(spec)

    def to_sdpa(reason: str) -> Decision:
        """The call goes to SDPA under impl "auto"; another impl refuses it."""
        if backend.impl != "auto":
            return Decision("sdpa", reason, refusal=refusal(backend, reason))
        reason = precision_fallback_reason(reason, backend.precision)
        return Decision("sdpa", reason if backends_why is None else f"{reason}; {backends_why}", backends, backends_why)

    if (reason := fallback_reason(spec, _LIBRARY_LIMITS) or _no_gradient_reason(spec, backend)) is not None:
        return to_sdpa(reason)
    device_index = query.device.index
    head_dim, value_dim = spec.q_shape[-1], spec.v_shape[-1]
    # Training under auto trains on ffpa's backward only where one runs for the call; routing's training
    # rows measured on the Hopper backward hold where the library runs that one (both: ffpa_backward_route).
    training = spec.needs_grad and backend.impl == "auto" and _LIBRARY_MISSING is None
    no_backward = backward_refusal(device_index, spec.dtype, head_dim, value_dim) if training else None
    chosen = route(
        spec,
        backend,
        return_lse,
        hopper_family=spec.device_type == "cuda" and hopper_family_serves(head_dim, device_index),
        hopper_backward=training and no_backward is None
        and hopper_backward_runs(device_index, spec.dtype, head_dim, value_dim),
    )
    if chosen.path == "sdpa":
        reason = chosen.reason if backends_why is None else f"{chosen.reason}; {backends_why}"
        return Decision("sdpa", reason, backends, backends_why)
    # The library can serve the call: whether it runs at all here.
    unusable = library_unusable(device_index, backend.impl, backend.precision, head_dim) or no_backward
    if unusable is not None:
        return to_sdpa(unusable)
    return Decision(
        "ffpa",
        chosen.reason,
        backends,
        backends_why,
        needs_grad=spec.needs_grad,
        causal=Causal[backend.causal_alignment.upper()] if is_causal else Causal.NONE,
        accumulation=Accumulation[backend.accumulation.upper()],
        impl=LIBRARY_IMPLS[backend.impl],
        scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
        dropout_p=float(dropout_p),
        **(_fp8_arguments(backend) if backend.precision == "fp8" else {}),  # else the defaults: read with FP8 only
    )


# Decisions of recent calls by their metadata: a pure function's values, so that an eager call pays for
# a tuple and a lookup, not for CallSpec and the rules. Bounded; cleared when full.
_DECISIONS: dict = {}
_MAX_DECISIONS = 4096
_grad_enabled = torch.is_grad_enabled


def decide_cached(
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
) -> tuple[Decision, object]:
    """decide() of a call on plain tensors in eager mode and, for ffpa, the op's plan of its layout
    (ops.plan_for: None for a call that needs grad, which goes through the op's autograd), looked up
    together by the call's metadata."""
    if query.is_nested or key.is_nested or value.is_nested:
        return decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse), None
    cache_key = (
        query.shape, query.stride(), key.shape, key.stride(), value.shape, value.stride(),
        query.dtype, key.dtype, value.dtype, query.get_device(), key.get_device(), value.get_device(),
        None if attn_mask is None else (
            attn_mask.shape, attn_mask.stride(), attn_mask.dtype, attn_mask.get_device(), attn_mask.is_nested
        ),
        dropout_p, is_causal, scale, enable_gqa, None if backend is DEFAULT_BACKEND else backend, return_lse,
        _grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad
            or (attn_mask is not None and attn_mask.requires_grad)
        ),
    )  # fmt: skip
    entry = _DECISIONS.get(cache_key)
    if entry is None:
        decision = decide(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, backend, return_lse)
        plan = None
        if decision.path == "ffpa" and decision.error is None and not decision.needs_grad:
            plan = ops.plan_for(query, key, value, attn_mask, return_lse, decision.op_options)
        entry = (decision, plan)
        if len(_DECISIONS) >= _MAX_DECISIONS:
            _DECISIONS.clear()
        _DECISIONS[cache_key] = entry
    return entry


def explanation(decision: Decision, backend: CUDABackend) -> str:
    """A decision in one line: what ffpa_attn_func runs (or raises) and why (explain's text)."""
    if decision.error is not None:
        return f"raises {decision.error[0].__name__}: {decision.error[1]}"
    if decision.refusal is not None:
        return f"raises NotImplementedError: {decision.refusal}"
    if decision.path == "sdpa":
        backends = "its own choice" if decision.sdpa_backends is None else ", ".join(decision.sdpa_backends)
        return f"PyTorch SDPA ({backends}): {decision.reason}"
    precision = ", precision fp8" if backend.precision == "fp8" else ""
    return f"ffpa (impl {backend.impl}{precision}): {decision.reason}"


def refusal(backend: CUDABackend, reason: str) -> str:
    """The NotImplementedError message of an explicit impl that cannot serve a call."""
    precision = " with precision='fp8'" if backend.precision == "fp8" else ""
    return f"ffpa_attn: backend.impl = {backend.impl!r}{precision} cannot serve this call: {reason}"


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
    """Decision's precision fields of a backend with precision "fp8" (the C ABI's values)."""
    return dict(
        precision=Precision.FP8,
        fp8_qk_format=Fp8QkFormat[backend.fp8_qk.upper()],
        fp8_qk_scales=Fp8QkScales[backend.fp8_qk_scales.upper()],
        fp8_smooth_k=backend.fp8_smooth_k,
        fp8_early_rows=-1 if backend.fp8_early_rows is None else backend.fp8_early_rows,
        fp8_v_scales=Fp8VScales[backend.fp8_v_scales.upper()],
        fp8_smooth_v=backend.fp8_smooth_v,
    )


def _invalid_sdpa_arguments(query: torch.Tensor, key: torch.Tensor, dropout_p: float) -> str | None:
    """Arguments SDPA rejects, checked here instead of passed on: on CUDA, PyTorch
    2.11's SDPA fails inside cuDNN for them, and a second such call crashes the
    process. RuntimeError, the type SDPA raises, keeps callers' handlers working."""
    if query.shape[-1] != key.shape[-1]:
        return f"query and key must have the same head dim (last dim), got {query.shape[-1]} and {key.shape[-1]}"
    if not 0.0 <= dropout_p <= 1.0:
        return f"dropout_p must be in [0, 1], got {dropout_p!r}"
    return None


def call_spec(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> CallSpec:
    """The torch-free metadata of an ffpa_attn_func call, as decisions.py and routing.py read it."""
    tensors = given_tensors(query, key, value, attn_mask)
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


def given_tensors(query: object, key: object, value: object, attn_mask: object) -> tuple:
    """q, k, v and the mask where one is given."""
    return (query, key, value) + (() if attn_mask is None else (attn_mask,))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
