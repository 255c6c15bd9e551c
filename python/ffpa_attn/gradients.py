"""The gradients of ffpa_attn::forward: the custom op ffpa_attn::backward (one ffpa_backward call on torch
tensors) and forward's autograd formula, registered with torch.library.

Autograd saves only the forward's inputs, o and lse (no [Nq, Nkv] tensor); the backward redraws the
forward's dropout keep mask from the same (seed, offset), which are op arguments, so a recomputed forward
(activation checkpointing) and its backward agree. On CPU tensors the library's CPU reference computes the
gradients (f64 inside; f32 and f64 tensors too, for torch.autograd.gradcheck); on CUDA tensors the
library's GPU backward (kernels/sm90_backward on Hopper up to D 512, else kernels/sm80_backward), with
the forward's impl. Under impl "auto" the drop-in trains on ffpa where routing.py measured it faster.
"""

from typing import Optional

import torch

from . import _library, ops
from ._library import Precision

_EMPTY = (0,)


@torch.library.custom_op("ffpa_attn::backward", mutates_args=(), device_types=("cpu", "cuda"))
def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: Optional[torch.Tensor],
    o: torch.Tensor,
    lse: torch.Tensor,
    d_o: torch.Tensor,
    d_lse: Optional[torch.Tensor],
    mask_grad: bool,
    dropout_p: float,
    causal: int,
    scale: float,
    accumulation: int,
    impl: int,
    dropout_seed: int,
    dropout_offset: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """d_q, d_k, d_v and d_mask (empty unless mask_grad) of sum(o * d_o) + sum(lse * d_lse).

    The forward call is q, k, v, mask [4-D, broadcastable to [B, Hq, Nq, Nkv]] with the options given
    (the C ABI's enum values, as ffpa_attn::forward takes them), o and lse [B, Hq, Nq] fp32 its outputs.
    d_mask has the mask's shape (summed over the dims where it has size 1). Raises FFPAError when the
    library refuses the call.
    """
    q, k, v, o, d_o = (ops.readable_by_library(t) for t in (q, k, v, o, d_o))
    d_q, d_k, d_v = ops.new_output(q), ops.new_output(k), ops.new_output(v)
    d_mask = torch.empty(mask.shape, dtype=mask.dtype, device=mask.device) if mask_grad else None
    params = _library.FfpaBackwardParams(
        q=ops.describe("q", q),
        k=ops.describe("k", k),
        v=ops.describe("v", v),
        o=ops.describe("o", o),
        lse=ops.describe("lse", lse),
        mask=ops.describe("mask", mask) if mask is not None else _library.FfpaTensor(),
        d_o=ops.describe("d_o", d_o),
        d_q=ops.describe("d_q", d_q),
        d_k=ops.describe("d_k", d_k),
        d_v=ops.describe("d_v", d_v),
        d_mask=ops.describe("d_mask", d_mask) if d_mask is not None else _library.FfpaTensor(),
        d_lse=ops.describe("d_lse", d_lse) if d_lse is not None else _library.FfpaTensor(),
        options=_library.FfpaOptions(
            has_scale=1,
            scale=scale,
            causal=causal,
            dropout_p=dropout_p,
            dropout_seed=dropout_seed & ops.U64_MASK,
            dropout_offset=dropout_offset & ops.U64_MASK,
            accumulation=accumulation,
            impl=impl,
        ),
    )
    if q.is_cuda:
        with torch.cuda.device(q.device):
            params.stream = ops.raw_stream(q.get_device())
            # The kernels' workspace (delta) from torch's caching allocator (a graph's pool under capture).
            workspace_bytes = _library.backward_workspace_size(params)
            workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device) if workspace_bytes else None
            if workspace is not None:
                params.workspace, params.workspace_bytes = workspace.data_ptr(), workspace_bytes
            _library.backward(params)
    else:
        _library.backward(params)
    return d_q, d_k, d_v, d_mask if d_mask is not None else q.new_empty(_EMPTY)


@backward.register_fake
def _backward_fake(
    q, k, v, mask, o, lse, d_o, d_lse, mask_grad, dropout_p, causal, scale, accumulation, impl, dropout_seed,
    dropout_offset,
):  # fmt: skip
    d_mask = mask.new_empty(mask.shape) if mask_grad else q.new_empty(_EMPTY)
    return ops.new_output(q), ops.new_output(k), ops.new_output(v), d_mask


# ffpa_attn::forward's arguments, by position (its signature in ops.py).
(_Q, _K, _V, _MASK, _DROPOUT_P, _CAUSAL, _SCALE, _ACCUMULATION, _IMPL, _SEED, _OFFSET, _RETURN_LSE,
 _PRECISION) = range(13)  # fmt: skip


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    o, lse = output
    ctx.save_for_backward(inputs[_Q], inputs[_K], inputs[_V], inputs[_MASK], o, lse)
    ctx.forward_arguments = inputs[_DROPOUT_P : _PRECISION + 1] if len(inputs) > _PRECISION else (
        *inputs[_DROPOUT_P:], Precision.INPUT
    )
    ctx.argument_count = len(inputs)


def _forward_backward(ctx, d_o: Optional[torch.Tensor], d_lse: Optional[torch.Tensor]) -> tuple:
    q, k, v, mask, o, lse = ctx.saved_tensors
    dropout_p, causal, scale, accumulation, impl, seed, offset, return_lse, precision = ctx.forward_arguments
    if precision != Precision.INPUT:
        raise NotImplementedError(
            "ffpa_attn::forward with precision FP8 has no gradient: the backward runs in the inputs' precision; "
            "call it with precision 0 (the inputs') to train"
        )
    if not return_lse:
        # The backward needs the forward's lse; a caller that did not ask for it pays a second forward.
        _, lse = torch.ops.ffpa_attn.forward(
            q, k, v, mask, dropout_p, causal, scale, accumulation, impl, seed, offset, True
        )
        d_lse = None
    if d_o is None:
        d_o = torch.zeros_like(o)
    mask_grad = mask is not None and ctx.needs_input_grad[_MASK]
    # The library takes a 4-D mask: leading size-1 dims added (a view), d_mask in that shape, then the mask's.
    mask_4d = None if mask is None else mask[(None,) * (4 - mask.dim())]
    d_q, d_k, d_v, d_mask = torch.ops.ffpa_attn.backward(
        q, k, v, mask_4d, o, lse, d_o, d_lse, mask_grad, dropout_p, causal, scale, accumulation, impl, seed, offset
    )
    grads = [None] * ctx.argument_count
    grads[_Q], grads[_K], grads[_V] = d_q, d_k, d_v
    if mask_grad:
        grads[_MASK] = d_mask.view(mask.shape)
    return tuple(grads)


ops.forward.register_autograd(_forward_backward, setup_context=_setup_context)
