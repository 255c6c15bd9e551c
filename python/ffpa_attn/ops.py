"""The custom op ffpa_attn::forward: one ffpa_forward call on torch tensors.

Registered with torch.library, with a fake implementation, so torch.compile
traces it and CUDA graphs capture it: it runs on the current CUDA stream, never
synchronizes the host, and allocates nothing but its outputs (plus a copy of an
input whose layout the library cannot read). On CPU tensors it runs the
library's CPU reference (impl auto or cpu_reference): slow, exact, for tests.
"""

import ctypes
import threading
from typing import Optional

import torch

from . import _library
from ._library import DType

_FFPA_DTYPES = {
    torch.float16: DType.F16,
    torch.bfloat16: DType.BF16,
    torch.float32: DType.F32,
    torch.float64: DType.F64,
    torch.bool: DType.BOOL,
}

# The library reads q, k, v and writes o in 16-byte vectors along D.
_VECTOR_BYTES = 16


@torch.library.custom_op(
    "ffpa_attn::forward",
    mutates_args=(),
    device_types=("cpu", "cuda"),
    # The fake implementation gives o the input's layout: inputs must keep theirs.
    tags=(torch.Tag.needs_exact_strides,),
)
def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    dropout_p: float,
    causal: int,
    scale: float,
    accumulation: int,
    impl: int,
    dropout_seed: int,
    dropout_offset: int,
    return_lse: bool,
    precision: int = 0,
    fp8_qk_format: int = 0,
    fp8_qk_scales: int = 0,
    fp8_smooth_k: bool = True,
    fp8_early_rows: int = -1,
    fp8_v_scales: int = 0,
    fp8_smooth_v: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, Hq, Nq, Dv] and lse [B, Hq, Nq] fp32 (empty unless return_lse) of the attention.

    q [B, Hq, Nq, D], k [B, Hkv, Nkv, D] and v [B, Hkv, Nkv, Dv] (any strides), mask broadcastable
    to [B, Hq, Nq, Nkv] or None; causal, accumulation, impl, precision,
    fp8_qk_format, fp8_qk_scales and fp8_v_scales are the C ABI's enum values
    (_library.Causal, Accumulation, Impl, Precision, Fp8QkFormat,
    Fp8QkScales, Fp8VScales); the fp8_* arguments are read with precision FP8
    only (fp8_early_rows -1: the library's default). Raises FFPAError when the
    library rejects the call.
    """
    options = (
        dropout_p, causal, scale, accumulation, impl,
        precision, fp8_qk_format, fp8_qk_scales, fp8_smooth_k, fp8_early_rows, fp8_v_scales, fp8_smooth_v,
    )  # fmt: skip
    o, lse = run(q, k, v, mask, return_lse, options, dropout_seed, dropout_offset)
    return o, _new_lse(q, False) if lse is None else lse


@forward.register_fake
def _forward_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    dropout_p: float,
    causal: int,
    scale: float,
    accumulation: int,
    impl: int,
    dropout_seed: int,
    dropout_offset: int,
    return_lse: bool,
    precision: int = 0,
    fp8_qk_format: int = 0,
    fp8_qk_scales: int = 0,
    fp8_smooth_k: bool = True,
    fp8_early_rows: int = -1,
    fp8_v_scales: int = 0,
    fp8_smooth_v: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    return new_output(q, v.shape[-1]), _new_lse(q, return_lse)


# The op's precision arguments for the inputs' own precision (precision, fp8_qk_format,
# fp8_qk_scales, fp8_smooth_k, fp8_early_rows, fp8_v_scales, fp8_smooth_v): the tail of
# an options tuple.
INPUT_PRECISION = (0, 0, 0, True, -1, 0, False)


def run(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    return_lse: bool,
    options: tuple,
    dropout_seed: int,
    dropout_offset: int,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The body of the op (options: its dropout_p, causal, scale, accumulation,
    impl, precision, fp8_qk_format, fp8_qk_scales, fp8_smooth_k, fp8_early_rows,
    fp8_v_scales, fp8_smooth_v; lse is None unless return_lse).

    Host time matters here (a decoder calls this once per layer and token): what
    depends only on shapes, strides, dtypes and options (the C structs, whether
    an input needs a copy, o's layout) is worked out once per combination
    (_Plan) and a call writes in its data pointers and stream.
    """
    plan = plan_for(q, k, v, mask, return_lse, options)
    result = launch(plan, q, k, v, mask, return_lse, dropout_seed, dropout_offset)
    if result is None:
        return _run_on_copies(q, k, v, mask, return_lse, options, dropout_seed, dropout_offset)
    return result


def plan_for(q, k, v, mask, return_lse: bool, options: tuple) -> "_Plan":
    """The plan of a call (options: as run's, twelve values; the dropout seed and
    offset are written per call), cached by the call's layout."""
    key = (
        q.dtype, k.dtype, v.dtype, q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(),
        None if mask is None else (mask.dtype, mask.shape, mask.stride()), return_lse, options, q.get_device(),
    )  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _Plan(q, k, v, mask, return_lse, options)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def launch(plan: "_Plan", q, k, v, mask, return_lse: bool, dropout_seed: int, dropout_offset: int):
    """One call of a planned layout: (o, lse or None), or None when the inputs need copies
    (a layout or address the library cannot read in place: run does those)."""
    q_data, k_data, v_data = q.data_ptr(), k.data_ptr(), v.data_ptr()
    if not plan.in_place or (q_data | k_data | v_data) % _VECTOR_BYTES:
        return None
    if plan.value_dim != q.shape[-1]:
        o = new_output(q, plan.value_dim)
    else:
        o = torch.empty_like(q) if plan.o_like_q else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    # Split-KV's partial rows: from torch's caching allocator (and a graph's pool
    # under capture), not the library's stream-ordered fallback, which the
    # default pool hands back to the driver at each synchronization.
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=q.device) if plan.workspace_bytes else None
    on_cuda = q.is_cuda
    device = q.get_device()
    slot = getattr(plan.threads, "slot", None)
    if slot is None:
        slot = plan.threads.slot = _Slot(plan.params)
    elif slot.busy:
        slot = _Slot(plan.params)  # re-entered on this thread (a signal handler): a slot of its own
    slot.busy = True
    try:
        words = slot.words
        words[_Q_WORD] = q_data
        words[_K_WORD] = k_data
        words[_V_WORD] = v_data
        words[_O_WORD] = o.data_ptr()
        words[_MASK_WORD] = 0 if mask is None else mask.data_ptr()  # the broadcast view shares the mask's storage
        words[_LSE_WORD] = 0 if lse is None else lse.data_ptr()
        words[_STREAM_WORD] = _RAW_STREAM(device) if on_cuda else 0
        words[_SEED_WORD] = dropout_seed & U64_MASK  # int64 through the op: a seed >= 2^63 arrives negative
        words[_OFFSET_WORD] = dropout_offset & U64_MASK
        if workspace is not None:
            words[_WORKSPACE_WORD] = workspace.data_ptr()
        if on_cuda and device != _CURRENT_DEVICE():
            with torch.cuda.device(device):
                _library.forward_prepared(slot.params_ref, slot.message)
        else:
            _library.forward_prepared(slot.params_ref, slot.message)
    finally:
        slot.busy = False
    return o, lse


class _Slot:
    """One thread's FfpaForwardParams of a plan, ready for ffpa_forward: a call writes its
    per-call words (data pointers, stream, dropout seed and offset) through the kept 64-bit
    view and passes it, instead of copying the plan's template and casting a view per call
    (together about 1.5 us of an eager call's host time). Per thread, since threads call
    at once; `busy` while a call uses it, so that a call re-entering on the same thread
    (from a signal handler) takes a fresh slot instead of overwriting it."""

    __slots__ = ("params", "params_ref", "words", "message", "busy")

    def __init__(self, template: _library.FfpaForwardParams) -> None:
        self.params = _library.FfpaForwardParams.from_buffer_copy(template)
        self.params_ref = ctypes.byref(self.params)
        self.words = memoryview(self.params).cast("B").cast("Q")
        self.message = ctypes.create_string_buffer(_library.MESSAGE_BYTES)
        self.busy = False


class _Plan:
    """What run works out once per combination of shapes, strides, dtypes and options."""

    __slots__ = ("in_place", "o_like_q", "value_dim", "params", "threads", "workspace_bytes")

    def __init__(self, q, k, v, mask, return_lse, options) -> None:
        # Inputs the library reads where they are (their addresses are checked per call).
        self.in_place = all(t.numel() == 0 or _strides_readable(t) for t in (q, k, v))
        # o in q's layout when the library can write it (new_output's rule, decided once).
        self.o_like_q = _strides_readable(torch.empty_like(q))
        self.value_dim = v.shape[-1]  # o's last dim (D_qk != D_v: not q's)
        o = new_output(q, self.value_dim)
        lse = _new_lse(q, True) if return_lse else None
        # The dropout seed and offset: written per call.
        self.params = _params_template(q, k, v, o, lse, _broadcast_mask(mask, q, k), options, 0, 0)
        # The workspace of the plan's calls (split-KV's partial rows, FP8's quantized
        # operands; q's device is part of the plan's key). A call the library refuses
        # gets its error from forward (or runs on copies: run).
        self.workspace_bytes = 0
        if q.is_cuda and self.in_place and q.numel() and k.numel():
            try:
                with torch.cuda.device(q.device):
                    self.workspace_bytes = _library.workspace_size(self.params)
            except _library.FFPAError:
                pass
        self.params.workspace_bytes = self.workspace_bytes
        self.threads = threading.local()  # each thread's _Slot


def _run_on_copies(
    q, k, v, mask, return_lse, options, dropout_seed, dropout_offset
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """run for inputs the library cannot read in place: copies of them, structs built for the call."""
    q, k, v = readable_by_library(q), readable_by_library(k), readable_by_library(v)
    o = new_output(q, v.shape[-1])
    lse = _new_lse(q, True) if return_lse else None
    params = _params_template(q, k, v, o, lse, _broadcast_mask(mask, q, k), options, dropout_seed, dropout_offset)
    if q.is_cuda:
        with torch.cuda.device(q.device):
            params.stream = _RAW_STREAM(q.get_device())
            _library.forward(params)
    else:
        _library.forward(params)
    return o, lse


def _broadcast_mask(mask: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor) -> Optional[torch.Tensor]:
    # A view with stride 0 along the broadcast dims: nothing is copied.
    return None if mask is None else mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


# Plans of recent calls (see run); a cache of pure values, bounded.
_PLANS: dict = {}
_MAX_PLANS = 1024
# Where launch writes the per-call values into an FfpaForwardParams: the data
# pointers of q, k, v, o, mask, lse (each FfpaTensor starts with its pointer),
# the stream, the workspace and the dropout seed and offset, all 64-bit and 8-byte aligned,
# as indices of 64-bit words. Offsets from ctypes, so a changed struct moves
# them too.
U64_MASK = 2**64 - 1
_PER_CALL_OFFSETS = (
    *(
        getattr(_library.FfpaForwardParams, field).offset + _library.FfpaTensor.data.offset
        for field in ("q", "k", "v", "o", "mask", "lse")
    ),
    _library.FfpaForwardParams.stream.offset,
    _library.FfpaForwardParams.workspace.offset,
    _library.FfpaForwardParams.options.offset + _library.FfpaOptions.dropout_seed.offset,
    _library.FfpaForwardParams.options.offset + _library.FfpaOptions.dropout_offset.offset,
)
if any(offset % 8 for offset in _PER_CALL_OFFSETS):
    raise ImportError("ffpa_attn: the library's per-call fields are not 64-bit aligned (a changed ffpa.h?)")
(
    _Q_WORD, _K_WORD, _V_WORD, _O_WORD, _MASK_WORD, _LSE_WORD, _STREAM_WORD, _WORKSPACE_WORD, _SEED_WORD,
    _OFFSET_WORD,
) = (offset // 8 for offset in _PER_CALL_OFFSETS)  # fmt: skip


def _params_template(q, k, v, o, lse, mask, options, dropout_seed, dropout_offset) -> _library.FfpaForwardParams:
    (
        dropout_p, causal, scale, accumulation, impl,
        precision, qk_format, qk_scales, smooth_k, early_rows, v_scales, smooth_v,
    ) = options  # fmt: skip
    return _library.FfpaForwardParams(
        q=describe("q", q),
        k=describe("k", k),
        v=describe("v", v),
        o=describe("o", o),
        lse=describe("lse", lse) if lse is not None else _library.FfpaTensor(),
        mask=describe("mask", mask) if mask is not None else _library.FfpaTensor(),
        options=_library.FfpaOptions(
            has_scale=1,
            scale=scale,
            causal=causal,
            dropout_p=dropout_p,
            dropout_seed=dropout_seed,
            dropout_offset=dropout_offset,
            accumulation=accumulation,
            impl=impl,
            precision=precision,
            fp8=_library.FfpaFp8Options(
                qk_format=qk_format,
                qk_scales=qk_scales,
                no_smooth_k=0 if smooth_k else 1,
                # -1: the library's default; any other value reaches its validation.
                has_early_rows=0 if early_rows == -1 else 1,
                early_rows=0 if early_rows == -1 else early_rows,
                v_scales=v_scales,
                smooth_v=1 if smooth_v else 0,
            ),
        ),
    )


def _raw_stream(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


# The current stream's cudaStream_t and the current device: torch's C
# accessors (what torch.compile's generated code calls), an order of magnitude
# cheaper than torch.cuda.current_stream() and torch.cuda.current_device();
# the public calls where this torch lacks them.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", _raw_stream)
raw_stream = _RAW_STREAM  # for gradients.py
_CURRENT_DEVICE = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def new_output(q: torch.Tensor, value_dim: Optional[int] = None) -> torch.Tensor:
    """o [B, H, N, Dv] (Dv: value_dim, default q's D) in q's layout (a [B, N, H, D] view in, [B, N, H, Dv]
    memory out) when the library can write it."""
    if value_dim is None or value_dim == q.shape[-1]:
        o = torch.empty_like(q)
        return o if _strides_readable(o) else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    # q's first three dims outermost first (by stride), Dv innermost, then viewed as [B, H, N, Dv].
    order = sorted(range(3), key=lambda d: q.stride(d), reverse=True)
    memory = torch.empty([q.shape[d] for d in order] + [value_dim], dtype=q.dtype, device=q.device)
    o = memory.permute(*[order.index(d) for d in range(3)], 3)
    return o if _strides_readable(o) else torch.empty((*q.shape[:3], value_dim), dtype=q.dtype, device=q.device)


def _new_lse(q: torch.Tensor, return_lse: bool) -> torch.Tensor:
    shape = q.shape[:3] if return_lse else (0,)
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def _strides_readable(t: torch.Tensor) -> bool:
    """Last dim contiguous, other strides whole 16-byte vectors (size-1 dims are never stepped)."""
    elements = _VECTOR_BYTES // t.element_size()
    return t.stride(-1) == 1 and all(
        size == 1 or stride % elements == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1])
    )


def readable_by_library(t: torch.Tensor) -> torch.Tensor:
    if t.numel() == 0 or (_strides_readable(t) and t.data_ptr() % _VECTOR_BYTES == 0):
        return t
    # clone, not contiguous(): a contiguous tensor at a misaligned address needs a copy too.
    return t.clone(memory_format=torch.contiguous_format)


def describe(name: str, t: torch.Tensor) -> _library.FfpaTensor:
    dtype = _FFPA_DTYPES.get(t.dtype)
    if dtype is None:
        raise TypeError(f"ffpa_attn::forward: {name}.dtype = {t.dtype} is not one of {list(_FFPA_DTYPES)}")
    return _library.tensor(t.data_ptr(), dtype, t.shape, t.stride())


# ffpa_attn::backward and forward's autograd formula (they use the helpers above).
from . import gradients  # noqa: E402,F401
