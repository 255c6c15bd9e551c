"""routing.route and routing.sdpa_backends on hand-built CallSpecs (torch-free, runs in CI):
where impl="auto" sends a call the library can serve, and which SDPA backends
a call going to SDPA may use."""

from dataclasses import replace

import pytest

from call_specs import served_call_spec
from ffpa_attn.config import CUDABackend
from ffpa_attn.decisions import CallSpec
from ffpa_attn.routing import (
    CUDNN_FP32_MASK_MAX_HEAD_DIM,
    FFPA_FASTER_HOPPER_DECODE_MAX_ROWS,
    FFPA_FASTER_HOPPER_HEAD_DIMS,
    FFPA_TRAINS_MIN_KEYS,
    FFPA_TRAINS_MIN_KEYS_HOPPER,
    SDPA_FASTER_DECODE_MIN_ROWS,
    SDPA_FASTER_MHA_DECODE,
    SDPA_FASTER_MAX_HEAD_DIM,
    route,
    sdpa_backends,
    sdpa_refusal_reason,
    training_sdpa_reason,
)

B, H, N = 2, 8, 300


def spec(d=512, nq=N, nkv=N, **changes) -> CallSpec:
    return served_call_spec((B, H, nq, d), (B, H, nkv, d), (B, H, nkv, d), **changes)


AUTO = CUDABackend()


@pytest.mark.parametrize("d", [8, 64, 128, 256])
def test_small_head_dims_go_to_sdpa(d):
    chosen = route(spec(d), AUTO, return_lse=False)
    assert chosen.path == "sdpa" and f"D = {d}" in chosen.reason


@pytest.mark.parametrize("d", [264, 320, 512, 1024])
def test_large_head_dims_stay_on_ffpa(d):
    assert route(spec(d), AUTO, return_lse=False).path == "ffpa"


def test_the_split_is_the_measured_one():
    assert SDPA_FASTER_MAX_HEAD_DIM == 256
    assert route(spec(SDPA_FASTER_MAX_HEAD_DIM), AUTO, False).path == "sdpa"
    assert route(spec(SDPA_FASTER_MAX_HEAD_DIM + 8), AUTO, False).path == "ffpa"


def decode_spec(batch, heads_q, heads_kv, nkv, nq=1, d=512, **changes) -> CallSpec:
    return served_call_spec((batch, heads_q, nq, d), (batch, heads_kv, nkv, d), (batch, heads_kv, nkv, d), **changes)


ROWS = SDPA_FASTER_DECODE_MIN_ROWS


@pytest.mark.parametrize("d, nkv", [(512, 512), (640, 512), (640, 8192), (1024, 2048), (1024, 8192)])
def test_mha_decode_over_many_rows_goes_to_sdpa_where_measured_faster(d, nkv):
    chosen = route(decode_spec(ROWS // 32, 32, 32, nkv, d=d), AUTO, False)
    assert chosen.path == "sdpa" and "MHA decode" in chosen.reason and f"D = {d}" in chosen.reason


def test_the_mha_decode_table_is_the_measured_one():
    assert SDPA_FASTER_MHA_DECODE == ((448, 0), (512, 512), (1024, 8192))
    for max_d, max_nkv in SDPA_FASTER_MHA_DECODE:
        assert route(decode_spec(8, 32, 32, max_nkv + 8, d=max_d), AUTO, False).path == "ffpa"


@pytest.mark.parametrize(
    "call",
    [
        decode_spec(8, 32, 32, 512, d=320),  # ffpa faster at D = 320
        decode_spec(8, 32, 32, 1024, d=512),  # ffpa faster from Nkv 1024 at D = 512
        decode_spec(8, 32, 32, 16384, d=1024),  # past the measured range
        decode_spec(ROWS // 32 - 1, 32, 32, 512),  # too few rows: ffpa splits the keys
        decode_spec(8, 32, 8, 512),  # GQA: ffpa packs the group's heads
        decode_spec(8, 32, 32, 512, nq=2),  # not measured beyond Nq = 1
    ],
    ids=["d320", "d512-nkv1024", "d1024-nkv16k", "few-rows", "gqa", "nq2"],
)
def test_other_decode_calls_stay_on_ffpa(call):
    assert route(call, AUTO, False).path == "ffpa"


def test_short_mha_decode_asking_for_lse_stays_on_ffpa():
    assert route(decode_spec(8, 32, 32, 512), AUTO, True).path == "ffpa"


@pytest.mark.parametrize(
    "call",
    [
        spec(256, mask_dtype="bool", mask_shape=(B, 1, 1, N)),
        spec(256, is_causal=False, mask_dtype="bool", mask_shape=(B, 1, N, N)),
        decode_spec(1, 32, 32, 8192, d=256),
        decode_spec(1, 32, 8, 512, d=256),
    ],
    ids=["key-padding", "full-bool", "decode-mha", "decode-gqa"],
)
def test_d256_calls_measured_faster_on_the_hopper_family_stay_on_ffpa_there(call):
    assert FFPA_FASTER_HOPPER_HEAD_DIMS == (256,) and FFPA_FASTER_HOPPER_DECODE_MAX_ROWS == 32
    chosen = route(call, AUTO, False, hopper_family=True)
    assert chosen.path == "ffpa" and "measured" in chosen.reason
    assert route(call, AUTO, False, hopper_family=False).path == "sdpa"  # another GPU, or no such instance


@pytest.mark.parametrize(
    "call",
    [
        spec(256),  # no mask, not decode: cuDNN/flash are faster
        spec(256, mask_dtype="bfloat16", mask_shape=(B, 1, 1, N)),  # additive masks were not measured
        spec(256, dropout_p=0.1, mask_dtype="bool", mask_shape=(B, 1, 1, N)),  # nor dropout
        spec(128, mask_dtype="bool", mask_shape=(B, 1, 1, N)),  # nor D = 128
        decode_spec(2, 32, 32, 8192, d=256),  # 64 rows: beyond the measured decode
        spec(256, nq=64, nkv=N, mask_dtype="bool", mask_shape=(B, 1, 1, N)),  # masked Nq != Nkv: not measured
    ],
    ids=["unmasked", "additive", "dropout", "d128", "decode-b2", "masked-cross"],
)
def test_other_small_head_dim_calls_go_to_sdpa_on_the_hopper_family_too(call):
    assert route(call, AUTO, False, hopper_family=True).path == "sdpa"


ONLY_FFPA = {
    "explicit impl": (spec(128), CUDABackend(impl="ffpa"), False, "asks for ffpa"),
    "explicit family": (spec(128), CUDABackend(impl="sm80_split_d"), False, "asks for ffpa"),
    "lse": (spec(128), AUTO, True, "return_lse"),
    "f16 accumulation": (spec(128, dtype="float16"), CUDABackend(accumulation="f16"), False, "fp16 accumulation"),
    "bottom-right causal, Nq != Nkv": (
        spec(128, nq=5, nkv=300, is_causal=True),
        CUDABackend(causal_alignment="bottom_right"),
        False,
        "bottom-right",
    ),
    "explicit dropout seed": (spec(128, dropout_p=0.1), CUDABackend(dropout_seed=7), False, "dropout seed"),
    "fp8": (spec(128), CUDABackend(precision="fp8"), False, "fp8"),
    "fp8 with impl ffpa": (spec(128), CUDABackend(impl="ffpa", precision="fp8"), False, "fp8"),
}


@pytest.mark.parametrize("case", ONLY_FFPA.values(), ids=ONLY_FFPA.keys())
def test_calls_asking_for_what_only_ffpa_gives_stay_on_ffpa(case):
    call, backend, return_lse, words = case
    chosen = route(call, backend, return_lse)
    assert chosen.path == "ffpa" and words in chosen.reason


def test_bottom_right_with_equal_lengths_is_sdpas_is_causal():
    chosen = route(spec(128, is_causal=True), CUDABackend(causal_alignment="bottom_right"), False)
    assert chosen.path == "sdpa"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1, N, N), (B, H, N, N), (B, 1, 1, N)])
def test_fp32_masks_at_small_head_dims_stay_on_ffpa(dtype, shape):
    # SDPA's default (cuDNN) returns NaN or garbage for them.
    call = spec(128, dtype=dtype, mask_dtype="float32", mask_shape=shape)
    chosen = route(call, AUTO, False)
    assert chosen.path == "ffpa" and "fp32 additive mask" in chosen.reason


def test_masks_of_the_query_dtype_at_small_head_dims_go_to_sdpa():
    for dtype in ("bool", "bfloat16"):
        assert route(spec(128, mask_dtype=dtype, mask_shape=(B, 1, 1, N)), AUTO, False).path == "sdpa"


def test_sdpa_backends_for_an_fp32_mask_is_math_only_where_cudnn_is_chosen():
    backends, why = sdpa_backends(spec(128, mask_dtype="float32", mask_shape=(1, 1, N, N), needs_grad=True))
    assert backends == ("MATH",) and "fp32 mask" in why
    assert sdpa_backends(spec(CUDNN_FP32_MASK_MAX_HEAD_DIM + 8, mask_dtype="float32", mask_shape=(1, 1, N, N))) == (
        None,
        None,
    )


@pytest.mark.parametrize("nq,nkv", [(192, 192), (64, 300), (300, 320)])
def test_masked_backward_with_a_length_64_mod_128_avoids_cudnn(nq, nkv):
    call = spec(128, nq=nq, nkv=nkv, mask_dtype="bool", mask_shape=(B, 1, 1, nkv), needs_grad=True)
    backends, why = sdpa_backends(call)
    if nq % 128 == 64 or nkv % 128 == 64:
        assert backends == ("EFFICIENT_ATTENTION", "MATH") and "196678" in why
    else:
        assert backends is None


def test_sdpa_backends_leave_unaffected_calls_to_sdpa():
    assert sdpa_backends(spec(128)) == (None, None)
    assert sdpa_backends(spec(128, mask_dtype="bool", mask_shape=(B, 1, 1, N))) == (None, None)
    assert sdpa_backends(spec(128, device_type="cpu", mask_dtype="float32", mask_shape=(1, 1, N, N))) == (None, None)
    # Without grad, no backward: cuDNN's forward is right for these lengths.
    assert sdpa_backends(spec(128, nq=192, nkv=192, mask_dtype="bool", mask_shape=(B, 1, 1, 192))) == (None, None)


FP8 = CUDABackend(precision="fp8")


@pytest.mark.parametrize(
    "call",
    [
        spec(64),
        spec(256),
        spec(256, is_causal=True),
        spec(128, mask_dtype="bool", mask_shape=(B, 1, 1, N)),
        decode_spec(ROWS // 32, 32, 32, 512, d=512),  # MHA decode SDPA is measured faster at
        decode_spec(8, 32, 32, 8192, d=1024),
    ],
    ids=["d64", "d256", "d256-causal", "d128-bool-mask", "mha-decode-d512", "mha-decode-d1024"],
)
@pytest.mark.parametrize("hopper_family", [False, True])
def test_fp8_calls_are_never_routed_to_sdpa_for_speed(call, hopper_family):
    assert route(call, AUTO, False, hopper_family).path == "sdpa"  # the same call without FP8
    chosen = route(call, FP8, False, hopper_family)
    assert chosen.path == "ffpa" and "fp8" in chosen.reason


def train(d, n, h=16, **changes) -> CallSpec:
    """A B = 1 training call of H heads, Nq = Nkv = n (routing_sweep.py's shapes)."""
    return served_call_spec((1, h, n, d), (1, h, n, d), (1, h, n, d), needs_grad=True, **changes)


def mla_train(n: int) -> CallSpec:
    """Absorbed MLA's training call: D_qk 576 / D_v 512, Hq 32 over one KV head, causal, n keys."""
    return served_call_spec(
        (1, 32, n, 576), (1, 1, n, 576), (1, 1, n, 512), enable_gqa=True, is_causal=True, needs_grad=True
    )


# (call, path with the portable backward, path where the library runs its Hopper backward)
TRAINING_CALLS = {
    "d512": (spec(512, needs_grad=True), "ffpa", "ffpa"),  # 1.44-1.72x portable, 1.87-6.36x Hopper
    "d320-causal": (spec(320, is_causal=True, needs_grad=True), "ffpa", "ffpa"),
    "d768": (spec(768, needs_grad=True), "ffpa", "ffpa"),
    "d512-key-padding": (spec(512, mask_dtype="bool", mask_shape=(B, 1, 1, N), needs_grad=True), "ffpa", "ffpa"),
    "d256": (spec(256, needs_grad=True), "sdpa", "sdpa"),  # SDPA's flash / cuDNN backward
    "d128": (spec(128, needs_grad=True), "sdpa", "sdpa"),
    "d1024-n2048": (train(1024, 2048), "ffpa", "ffpa"),  # 1.11-1.43x portable, 4.92-5.14x Hopper
    "d1024-n4096": (train(1024, 4096), "sdpa", "ffpa"),  # 0.97x portable, 4.47-5.53x Hopper
    "d1024-n8192-dropout": (train(1024, 8192, dropout_p=0.1), "sdpa", "ffpa"),  # 0.81-0.99x; 2.78-3.82x
    "d896-n8192-causal": (train(896, 8192, is_causal=True), "sdpa", "ffpa"),
    "d640-n8192": (train(640, 8192, h=32), "ffpa", "ffpa"),  # 1.03x portable, 2.81-4.13x Hopper
    "mla-n1024": (mla_train(1024), "sdpa", "ffpa"),  # 0.63x portable, 1.45x Hopper
    "mla-n4096": (mla_train(4096), "ffpa", "ffpa"),  # 1.81x portable, 4.71x Hopper
}


@pytest.mark.parametrize("hopper_backward", [False, True], ids=["portable-backward", "hopper-backward"])
@pytest.mark.parametrize("name", TRAINING_CALLS)
def test_training_calls_under_auto_run_where_measured_faster(name, hopper_backward):
    call, portable_path, hopper_path = TRAINING_CALLS[name]
    path = hopper_path if hopper_backward else portable_path
    chosen = route(call, AUTO, return_lse=False, hopper_backward=hopper_backward)
    assert chosen.path == path, chosen.reason
    if path == "sdpa":
        assert "training" in chosen.reason and "measured" in chosen.reason
    for impl in ("ffpa", "sm80_split_d"):  # an explicit impl always trains on ffpa
        assert route(call, CUDABackend(impl=impl), False, hopper_backward=hopper_backward).path == "ffpa"


@pytest.mark.parametrize("hopper_backward", [False, True], ids=["portable-backward", "hopper-backward"])
def test_training_with_few_keys_stays_on_sdpa(hopper_backward):
    # MLA's shape with one KV head: each dK/dV CTA owns keys of one KV head, so few keys leave the GPU idle.
    # Portable backward: 1024 keys 0.63x, 4096 1.81x. Hopper backward: 1024 keys 1.45x (the fewest
    # measured), fewer unmeasured.
    fewest_on_ffpa = FFPA_TRAINS_MIN_KEYS_HOPPER if hopper_backward else FFPA_TRAINS_MIN_KEYS
    few = mla_train(fewest_on_ffpa // 2)
    chosen = route(few, AUTO, return_lse=False, hopper_backward=hopper_backward)
    assert chosen.path == "sdpa" and "keys" in chosen.reason
    assert route(mla_train(fewest_on_ffpa - 8), AUTO, False, hopper_backward=hopper_backward).path == "sdpa"
    assert route(mla_train(fewest_on_ffpa), AUTO, False, hopper_backward=hopper_backward).path == "ffpa"
    # B x Hkv x Nkv counts the keys: two sequences of 512 keys are 1024.
    batched = served_call_spec(
        (2, 32, 512, 576), (2, 1, 512, 576), (2, 1, 512, 512), enable_gqa=True, is_causal=True, needs_grad=True
    )
    assert route(batched, AUTO, False, hopper_backward=True).path == "ffpa"
    assert route(batched, AUTO, False, hopper_backward=False).path == "sdpa"


def test_the_hopper_backward_does_not_move_small_head_dims_off_sdpa():
    # D <= 256: SDPA's flash / cuDNN backward, whichever backward ffpa would run (0.18-0.68x).
    for call in (train(256, 8192, h=32), train(128, 4096, h=32, is_causal=True), spec(192, needs_grad=True)):
        chosen = route(call, AUTO, False, hopper_backward=True)
        assert chosen.path == "sdpa" and "256" in chosen.reason


def test_unequal_value_head_dims_route_by_the_wider_one():
    # D_qk 576 / D_v 512 (MLA, absorbed): ffpa 5.6-11.6x; D_qk 192 / D_v 128: SDPA 2.3-3x (H200).
    mla = served_call_spec((1, 16, 300, 576), (1, 1, 300, 576), (1, 1, 300, 512), enable_gqa=True)
    assert route(mla, AUTO, return_lse=False).path == "ffpa"
    prefill = served_call_spec((1, 16, 300, 192), (1, 16, 300, 192), (1, 16, 300, 128))
    chosen = route(prefill, AUTO, return_lse=False)
    assert chosen.path == "sdpa" and "256" in chosen.reason
    assert route(prefill, CUDABackend(impl="ffpa"), return_lse=False).path == "ffpa"
    wide_value = served_call_spec((1, 16, 300, 128), (1, 16, 300, 128), (1, 16, 300, 512))
    assert route(wide_value, AUTO, return_lse=False).path == "ffpa"



# --- where SDPA would raise (issue 31, finding 4c) --------------------------------------------------------


def refused_training_call(**changes) -> CallSpec:
    """Issue 31's call: bf16 q [2,1,1,1024], k/v [2,1,5,1024], an fp32 additive mask, requires grad."""
    fields = dict(mask_dtype="float32", mask_shape=(2, 1, 1, 5), needs_grad=True) | changes
    return served_call_spec((2, 1, 1, 1024), (2, 1, 5, 1024), (2, 1, 5, 1024), **fields)


@pytest.mark.parametrize("hopper_backward", [False, True])
def test_a_call_sdpa_raises_for_goes_to_ffpa_over_the_training_table(hopper_backward):
    call = refused_training_call()
    assert training_sdpa_reason(call, hopper_backward) is not None, "the training table alone picks SDPA"
    chosen = route(call, AUTO, False, hopper_backward=hopper_backward)
    assert chosen.path == "ffpa" and "invalid dtype for bias" in chosen.reason, chosen


@pytest.mark.parametrize("d, nkv", [(512, 512), (1024, 8192)])
def test_a_call_sdpa_raises_for_goes_to_ffpa_over_the_decode_table(d, nkv):
    call = decode_spec(ROWS // 32, 32, 32, nkv, d=d)
    assert route(call, AUTO, False).path == "sdpa"
    masked = replace(call, mask_dtype="float32", mask_shape=(1, 1, 1, nkv))
    assert route(masked, AUTO, False).path == "ffpa"


@pytest.mark.parametrize(
    "changes",
    [
        dict(mask_dtype="bfloat16"),  # the query's dtype: the memory-efficient kernel takes it
        dict(mask_dtype="bool"),  # SDPA converts it to the query's dtype
        dict(mask_dtype=None, mask_shape=None),
        dict(device_type="cpu"),  # SDPA's CPU kernels take an fp32 mask
    ],
)
def test_sdpa_raises_only_for_an_fp32_mask_with_half_inputs_on_cuda(changes):
    assert sdpa_refusal_reason(refused_training_call(**changes)) is None
    assert sdpa_refusal_reason(refused_training_call()) is not None
    assert sdpa_refusal_reason(refused_training_call(dtype="float16")) is not None


@pytest.mark.parametrize("d", range(8, 1025, 8))
@pytest.mark.parametrize("needs_grad", [False, True])
def test_every_fp32_mask_call_sdpa_gets_is_one_it_runs(d, needs_grad):
    # At D <= 256 SDPA gets such a call with its math kernel only (sdpa_backends); above, never (ffpa).
    call = spec(d, mask_dtype="float32", mask_shape=(1, 1, N, N), needs_grad=needs_grad)
    refused = sdpa_refusal_reason(call) is not None
    assert refused == (d > CUDNN_FP32_MASK_MAX_HEAD_DIM)
    chosen = route(call, AUTO, False)
    if chosen.path == "sdpa" or not refused:
        assert not refused and sdpa_backends(call)[0] == ("MATH",), (d, chosen)
