"""An FP8 KV cache from PyTorch (docs/spec.md, "FP8 KV cache"): K and V quantized
once by the library, then FP8 attention calls that quantize only Q.

    from ffpa_attn import fp8_kv_cache
    cache = fp8_kv_cache.quantize_kv(k, v)                  # K and V in the library's FP8 format
    out = fp8_kv_cache.attention(q, cache, is_causal=True)  # precision "fp8", K and V from the cache

A minimal eager entry: no custom op (torch.compile and CUDA graphs do not trace
it), no autograd, no routing to SDPA (a call the library cannot serve raises
its FFPAError). The cache records the FP8 knobs it was made with and passes them
to every call, so they cannot differ. On CPU tensors quantize_kv runs the
library's CPU model (the same bytes as the GPU); attention needs a Hopper GPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from . import _library
from .config import CUDABackend
from .ops import describe

# ffpa_fp8_kv_cache's tensors, in its order.
_FIELDS = ("k_codes", "k_scales", "k_mean", "v_codes", "v_scales", "v_mean")
_TORCH_DTYPES = {_library.DType.U8: torch.uint8, _library.DType.F32: torch.float32}
_CAUSAL = {"none": _library.Causal.NONE, "top_left": _library.Causal.TOP_LEFT, "bottom_right": _library.Causal.BOTTOM_RIGHT}


@dataclass(frozen=True)
class Fp8KvCache:
    """K [B, Hkv, Nkv, D] and V of the same shape in the library's FP8 format (dense tensors;
    k_mean / v_mean are None without smooth-K / smooth-V), and the knobs that made it."""

    k_codes: torch.Tensor  # uint8 [B, Hkv, Nkv, round_up(D, 16)]
    k_scales: torch.Tensor  # float32 [B, Hkv, k_count]
    k_mean: torch.Tensor | None  # float32 [B, Hkv, D]
    v_codes: torch.Tensor  # uint8 [B, Hkv, D, round_up(Nkv, 16)]: V^T
    v_scales: torch.Tensor  # float32 [B, Hkv, v_count]
    v_mean: torch.Tensor | None  # float32 [B, Hkv, D]
    fp8_options: _library.FfpaFp8Options  # early_rows not set: each call's own
    kv_shape: tuple[int, int, int, int]  # [B, Hkv, Nkv, D]

    def c_struct(self) -> _library.FfpaFp8KvCache:
        """The ffpa_fp8_kv_cache over these tensors (absent means: data NULL)."""
        c = _library.FfpaFp8KvCache()
        for name in _FIELDS:
            t = getattr(self, name)
            if t is not None:
                dtype = _library.DType.U8 if t.dtype == torch.uint8 else _library.DType.F32
                setattr(c, name, _library.tensor(t.data_ptr(), dtype, t.shape, t.stride()))
        return c


def _fp8_options(backend: CUDABackend) -> _library.FfpaFp8Options:
    return _library.FfpaFp8Options(
        qk_format=_library.Fp8QkFormat[backend.fp8_qk.upper()],
        qk_scales=_library.Fp8QkScales[backend.fp8_qk_scales.upper()],
        no_smooth_k=0 if backend.fp8_smooth_k else 1,
        v_scales=_library.Fp8VScales[backend.fp8_v_scales.upper()],
        smooth_v=1 if backend.fp8_smooth_v else 0,
    )


def _stream(t: torch.Tensor) -> int | None:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def quantize_kv(k: torch.Tensor, v: torch.Tensor, backend: CUDABackend | None = None) -> Fp8KvCache:
    """k and v ([B, Hkv, Nkv, D], float16 or bfloat16, rows contiguous) quantized as the FP8
    pre-pass quantizes them, with backend's FP8 knobs (fp8_qk, fp8_qk_scales, fp8_smooth_k,
    fp8_v_scales, fp8_smooth_v; CUDABackend() by default). On the current CUDA stream for CUDA
    tensors. Raises FFPAError where the library refuses (e.g. Dv != D: impl_unavailable)."""
    backend = backend or CUDABackend(precision="fp8")
    library = _library.load_library()
    knobs = _fp8_options(backend)
    batch, heads_kv, seq_kv, head_dim = k.shape
    layout = library.fp8_kv_cache_layout(batch, heads_kv, seq_kv, head_dim, knobs)
    wanted = {"k_mean": backend.fp8_smooth_k, "v_mean": backend.fp8_smooth_v}  # absent otherwise
    tensors = {}
    for name in _FIELDS:
        c = getattr(layout, name)
        tensors[name] = (
            torch.empty(tuple(c.shape[: c.rank]), dtype=_TORCH_DTYPES[_library.DType(c.dtype)], device=k.device)
            if wanted.get(name, True)
            else None
        )
    cache = Fp8KvCache(**tensors, fp8_options=knobs, kv_shape=(batch, heads_kv, seq_kv, head_dim))
    params = _library.FfpaFp8QuantizeKvParams(
        k=describe("k", k), v=describe("v", v), cache=cache.c_struct(), fp8=knobs, stream=_stream(k)
    )
    workspace = None
    if k.is_cuda:  # the scratch from torch's allocator (its blocks are 512-byte aligned)
        workspace = torch.empty(library.fp8_quantize_kv_workspace_size(params), dtype=torch.uint8, device=k.device)
        params.workspace, params.workspace_bytes = workspace.data_ptr(), workspace.numel()
    library.fp8_quantize_kv(params)
    return cache


def attention(
    q: torch.Tensor,
    cache: Fp8KvCache,
    *,
    is_causal: bool = False,
    causal_alignment: str = "top_left",
    scale: float | None = None,
    early_rows: int = 0,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of q [B, Hq, Nq, D] over the cache's K and V with precision "fp8": the library
    quantizes only Q. early_rows > 0 computes query rows [0, early_rows) in the inputs' precision
    and then needs the k and v the cache was made from. Returns out (q's dtype, contiguous) and,
    with return_lse, the fp32 lse [B, Hq, Nq]."""
    batch, heads_kv, seq_kv, head_dim = cache.kv_shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if return_lse else None
    kv_dtype = describe("q", q).dtype

    def absent() -> _library.FfpaTensor:  # a shape only: the cache holds the values
        strides = (heads_kv * seq_kv * head_dim, seq_kv * head_dim, head_dim, 1)
        return _library.FfpaTensor(data=None, dtype=kv_dtype, rank=4, shape=cache.kv_shape, stride=strides)

    knobs = _library.FfpaFp8Options.from_buffer_copy(cache.fp8_options)
    knobs.has_early_rows, knobs.early_rows = 1, early_rows
    c_cache = cache.c_struct()
    params = _library.FfpaForwardParams(
        q=describe("q", q),
        k=describe("k", k) if k is not None else absent(),
        v=describe("v", v) if v is not None else absent(),
        o=describe("o", out),
        lse=describe("lse", lse) if lse is not None else _library.FfpaTensor(),
        options=_library.FfpaOptions(
            has_scale=0 if scale is None else 1,
            scale=0.0 if scale is None else scale,
            causal=_CAUSAL[causal_alignment] if is_causal else _library.Causal.NONE,
            impl=_library.Impl.AUTO,
            precision=_library.Precision.FP8,
            fp8=knobs,
        ),
        stream=_stream(q),
        fp8_kv_cache=ctypes.pointer(c_cache),
    )
    library = _library.load_library()
    workspace = None
    if q.is_cuda:
        workspace = torch.empty(library.workspace_size(params), dtype=torch.uint8, device=q.device)
        params.workspace, params.workspace_bytes = workspace.data_ptr(), workspace.numel()
    library.forward(params)
    return (out, lse) if return_lse else out
