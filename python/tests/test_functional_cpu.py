"""ffpa_attn_func on CPU tensors: the library never serves them, so every call is
SDPA's (bit for bit), including its errors, its dropout RNG and its gradients;
the extras (return_lse, bottom-right causal) still hold on this fallback path."""

import pytest

torch = pytest.importorskip("torch")

from attention_inputs import MASK_KINDS, MASK_PATTERNS, mask_dtype, odd_length, random_mask, random_qkv  # noqa: E402
from attention_reference import (  # noqa: E402
    ORIGINAL_SDPA,
    assert_lse_close,
    assert_output_close,
    causal_mask,
    logsumexp_float64,
    sdpa_float32,
)
from dispatch_probe import (  # noqa: E402
    REJECTED_CASES,
    SDPA_OWN_CASES,
    assert_same_outcome,
    capture_fallback_reasons,
    fallback_reasons,
)
from ffpa_attn import CUDABackend, explain, ffpa_attn_func  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def small_call(rng, dtype, heads_kv=4, layout="bhnd"):
    """Random CPU q, k, v of a small odd shape, and its sizes (B, Hq, Nq, Nkv)."""
    b, hq, d = rng.randint(1, 2), 4, rng.choice([8, 24, 64, 72])
    nq, nkv = odd_length(rng, 1, 33), odd_length(rng, 1, 33)
    return random_qkv(b, hq, heads_kv, nq, nkv, d, dtype, "cpu", layout), (b, hq, nq, nkv)


FEATURES = {
    "plain": {},
    "scale": dict(scale=0.3),
    "causal": dict(is_causal=True),
    "gqa": dict(enable_gqa=True),
    "dropout": dict(dropout_p=0.3),
}


def assert_same_as_sdpa(seed, q, k, v, **kwargs):
    # Same RNG state for both: the fallback must not draw from the generator before SDPA does.
    torch.manual_seed(seed)
    out = ffpa_attn_func(q, k, v, **kwargs)
    torch.manual_seed(seed)
    expected = ORIGINAL_SDPA(q, k, v, **kwargs)
    assert out.dtype == q.dtype and out.device.type == "cpu"
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("feature", FEATURES)
def test_cpu_call_is_sdpa_bit_for_bit(rng, seed, feature, layout, dtype):
    (q, k, v), _ = small_call(rng, dtype, heads_kv=2 if feature == "gqa" else 4, layout=layout)
    assert_same_as_sdpa(seed, q, k, v, **FEATURES[feature])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("pattern", MASK_PATTERNS)
def test_cpu_masked_call_is_sdpa_bit_for_bit(rng, seed, pattern, kind, dtype):
    (q, k, v), (b, hq, nq, nkv) = small_call(rng, dtype)
    mask = random_mask(pattern, mask_dtype(kind, dtype), b, hq, nq, nkv, "cpu")
    assert_same_as_sdpa(seed, q, k, v, attn_mask=mask)


def test_cpu_fallback_logs_reason_at_debug(rng, caplog):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    capture_fallback_reasons(caplog)
    ffpa_attn_func(q, k, v)
    reasons = fallback_reasons(caplog)
    assert reasons, "the fallback reason is logged at DEBUG on logger 'ffpa_attn'"
    assert any("cpu" in reason.lower() for reason in reasons), reasons


LSE_CASES = {
    "plain": dict(),
    "scale": dict(scale=0.7),
    "gqa": dict(enable_gqa=True),
    "causal-top-left": dict(is_causal=True),
    "causal-bottom-right": dict(is_causal=True, backend=CUDABackend(causal_alignment="bottom_right")),
    "bool-mask-with-empty-row": dict(attn_mask="bool-empty-row"),
    "additive-float32-mask": dict(attn_mask="float32"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", LSE_CASES)
def test_return_lse_on_fallback(rng, case, dtype):
    b, hq, nq, nkv, d = 2, 4, 23, 13, 40  # Nq > Nkv: bottom-right leaves rows without keys
    q, k, v = random_qkv(b, hq, 2 if case == "gqa" else hq, nq, nkv, d, dtype, "cpu")
    kwargs = dict(LSE_CASES[case])
    if kwargs.get("attn_mask") == "bool-empty-row":
        kwargs["attn_mask"] = random_mask("full", torch.bool, b, hq, nq, nkv, "cpu")
        kwargs["attn_mask"][1, 2, 5] = False
    elif kwargs.get("attn_mask") == "float32":
        kwargs["attn_mask"] = random_mask("batch-rows", torch.float32, b, hq, nq, nkv, "cpu")
    out, lse = ffpa_attn_func(q, k, v, return_lse=True, **kwargs)

    alignment = kwargs["backend"].causal_alignment if "backend" in kwargs else "top_left"
    causal = alignment if kwargs.get("is_causal") else None
    mask = causal_mask(nq, nkv, causal, "cpu") if causal else kwargs.get("attn_mask")
    expected = sdpa_float32(q, k, v, attn_mask=mask, scale=kwargs.get("scale"), enable_gqa=case == "gqa")
    assert out.dtype == dtype and out.device.type == "cpu"
    assert_output_close(out, expected, dtype)
    assert lse.device.type == "cpu"
    assert_lse_close(lse, logsumexp_float64(q, k, kwargs.get("attn_mask"), causal, kwargs.get("scale")))


def test_bottom_right_causal_on_fallback(rng):
    (q, k, v), (_, _, nq, nkv) = small_call(rng, torch.float32)
    out = ffpa_attn_func(q, k, v, is_causal=True, backend=CUDABackend(causal_alignment="bottom_right"))
    assert_output_close(
        out, sdpa_float32(q, k, v, attn_mask=causal_mask(nq, nkv, "bottom_right", "cpu")), torch.float32
    )


def test_explicit_impl_raises_not_implemented_with_reason(rng):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    with pytest.raises(NotImplementedError) as error:
        ffpa_attn_func(q, k, v, backend=CUDABackend(impl="sm80_split_d"))
    assert "cpu" in str(error.value).lower(), str(error.value)


def test_bf16_with_f16_accumulation_raises_value_error(rng):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    with pytest.raises(ValueError, match="accumulation"):
        ffpa_attn_func(q, k, v, backend=CUDABackend(accumulation="f16"))


def test_f16_accumulation_with_fp16_falls_back_on_cpu(rng):
    (q, k, v), _ = small_call(rng, torch.float16)
    assert torch.equal(ffpa_attn_func(q, k, v, backend=CUDABackend(accumulation="f16")), ORIGINAL_SDPA(q, k, v))


@pytest.mark.parametrize("case", SDPA_OWN_CASES)
def test_sdpa_outcome_passes_through(rng, case):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    kwargs = dict(query=q, key=k, value=v) | SDPA_OWN_CASES[case](q, k, v)
    assert_same_outcome(lambda: ffpa_attn_func(**kwargs), lambda: ORIGINAL_SDPA(**kwargs))


@pytest.mark.parametrize("case", REJECTED_CASES)
def test_invalid_sdpa_arguments_raise_like_sdpa(rng, case):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    build, named = REJECTED_CASES[case]
    kwargs = dict(query=q, key=k, value=v) | build(q, k, v)
    with pytest.raises(RuntimeError, match=named):
        ffpa_attn_func(**kwargs)
    with pytest.raises(RuntimeError):
        ORIGINAL_SDPA(**kwargs)


def test_gradients_are_sdpa_gradients(rng):
    (q, k, v), _ = small_call(rng, torch.float32)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    reference_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = ffpa_attn_func(*inputs, is_causal=True)
    expected = ORIGINAL_SDPA(*reference_inputs, is_causal=True)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for name, got, want in zip("qkv", inputs, reference_inputs):
        assert torch.equal(got.grad, want.grad), f"d{name}"


@pytest.mark.parametrize("return_lse", [False, True])
def test_compiles_fullgraph_on_fallback(rng, caplog, return_lse):
    torch._dynamo.reset()
    capture_fallback_reasons(caplog)  # logging on: it must not break the graph
    (q, k, v), (b, hq, nq, nkv) = small_call(rng, torch.float32)
    mask = random_mask("batch-keys", torch.bool, b, hq, nq, nkv, "cpu")

    def attention(q, k, v, mask):
        return ffpa_attn_func(q, k, v, attn_mask=mask, scale=0.5, return_lse=return_lse)

    compiled = torch.compile(attention, fullgraph=True, backend="eager")
    got, eager = compiled(q, k, v, mask), attention(q, k, v, mask)
    if return_lse:
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    else:
        assert torch.equal(got, eager)


FP8 = CUDABackend(precision="fp8")


def test_fp8_on_cpu_is_sdpa_and_the_reason_says_fp8(rng, caplog):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    capture_fallback_reasons(caplog)
    out = ffpa_attn_func(q, k, v, is_causal=True, backend=FP8)
    assert torch.equal(out, ORIGINAL_SDPA(q, k, v, is_causal=True))
    reasons = fallback_reasons(caplog)
    assert any("fp8" in reason and "cpu" in reason for reason in reasons), reasons
    said = explain(q, k, v, is_causal=True, backend=FP8)
    assert said.startswith("PyTorch SDPA") and "fp8" in said, said


def test_fp8_with_grad_keeps_sdpas_gradients_and_says_why(rng, caplog):
    # No backward in the library: a grad call goes to SDPA as without FP8, the reason saying FP8 is not applied.
    (q, k, v), _ = small_call(rng, torch.float32)
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    reference_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    capture_fallback_reasons(caplog)
    out = ffpa_attn_func(*inputs, backend=FP8)
    expected = ORIGINAL_SDPA(*reference_inputs)
    assert torch.equal(out, expected)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for name, got, want in zip("qkv", inputs, reference_inputs):
        assert torch.equal(got.grad, want.grad), f"d{name}"
    reasons = fallback_reasons(caplog)
    assert any("fp8" in reason and "inputs' precision" in reason for reason in reasons), reasons


def test_what_has_no_backward_is_said_for_calls_that_need_grad():
    # On CUDA tensors these reach the check (on CPU ones "tensors on cpu" comes first): FP8 and fp16
    # accumulation have no backward; everything else the library can differentiate.
    from ffpa_attn.decide import _no_gradient_reason
    from call_specs import served_call_spec

    grad = served_call_spec((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64), needs_grad=True)
    assert "fp8" in _no_gradient_reason(grad, CUDABackend(precision="fp8"))
    assert "fp16 accumulation" in _no_gradient_reason(grad, CUDABackend(accumulation="f16"))
    assert _no_gradient_reason(grad, CUDABackend()) is None
    no_grad = served_call_spec((1, 2, 8, 64), (1, 2, 8, 64), (1, 2, 8, 64))
    assert _no_gradient_reason(no_grad, CUDABackend(precision="fp8")) is None


def test_fp8_with_an_explicit_impl_on_cpu_raises_saying_fp8(rng):
    (q, k, v), _ = small_call(rng, torch.bfloat16)
    with pytest.raises(NotImplementedError) as error:
        ffpa_attn_func(q, k, v, backend=CUDABackend(impl="sm90_wgmma", precision="fp8"))
    assert "fp8" in str(error.value) and "cpu" in str(error.value).lower(), str(error.value)
