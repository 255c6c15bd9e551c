"""The options of ffpa_attn_func that SDPA does not have: the CUDABackend record.

Torch-free, so that CI without PyTorch can test the validation.
"""

from __future__ import annotations

from dataclasses import dataclass

IMPLS = ("auto", "ffpa", "sm80_split_d", "sm90_wgmma")
ACCUMULATIONS = ("f32", "f16")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
PRECISIONS = ("input", "fp8")
FP8_QK_FORMATS = ("int8", "e4m3")
FP8_QK_SCALES = ("per_thread_group", "per_block")
FP8_V_SCALES = ("per_channel", "per_block")
# The impls that run precision="fp8": the library's sm90 family, chosen or named.
FP8_IMPLS = ("auto", "ffpa", "sm90_wgmma")
# fp8_early_rows: whole tiles of query rows (the library's kQuantQueryBlock; validate.cpp rejects others).
FP8_EARLY_ROWS_MULTIPLE = 64

# Seeds and offsets travel through the custom op as int64 (the C ABI's are uint64).
MAX_DROPOUT_COUNTER = 2**63 - 1


@dataclass(frozen=True)
class CUDABackend:
    """How the ffpa library serves a call; validated on construction.

    impl: "auto" runs the fastest correct path for the call: the library's own
        choice of kernel, or PyTorch's SDPA where the routing table
        (routing.py) measured SDPA faster, and SDPA for calls the library
        cannot serve. "ffpa" runs the library's own choice and never SDPA
        (raising where the library cannot serve the call); an explicit family
        ("sm80_split_d", or "sm90_wgmma" on Hopper) runs that family or raises
        saying why it cannot.
    accumulation: "f32", or "f16" for float16 inputs only.
    causal_alignment: what is_causal=True means: "top_left" (SDPA's j <= i) or
        "bottom_right" (FlashAttention's j <= i + Nkv - Nq).
    dropout_seed: the seed of the dropout keep-mask (the library's stream is
        PyTorch SDPA's: docs/kernels/sdpa_dropout.md). None: in eager mode on
        CUDA, torch's CUDA generator, read and advanced as SDPA does, so the
        call drops exactly what SDPA would after the same torch.manual_seed;
        while compiling or capturing a CUDA graph, a seed drawn per call from
        torch's default CPU generator.
    dropout_offset: the stream's offset (in 32-bit words) with an explicit seed.
    precision: what the tensor cores multiply: "input" (the inputs' fp16/bf16),
        or "fp8": the library quantizes Q, K and V (into a workspace from
        torch's allocator) and runs Q K^T and P V on Hopper's 8-bit tensor
        cores; the output keeps the inputs' dtype, with a larger error (about
        4e-2 relative L2 on random inputs: docs/kernels/fp8_model.md). FP8
        runs on the library's sm90 family only (impl "auto", "ffpa" or
        "sm90_wgmma"; fp32 accumulation). Under impl "auto" an fp8 call is
        never routed to SDPA for speed (SDPA has no FP8); it goes to SDPA, in
        the inputs' precision, only where the library cannot serve it at all
        (no Hopper GPU the build runs on, an input that requires grad, ...),
        with the reason, which says fp8, logged at DEBUG.
    fp8_qk: the codes of Q and K with precision "fp8": "int8" (exact integer
        sums on the tensor cores; the most accurate) or "e4m3".
    fp8_qk_scales: the granularity of Q's and K's scales: "per_thread_group"
        (the rows and keys one thread's scores cover) or "per_block" (64 query
        rows, 128 keys).
    fp8_smooth_k: subtract K's per-channel mean over tokens before quantizing
        (softmax-invariant; more accurate).
    fp8_early_rows: query rows [0, fp8_early_rows) computed in the inputs'
        precision, a multiple of 64; None: the library's default (256 with
        is_causal, where the first rows attend few keys, else 0).
    fp8_v_scales: the granularity of V's scales: "per_channel" (one scale per
        channel over all keys, applied in the epilogue) or "per_block" (one
        scale per 128 keys, applied as each block is added).
    fp8_smooth_v: subtract V's per-channel mean over tokens before quantizing
        and add it back to every row that attends a key (the softmax weights
        sum to 1). Not with dropout (the kept weights do not sum to 1): a call
        with dropout_p > 0 raises FFPAError (invalid_option).
    The fp8_* fields are read with precision "fp8" only.
    """

    impl: str = "auto"
    accumulation: str = "f32"
    causal_alignment: str = "top_left"
    dropout_seed: int | None = None
    dropout_offset: int = 0
    precision: str = "input"
    fp8_qk: str = "int8"
    fp8_qk_scales: str = "per_thread_group"
    fp8_smooth_k: bool = True
    fp8_early_rows: int | None = None
    fp8_v_scales: str = "per_channel"
    fp8_smooth_v: bool = False

    def __post_init__(self) -> None:
        _check_choice("impl", self.impl, IMPLS)
        _check_choice("accumulation", self.accumulation, ACCUMULATIONS)
        _check_choice("causal_alignment", self.causal_alignment, CAUSAL_ALIGNMENTS)
        if self.dropout_seed is not None:
            _check_counter("dropout_seed", self.dropout_seed)
        _check_counter("dropout_offset", self.dropout_offset)
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("fp8_qk", self.fp8_qk, FP8_QK_FORMATS)
        _check_choice("fp8_qk_scales", self.fp8_qk_scales, FP8_QK_SCALES)
        _check_bool("fp8_smooth_k", self.fp8_smooth_k)
        if self.fp8_early_rows is not None:
            _check_early_rows(self.fp8_early_rows)
        _check_choice("fp8_v_scales", self.fp8_v_scales, FP8_V_SCALES)
        _check_bool("fp8_smooth_v", self.fp8_smooth_v)
        if self.precision == "fp8":
            if self.impl not in FP8_IMPLS:
                raise ValueError(
                    f"CUDABackend.precision = 'fp8' runs on the library's sm90 family only: impl must be one of "
                    f"{FP8_IMPLS}, not {self.impl!r}"
                )
            if self.accumulation != "f32":
                raise ValueError(
                    f"CUDABackend.precision = 'fp8' accumulates in fp32: accumulation must be 'f32', "
                    f"not {self.accumulation!r}"
                )


def _check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise TypeError(f"CUDABackend.{field} must be a str, one of {allowed}; got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"CUDABackend.{field} = {value!r} is not one of {allowed}")


def _check_bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"CUDABackend.{field} must be a bool; got {type(value).__name__} {value!r}")


def _check_counter(field: str, value: object) -> None:
    # bool is an int subclass, but True as a seed is a mistake, not a seed.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"CUDABackend.{field} must be an int; got {type(value).__name__} {value!r}")
    if not 0 <= value <= MAX_DROPOUT_COUNTER:
        raise ValueError(f"CUDABackend.{field} = {value} is outside [0, 2**63 - 1]")


def _check_early_rows(value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"CUDABackend.fp8_early_rows must be an int or None; got {type(value).__name__} {value!r}")
    # It travels through the custom op and the C ABI as int64.
    if not 0 <= value < 2**63 or value % FP8_EARLY_ROWS_MULTIPLE:
        raise ValueError(
            f"CUDABackend.fp8_early_rows = {value} is not a non-negative multiple of {FP8_EARLY_ROWS_MULTIPLE}"
            " (below 2**63)"
        )
