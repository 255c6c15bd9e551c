"""Which calls the ffpa library serves, decided from tensor metadata and the library's limits.

Torch-free, so that CI without PyTorch can test the decisions, and cheap, since
it also runs while torch.compile traces (on fake tensors). Whatever the library
cannot serve goes to SDPA, which raises its own errors for invalid calls: a
call is served only when SDPA would accept it and the library computes the
same answer. The head-dim limits are the library's own (Limits, from
ffpa_library_info_get through _library.limits()), never restated here.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVED_DTYPES = ("float16", "bfloat16")

# The C ABI takes dropout_p and scale as float32 (round to nearest even): from
# 1 - 2**-25 on, p rounds to 1.0, and from 2**128 - 2**103 on, |scale| rounds to
# inf. Bounds rather than a float32 conversion, which torch.compile cannot trace.
DROPOUT_P_BOUND = 1 - 2**-25
SCALE_BOUND = 2**128 - 2**103


@dataclass(frozen=True)
class Limits:
    """The head dims the library's validation accepts: multiples of head_dim_multiple in [min_head_dim, max_head_dim]."""

    min_head_dim: int
    max_head_dim: int
    head_dim_multiple: int


@dataclass(frozen=True)
class CallSpec:
    """The metadata of one ffpa_attn_func call (dtype names without "torch.")."""

    device_type: str  # "cuda", "cpu", "meta", ...
    same_device: bool  # q, k, v (and the mask) on one device
    dtype: str  # q's dtype, e.g. "bfloat16"
    kv_dtypes_match: bool  # k's and v's dtypes equal q's
    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    mask_dtype: str | None
    mask_shape: tuple[int, ...] | None
    dropout_p: float
    enable_gqa: bool
    needs_grad: bool  # grad mode on and an input requires grad
    nested: bool  # an input is a nested tensor
    is_causal: bool = False
    scale: float | None = None


def fallback_reason(spec: CallSpec, limits: Limits | None) -> str | None:
    """None when the library serves the call, else why SDPA gets it (short, human).

    limits: the loaded library's (_library.limits()). None when no library loads:
    the head dim is then not judged; a call that passes the other checks goes to
    SDPA under impl="auto" (decide.py says why) and is refused otherwise.
    """
    # In this order, each only once the ones before pass (the mask check reads a 4-D q_shape).
    return _tensor_kind_reason(spec) or _shape_reason(spec, limits) or _mask_reason(spec) or _option_reason(spec)


def precision_fallback_reason(reason: str, precision: str) -> str:
    """The reason a call goes to SDPA (or an explicit impl refuses it), saying that
    precision="fp8" is not applied there: SDPA computes in the inputs' precision."""
    if precision != "fp8":
        return reason
    return f"precision='fp8' is not served (SDPA computes in the inputs' precision): {reason}"


def _tensor_kind_reason(spec: CallSpec) -> str | None:
    if spec.nested:
        return "nested tensors are not served"
    if spec.device_type != "cuda":
        return f"tensors on {spec.device_type}, not CUDA"
    if not spec.same_device:
        return "query, key, value and attn_mask are not on one device"
    if spec.dtype not in SERVED_DTYPES:
        return f"dtype {spec.dtype} is not served (float16, bfloat16)"
    if not spec.kv_dtypes_match:
        return f"key or value dtype differs from query's {spec.dtype}"
    return None


def _shape_reason(spec: CallSpec, limits: Limits | None) -> str | None:
    ranks = (len(spec.q_shape), len(spec.k_shape), len(spec.v_shape))
    if ranks != (4, 4, 4):
        return f"query, key, value ranks are {ranks}; served: 4-D [B, H, N, D]"
    (batch, heads_q, _, head_dim), (k_batch, heads_kv, seq_kv, k_dim) = spec.q_shape, spec.k_shape
    if not batch == k_batch == spec.v_shape[0]:
        return f"batch sizes differ: query {batch}, key {k_batch}, value {spec.v_shape[0]}"
    if spec.v_shape[1:3] != spec.k_shape[1:3]:
        return f"value shape {spec.v_shape} does not match key shape {spec.k_shape} in heads and length"
    if head_dim != k_dim:
        return f"head dims differ: query {head_dim}, key {k_dim}"
    if (reason := head_dims_reason(head_dim, spec.v_shape[3], limits)) is not None:
        return reason
    if seq_kv < 1:
        return "key length is 0"
    if heads_kv < 1:
        return "key has 0 heads"
    if heads_q != heads_kv and not (spec.enable_gqa and heads_q % heads_kv == 0):
        if spec.enable_gqa:
            return f"query heads {heads_q} are not a multiple of key heads {heads_kv}"
        return f"query heads {heads_q} differ from key heads {heads_kv} without enable_gqa=True"
    return None


def head_dims_reason(head_dim: int, value_dim: int, limits: Limits | None) -> str | None:
    """Why the library takes no such head dims (D of q and k, Dv of v), or None; limits None (no library
    loads): not judged. The value's may differ (D_qk != D_v, e.g. absorbed MLA's 576 / 512); each must be valid."""
    for name, dim in (("head dim", head_dim), ("value head dim", value_dim)):
        if limits is not None and not (
            limits.min_head_dim <= dim <= limits.max_head_dim and dim % limits.head_dim_multiple == 0
        ):
            return (
                f"{name} {dim} is not a multiple of {limits.head_dim_multiple}"
                f" in [{limits.min_head_dim}, {limits.max_head_dim}]"
            )
    return None


def _mask_reason(spec: CallSpec) -> str | None:
    if spec.mask_shape is None:
        return None
    if spec.is_causal:
        return "is_causal=True with attn_mask (SDPA rejects it)"
    # SDPA's rule: a bool mask, a float32 mask or a mask of the query's dtype.
    if spec.mask_dtype not in ("bool", "float32", spec.dtype):
        return f"attn_mask dtype {spec.mask_dtype} is neither bool, float32 nor the query's {spec.dtype}"
    batch, heads_q, seq_q, _ = spec.q_shape
    scores_shape = (batch, heads_q, seq_q, spec.k_shape[2])
    # SDPA's CPU backend choice reads dim -2 of the mask and raises for a 0-D or
    # 1-D one; such masks stay SDPA's, whatever it does with them on CUDA.
    if not 2 <= len(spec.mask_shape) <= 4 or not _broadcasts_to(spec.mask_shape, scores_shape):
        return f"attn_mask shape {spec.mask_shape} does not broadcast to [B, Hq, Nq, Nkv] = {list(scores_shape)}"
    return None


def _option_reason(spec: CallSpec) -> str | None:
    # The negated comparisons also catch NaN.
    if not (_is_real(spec.dropout_p) and 0 <= spec.dropout_p < DROPOUT_P_BOUND):
        return f"dropout_p = {spec.dropout_p!r} is outside [0, 1) as a float32"
    if spec.scale is not None and not (_is_real(spec.scale) and abs(spec.scale) < SCALE_BOUND):
        return f"scale = {spec.scale!r} is not a finite float32"
    return None


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Broadcasting as torch does it: trailing dims aligned, size-1 dims stretch."""
    return len(shape) <= len(target) and all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def _is_real(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
