"""CUDABackend: defaults, every accepted value, and a clear TypeError/ValueError naming
the field and the allowed values for everything else. Torch-free (runs in CI)."""

import dataclasses

import pytest

from ffpa_attn.config import CUDABackend

ALLOWED = {
    "impl": ("auto", "ffpa", "sm80_split_d", "sm90_wgmma"),
    "accumulation": ("f32", "f16"),
    "causal_alignment": ("top_left", "bottom_right"),
}
# Seeds and offsets travel through the custom op as int64.
MAX_DROPOUT_COUNTER = 2**63 - 1


def test_defaults():
    backend = CUDABackend()
    assert (backend.impl, backend.accumulation, backend.causal_alignment) == ("auto", "f32", "top_left")
    assert backend.dropout_seed is None
    assert backend.dropout_offset == 0


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
