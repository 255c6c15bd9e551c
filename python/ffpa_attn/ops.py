"""The custom op ffpa_attn::forward: one ffpa_forward call on torch tensors.

Registered with torch.library, with a fake implementation, so torch.compile
traces it and CUDA graphs capture it: it runs on the current CUDA stream, never
synchronizes the host, and allocates nothing but its outputs (plus a copy of an
input whose layout the library cannot read). On CPU tensors it runs the
library's CPU reference (impl auto or cpu_reference): slow, exact, for tests.
"""

from typing import Optional

import torch

from . import _library
from ._library import DType

_FFPA_DTYPES = {torch.float16: DType.F16, torch.bfloat16: DType.BF16, torch.float32: DType.F32, torch.bool: DType.BOOL}

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
) -> tuple[torch.Tensor, torch.Tensor]:
    """o [B, Hq, Nq, D] and lse [B, Hq, Nq] fp32 (empty unless return_lse) of the attention.

    q [B, Hq, Nq, D], k and v [B, Hkv, Nkv, D] (any strides), mask broadcastable
    to [B, Hq, Nq, Nkv] or None; causal, accumulation and impl are the C ABI's
    enum values (_library.Causal, Accumulation, Impl). Raises FFPAError when
    the library rejects the call.
    """
    o = _new_output(q)
    lse = _new_lse(q, return_lse)
    q, k, v = (_readable_by_library(t) for t in (q, k, v))
    params = _library.FfpaForwardParams(
        q=_describe("q", q),
        k=_describe("k", k),
        v=_describe("v", v),
        o=_describe("o", o),
        lse=_describe("lse", lse) if return_lse else _library.FfpaTensor(),
        options=_library.FfpaOptions(
            has_scale=1,
            scale=scale,
            causal=causal,
            dropout_p=dropout_p,
            dropout_seed=dropout_seed,
            dropout_offset=dropout_offset,
            accumulation=accumulation,
            impl=impl,
        ),
    )
    if mask is not None:
        # A view with stride 0 along the broadcast dims: nothing is copied.
        params.mask = _describe("mask", mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]))
    if q.device.type == "cuda":
        with torch.cuda.device(q.device):
            params.stream = torch.cuda.current_stream(q.device).cuda_stream
            _library.forward(params)
    else:
        _library.forward(params)
    return o, lse


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
) -> tuple[torch.Tensor, torch.Tensor]:
    return _new_output(q), _new_lse(q, return_lse)


def _new_output(q: torch.Tensor) -> torch.Tensor:
    """o in q's layout (a [B, N, H, D] view in, [B, N, H, D] memory out) when the library can write it."""
    o = torch.empty_like(q)
    return o if _strides_readable(o) else torch.empty(q.shape, dtype=q.dtype, device=q.device)


def _new_lse(q: torch.Tensor, return_lse: bool) -> torch.Tensor:
    shape = q.shape[:3] if return_lse else (0,)
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def _strides_readable(t: torch.Tensor) -> bool:
    """Last dim contiguous, other strides whole 16-byte vectors (size-1 dims are never stepped)."""
    elements = _VECTOR_BYTES // t.element_size()
    return t.stride(-1) == 1 and all(
        size == 1 or stride % elements == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1])
    )


def _readable_by_library(t: torch.Tensor) -> torch.Tensor:
    if t.numel() == 0 or (_strides_readable(t) and t.data_ptr() % _VECTOR_BYTES == 0):
        return t
    # clone, not contiguous(): a contiguous tensor at a misaligned address needs a copy too.
    return t.clone(memory_format=torch.contiguous_format)


def _describe(name: str, t: torch.Tensor) -> _library.FfpaTensor:
    dtype = _FFPA_DTYPES.get(t.dtype)
    if dtype is None:
        raise TypeError(f"ffpa_attn::forward: {name}.dtype = {t.dtype} is not one of {list(_FFPA_DTYPES)}")
    return _library.tensor(t.data_ptr(), dtype, t.shape, t.stride())
