"""The ctypes mirror of ffpa_options (_library.FfpaOptions, FfpaFp8Options) against
the C library: every field, the FP8 ones included, lands where the library reads
it (its validation names the value it read), and a zero-initialised struct is
the defaults. Host buffers and the library's own checks: torch-free, no GPU.
The C side of the layout is static_asserted in tests/cpu/test_c_api.cpp."""

import ctypes

import pytest

from ffpa_attn import _library
from ffpa_attn._library import (
    Accumulation,
    DType,
    FFPAError,
    FfpaBackwardParams,
    FfpaFp8Options,
    FfpaForwardParams,
    FfpaOptions,
    Fp8QkFormat,
    Fp8QkScales,
    Fp8VScales,
    Impl,
    Precision,
)

# (field, offset) of the C structs on x86-64 and aarch64, as tests/cpu/test_c_api.cpp asserts them.
OPTIONS_OFFSETS = {
    "has_scale": 0,
    "scale": 4,
    "causal": 8,
    "dropout_p": 12,
    "dropout_seed": 16,
    "dropout_offset": 24,
    "accumulation": 32,
    "impl": 36,
    "precision": 40,
    "fp8": 48,
    "has_window": 80,
    "window_left": 88,
    "window_right": 96,
    "softcap": 104,
}
FP8_OFFSETS = {
    "qk_format": 0,
    "qk_scales": 4,
    "no_smooth_k": 8,
    "has_early_rows": 12,
    "early_rows": 16,
    "v_scales": 24,
    "smooth_v": 28,
}


def test_the_structs_have_the_c_layout():
    assert {name: getattr(FfpaOptions, name).offset for name, _ in FfpaOptions._fields_} == OPTIONS_OFFSETS
    assert {name: getattr(FfpaFp8Options, name).offset for name, _ in FfpaFp8Options._fields_} == FP8_OFFSETS
    assert (ctypes.sizeof(FfpaFp8Options), ctypes.sizeof(FfpaOptions), ctypes.sizeof(FfpaForwardParams)) == (
        32,
        112,
        880,
    )
    assert (FfpaForwardParams.options.offset, FfpaForwardParams.stream.offset) == (480, 592)
    assert FfpaForwardParams.fp8_kv_cache.offset == 616
    assert (FfpaForwardParams.sinks.offset, FfpaForwardParams.sequences.offset) == (624, 864)
    assert (FfpaBackwardParams.options.offset, FfpaBackwardParams.stream.offset) == (960, 1072)
    assert (FfpaBackwardParams.sequences.offset, FfpaBackwardParams.sinks.offset) == (1096, 1104)
    assert (FfpaBackwardParams.d_sinks.offset, ctypes.sizeof(FfpaBackwardParams)) == (1184, 1264)


def test_the_enums_are_the_c_values():
    # include/ffpa/ffpa.h: FFPA_PRECISION_*, FFPA_FP8_QK_*, FFPA_FP8_QK_SCALES_*, FFPA_FP8_V_SCALES_*.
    assert (Precision.INPUT, Precision.FP8) == (0, 1)
    assert (Fp8QkFormat.INT8, Fp8QkFormat.E4M3) == (0, 1)
    assert (Fp8QkScales.PER_THREAD_GROUP, Fp8QkScales.PER_BLOCK) == (0, 1)
    assert (Fp8VScales.PER_CHANNEL, Fp8VScales.PER_BLOCK) == (0, 1)


def test_zero_initialised_options_are_the_defaults():
    options = FfpaOptions()
    assert options.precision == Precision.INPUT
    assert (options.fp8.qk_format, options.fp8.qk_scales) == (Fp8QkFormat.INT8, Fp8QkScales.PER_THREAD_GROUP)
    assert options.fp8.no_smooth_k == 0 and options.fp8.has_early_rows == 0
    assert options.fp8.v_scales == Fp8VScales.PER_CHANNEL and options.fp8.smooth_v == 0


def test_the_fp8_fields_round_trip():
    # Each field keeps what is written to it and no other field moves (no overlap).
    values = dict(
        qk_format=1, qk_scales=1, no_smooth_k=1, has_early_rows=1, early_rows=2**40 + 64, v_scales=1, smooth_v=1
    )
    options = FfpaOptions(precision=Precision.FP8, fp8=FfpaFp8Options(**values))
    assert {name: getattr(options.fp8, name) for name in values} == values
    raw = bytes(options.fp8)
    assert int.from_bytes(raw[24:28], "little", signed=True) == 1  # v_scales
    assert int.from_bytes(raw[28:32], "little", signed=True) == 1  # smooth_v
    assert int.from_bytes(raw[16:24], "little", signed=True) == 2**40 + 64  # early_rows, unchanged
    options.fp8.v_scales = Fp8VScales.PER_CHANNEL
    assert (options.fp8.smooth_v, options.fp8.early_rows, options.fp8.has_early_rows) == (1, 2**40 + 64, 1)


# --- through the library ----------------------------------------------------------------

try:
    _library.load_library()
except _library.LibraryNotFoundError as error:
    pytest.skip(f"the ffpa C library does not load (build it, or set FFPA_LIBRARY): {error}", allow_module_level=True)

SHAPE = (1, 2, 8, 64)  # [B, H, N, D], fp16: 2 KiB per tensor
STRIDES = (2 * 8 * 64, 8 * 64, 64, 1)
ALIGNMENT = 16  # the library reads 16-byte vectors


class HostCall:
    """q, k, v (zeros) and o in 16-byte aligned host buffers, and params for them (impl and options to set)."""

    def __init__(self) -> None:
        count = SHAPE[0] * SHAPE[1] * SHAPE[2] * SHAPE[3]
        self.buffers = [(ctypes.c_uint16 * (count + ALIGNMENT // 2))() for _ in range(4)]  # kept alive here
        q, k, v, o = (_library.tensor(_aligned(b), DType.F16, SHAPE, STRIDES) for b in self.buffers)
        self.params = FfpaForwardParams(q=q, k=k, v=v, o=o)


def _aligned(buffer: ctypes.Array) -> int:
    address = ctypes.addressof(buffer)
    return address + (-address) % ALIGNMENT


def library_error(params: FfpaForwardParams) -> FFPAError:
    """The FFPAError of ffpa_forward; ffpa_workspace_size must answer with the same status."""
    with pytest.raises(FFPAError) as forward_error:
        _library.forward(params)
    with pytest.raises(FFPAError) as size_error:
        _library.workspace_size(params)
    assert size_error.value.status_name == forward_error.value.status_name
    return forward_error.value


def test_zeroed_options_run_the_cpu_reference():
    call = HostCall()
    call.params.options.impl = Impl.CPU_REFERENCE
    _library.forward(call.params)  # the defaults: no FP8 option is read
    assert _library.workspace_size(call.params) == 0


def fp8(**fields) -> FfpaOptions:
    return FfpaOptions(precision=Precision.FP8, fp8=FfpaFp8Options(**fields))


# Values the library rejects, naming the value it read: each field is where the C struct has it.
REJECTED = {
    "precision": (FfpaOptions(precision=7), "invalid_option", "options.precision = 7"),
    "qk_format": (fp8(qk_format=7), "invalid_option", "options.fp8.qk_format = 7"),
    "qk_scales": (fp8(qk_scales=5), "invalid_option", "options.fp8.qk_scales = 5"),
    "v_scales": (fp8(v_scales=5), "invalid_option", "options.fp8.v_scales = 5"),
    "smooth_v-with-dropout": (
        FfpaOptions(precision=Precision.FP8, dropout_p=0.25, fp8=FfpaFp8Options(smooth_v=1)),
        "invalid_option",
        "options.fp8.smooth_v with dropout",
    ),
    "early_rows": (fp8(has_early_rows=1, early_rows=65), "invalid_option", "options.fp8.early_rows = 65"),
    # All 64 bits of early_rows: 2^40 + 1 read as an int32 would be 1.
    "early_rows-int64": (
        fp8(has_early_rows=1, early_rows=2**40 + 1),
        "invalid_option",
        f"options.fp8.early_rows = {2**40 + 1}",
    ),
    "f16-accumulation": (
        FfpaOptions(precision=Precision.FP8, accumulation=Accumulation.F16),
        "unsupported_accumulation",
        "precision fp8",
    ),
}


@pytest.mark.parametrize("case", REJECTED.values(), ids=REJECTED.keys())
def test_each_field_lands_where_the_library_reads_it(case):
    options, status, words = case
    call = HostCall()
    call.params.options = options
    error = library_error(call.params)
    assert error.status_name == status, error
    assert words in error.message, error.message


def test_fp8_on_the_cpu_reference_is_unavailable():
    call = HostCall()
    call.params.options = fp8()
    call.params.options.impl = Impl.CPU_REFERENCE
    error = library_error(call.params)
    assert error.status_name == "impl_unavailable", error
    assert "precision fp8 runs on impl sm90_wgmma only" in error.message, error.message


def test_fp8_on_host_pointers_is_the_sm90_familys_answer():
    # impl auto with FP8 asks the sm90 family: no device here (impl_unavailable), or
    # host pointers (wrong_memory_space) where there is one. early_rows is read only
    # with has_early_rows: 65 alone is no option error; per-block V scales and
    # smooth-V without dropout are valid knobs.
    for options in (fp8(early_rows=65), fp8(v_scales=Fp8VScales.PER_BLOCK, smooth_v=1)):
        call = HostCall()
        call.params.options = options
        error = library_error(call.params)
        assert error.status_name in ("impl_unavailable", "wrong_memory_space"), error
        assert "sm90" in error.message, error.message


def test_fp8_v_knobs_are_read_with_precision_fp8_only():
    # With the inputs' precision, smooth-V with dropout and an out-of-range v_scales are no error.
    call = HostCall()
    fp8_options = FfpaFp8Options(smooth_v=1, v_scales=5)
    call.params.options = FfpaOptions(impl=Impl.CPU_REFERENCE, dropout_p=0.25, fp8=fp8_options)
    _library.forward(call.params)
