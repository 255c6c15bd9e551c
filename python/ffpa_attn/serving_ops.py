"""The custom ops of a serving call: one ffpa_forward over a batch of sequences (ffpa_sequence_batch).

ffpa_attn::serving_forward (functional: returns o and lse) and ffpa_attn::serving_forward_out (writes a
caller's o: vLLM's `out=`), registered with torch.library with fake implementations, so that
torch.compile traces them and CUDA graphs capture them: they run on the current CUDA stream, never
synchronize the host (the lengths and block ids stay in device memory; the library checks them there)
and take their workspace from torch's caching allocator (a graph's pool under capture). On CPU tensors
the library's CPU reference serves them.

Tensors come in the library's logical layout, [B, H, N, D] views of the callers' buffers
(flash_attn_interface.py makes them, without copies): q [1, Hq, total_q, D] packed or [B, Hq, Nq, D];
k and v [1, Hkv, total_k, D] packed, [num_blocks, Hkv, page_size, D] paged or [B, Hkv, Nkv, D]. o keeps
q's memory order ([total_q, Hq, Dv] or [B, Nq, Hq, Dv] memory), lse is f32 q.shape[:3].

The autograd formula of serving_forward runs ffpa_backward with the sequence batch (the gradients laid
out like the inputs) where the library's backward takes one; until then it raises NotImplementedError.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

from . import _library, ops
from ._library import DType

# The element types a serving call's tensors may have: ops' plus the int32 lengths and tables and an
# e4m3 KV cache.
_SERVING_DTYPES = {
    torch.float16: DType.F16,
    torch.bfloat16: DType.BF16,
    torch.float32: DType.F32,
    torch.float64: DType.F64,
    torch.int32: DType.I32,
    torch.float8_e4m3fn: DType.E4M3,
}

# Whether this binding's ffpa_backward_params has the sequence batch (include/ffpa/ffpa.h): the ctypes
# mirror gains the field when the C header does.
BACKWARD_TAKES_SEQUENCES = any(name == "sequences" for name, *_ in _library.FfpaBackwardParams._fields_)


@torch.library.custom_op(
    "ffpa_attn::serving_forward",
    mutates_args=(),
    device_types=("cpu", "cuda"),
    # o's layout follows q's strides (the fake gives the same): inputs keep theirs.
    tags=(torch.Tag.needs_exact_strides,),
)
def serving_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    k_descale: Optional[torch.Tensor],
    v_descale: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    softcap: float,
    impl: int,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """o (q's memory order, v's last dim) and lse (f32 q.shape[:3], empty unless return_lse) of one
    serving call. The sequence tensors are int32 (None: absent); sinks f32 [Hq]; k_descale / v_descale
    f32 [B, Hkv] with e4m3 k and v; max_seqlen_* 0: derived; causal and impl: the C ABI's enums;
    window_left / window_right -1: unbounded (both -1: no window); softcap 0: none. Raises FFPAError
    when the library refuses the call."""
    o = ops.new_output(q, v.shape[-1])
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    _run(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, sinks, k_descale, v_descale,
         max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap, impl)  # fmt: skip
    return o, lse if lse is not None else q.new_empty((0,), dtype=torch.float32)


@serving_forward.register_fake
def _serving_forward_fake(
    q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, sinks, k_descale, v_descale, max_seqlen_q,
    max_seqlen_k, scale, causal, window_left, window_right, softcap, impl, return_lse,
):  # fmt: skip
    lse_shape = q.shape[:3] if return_lse else (0,)
    return ops.new_output(q, v.shape[-1]), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("ffpa_attn::serving_forward_out", mutates_args=("o",), device_types=("cpu", "cuda"))
def serving_forward_out(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    block_table: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    k_descale: Optional[torch.Tensor],
    v_descale: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    softcap: float,
    impl: int,
    return_lse: bool,
) -> torch.Tensor:
    """serving_forward writing the caller's o (its logical [B, H, N, Dv] view); returns lse (empty unless
    return_lse). No autograd formula: an inference call (vLLM's out=)."""
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    _run(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, sinks, k_descale, v_descale,
         max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap, impl)  # fmt: skip
    return lse if lse is not None else q.new_empty((0,), dtype=torch.float32)


@serving_forward_out.register_fake
def _serving_forward_out_fake(
    q, k, v, o, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, sinks, k_descale, v_descale, max_seqlen_q,
    max_seqlen_k, scale, causal, window_left, window_right, softcap, impl, return_lse,
):  # fmt: skip
    return q.new_empty(q.shape[:3] if return_lse else (0,), dtype=torch.float32)


def _run(
    q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, sinks, k_descale, v_descale,
    max_seqlen_q, max_seqlen_k, scale, causal, window_left, window_right, softcap, impl,
) -> None:  # fmt: skip
    """One ffpa_forward of a serving call into o (and lse when given)."""
    q, k, v = ops.readable_by_library(q), ops.readable_by_library(k), ops.readable_by_library(v)
    batch = sequence_batch(cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k)
    params = _library.FfpaForwardParams(
        q=describe("q", q),
        k=describe("k", k),
        v=describe("v", v),
        o=describe("o", o),
        lse=describe("lse", lse) if lse is not None else _library.FfpaTensor(),
        options=options(scale, causal, window_left, window_right, softcap, impl),
        sinks=describe("sinks", sinks) if sinks is not None else _library.FfpaTensor(),
        k_descale=describe("k_descale", k_descale) if k_descale is not None else _library.FfpaTensor(),
        v_descale=describe("v_descale", v_descale) if v_descale is not None else _library.FfpaTensor(),
        sequences=ctypes.pointer(batch),
    )
    if not q.is_cuda:
        _library.forward(params)
        return
    with torch.cuda.device(q.device):
        params.stream = ops.raw_stream(q.get_device())
        # The plan's and the kernels' workspace from torch's caching allocator (a graph's pool under capture).
        workspace_bytes = _library.workspace_size(params)
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device) if workspace_bytes else None
        if workspace is not None:
            params.workspace, params.workspace_bytes = workspace.data_ptr(), workspace_bytes
        _library.forward(params)


def sequence_batch(cu_seqlens_q, cu_seqlens_k, block_table, seqused_k, max_seqlen_q, max_seqlen_k):
    """The FfpaSequenceBatch of a call's int32 tensors (None: absent)."""
    return _library.FfpaSequenceBatch(
        cu_seqlens_q=describe("cu_seqlens_q", cu_seqlens_q) if cu_seqlens_q is not None else _library.FfpaTensor(),
        cu_seqlens_k=describe("cu_seqlens_k", cu_seqlens_k) if cu_seqlens_k is not None else _library.FfpaTensor(),
        block_table=describe("block_table", block_table) if block_table is not None else _library.FfpaTensor(),
        seqused_k=describe("seqused_k", seqused_k) if seqused_k is not None else _library.FfpaTensor(),
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
    )


def options(scale: float, causal: int, window_left: int, window_right: int, softcap: float, impl: int):
    """The FfpaOptions of a serving call."""
    has_window = window_left != -1 or window_right != -1
    return _library.FfpaOptions(
        has_scale=1,
        scale=scale,
        causal=causal,
        impl=impl,
        has_window=1 if has_window else 0,
        window_left=window_left,
        window_right=window_right,
        softcap=softcap,
    )


def describe(name: str, t: torch.Tensor) -> _library.FfpaTensor:
    dtype = _SERVING_DTYPES.get(t.dtype)
    if dtype is None:
        raise TypeError(f"ffpa_attn: {name}.dtype = {t.dtype} is not one of {list(_SERVING_DTYPES)}")
    return _library.tensor(t.data_ptr(), dtype, t.shape, t.stride())


# --- the gradients -------------------------------------------------------------------------------------

# serving_forward's arguments by position.
(_Q, _K, _V, _CU_Q, _CU_K, _TABLE, _USED_K, _SINKS, _K_DESCALE, _V_DESCALE, _MAX_Q, _MAX_K, _SCALE, _CAUSAL,
 _WINDOW_LEFT, _WINDOW_RIGHT, _SOFTCAP, _IMPL, _RETURN_LSE) = range(19)  # fmt: skip


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    o, lse = output
    ctx.save_for_backward(*inputs[_Q : _V_DESCALE + 1], o, lse)
    ctx.options = inputs[_MAX_Q:]
    ctx.argument_count = len(inputs)


def _serving_backward(ctx, d_o: Optional[torch.Tensor], d_lse: Optional[torch.Tensor]) -> tuple:
    saved = ctx.saved_tensors
    q, k, v, cu_q, cu_k, table, used_k, sinks, k_descale, v_descale, o, lse = saved
    if not BACKWARD_TAKES_SEQUENCES:
        raise NotImplementedError(
            "flash_attn_varlen_func's backward: the ffpa library's backward takes no sequence batch yet "
            "(ffpa_backward_params has no `sequences` field in this build); the forward ran, its gradients cannot"
        )
    if table is not None:
        raise NotImplementedError("flash_attn_varlen_func's backward: a paged call (block_table) has no gradients")
    max_q, max_k, scale, causal, window_left, window_right, softcap, impl, return_lse = ctx.options
    if not return_lse:
        raise RuntimeError("ffpa_attn::serving_forward: autograd needs the forward's lse (call it with return_lse)")
    if d_o is None:
        d_o = torch.zeros_like(o)
    d_q, d_k, d_v, d_sinks = torch.ops.ffpa_attn.serving_backward(
        q, k, v, o, lse, d_o, d_lse, cu_q, cu_k, used_k, sinks, max_q, max_k, scale, causal, window_left,
        window_right, softcap, impl,
    )  # fmt: skip
    grads = [None] * ctx.argument_count
    grads[_Q], grads[_K], grads[_V] = d_q, d_k, d_v
    if sinks is not None:
        grads[_SINKS] = d_sinks
    return tuple(grads)


serving_forward.register_autograd(_serving_backward, setup_context=_setup_context)


@torch.library.custom_op("ffpa_attn::serving_backward", mutates_args=(), device_types=("cpu", "cuda"))
def serving_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    d_o: torch.Tensor,
    d_lse: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    seqused_k: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    scale: float,
    causal: int,
    window_left: int,
    window_right: int,
    softcap: float,
    impl: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """d_q, d_k, d_v (each in its input's memory order) and d_sinks (f32 [Hq]; [0] without sinks) of a
    packed or batched serving call: one ffpa_backward with the sequence batch. Raises FFPAError when
    the library refuses the call."""
    if not BACKWARD_TAKES_SEQUENCES:
        raise NotImplementedError("ffpa_attn::serving_backward: this ffpa build's backward takes no sequence batch")
    q, k, v, o, d_o = (ops.readable_by_library(t) for t in (q, k, v, o, d_o))
    d_q, d_k, d_v = ops.new_output(q), ops.new_output(k), ops.new_output(v)
    d_sinks = torch.empty(sinks.shape[0] if sinks is not None else 0, dtype=torch.float32, device=q.device)
    batch = sequence_batch(cu_seqlens_q, cu_seqlens_k, None, seqused_k, max_seqlen_q, max_seqlen_k)
    params = _library.FfpaBackwardParams(
        q=describe("q", q),
        k=describe("k", k),
        v=describe("v", v),
        o=describe("o", o),
        lse=describe("lse", lse),
        d_o=describe("d_o", d_o),
        d_q=describe("d_q", d_q),
        d_k=describe("d_k", d_k),
        d_v=describe("d_v", d_v),
        d_lse=describe("d_lse", d_lse) if d_lse is not None else _library.FfpaTensor(),
        options=options(scale, causal, window_left, window_right, softcap, impl),
    )
    params.sequences = ctypes.pointer(batch)  # the field the header gains (BACKWARD_TAKES_SEQUENCES)
    if sinks is not None:
        params.sinks, params.d_sinks = describe("sinks", sinks), describe("d_sinks", d_sinks)
    if not q.is_cuda:
        _library.backward(params)
        return d_q, d_k, d_v, d_sinks
    with torch.cuda.device(q.device):
        params.stream = ops.raw_stream(q.get_device())
        workspace_bytes = _library.backward_workspace_size(params)
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device) if workspace_bytes else None
        if workspace is not None:
            params.workspace, params.workspace_bytes = workspace.data_ptr(), workspace_bytes
        _library.backward(params)
    return d_q, d_k, d_v, d_sinks


@serving_backward.register_fake
def _serving_backward_fake(
    q, k, v, o, lse, d_o, d_lse, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, max_seqlen_q, max_seqlen_k, scale,
    causal, window_left, window_right, softcap, impl,
):  # fmt: skip
    d_sinks = q.new_empty(sinks.shape[0] if sinks is not None else 0, dtype=torch.float32)
    return ops.new_output(q), ops.new_output(k), ops.new_output(v), d_sinks
