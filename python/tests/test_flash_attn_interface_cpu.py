"""flash_attn_varlen_func and flash_attn_with_kvcache on the library's CPU reference (host tensors): FlashAttention's
arguments and layouts against the float64 serving semantics (serving_reference.py) on fresh random batches of odd
lengths; every argument the library cannot serve raises NotImplementedError naming it; the custom ops' fake
implementations; torch.compile(fullgraph=True) traces the functions; the varlen backward."""

import math

import pytest

torch = pytest.importorskip("torch")

from serving_reference import (  # noqa: E402
    assert_close,
    cumulative,
    packed_attention,
    paged_cache,
    same_pages,
    sequence_attention,
)  # noqa: E402

from ffpa_attn import serving_ops  # noqa: E402
from ffpa_attn.flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402

TOLERANCE = 1e-5  # f32 inputs, the reference accumulates in f64


def random_lengths(rng, count, low, high):
    return [rng.randint(low, high) for _ in range(count)]


def window_case(rng):
    return rng.choice([(-1, -1), (rng.randint(0, 6), -1), (rng.randint(0, 6), rng.randint(0, 4)), (-1, 2)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extras", ["plain", "window", "softcap", "sinks", "all"])
def test_varlen_packed_matches_the_semantics(rng, causal, extras):
    batch, heads_kv = rng.randint(1, 4), rng.choice([1, 2])
    heads_q, dim, value_dim = heads_kv * rng.choice([1, 3]), 8 * rng.randint(1, 4), 8 * rng.randint(1, 4)
    lengths_k = random_lengths(rng, batch, 0, 13)
    lengths_q = [rng.randint(0, n) for n in lengths_k]  # queries: each sequence's last tokens
    first = rng.randint(0, 3)  # cu_seqlens_q need not start at 0: rows before are no sequence's
    cu_q, cu_k = cumulative(lengths_q, first), cumulative(lengths_k)
    total_q = int(cu_q[-1]) + rng.randint(0, 2)
    q, k = torch.randn(total_q, heads_q, dim), torch.randn(int(cu_k[-1]), heads_kv, dim)
    v = torch.randn(int(cu_k[-1]), heads_kv, value_dim)
    options = dict(causal=causal)
    if extras in ("window", "all"):
        options["window"] = window_case(rng)
    if extras in ("softcap", "all"):
        options["softcap"] = rng.uniform(0.5, 5.0)
    sinks = torch.randn(heads_q) if extras in ("sinks", "all") else None

    out, lse, probs = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q, default=0), max(lengths_k, default=0), causal=causal,
        window_size=options.get("window", (-1, -1)), softcap=options.get("softcap", 0.0), return_attn_probs=True,
        s_aux=sinks,
    )  # fmt: skip
    expected_o, expected_lse = packed_attention(q, k, v, cu_q, cu_k, sinks=sinks, **options)
    rows = slice(first, int(cu_q[-1]))
    assert out.shape == (total_q, heads_q, value_dim) and out.is_contiguous()
    assert lse.shape == (heads_q, total_q) and lse.dtype == torch.float32 and probs is None
    assert_close(out[rows], expected_o[rows], TOLERANCE, "out")
    assert_close(lse[:, rows], expected_lse[:, rows], TOLERANCE, "softmax_lse")


def test_rows_of_no_sequence_are_not_written_through_out(rng):
    lengths = random_lengths(rng, 3, 1, 9)
    cu = cumulative(lengths, 2)
    total = int(cu[-1]) + 3
    q, k, v = torch.randn(total, 2, 16), torch.randn(total, 2, 16), torch.randn(total, 2, 16)
    out = torch.full_like(q, math.nan)
    returned = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, out=out)
    assert returned is out
    expected, _ = packed_attention(q, k, v, cu, cu, causal=True)
    assert_close(out[2 : int(cu[-1])], expected[2 : int(cu[-1])], TOLERANCE, "out")
    assert out[:2].isnan().all() and out[int(cu[-1]) :].isnan().all(), "rows of no sequence stay as they were"


@pytest.mark.parametrize("page_size", [1, 3, 8, 16])
def test_varlen_paged_reads_the_cache_through_the_block_table(rng, page_size):
    batch, heads_q, heads_kv, dim = rng.randint(1, 4), 4, 2, 24
    lengths_k = random_lengths(rng, batch, 1, 20)
    lengths_q = [rng.randint(1, n) for n in lengths_k]
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    q = torch.randn(int(cu_q[-1]), heads_q, dim)
    k, v = torch.randn(int(cu_k[-1]), heads_kv, dim), torch.randn(int(cu_k[-1]), heads_kv, dim)
    k_cache, table = paged_cache(k, cu_k, page_size, rng)
    v_cache = same_pages(v, cu_k, table, k_cache.shape[0], page_size)
    used = torch.tensor([rng.randint(0, n) for n in lengths_k], dtype=torch.int32)
    window = window_case(rng)

    # FlashAttention 2's form: cu_seqlens_k gives the lengths.
    out = flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True, window_size=window,
        block_table=table,
    )  # fmt: skip
    expected, _ = packed_attention(q, k, v, cu_q, cu_k, causal=True, window=window)
    assert_close(out, expected, TOLERANCE, "out (cu_seqlens_k)")
    # vLLM's form: seqused_k and the table, no cu_seqlens_k.
    out = flash_attn_varlen_func(
        q, k_cache, v_cache, cu_q, None, max(lengths_q), max(lengths_k), causal=True, block_table=table,
        seqused_k=used,
    )  # fmt: skip
    expected, _ = packed_attention(q, k, v, cu_q, cu_k, seqused_k=used, causal=True)
    assert_close(out, expected, TOLERANCE, "out (seqused_k)")


@pytest.mark.parametrize("form", ["batched", "cache_batch_idx", "paged"])
@pytest.mark.parametrize("append", [False, True])
def test_with_kvcache_matches_the_semantics(rng, form, append):
    batch, heads_q, heads_kv, dim, n_cache = rng.randint(1, 4), 6, 2, 16, 24
    n_q = rng.randint(1, 4)
    new = rng.randint(1, 3) if append else 0
    cached = [rng.randint(0, n_cache - new - 1) for _ in range(batch)]
    seqlens = torch.tensor(cached, dtype=torch.int32)
    q = torch.randn(batch, n_q, heads_q, dim)
    k_new, v_new = torch.randn(batch, new, heads_kv, dim), torch.randn(batch, new, heads_kv, dim)
    keys = torch.randn(batch, n_cache, heads_kv, dim)
    values = torch.randn(batch, n_cache, heads_kv, dim)
    expected_keys, expected_values = keys.clone(), values.clone()
    for b in range(batch):
        expected_keys[b, cached[b] : cached[b] + new] = k_new[b]
        expected_values[b, cached[b] : cached[b] + new] = v_new[b]
    arguments = {}
    if form == "batched":
        k_cache, v_cache = keys.clone(), values.clone()
    elif form == "cache_batch_idx":
        rows = torch.randperm(batch + 2)[:batch]
        k_cache, v_cache = torch.randn(batch + 2, n_cache, heads_kv, dim), torch.randn(batch + 2, n_cache, heads_kv, dim)
        k_cache[rows], v_cache[rows] = keys, values
        arguments["cache_batch_idx"] = rows.to(torch.int32)
    else:
        cu = cumulative([n_cache] * batch)
        k_cache, table = paged_cache(keys.reshape(-1, heads_kv, dim), cu, 4, rng)
        v_cache = same_pages(values.reshape(-1, heads_kv, dim), cu, table, k_cache.shape[0], 4)
        arguments["block_table"] = table
    window = window_case(rng)
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new if append else None, v_new if append else None, cache_seqlens=seqlens,
        causal=True, window_size=window, return_softmax_lse=True, **arguments,
    )  # fmt: skip
    assert out.shape == (batch, n_q, heads_q, dim) and lse.shape == (batch, heads_q, n_q)
    for b in range(batch):
        used = cached[b] + new
        expected_o, expected_lse = sequence_attention(
            q[b], expected_keys[b, :used], expected_values[b, :used], causal=True, window=window
        )
        assert_close(out[b], expected_o, TOLERANCE, f"out[{b}]")
        assert_close(lse[b], expected_lse, TOLERANCE, f"lse[{b}]")
    if append:  # the new keys are in the caches, where the form puts sequence b's position p
        if form == "batched":
            assert torch.equal(k_cache, expected_keys) and torch.equal(v_cache, expected_values)
        elif form == "cache_batch_idx":
            assert torch.equal(k_cache[rows], expected_keys) and torch.equal(v_cache[rows], expected_values)
        else:
            for b in range(batch):
                for p in range(cached[b], cached[b] + new):
                    page, row = int(table[b, p // 4]), p % 4
                    assert torch.equal(k_cache[page, row], expected_keys[b, p])
                    assert torch.equal(v_cache[page, row], expected_values[b, p])


def test_e4m3_cache_with_descales(rng):
    batch, heads_q, heads_kv, dim, n_cache = 2, 4, 2, 16, 11
    q = torch.randn(batch, 3, heads_q, dim, dtype=torch.bfloat16)
    k_cache = torch.randn(batch, n_cache, heads_kv, dim).to(torch.float8_e4m3fn)
    v_cache = torch.randn(batch, n_cache, heads_kv, dim).to(torch.float8_e4m3fn)
    k_descale, v_descale = torch.rand(batch, heads_kv) + 0.5, torch.rand(batch, heads_kv) + 0.5
    seqlens = torch.tensor([n_cache, rng.randint(3, n_cache)], dtype=torch.int32)
    out = flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, k_descale=k_descale, v_descale=v_descale
    )
    for b in range(batch):
        used = int(seqlens[b])
        expected, _ = sequence_attention(
            q[b].float(), k_cache[b, :used].float(), v_cache[b, :used].float(), causal=True, k_scale=k_descale[b],
            v_scale=v_descale[b],
        )  # fmt: skip
        assert_close(out[b], expected, 1e-2, f"out[{b}]")  # bf16 out


@pytest.mark.parametrize(
    "argument, value",
    [("dropout_p", 0.1), ("alibi_slopes", "tensor"), ("q_descale", "tensor")],
)
def test_varlen_refuses_what_it_cannot_serve_naming_the_argument(argument, value):
    q = torch.randn(5, 2, 16)
    cu = cumulative([2, 3])
    value = torch.ones(2) if value == "tensor" else value
    with pytest.raises(NotImplementedError, match=argument):
        flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, **{argument: value})


@pytest.mark.parametrize("argument", ["rotary_cos", "rotary_sin", "cache_leftpad", "alibi_slopes", "q_descale"])
def test_with_kvcache_refuses_what_it_cannot_serve_naming_the_argument(argument):
    q, cache = torch.randn(2, 1, 2, 16), torch.randn(2, 5, 2, 16)
    with pytest.raises(NotImplementedError, match=argument):
        flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3, **{argument: torch.ones(2)})


def test_bad_arguments_get_their_own_errors():
    q, cu = torch.randn(5, 2, 16), cumulative([2, 3])
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flash_attn_varlen_func(q, q, q, cu, None, 3, 3)
    with pytest.raises(ValueError, match="q must have 3 dims"):
        flash_attn_varlen_func(q[None], q, q, cu, cu, 3, 3)
    with pytest.raises(ValueError, match="impl"):
        flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, impl="fastest")
    with pytest.raises(NotImplementedError, match="out="):
        flash_attn_varlen_func(q.clone().requires_grad_(), q, q, cu, cu, 3, 3, out=torch.empty_like(q))
    from ffpa_attn._library import FFPAError

    with pytest.raises(FFPAError, match="invalid_sequence_lengths"):  # the library checks host lengths
        flash_attn_varlen_func(torch.randn(5, 2, 16), q, q, cumulative([4, 3]), cu, 4, 3)
    cache = torch.randn(2, 5, 2, 16)
    with pytest.raises(ValueError, match="cache_seqlens"):
        flash_attn_with_kvcache(torch.randn(2, 1, 2, 16), cache, cache, cache[:, :1], cache[:, :1])


def test_fake_implementations_give_the_outputs_layouts():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(37, 8, 64, dtype=torch.bfloat16).unsqueeze(0).transpose(1, 2)
        k = torch.empty(11, 16, 2, 64, dtype=torch.bfloat16).transpose(1, 2)
        v = torch.empty(11, 16, 2, 48, dtype=torch.bfloat16).transpose(1, 2)
        cu, table = torch.empty(4, dtype=torch.int32), torch.empty(3, 5, dtype=torch.int32)
        arguments = (cu, None, table, None, None, None, None, 0, 0, 0.125, 2, -1, -1, 0.0, 0)
        o, lse = torch.ops.ffpa_attn.serving_forward(q, k, v, *arguments, True)
        assert o.shape == (1, 8, 37, 48) and o[0].transpose(0, 1).is_contiguous()
        assert lse.shape == (1, 8, 37) and lse.dtype == torch.float32
        _, lse = torch.ops.ffpa_attn.serving_forward(q, k, v, *arguments, False)
        assert lse.numel() == 0
        out = torch.empty(37, 8, 48, dtype=torch.bfloat16)
        lse = torch.ops.ffpa_attn.serving_forward_out(q, k, v, out.unsqueeze(0).transpose(1, 2), *arguments, True)
        assert lse.shape == (1, 8, 37)


def test_compile_fullgraph_traces_both_functions(rng):
    lengths = random_lengths(rng, 3, 1, 9)
    cu = cumulative(lengths)
    q, k, v = (torch.randn(int(cu[-1]), 4, 16) for _ in range(3))
    cache = torch.randn(3, 12, 4, 16)
    seqlens = torch.tensor(lengths, dtype=torch.int32)

    def serve(q, k, v, cache, seqlens):
        packed = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, window_size=(3, 0))
        decoded = flash_attn_with_kvcache(q[:3, None], cache, cache, cache_seqlens=seqlens, causal=True)
        return packed, decoded

    compiled = torch.compile(serve, backend="aot_eager", fullgraph=True)
    for got, expected in zip(compiled(q, k, v, cache, seqlens), serve(q, k, v, cache, seqlens), strict=True):
        assert got.shape == expected.shape and torch.equal(got, expected)


def test_varlen_backward_without_the_library_backward_says_so(rng):
    if serving_ops.BACKWARD_TAKES_SEQUENCES:
        pytest.skip("the library's backward takes a sequence batch: test_varlen_gradients runs instead")
    cu = cumulative([3, 4])
    q, k, v = (torch.randn(7, 2, 16, requires_grad=True) for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, cu, cu, 4, 4, causal=True)
    expected, _ = packed_attention(q.detach(), k.detach(), v.detach(), cu, cu, causal=True)
    assert_close(out.detach(), expected, TOLERANCE, "the forward runs")
    with pytest.raises(NotImplementedError, match="sequence batch"):
        out.sum().backward()


@pytest.mark.skipif(
    not serving_ops.BACKWARD_TAKES_SEQUENCES,
    reason="the ffpa library's backward takes no sequence batch yet (ffpa_backward_params.sequences)",
)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gradients(rng, causal):
    lengths_k = random_lengths(rng, 3, 1, 9)
    lengths_q = [rng.randint(1, n) for n in lengths_k]
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    q = torch.randn(int(cu_q[-1]), 4, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 2, 24, dtype=torch.float64, requires_grad=True)

    def attention(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal)

    torch.autograd.gradcheck(attention, (q, k, v))


@pytest.mark.skipif(
    not serving_ops.BACKWARD_TAKES_SEQUENCES,
    reason="the ffpa library's backward takes no sequence batch yet (ffpa_backward_params.sequences)",
)
@pytest.mark.parametrize("extras", ["window", "sinks", "softcap"])
def test_varlen_gradients_of_the_serving_options(rng, extras):
    # Against autograd through the float64 semantics: a window, sinks (their gradient: s_aux.grad) and
    # the softcap (the CPU reference's backward serves each).
    lengths_k = random_lengths(rng, 3, 1, 11)
    lengths_q = [rng.randint(1, n) for n in lengths_k]
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    q = torch.randn(int(cu_q[-1]), 4, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(int(cu_k[-1]), 2, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(int(cu_k[-1]), 2, 8, dtype=torch.float64, requires_grad=True)
    sinks = torch.randn(4, requires_grad=True) if extras == "sinks" else None
    window = (rng.randint(0, 4), rng.randint(0, 2)) if extras == "window" else (-1, -1)
    softcap = 2.5 if extras == "softcap" else 0.0
    weights = torch.randn(int(cu_q[-1]), 4, 8, dtype=torch.float64)

    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True,
                                 window_size=window, softcap=softcap, s_aux=sinks)  # fmt: skip
    got = torch.autograd.grad((out * weights).sum(), [t for t in (q, k, v, sinks) if t is not None])
    reference_sinks = sinks.detach().double().requires_grad_() if sinks is not None else None
    expected_o, _ = packed_attention(q, k, v, cu_q, cu_k, causal=True, window=window, softcap=softcap,
                                     sinks=reference_sinks)  # fmt: skip
    expected = torch.autograd.grad(
        (expected_o * weights).sum(), [t for t in (q, k, v, reference_sinks) if t is not None]
    )
    for name, g, e in zip(("d_q", "d_k", "d_v", "d_sinks"), got, expected):
        assert_close(g.double(), e, 1e-5, name)


def test_opcheck(rng):
    lengths = random_lengths(rng, 3, 1, 9)
    cu = cumulative(lengths)
    q = torch.randn(int(cu[-1]), 4, 16).unsqueeze(0).transpose(1, 2)
    k, v = (torch.randn(int(cu[-1]), 2, 16).unsqueeze(0).transpose(1, 2) for _ in range(2))
    arguments = (cu, cu, None, None, torch.randn(4), None, None, max(lengths), max(lengths), 0.25, 2, 3, 0, 2.0, 0, True)
    torch.library.opcheck(
        torch.ops.ffpa_attn.serving_forward.default,
        (q, k, v, *arguments),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    out = torch.empty(int(cu[-1]), 4, 16).unsqueeze(0).transpose(1, 2)
    torch.library.opcheck(
        torch.ops.ffpa_attn.serving_forward_out.default,
        (q, k, v, out, *arguments),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_packed_backward_refusal_asks_the_library(monkeypatch):
    from ffpa_attn import decide

    decide.packed_backward_refusal.cache_clear()
    if not serving_ops.BACKWARD_TAKES_SEQUENCES:
        assert "takes no sequence batch" in decide.packed_backward_refusal(False, False)
        # A binding whose backward had the batch: the library's validation answers for the options.
        monkeypatch.setattr(serving_ops, "BACKWARD_TAKES_SEQUENCES", True)
    decide.packed_backward_refusal.cache_clear()
    try:
        for window, softcap in ((True, False), (False, True)):
            reason = decide.packed_backward_refusal(window, softcap)
            assert reason is None or "invalid_option" in reason, reason
        assert decide.packed_backward_refusal(False, False) is None
    finally:
        decide.packed_backward_refusal.cache_clear()


def test_an_impl_that_serves_no_such_call_raises_not_implemented():
    q, cu = torch.randn(5, 2, 16, dtype=torch.bfloat16), cumulative([2, 3])
    with pytest.raises(NotImplementedError, match="flash_attn_varlen_func: .*sm80_split_d"):
        flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, impl="sm80_split_d")  # host tensors: the CPU reference's
