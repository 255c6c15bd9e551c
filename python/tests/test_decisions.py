"""fallback_reason on hand-built CallSpecs: every call the library serves gets None,
every other call a short human reason. Torch-free (runs in CI). The head-dim
limits are the loaded library's; without one, the tests use explicit limits of
the same shape (the logic given limits is what is tested here)."""

import pytest

from ffpa_attn import _library
from call_specs import served_call_spec
from ffpa_attn.decisions import CallSpec, Limits, fallback_reason, head_dims_reason, precision_fallback_reason


def limits_under_test() -> Limits:
    try:
        return _library.limits()
    except _library.LibraryNotFoundError:
        return Limits(min_head_dim=8, max_head_dim=1024, head_dim_multiple=8)


LIMITS = limits_under_test()
D_MIN, D_MAX, D_STEP = LIMITS.min_head_dim, LIMITS.max_head_dim, LIMITS.head_dim_multiple
B, HQ, NQ, NKV, D = 2, 8, 37, 53, 128


def spec(**changes) -> CallSpec:
    """A call the library serves (bf16, CUDA, [B, H, N, D], no mask), with `changes` applied."""
    shapes = dict(q_shape=(B, HQ, NQ, D), k_shape=(B, HQ, NKV, D), v_shape=(B, HQ, NKV, D))
    return served_call_spec(**(shapes | changes))


def head_dim(d: int) -> dict:
    return dict(q_shape=(B, HQ, NQ, d), k_shape=(B, HQ, NKV, d), v_shape=(B, HQ, NKV, d))


def kv_heads(h: int, **changes) -> dict:
    return dict(k_shape=(B, h, NKV, D), v_shape=(B, h, NKV, D), **changes)


def mask(shape: tuple, dtype: str = "bool") -> dict:
    return dict(mask_dtype=dtype, mask_shape=shape)


SERVED = {
    "bf16": {},
    "fp16": dict(dtype="float16"),
    "D-min": head_dim(D_MIN),
    "D-max": head_dim(D_MAX),
    "D-one-step-below-max": head_dim(D_MAX - D_STEP),
    "D520-not-multiple-of-64": head_dim(520),
    "D72": head_dim(72),
    "Nq1-decode": dict(q_shape=(B, HQ, 1, D)),
    "Nkv1": dict(k_shape=(B, HQ, 1, D), v_shape=(B, HQ, 1, D)),
    "B1": dict(q_shape=(1, HQ, NQ, D), k_shape=(1, HQ, NKV, D), v_shape=(1, HQ, NKV, D)),
    "gqa-4": kv_heads(2, enable_gqa=True),
    "gqa-8-to-1": kv_heads(1, enable_gqa=True),
    "gqa-flag-equal-heads": dict(enable_gqa=True),
    "dropout": dict(dropout_p=0.5),
    "dropout-near-1": dict(dropout_p=0.999),
    "causal": dict(is_causal=True),
    "scale": dict(scale=0.05),
    "negative-scale": dict(scale=-1.0),
    "mask-2d": mask((NQ, NKV)),
    "mask-keys": mask((1, 1, 1, NKV)),
    "mask-batch-keys": mask((B, 1, 1, NKV)),
    "mask-batch-rows": mask((B, 1, NQ, NKV)),
    "mask-full": mask((B, HQ, NQ, NKV)),
    "mask-3d-heads": mask((HQ, NQ, NKV)),
    "mask-head-only": mask((1, HQ, 1, 1)),
    "mask-rows-only": mask((NQ, 1)),
    "mask-1x1": mask((1, 1)),
    "mask-same-dtype": mask((NQ, NKV), "bfloat16"),
    "mask-fp16-with-fp16": dict(dtype="float16", **mask((NQ, NKV), "float16")),
    "mask-float32": mask((B, 1, NQ, NKV), "float32"),
    "mask-gqa-full": kv_heads(2, enable_gqa=True, **mask((B, HQ, NQ, NKV))),
    # The library has the gradients; whether it or SDPA trains is routing's (speed) choice.
    "needs-grad": dict(needs_grad=True),
    # D_qk != D_v (absorbed MLA's 576 / 512): served; routing picks the path.
    "v-head-dim-differs": dict(v_shape=(B, HQ, NKV, D + 64)),
}


@pytest.mark.parametrize("changes", SERVED.values(), ids=SERVED.keys())
def test_served(changes):
    assert fallback_reason(spec(**changes), LIMITS) is None


# (changes, a word the reason should contain or None): the value that disqualifies the
# call, where naming it is the obvious way to explain the fallback.
FALLBACK = {
    "cpu": (dict(device_type="cpu"), "cpu"),
    "meta": (dict(device_type="meta"), "meta"),
    "mps": (dict(device_type="mps"), "mps"),
    "devices-differ": (dict(same_device=False), None),
    "float32": (dict(dtype="float32"), "float32"),
    "float64": (dict(dtype="float64"), "float64"),
    "int8": (dict(dtype="int8"), "int8"),
    "kv-dtype-differs": (dict(kv_dtypes_match=False), None),
    "rank3": (dict(q_shape=(HQ, NQ, D), k_shape=(HQ, NKV, D), v_shape=(HQ, NKV, D)), None),
    "rank5": (dict(q_shape=(1, B, HQ, NQ, D), k_shape=(1, B, HQ, NKV, D), v_shape=(1, B, HQ, NKV, D)), None),
    "k-rank3": (dict(k_shape=(HQ, NKV, D)), None),
    "batch-differs": (dict(k_shape=(1, HQ, NKV, D), v_shape=(1, HQ, NKV, D)), None),
    "D-one-step-above-max": (head_dim(D_MAX + D_STEP), str(D_MAX + D_STEP)),
    "D-twice-max": (head_dim(2 * D_MAX), str(2 * D_MAX)),
    "D-below-min": (head_dim(D_MIN - D_STEP // 2), str(D_MIN - D_STEP // 2)),
    "D-between-multiples": (head_dim(D_MIN + D_STEP + D_STEP // 2), str(D_MIN + D_STEP + D_STEP // 2)),
    "D100-not-multiple-of-8": (head_dim(100), "100"),
    "k-head-dim-differs": (dict(k_shape=(B, HQ, NKV, 64)), None),
    "v-head-dim-invalid": (dict(v_shape=(B, HQ, NKV, 2 * D_MAX)), "value head dim"),
    "kv-lengths-differ": (dict(v_shape=(B, HQ, NKV + 1, D)), None),
    "kv-heads-differ": (dict(v_shape=(B, 4, NKV, D), enable_gqa=True), None),
    "Nkv0": (dict(k_shape=(B, HQ, 0, D), v_shape=(B, HQ, 0, D)), None),
    "heads-differ-without-gqa": (kv_heads(2), None),
    "gqa-ratio-not-integer": (kv_heads(3, enable_gqa=True), None),
    "gqa-more-kv-heads": (dict(q_shape=(B, 2, NQ, D), enable_gqa=True), None),
    "mask-int64": (mask((NQ, NKV), "int64"), "int64"),
    "mask-uint8": (mask((NQ, NKV), "uint8"), "uint8"),
    "mask-float64": (mask((NQ, NKV), "float64"), "float64"),
    # SDPA rejects an fp16 mask with bf16 inputs: the fallback lets it say so.
    "mask-fp16-with-bf16": (mask((NQ, NKV), "float16"), None),
    "mask-keys-not-broadcastable": (mask((NQ, NKV - 1)), None),
    "mask-rows-not-broadcastable": (mask((NQ + 1, NKV)), None),
    "mask-batch-not-broadcastable": (mask((3, 1, NQ, NKV)), None),
    "mask-heads-not-broadcastable": (mask((B, 3, NQ, NKV)), None),
    "mask-rank5": (mask((1, B, HQ, NQ, NKV)), None),
    # SDPA needs the mask's last two dims: a 1-D or 0-D mask is its error to raise.
    "mask-1d": (mask((NKV,)), None),
    "mask-0d": (mask(()), None),
    "causal-with-mask": (dict(is_causal=True, **mask((NQ, NKV))), None),
    "scale-inf": (dict(scale=float("inf")), None),
    "scale-nan": (dict(scale=float("nan")), None),
    "dropout-1": (dict(dropout_p=1.0), None),
    "dropout-negative": (dict(dropout_p=-0.1), None),
    "dropout-nan": (dict(dropout_p=float("nan")), None),
    "dropout-rounds-to-1-in-float32": (dict(dropout_p=1 - 2**-26), None),
    "nested": (dict(nested=True), None),
}


@pytest.mark.parametrize(("changes", "word"), FALLBACK.values(), ids=FALLBACK.keys())
def test_fallback_reason(changes, word):
    reason = fallback_reason(spec(**changes), LIMITS)
    assert isinstance(reason, str) and reason.strip(), f"expected a reason, got {reason!r}"
    if word is not None:
        assert word in reason.lower(), f"the reason should name {word!r}: {reason!r}"


# Limits other than the library's: the decision follows the limits it is given.
NARROW = Limits(min_head_dim=32, max_head_dim=256, head_dim_multiple=16)


@pytest.mark.parametrize(("d", "served"), [(32, True), (48, True), (256, True), (16, False), (40, False), (272, False)])
def test_head_dim_follows_the_given_limits(d, served):
    reason = fallback_reason(spec(**head_dim(d)), NARROW)
    if served:
        assert reason is None
    else:
        assert reason is not None and str(d) in reason and "[32, 256]" in reason and "16" in reason


def test_without_limits_the_head_dim_is_not_judged():
    # No library loads: the call then fails where the op loads it, with the loader's error.
    assert fallback_reason(spec(**head_dim(2 * D_MAX)), None) is None
    assert fallback_reason(spec(device_type="cpu", **head_dim(2 * D_MAX)), None) is not None


@pytest.mark.parametrize("changes", [dict(nested=True), dict(device_type="cpu"), dict(dtype="float32")])
def test_an_fp8_call_going_to_sdpa_says_fp8_is_not_applied(changes):
    reason = fallback_reason(spec(**changes), LIMITS)
    fp8_reason = precision_fallback_reason(reason, "fp8")
    assert "fp8" in fp8_reason and "inputs' precision" in fp8_reason and fp8_reason.endswith(reason)
    assert precision_fallback_reason(reason, "input") == reason


def test_head_dims_are_judged_by_the_library_s_limits_each():
    limits = Limits(8, 1024, 8)
    assert head_dims_reason(576, 512, limits) is None
    assert "head dim 12" in head_dims_reason(12, 64, limits)
    assert "value head dim 1032" in head_dims_reason(64, 1032, limits)
    assert head_dims_reason(12, 1032, None) is None  # no library: not judged
