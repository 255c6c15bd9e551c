"""Which path runs a call the library can serve, for impl="auto": ffpa's kernel or PyTorch's SDPA.

The drop-in promises a model that is never slower and never different. So a
call goes to SDPA where SDPA's own kernels are measured faster (the table
below), unless the call asks for something only ffpa gives, or SDPA is known
to compute it wrongly or to raise for it (then it stays on ffpa). Calls that
go to SDPA for any reason (also those the library cannot serve, decisions.py)
get the SDPA backends that compute them correctly (sdpa_backends). decide.py
puts these rules together with the library's answers.

Torch-free and cheap (no timing at run time): a decision reads the call's
metadata and the constant tables here. The D <= 256 split holds on every GPU
the library has kernels for; the rows where ffpa's Hopper family beats SDPA
below it apply only where the caller has asked the library that the family
runs at the call's head dim (route's hopper_family), and the training rows
measured on the Hopper backward only where the caller has asked it that the
backward runs for the call (route's hopper_backward).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import CUDABackend
from .decisions import CallSpec

# --- where SDPA's own kernels are faster (measured) ---------------------------------------
#
# NVIDIA H200 (sm_90), torch 2.11 (cuDNN 9.19), bf16, B=1, H=32, 2026-11-30
# (issue 16; docs/perf/h200-2026-11-30-dropin/): for D <= 256 SDPA runs cuDNN or
# FlashAttention-2, 1.7-3.3x faster than ffpa's kernels at every N, causal or
# not; for D > 256 SDPA has only its memory-efficient and math kernels, which
# ffpa's beat 3-4x. Off Hopper the same split holds by construction: SDPA's
# flash kernels serve D <= 256 from sm_80 on (ffpa's kernels need sm_80 too),
# and nothing in SDPA serves D > 256 but the memory-efficient and math kernels.
SDPA_FASTER_MAX_HEAD_DIM = 256

# Except where ffpa's Hopper family (sm90_wgmma) is measured faster at D <= 256.
# H200, torch 2.11, bf16, B = 1, H = 32 (docs/perf/h200-2026-12-01d/dropin_sweep.md,
# its ffpa column: the library's own plan), D = 256 against SDPA's own dispatch:
#   a boolean mask, Nq = Nkv: key padding [B,1,1,N] 1.65x (N 128), 1.20x (512), 0.99x (2048),
#     1.07x (8192); causal key padding [B,1,N,N] 1.81x, 1.30x, 1.29x, 1.41x
#   decode (Nq = 1) over B x Hq <= 32 rows (split-KV): 1.12-1.55x, Nkv 512-32768,
#     MHA and GQA 4
# Only where the library runs that family at exactly such a head dim (a Hopper GPU,
# a build with the instance: padded to a larger one it was not measured), which the
# caller asks of the library (route's hopper_family); no dropout (not measured).
FFPA_FASTER_HOPPER_HEAD_DIMS = (256,)
FFPA_FASTER_HOPPER_DECODE_MAX_ROWS = 32

# MHA decode over many rows: Nq = 1, one query head per KV head, B x Hq >= 128
# rows (ffpa's tiles then fill an H200 unsplit, each holding one real row of
# its 64, and there is no GQA group to pack). SDPA's memory-efficient kernel
# is faster there up to a key count that depends on D: (largest D, largest
# Nkv SDPA wins at), in increasing D. H200, torch 2.11, bf16, B = 8, Hq = 32,
# Nkv 512 to 8192 (docs/perf/h200-2026-12-01d/dropin_decode.md):
#   D = 320: ffpa at every Nkv (1.04x at 512 to 1.19x at 8192)
#   D = 512: SDPA 1.01x at 512; ffpa 1.04-1.05x from 1024
#   D = 640 and 1024 (two-CTA clusters): SDPA at every Nkv measured, 1.17-1.45x
#   (640) and 1.03-1.25x (1024)
# D = 384 and 448 (one-CTA tiles, unmeasured) go with 320 and 512's edge.
SDPA_FASTER_MHA_DECODE = ((448, 0), (512, 512), (1024, 8192))
SDPA_FASTER_DECODE_MIN_ROWS = 128

# Training calls (an input requires grad: ffpa's forward, then its backward) against SDPA's forward and
# backward (its memory-efficient kernels above D = 256), forward + backward of one call. H200, torch 2.11,
# bf16, B = 1 (bench/routing_sweep.py), SDPA ms / ffpa ms:
#   D 128 and 256 (H 32), N 1024-8192: 0.18-0.68x (SDPA's flash / cuDNN)
#   D_qk 192 / D_v 128: SDPA 3-3.5x faster (flash / cuDNN at D <= 256)
# Where the library runs its Hopper backward for the call (kernels/sm90_backward: an sm_90 GPU, a build
# with an instance as wide as the call; route's hopper_backward), N 1024-8192, causal or not
# (docs/perf/h200-2026-12-01g/routing_train.md, h200-2026-12-01h/routing_train_large.md):
#   D 320-512 (H 32): 1.87-6.36x; D 640 (H 32): 2.81-4.13x; D 768 (H 16): 3.37-5.71x
#   D 1024 (H 16): 4.10-5.53x (key padding 3.95-4.69x, dropout 0.1 2.78-3.82x)
#   D_qk 576 / D_v 512, Hq 32, one KV head, causal: N 1024 1.45x, N 4096 4.71x
# Elsewhere the portable backward (kernels/sm80_backward; docs/perf/h200-2026-12-01f/routing_sweep.md,
# h200-2026-12-01g/routing_train.md):
#   D 320-512 (H 32): 1.28-1.72x; D 640-768 (H 32, 16 at 768): 1.03-1.71x
#   D 1024 (H 16): N 1024 1.29-1.62x, N 2048 1.11-1.43x (key padding 1.09x,
#     dropout 1.02-1.28x); N 4096 0.97x (causal 1.16x); N 8192 0.81-0.99x
#   D_qk 576 / D_v 512 as above: N 4096 1.81x, N 1024 0.63x (each dK/dV CTA owns
#     a block of keys of one KV head: 1024 keys in all leave most SMs idle)
# The larger of D_qk and D_v decides (the backward's work follows both).
# The Hopper backward: ffpa trains every D above 256 with at least this many keys, B x Hkv x Nkv (the
# fewest measured: MLA at N 1024; fewer are unmeasured and stay on SDPA).
FFPA_TRAINS_MIN_KEYS_HOPPER = 1024
# The portable backward: ffpa trains D up to 768 at any length, D above it up to N 2048, each with at
# least FFPA_TRAINS_MIN_KEYS keys.
FFPA_TRAINS_MAX_HEAD_DIM_ANY_LENGTH = 768
FFPA_TRAINS_LARGE_HEAD_DIM_MAX_SEQ = 2048  # D above 768: ffpa trains when Nq and Nkv are at most this
FFPA_TRAINS_MIN_KEYS = 4096  # B x Hkv x Nkv: fewer keys and SDPA trains (MLA at N 1024: 0.63x)

# --- where SDPA's default dispatch computes a wrong result (measured) --------------------
#
# cuDNN (SDPA's first choice for D <= 256 on Hopper) is not told an fp32
# additive mask's dtype and returns NaN or garbage for fp16/bf16 q, k, v, with
# and without grad (PyTorch PR #191612; H200, torch 2.11, cuDNN 9.19). The
# memory-efficient kernel refuses an fp32 mask; the math kernel is right.
CUDNN_FP32_MASK_MAX_HEAD_DIM = 256
# cuDNN's backward returns NaN dQ when a sequence length % 128 == 64 with a
# mask (PyTorch issue #196678, H100/H200); the memory-efficient kernel is right.
CUDNN_MASKED_BACKWARD_BAD_REMAINDER = (128, 64)


# --- where SDPA raises for a call it accepts as valid (PyTorch 2.11, CUDA) -----------------
#
# SDPA's argument checks take an attn_mask of dtype bool, float32 or the query's (validate_sdpa_input,
# aten/src/ATen/native/transformers/attention.cpp), and its choice of kernel on CUDA reads the mask's
# dtype nowhere (select_sdp_backend and the can_use_*_attention filters,
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp). Flash takes no mask (check_for_attn_mask) and
# cuDNN no head dim above 256 (check_cudnn_tensor_shapes; 128 off sm_90 / sm_100), so a float32 mask
# with fp16/bf16 q, k, v at D > 256 reaches the memory-efficient kernel, whose forward raises "invalid
# dtype for bias - should match query's dtype" (_efficient_attention_forward,
# aten/src/ATen/native/transformers/cuda/attention.cu), with or without grad: an unpatched SDPA call
# raises it (issue 31's bf16 q [2,1,1,1024], k/v [2,1,5,1024] training call; H200, torch 2.11). SDPA's
# math kernel gets such a call only where the memory-efficient one declines it for its layout (a q, k
# or v storage offset not 16-byte aligned, a last dim not contiguous) or is disabled, and computes it
# far slower than ffpa at these head dims (the tables here measure SDPA's memory-efficient kernel).
# Such calls go to ffpa: sdpa_refusal_reason. At D <= 256 these masks reach cuDNN, which computes them
# wrongly (sdpa_wrong_reason), or the memory-efficient kernel where cuDNN does not take the call; a
# call of them that goes to SDPA gets its math kernel (sdpa_backends), so SDPA raises for none of them.


@dataclass(frozen=True)
class Route:
    """Where a call runs ("ffpa" or "sdpa") and why, in a few words.

    sdpa_backends: for path "sdpa", the SDPA backends to allow (names of
    torch.nn.attention.SDPBackend), or None for SDPA's own choice.
    """

    path: str
    reason: str
    sdpa_backends: tuple[str, ...] | None = None


def only_ffpa_reason(spec: CallSpec, backend: CUDABackend, return_lse: bool) -> str | None:
    """What the call asks for that only ffpa gives, or None."""
    if backend.precision == "fp8":
        return "precision='fp8' (SDPA has no FP8 attention)"
    if backend.impl != "auto":
        return f"backend.impl = {backend.impl!r} asks for ffpa"
    if return_lse:
        return "return_lse=True (SDPA's public call returns no LSE)"
    if backend.accumulation == "f16":
        return "fp16 accumulation (SDPA has none)"
    if spec.is_causal and backend.causal_alignment == "bottom_right" and spec.q_shape[2] != spec.k_shape[2]:
        return "bottom-right causal alignment with Nq != Nkv (SDPA's is_causal is top-left)"
    if spec.dropout_p > 0 and backend.dropout_seed is not None:
        return "an explicit dropout seed (ffpa's Philox stream)"
    return None


def _cudnn_bugs_apply(spec: CallSpec) -> bool:
    """A masked fp16/bf16 CUDA call SDPA may give cuDNN (D <= 256): where cuDNN's two known bugs live."""
    head_dim = spec.q_shape[-1] if spec.q_shape else 0
    return (
        spec.device_type == "cuda"
        and spec.mask_dtype is not None
        and spec.dtype in ("float16", "bfloat16")
        and head_dim <= CUDNN_FP32_MASK_MAX_HEAD_DIM
    )


def _fp32_mask_on_half_cuda(spec: CallSpec) -> bool:
    """An fp32 additive mask with fp16/bf16 CUDA inputs: at D <= 256 cuDNN's bug (_cudnn_bugs_apply), above
    it SDPA's refusal (sdpa_refusal_reason)."""
    return spec.device_type == "cuda" and spec.mask_dtype == "float32" and spec.dtype in ("float16", "bfloat16")


def sdpa_wrong_reason(spec: CallSpec) -> str | None:
    """Why SDPA's default dispatch would compute this call wrongly, or None."""
    if _cudnn_bugs_apply(spec) and spec.mask_dtype == "float32":
        return "an fp32 additive mask with fp16/bf16 inputs: SDPA's cuDNN kernel returns NaN or garbage (PyTorch PR #191612)"
    return None


def sdpa_refusal_reason(spec: CallSpec) -> str | None:
    """Why PyTorch's SDPA would raise for this call, which it takes as valid (the rule above), or None."""
    if _fp32_mask_on_half_cuda(spec) and not _cudnn_bugs_apply(spec):
        return (
            f"an fp32 additive mask with {spec.dtype} inputs at D = {spec.q_shape[-1]} > "
            f"{CUDNN_FP32_MASK_MAX_HEAD_DIM}: SDPA's memory-efficient kernel raises for it "
            "(\"invalid dtype for bias\", PyTorch 2.11)"
        )
    return None


def route(
    spec: CallSpec, backend: CUDABackend, return_lse: bool, hopper_family: bool = False, hopper_backward: bool = False
) -> Route:
    """The path of a call the library can serve (decisions.fallback_reason(spec) is None): ffpa where SDPA
    would raise for it (sdpa_refusal_reason), whatever the tables say, else as the tables and rules say.

    hopper_family: the library runs its Hopper family (sm90_wgmma) at exactly the call's
    head dim on the call's device (asked of the library by the caller: decide.py).
    hopper_backward: the library's backward for the call's head dims on the call's device is
    its Hopper one (sm90_backward; asked of the library by the caller: decide.py).
    """
    if (reason := sdpa_refusal_reason(spec)) is not None:
        return Route("ffpa", reason)
    if (
        spec.needs_grad
        and backend.impl == "auto"
        and (reason := training_sdpa_reason(spec, hopper_backward)) is not None
    ):
        return Route("sdpa", reason)
    if (reason := only_ffpa_reason(spec, backend, return_lse)) is not None:
        return Route("ffpa", reason)
    if (reason := sdpa_wrong_reason(spec)) is not None:
        return Route("ffpa", reason)
    head_dim = widest_head_dim(spec)
    if hopper_family and (reason := _hopper_faster_reason(spec)) is not None:
        return Route("ffpa", reason)
    if head_dim <= SDPA_FASTER_MAX_HEAD_DIM:
        return Route(
            "sdpa", f"D = {head_dim} <= {SDPA_FASTER_MAX_HEAD_DIM}: SDPA's cuDNN/flash kernels are faster (measured)"
        )
    if (max_seq_kv := _mha_decode_sdpa_max_seq_kv(spec)) is not None:
        return Route(
            "sdpa",
            f"MHA decode of B x Hq >= {SDPA_FASTER_DECODE_MIN_ROWS} rows at D = {head_dim}, Nkv <= {max_seq_kv}: "
            "SDPA's memory-efficient kernel is faster (measured)",
        )
    return Route("ffpa", f"D = {head_dim}: ffpa's kernels are faster than SDPA's (measured)")


def widest_head_dim(spec: CallSpec) -> int:
    """The larger of D_qk and D_v: with D_qk != D_v the routing rules read it (measured: D_qk 576 / D_v 512
    5.6-11.6x faster on ffpa's portable kernels, D_qk 192 / D_v 128 2.3-3x faster on SDPA's, H200,
    docs/perf/h200-2026-12-01f/routing_sweep.md)."""
    return max(spec.q_shape[-1], spec.v_shape[-1]) if spec.v_shape else spec.q_shape[-1]


def training_sdpa_reason(spec: CallSpec, hopper_backward: bool = False) -> str | None:
    """Why SDPA trains a call that needs grad under impl="auto" (the table above), or None: ffpa trains it.

    hopper_backward: the library runs its Hopper backward for the call (route's); else the portable
    backward's measurements apply. (Calls whose options have no backward, FP8 and fp16 accumulation, never
    get here: decide.py's _no_gradient_reason sends them to SDPA first.)"""
    head_dim = widest_head_dim(spec)
    if head_dim <= SDPA_FASTER_MAX_HEAD_DIM:
        return f"training at D = {head_dim} <= {SDPA_FASTER_MAX_HEAD_DIM}: SDPA's backward is faster (measured)"
    if len(spec.q_shape) != 4 or len(spec.k_shape) != 4:
        return "training call of an unusual rank: not measured"
    batch, _, seq_q, _ = spec.q_shape
    heads_kv, seq_kv = spec.k_shape[1], spec.k_shape[2]
    keys = batch * heads_kv * seq_kv
    if hopper_backward:
        if keys < FFPA_TRAINS_MIN_KEYS_HOPPER:
            return (f"training with B x Hkv x Nkv = {keys} < {FFPA_TRAINS_MIN_KEYS_HOPPER} keys: "
                    "ffpa's Hopper backward is not measured faster there")
        return None
    if keys < FFPA_TRAINS_MIN_KEYS:
        return (f"training with B x Hkv x Nkv = {keys} < {FFPA_TRAINS_MIN_KEYS} keys: "
                "ffpa's backward leaves the GPU idle, SDPA's is faster (measured)")
    longest = max(seq_q, seq_kv)
    if head_dim > FFPA_TRAINS_MAX_HEAD_DIM_ANY_LENGTH and longest > FFPA_TRAINS_LARGE_HEAD_DIM_MAX_SEQ:
        return (f"training at D = {head_dim} > {FFPA_TRAINS_MAX_HEAD_DIM_ANY_LENGTH} with N = {longest} > "
                f"{FFPA_TRAINS_LARGE_HEAD_DIM_MAX_SEQ}: SDPA's backward is as fast or faster (measured)")
    return None


def _hopper_faster_reason(spec: CallSpec) -> str | None:
    """Why ffpa's Hopper family is measured faster than SDPA for this D <= 256 call, or None."""
    if len(spec.q_shape) != 4 or len(spec.k_shape) != 4 or spec.dropout_p > 0:
        return None
    batch, heads_q, seq_q, head_dim = spec.q_shape
    if head_dim not in FFPA_FASTER_HOPPER_HEAD_DIMS:
        return None
    if spec.mask_dtype == "bool" and seq_q == spec.k_shape[2]:
        return f"D = {head_dim} with a boolean mask: ffpa's Hopper kernel is faster than SDPA's (measured)"
    if spec.mask_dtype is None and seq_q == 1 and batch * heads_q <= FFPA_FASTER_HOPPER_DECODE_MAX_ROWS:
        return f"decode at D = {head_dim}, B x Hq <= {FFPA_FASTER_HOPPER_DECODE_MAX_ROWS}: ffpa's split-KV kernel is faster (measured)"
    return None


def _mha_decode_sdpa_max_seq_kv(spec: CallSpec) -> int | None:
    """For a many-row MHA decode call SDPA serves faster: the Nkv bound of its D's entry; else None."""
    if len(spec.q_shape) != 4 or len(spec.k_shape) != 4:
        return None
    batch, heads_q, seq_q, head_dim = spec.q_shape
    heads_kv, seq_kv = spec.k_shape[1], spec.k_shape[2]
    if seq_q != 1 or heads_q != heads_kv or batch * heads_q < SDPA_FASTER_DECODE_MIN_ROWS:
        return None
    for max_head_dim, max_seq_kv in SDPA_FASTER_MHA_DECODE:
        if head_dim <= max_head_dim:
            return max_seq_kv if seq_kv <= max_seq_kv else None
    return None


def sdpa_backends(spec: CallSpec) -> tuple[tuple[str, ...] | None, str | None]:
    """The SDPA backends that compute a call going to SDPA correctly, and why they are restricted.

    (None, None): SDPA's own choice is right for the call.
    """
    if not _cudnn_bugs_apply(spec):
        return None, None  # SDPA's own choice: not cuDNN, or not a call its bugs touch
    if spec.mask_dtype == "float32":
        # The memory-efficient kernel refuses an fp32 mask; math computes it exactly.
        return ("MATH",), "fp32 mask: SDPA's cuDNN kernel is wrong for it, the math kernel is right"
    modulus, remainder = CUDNN_MASKED_BACKWARD_BAD_REMAINDER
    lengths = (spec.q_shape[2], spec.k_shape[2]) if len(spec.q_shape) == 4 and len(spec.k_shape) == 4 else ()
    if spec.needs_grad and any(n % modulus == remainder for n in lengths):
        return (
            ("EFFICIENT_ATTENTION", "MATH"),
            f"masked backward with a length % {modulus} == {remainder}: cuDNN's dQ is NaN (PyTorch #196678)",
        )
    return None, None
