"""ffpa_attn_func on the GPU against SDPA computed in float32 on upcast inputs:
randomized odd shapes, head dims 8..1024, every mask broadcast pattern and dtype,
both causal alignments, GQA, LSE, strided inputs, fp16 accumulation, dropout with
the library's own keep-mask, streams, and the calls that go to the fallback."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from attention_inputs import (  # noqa: E402
    MASK_KINDS,
    MASK_PATTERNS,
    attention_input,
    identity_values,
    mask_dtype,
    odd_length,
    random_mask,
    random_qkv,
    uniform,
)
from attention_reference import (  # noqa: E402
    ORIGINAL_SDPA,
    assert_lse_close,
    assert_output_close,
    causal_mask,
    dropout_attention_float32,
    logsumexp_float64,
    sdpa_float32,
)
from dispatch_probe import (  # noqa: E402
    REJECTED_CASES,
    SDPA_OWN_CASES,
    assert_same_outcome,
    capture_fallback_reasons,
    fallback_reasons,
    run_and_check_served,
)
from ffpa_attn import CUDABackend  # noqa: E402
from ffpa_attn import ffpa_attn_func as auto_attn_func  # noqa: E402

CUDA = "cuda"
DTYPES = [torch.bfloat16, torch.float16]
HEAD_DIMS = [8, 16, 24, 40, 64, 72, 96, 128, 136, 200, 256, 320, 392, 512, 520, 640, 776, 1000, 1024]


def ffpa_attn_func(*args, backend=None, **kwargs):
    """The drop-in on the library's kernels: impl "ffpa" unless the test names a family.

    (With impl "auto" D <= 256 goes to SDPA's own kernels: test_routing_gpu.py
    tests that routing; the auto-only behaviour, fallback and SDPA's outcome,
    is tested here through auto_attn_func.)"""
    if backend is None:
        backend = CUDABackend(impl="ffpa")
    elif backend.impl == "auto":
        backend = dataclasses.replace(backend, impl="ffpa")
    return auto_attn_func(*args, backend=backend, **kwargs)


def served(call):
    """call()'s result, asserting that the library (not the fallback) ran it."""
    result, ran_ffpa = run_and_check_served(call)
    assert ran_ffpa, "the library should serve this call, not the SDPA fallback"
    return result


def check_output(out, q, expected):
    assert out.device == q.device and out.dtype == q.dtype
    assert_output_close(out, expected, q.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_head_dims(rng, head_dim, dtype):
    b, h, nq, nkv = rng.randint(1, 2), rng.randint(1, 3), odd_length(rng, 1, 301), odd_length(rng, 1, 301)
    q, k, v = random_qkv(b, h, h, nq, nkv, head_dim, dtype, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v))
    check_output(out, q, sdpa_float32(q, k, v))


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("pattern", MASK_PATTERNS)
def test_masks(rng, pattern, kind):
    dtype = rng.choice(DTYPES)
    b, h, d = 2, rng.randint(2, 3), rng.choice([64, 136, 512])
    nq, nkv = odd_length(rng, 1, 201), odd_length(rng, 1, 201)
    q, k, v = random_qkv(b, h, h, nq, nkv, d, dtype, CUDA)
    mask = random_mask(pattern, mask_dtype(kind, dtype), b, h, nq, nkv, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, attn_mask=mask))
    check_output(out, q, sdpa_float32(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_rows_without_keys_give_zero_and_minus_infinity(rng, kind):
    dtype = rng.choice(DTYPES)
    b, h, nq, nkv, d = 2, 2, 33, 47, 128
    q, k, v = random_qkv(b, h, h, nq, nkv, d, dtype, CUDA)
    mask = random_mask("full", mask_dtype(kind, dtype), b, h, nq, nkv, CUDA)
    excluded = False if kind == "bool" else float("-inf")
    mask[0, 1, 5] = excluded
    mask[1, 0, nq - 1] = excluded
    out, lse = served(lambda: ffpa_attn_func(q, k, v, attn_mask=mask, return_lse=True))
    assert torch.equal(out[0, 1, 5], torch.zeros_like(out[0, 1, 5]))
    assert torch.equal(out[1, 0, nq - 1], torch.zeros_like(out[1, 0, nq - 1]))
    check_output(out, q, sdpa_float32(q, k, v, attn_mask=mask))
    assert_lse_close(lse, logsumexp_float64(q, k, mask))


SEQUENCE_RELATIONS = {"nq<nkv": (37, 129), "nq=nkv": (129, 129), "nq>nkv": (129, 37), "decode": (1, 257)}


@pytest.mark.parametrize("relation", SEQUENCE_RELATIONS)
@pytest.mark.parametrize("alignment", ["top_left", "bottom_right"])
def test_causal(rng, alignment, relation):
    dtype = rng.choice(DTYPES)
    nq, nkv = SEQUENCE_RELATIONS[relation]
    q, k, v = random_qkv(2, 2, 2, nq, nkv, rng.choice([64, 320, 1024]), dtype, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, is_causal=True, backend=CUDABackend(causal_alignment=alignment)))
    if alignment == "top_left":  # SDPA's own is_causal is the oracle of what top-left means
        expected = sdpa_float32(q, k, v, is_causal=True)
    else:
        expected = sdpa_float32(q, k, v, attn_mask=causal_mask(nq, nkv, "bottom_right", CUDA))
    check_output(out, q, expected)


def test_causal_alignment_needs_is_causal(rng):
    q, k, v = random_qkv(1, 2, 2, 65, 33, 128, torch.bfloat16, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, backend=CUDABackend(causal_alignment="bottom_right")))
    check_output(out, q, sdpa_float32(q, k, v))


@pytest.mark.parametrize("extra", ["plain", "causal", "mask"])
@pytest.mark.parametrize(("heads_q", "heads_kv"), [(4, 1), (6, 3), (8, 2)])
def test_gqa(rng, heads_q, heads_kv, extra):
    dtype = rng.choice(DTYPES)
    b, nq, nkv = 2, odd_length(rng, 1, 201), odd_length(rng, 1, 201)
    q, k, v = random_qkv(b, heads_q, heads_kv, nq, nkv, rng.choice([72, 256, 640]), dtype, CUDA)
    kwargs = dict(enable_gqa=True)
    if extra == "causal":
        kwargs["is_causal"] = True
    elif extra == "mask":
        kwargs["attn_mask"] = random_mask("full", torch.bool, b, heads_q, nq, nkv, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, **kwargs))
    check_output(out, q, sdpa_float32(q, k, v, **kwargs))


LSE_CASES = ["plain", "scale", "gqa", "causal-top-left", "causal-bottom-right", "bool-mask", "float32-mask"]


@pytest.mark.parametrize("case", LSE_CASES)
def test_return_lse(rng, case):
    dtype = rng.choice(DTYPES)
    b, hq, nq, nkv = 2, 4, odd_length(rng, 41, 201), odd_length(rng, 1, 39)  # Nq > Nkv: bottom-right has empty rows
    hkv = 2 if case == "gqa" else hq
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, rng.choice([40, 384, 1024]), dtype, CUDA)
    mask = causal = scale = None
    kwargs = {}
    if case == "scale":
        scale = kwargs["scale"] = 0.3
    elif case == "gqa":
        kwargs["enable_gqa"] = True
    elif case.startswith("causal"):
        causal = case.removeprefix("causal-").replace("-", "_")
        kwargs.update(is_causal=True, backend=CUDABackend(causal_alignment=causal))
    elif case.endswith("mask"):
        mask = kwargs["attn_mask"] = random_mask(
            "batch-rows", torch.bool if case == "bool-mask" else torch.float32, b, hq, nq, nkv, CUDA
        )
    out, lse = served(lambda: ffpa_attn_func(q, k, v, return_lse=True, **kwargs))
    reference_mask = causal_mask(nq, nkv, causal, CUDA) if causal else mask
    check_output(out, q, sdpa_float32(q, k, v, attn_mask=reference_mask, scale=scale, enable_gqa=case == "gqa"))
    assert lse.device == q.device and lse.is_contiguous()
    assert_lse_close(lse, logsumexp_float64(q, k, mask, causal, scale))


@pytest.mark.parametrize("layout", ["bnhd", "padded-rows", "mixed"])
def test_strided_inputs(rng, layout):
    dtype = rng.choice(DTYPES)
    b, hq, hkv, nq, nkv, d = 2, 4, 2, odd_length(rng, 1, 201), odd_length(rng, 1, 201), rng.choice([64, 200, 512])
    q_layout, k_layout, v_layout = ("bnhd", "bhnd", "padded-rows") if layout == "mixed" else (layout,) * 3
    q = attention_input((b, hq, nq, d), -2.0, 2.0, dtype, CUDA, q_layout)
    k = attention_input((b, hkv, nkv, d), -1.0, 1.0, dtype, CUDA, k_layout)
    v = attention_input((b, hkv, nkv, d), -1.0, 1.0, dtype, CUDA, v_layout)
    out = served(lambda: ffpa_attn_func(q, k, v, is_causal=True, enable_gqa=True))
    check_output(out, q, sdpa_float32(q, k, v, is_causal=True, enable_gqa=True))
    assert out.stride() == torch.empty_like(q).stride(), "o's memory layout follows q's"
    if q_layout == "bnhd":
        assert out.transpose(1, 2).is_contiguous(), "a [B, N, H, D] q gives a [B, N, H, D]-memory o"


def misaligned(t):
    """A copy of t whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.parametrize("case", ["last-dim-not-contiguous", "misaligned"])
def test_inputs_the_library_cannot_read_in_place(rng, case):
    dtype = rng.choice(DTYPES)
    q, k, v = random_qkv(1, 2, 2, odd_length(rng, 1, 99), odd_length(rng, 1, 99), 64, dtype, CUDA)
    if case == "misaligned":
        q, k, v = misaligned(q), misaligned(k), misaligned(v)
    else:  # logical [B, H, N, D] views of [B, H, D, N] memory: D is the strided dim
        q, k, v = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v))
    out = served(lambda: ffpa_attn_func(q, k, v))
    check_output(out, q, sdpa_float32(q, k, v))


@pytest.mark.parametrize("extra", ["plain", "causal", "mask", "gqa"])
def test_f16_accumulation(rng, extra):
    b, hq, nq, nkv = 2, 4, odd_length(rng, 1, 201), odd_length(rng, 1, 201)
    hkv = 2 if extra == "gqa" else hq
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, rng.choice([72, 128, 520, 1024]), torch.float16, CUDA)
    kwargs = {
        "plain": {},
        "causal": dict(is_causal=True),
        "gqa": dict(enable_gqa=True),
        "mask": dict(attn_mask=random_mask("batch-keys", torch.float16, b, hq, nq, nkv, CUDA)),
    }[extra]
    out = served(lambda: ffpa_attn_func(q, k, v, backend=CUDABackend(accumulation="f16"), **kwargs))
    check_output(out, q, sdpa_float32(q, k, v, **kwargs))


def test_bf16_with_f16_accumulation_raises(rng):
    q, k, v = random_qkv(1, 2, 2, 17, 17, 64, torch.bfloat16, CUDA)
    with pytest.raises(ValueError, match="accumulation"):
        ffpa_attn_func(q, k, v, backend=CUDABackend(accumulation="f16"))


def test_explicit_impl_serves(rng):
    q, k, v = random_qkv(1, 2, 2, 65, 97, 256, torch.bfloat16, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, backend=CUDABackend(impl="sm80_split_d")))
    check_output(out, q, sdpa_float32(q, k, v))


def is_sm90():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not torch.cuda.is_available() or not is_sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("head_dim", [512, 1024])
def test_explicit_sm90_impl_serves_large_head_dim(rng, head_dim):
    q, k, v = random_qkv(1, 2, 2, 65, 200, head_dim, torch.bfloat16, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, backend=CUDABackend(impl="sm90_wgmma")))
    check_output(out, q, sdpa_float32(q, k, v))


@pytest.mark.skipif(not torch.cuda.is_available() or not is_sm90(), reason="needs an sm_90 GPU")
def test_explicit_sm90_impl_refuses_f16_accumulation(rng):
    q, k, v = random_qkv(1, 2, 2, 17, 17, 512, torch.float16, CUDA)
    with pytest.raises(NotImplementedError, match="sm90_wgmma"):
        ffpa_attn_func(q, k, v, backend=CUDABackend(impl="sm90_wgmma", accumulation="f16"))


DROPOUT_CASES = ["plain", "causal-top-left", "causal-bottom-right", "mask", "gqa"]


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
@pytest.mark.parametrize("case", DROPOUT_CASES)
def test_dropout_matches_library_keep_mask(rng, case, dropout_p):
    pytest.importorskip("numpy")
    from sdpa_dropout_reference import sdpa_mem_efficient_keep_mask

    dtype = rng.choice(DTYPES)
    b, hq, nq, nkv = 2, 4, odd_length(rng, 1, 129), odd_length(rng, 1, 129)
    hkv = 2 if case == "gqa" else hq
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, rng.choice([64, 320, 1024]), dtype, CUDA)
    # Seeds and offsets over their whole int64 range: both 32-bit halves go into the key.
    dropout_seed, dropout_offset = rng.getrandbits(63), rng.getrandbits(63)
    mask = causal = None
    kwargs = dict(enable_gqa=case == "gqa")
    if case.startswith("causal"):
        causal = case.removeprefix("causal-").replace("-", "_")
        kwargs["is_causal"] = True
    elif case == "mask":
        mask = kwargs["attn_mask"] = random_mask("batch-rows", torch.bool, b, hq, nq, nkv, CUDA)
    backend = CUDABackend(
        causal_alignment=causal or "top_left", dropout_seed=dropout_seed, dropout_offset=dropout_offset
    )
    out, lse = served(lambda: ffpa_attn_func(q, k, v, dropout_p=dropout_p, backend=backend, return_lse=True, **kwargs))

    keep = torch.from_numpy(sdpa_mem_efficient_keep_mask(dropout_seed, dropout_offset, b, hq, nq, nkv, dropout_p))
    check_output(out, q, dropout_attention_float32(q, k, v, keep, dropout_p, mask, causal))
    assert_lse_close(lse, logsumexp_float64(q, k, mask, causal))  # before dropout


@pytest.mark.parametrize("dropout_p", [0.2, 0.7])
def test_dropout_keep_pattern_is_exactly_the_library_mask(rng, dropout_p):
    """With v[j] = e_j, o[..., j] is 0 exactly where key j is dropped."""
    pytest.importorskip("numpy")
    from sdpa_dropout_reference import sdpa_mem_efficient_keep_mask

    b, hq, hkv, nq, nkv, d = 2, 4, 2, 77, 201, 256
    q = uniform((b, hq, nq, d), -0.5, 0.5, torch.bfloat16, CUDA)
    k = uniform((b, hkv, nkv, d), -0.5, 0.5, torch.bfloat16, CUDA)
    v = identity_values(b, hkv, nkv, d, torch.bfloat16, CUDA)
    backend = CUDABackend(dropout_seed=rng.getrandbits(63), dropout_offset=rng.getrandbits(63))
    out = served(lambda: ffpa_attn_func(q, k, v, dropout_p=dropout_p, enable_gqa=True, backend=backend))
    kept = (out[..., :nkv] != 0).cpu()
    keep = torch.from_numpy(sdpa_mem_efficient_keep_mask(backend.dropout_seed, backend.dropout_offset, b, hq, nq, nkv, dropout_p))
    assert torch.equal(kept, keep), f"{(kept != keep).sum().item()} of {keep.numel()} keep decisions differ"


def test_dropout_default_seed_comes_from_torch_generator(seed):
    q, k, v = random_qkv(1, 2, 2, 65, 65, 128, torch.bfloat16, CUDA)
    torch.manual_seed(seed)
    first = served(lambda: ffpa_attn_func(q, k, v, dropout_p=0.3))
    torch.manual_seed(seed)
    replayed = ffpa_attn_func(q, k, v, dropout_p=0.3)
    following = ffpa_attn_func(q, k, v, dropout_p=0.3)
    assert torch.equal(first, replayed), "torch.manual_seed reproduces the dropout mask"
    assert not torch.equal(replayed, following), "each call draws a fresh dropout seed"


def test_dropout_zero_is_no_dropout(rng):
    q, k, v = random_qkv(1, 2, 2, 33, 65, 64, torch.float16, CUDA)
    out = served(lambda: ffpa_attn_func(q, k, v, dropout_p=0.0, backend=CUDABackend(dropout_seed=5)))
    check_output(out, q, sdpa_float32(q, k, v))


def nested_qkv():
    """Jagged nested q, k, v of [B, H, j, D] (the layout SDPA takes nested tensors in)."""
    lengths, heads, head_dim = (5, 17, 9), 2, 64
    make = lambda: torch.nested.nested_tensor(  # noqa: E731
        [torch.randn(n, heads, head_dim) for n in lengths], layout=torch.jagged, device=CUDA, dtype=torch.bfloat16
    ).transpose(1, 2)
    return make(), make(), make()


FALLBACK_CASES = {
    "float32": lambda: random_qkv(2, 2, 2, 33, 47, 64, torch.float32, CUDA),
    "float64": lambda: random_qkv(1, 2, 2, 17, 19, 32, torch.float64, CUDA),
    "D1032": lambda: random_qkv(1, 2, 2, 33, 47, 1032, torch.bfloat16, CUDA),
    "D12": lambda: random_qkv(1, 2, 2, 33, 47, 12, torch.float16, CUDA),
    "D100": lambda: random_qkv(1, 2, 2, 33, 47, 100, torch.bfloat16, CUDA),
    "requires-grad": lambda: [t.requires_grad_() for t in random_qkv(1, 2, 2, 33, 47, 64, torch.bfloat16, CUDA)],
    "nested": nested_qkv,
}


@pytest.mark.parametrize("case", FALLBACK_CASES)
def test_fallback_is_sdpa(case, caplog):
    q, k, v = FALLBACK_CASES[case]()
    is_causal = case != "nested"  # SDPA takes no is_causal with nested tensors
    capture_fallback_reasons(caplog)
    out, ran_ffpa = run_and_check_served(lambda: auto_attn_func(q, k, v, is_causal=is_causal))
    expected = ORIGINAL_SDPA(q, k, v, is_causal=is_causal)
    assert not ran_ffpa, "the library cannot serve this call"
    assert fallback_reasons(caplog), "the fallback reason is logged at DEBUG"
    assert out.device == q.device and out.dtype == q.dtype
    if case == "nested":  # back to [B, j, H, D]: values() is then the packed [sum(j), H, D] buffer
        assert out.is_nested
        assert torch.equal(out.transpose(1, 2).values(), expected.transpose(1, 2).values())
    else:
        assert torch.equal(out, expected)
    if case == "requires-grad":
        grad = torch.randn_like(out)
        got_grads = torch.autograd.grad(out, (q, k, v), grad)
        expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
        # SDPA's fused backward kernels accumulate with atomics: equal up to rounding, not bitwise.
        for got, want in zip(got_grads, expected_grads):
            assert_output_close(got, want, want.dtype)


def test_requires_grad_without_grad_mode_is_served(rng):
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 33, 47, 64, torch.bfloat16, CUDA))
    with torch.no_grad():
        out = served(lambda: ffpa_attn_func(q, k, v))
    check_output(out, q, sdpa_float32(q.detach(), k.detach(), v.detach()))


def test_explicit_impl_on_unservable_call_raises():
    q, k, v = random_qkv(1, 2, 2, 17, 17, 64, torch.float32, CUDA)
    with pytest.raises(NotImplementedError) as error:
        ffpa_attn_func(q, k, v, backend=CUDABackend(impl="sm80_split_d"))
    assert "float32" in str(error.value), str(error.value)


@pytest.mark.parametrize("case", SDPA_OWN_CASES)
def test_sdpa_outcome_passes_through(case):
    q, k, v = random_qkv(1, 4, 4, 33, 47, 128, torch.bfloat16, CUDA)
    kwargs = dict(query=q, key=k, value=v) | SDPA_OWN_CASES[case](q, k, v)
    assert_same_outcome(lambda: auto_attn_func(**kwargs), lambda: ORIGINAL_SDPA(**kwargs))


@pytest.mark.parametrize("case", REJECTED_CASES)
def test_invalid_sdpa_arguments_raise_without_calling_sdpa(case):
    q, k, v = random_qkv(1, 4, 4, 33, 47, 128, torch.bfloat16, CUDA)
    build, named = REJECTED_CASES[case]
    with pytest.raises(RuntimeError, match=named):
        auto_attn_func(**(dict(query=q, key=k, value=v) | build(q, k, v)))


def test_runs_on_current_stream(rng):
    """Inputs written on a busy side stream: a call on that stream must wait for them."""
    q, k, v = random_qkv(2, 4, 4, 129, 257, 256, torch.bfloat16, CUDA)
    new_q = torch.rand_like(q) * 4 - 2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(50_000_000)  # the copy below lands well after the default stream moved on
        q.copy_(new_q)
        out = served(lambda: ffpa_attn_func(q, k, v, return_lse=True))
    torch.cuda.current_stream().wait_stream(stream)
    check_output(out[0], q, sdpa_float32(new_q, k, v))
    assert_lse_close(out[1], logsumexp_float64(new_q, k))


def test_no_host_synchronization(rng):
    b, h, nq, nkv = 2, 4, 65, 129
    q, k, v = random_qkv(b, h, h, nq, nkv, 512, torch.bfloat16, CUDA)
    mask = random_mask("batch-keys", torch.float32, b, h, nq, nkv, CUDA)
    backend = CUDABackend(dropout_seed=rng.getrandbits(63))
    ffpa_attn_func(q, k, v, attn_mask=mask, dropout_p=0.1, backend=backend, return_lse=True)  # first-call setup
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ffpa_attn_func(q, k, v, attn_mask=mask, dropout_p=0.1, backend=backend, return_lse=True)
        ffpa_attn_func(q, k, v, dropout_p=0.1)  # the default seed is drawn on the host, without a sync
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_outputs_on_the_inputs_device(rng):
    device = torch.device(CUDA, 1)
    q, k, v = random_qkv(1, 2, 2, 65, 33, 128, torch.float16, device)
    with torch.cuda.device(0):
        out, lse = served(lambda: ffpa_attn_func(q, k, v, return_lse=True))
    assert out.device == device and lse.device == device
    check_output(out, q, sdpa_float32(q, k, v))
