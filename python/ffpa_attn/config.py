"""The options of ffpa_attn_func that SDPA does not have: the CUDABackend record.

Torch-free, so that CI without PyTorch can test the validation.
"""

from __future__ import annotations

from dataclasses import dataclass

IMPLS = ("auto", "ffpa", "sm80_split_d", "sm90_wgmma")
ACCUMULATIONS = ("f32", "f16")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")

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
    """

    impl: str = "auto"
    accumulation: str = "f32"
    causal_alignment: str = "top_left"
    dropout_seed: int | None = None
    dropout_offset: int = 0

    def __post_init__(self) -> None:
        _check_choice("impl", self.impl, IMPLS)
        _check_choice("accumulation", self.accumulation, ACCUMULATIONS)
        _check_choice("causal_alignment", self.causal_alignment, CAUSAL_ALIGNMENTS)
        if self.dropout_seed is not None:
            _check_counter("dropout_seed", self.dropout_seed)
        _check_counter("dropout_offset", self.dropout_offset)


def _check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise TypeError(f"CUDABackend.{field} must be a str, one of {allowed}; got {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ValueError(f"CUDABackend.{field} = {value!r} is not one of {allowed}")


def _check_counter(field: str, value: object) -> None:
    # bool is an int subclass, but True as a seed is a mistake, not a seed.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"CUDABackend.{field} must be an int; got {type(value).__name__} {value!r}")
    if not 0 <= value <= MAX_DROPOUT_COUNTER:
        raise ValueError(f"CUDABackend.{field} = {value} is outside [0, 2**63 - 1]")
