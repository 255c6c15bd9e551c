"""CUDABackend: defaults, every accepted value, and a clear TypeError/ValueError naming
the field and the allowed values for everything else. Torch-free (runs in CI)."""

import dataclasses

import pytest

from ffpa_attn.config import CUDABackend

ALLOWED = {
    "impl": ("auto", "ffpa", "sm80_split_d", "sm90_wgmma"),
    "accumulation": ("f32", "f16"),
    "causal_alignment": ("top_left", "bottom_right"),
    "precision": ("input", "fp8"),
    "fp8_qk": ("int8", "e4m3"),
    "fp8_qk_scales": ("per_thread_group", "per_block"),
    "fp8_v_scales": ("per_channel", "per_block"),
}
# Seeds and offsets travel through the custom op as int64.
MAX_DROPOUT_COUNTER = 2**63 - 1


def test_defaults():
    backend = CUDABackend()
    assert (backend.impl, backend.accumulation, backend.causal_alignment) == ("auto", "f32", "top_left")
    assert backend.dropout_seed is None
    assert backend.dropout_offset == 0
    assert backend.precision == "input"
    # FP8's knobs default to the library's (its most accurate setting measured).
    assert (backend.fp8_qk, backend.fp8_qk_scales, backend.fp8_smooth_k) == ("int8", "per_thread_group", True)
    assert backend.fp8_early_rows is None
    assert (backend.fp8_v_scales, backend.fp8_smooth_v) == ("per_channel", False)


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, values in ALLOWED.items() for v in values])
def test_accepts_allowed_choice(field, value):
    assert getattr(CUDABackend(**{field: value}), field) == value


@pytest.mark.parametrize("field", sorted(ALLOWED))
@pytest.mark.parametrize("value", ["", "AUTO", "f64", "sm90", "top-left"])
def test_rejects_unknown_choice_naming_field_and_choices(field, value):
    with pytest.raises(ValueError) as error:
        CUDABackend(**{field: value})
    message = str(error.value)
    assert field in message
    assert repr(value) in message or f"{value}" in message
    for allowed in ALLOWED[field]:
        assert allowed in message, f"the message should list {allowed!r}: {message}"


@pytest.mark.parametrize("field", sorted(ALLOWED))
@pytest.mark.parametrize("value", [None, 0, 1.0, b"auto"])
def test_rejects_non_string_choice(field, value):
    with pytest.raises(TypeError, match=field):
        CUDABackend(**{field: value})


@pytest.mark.parametrize("seed", [None, 0, 1, 2**32, MAX_DROPOUT_COUNTER])
def test_accepts_dropout_seed(seed):
    assert CUDABackend(dropout_seed=seed).dropout_seed == seed


@pytest.mark.parametrize("offset", [0, 5, 2**40 + 3, MAX_DROPOUT_COUNTER])
def test_accepts_dropout_offset(offset):
    assert CUDABackend(dropout_offset=offset).dropout_offset == offset


@pytest.mark.parametrize("field", ["dropout_seed", "dropout_offset"])
@pytest.mark.parametrize("value", [-1, MAX_DROPOUT_COUNTER + 1, 2**64])
def test_rejects_out_of_range_dropout_counter(field, value):
    with pytest.raises(ValueError, match=field):
        CUDABackend(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dropout_seed", 1.5),
        ("dropout_seed", "7"),
        ("dropout_seed", True),
        ("dropout_offset", None),
        ("dropout_offset", 2.0),
    ],
)
def test_rejects_non_integer_dropout_counter(field, value):
    with pytest.raises(TypeError, match=field):
        CUDABackend(**{field: value})


def test_is_frozen_and_hashable():
    backend = CUDABackend(impl="sm80_split_d", dropout_seed=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        backend.impl = "auto"
    assert hash(backend) == hash(CUDABackend(impl="sm80_split_d", dropout_seed=3))


# --- precision="fp8" and its knobs ---


@pytest.mark.parametrize("value", [True, False])
def test_accepts_fp8_smooth_k(value):
    assert CUDABackend(precision="fp8", fp8_smooth_k=value).fp8_smooth_k is value


@pytest.mark.parametrize("value", [1, 0, None, "yes"])
def test_rejects_non_bool_fp8_smooth_k(value):
    with pytest.raises(TypeError, match="fp8_smooth_k"):
        CUDABackend(fp8_smooth_k=value)


@pytest.mark.parametrize("value", [True, False])
def test_accepts_fp8_smooth_v(value):
    assert CUDABackend(precision="fp8", fp8_smooth_v=value).fp8_smooth_v is value


@pytest.mark.parametrize("value", [1, 0, None, "yes"])
def test_rejects_non_bool_fp8_smooth_v(value):
    with pytest.raises(TypeError, match="fp8_smooth_v"):
        CUDABackend(fp8_smooth_v=value)


@pytest.mark.parametrize("rows", [None, 0, 64, 256, 64 * 2**20])
def test_accepts_fp8_early_rows(rows):
    assert CUDABackend(precision="fp8", fp8_early_rows=rows).fp8_early_rows == rows


@pytest.mark.parametrize("rows", [-64, 1, 65, 100, 2**63])
def test_rejects_fp8_early_rows_that_are_not_whole_tiles(rows):
    with pytest.raises(ValueError, match="fp8_early_rows") as error:
        CUDABackend(fp8_early_rows=rows)
    assert "multiple of 64" in str(error.value)


@pytest.mark.parametrize("rows", [64.0, "64", True])
def test_rejects_non_integer_fp8_early_rows(rows):
    with pytest.raises(TypeError, match="fp8_early_rows"):
        CUDABackend(fp8_early_rows=rows)


@pytest.mark.parametrize("impl", ["auto", "ffpa", "sm90_wgmma"])
def test_fp8_takes_the_impls_that_run_the_sm90_family(impl):
    assert CUDABackend(impl=impl, precision="fp8").precision == "fp8"


def test_fp8_with_the_portable_family_is_rejected_naming_both():
    with pytest.raises(ValueError, match="precision") as error:
        CUDABackend(impl="sm80_split_d", precision="fp8")
    assert "sm80_split_d" in str(error.value) and "sm90" in str(error.value)


def test_fp8_with_f16_accumulation_is_rejected():
    with pytest.raises(ValueError, match="accumulation"):
        CUDABackend(accumulation="f16", precision="fp8")


def test_fp8_knobs_without_fp8_are_accepted_and_unread():
    # As the library: the fp8_* fields matter with precision "fp8" only.
    backend = CUDABackend(
        impl="sm80_split_d",
        accumulation="f16",
        fp8_qk="e4m3",
        fp8_early_rows=128,
        fp8_v_scales="per_block",
        fp8_smooth_v=True,
    )
    assert backend.precision == "input"


def test_fp8_backends_are_hashable_by_value():
    fields = dict(precision="fp8", fp8_qk="e4m3", fp8_qk_scales="per_block", fp8_smooth_k=False, fp8_early_rows=0)
    assert hash(CUDABackend(**fields)) == hash(CUDABackend(**fields))
    assert CUDABackend(**fields) != CUDABackend(**(fields | dict(fp8_early_rows=64)))
    assert CUDABackend(**fields) != CUDABackend(**(fields | dict(fp8_v_scales="per_block")))
    assert CUDABackend(**fields) != CUDABackend(**(fields | dict(fp8_smooth_v=True)))
