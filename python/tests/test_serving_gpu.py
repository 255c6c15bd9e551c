"""The serving functions and the transformers integration on the GPU (skipped without CUDA): what
test_flash_attn_interface_cpu.py and test_transformers_integration_cpu.py check on the CPU reference, on
the library's GPU kernels, at the head dims serving engines and Gemma4 use.

- flash_attn_varlen_func (packed and paged) and flash_attn_with_kvcache in bf16 against the float64 semantics;
- torch.compile(fullgraph=True, inductor) and a CUDA graph capture and replay of both functions;
- transformers (Gemma4 text, sliding layers at head_dim 256, full layers at global_head_dim 512, GQA, random
  weights, bf16): "ffpa" on a padded batch against "sdpa"; the padding-free training step's loss and gradients
  against the padded step's; continuous batching's greedy tokens ("paged|ffpa") against transformers' own SDPA
  path ("paged|sdpa"), at head_dim = global_head_dim = 512 (transformers' paged cache keeps one head dim).
"""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from serving_reference import (  # noqa: E402
    assert_close,
    cumulative,
    packed_attention,
    paged_cache,
    same_pages,
    sequence_attention,
)

from ffpa_attn.flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402

CUDA = "cuda"
BF16 = 2e-2  # bf16 inputs and output against float64


def random_lengths(rng, count, low, high):
    return [rng.randint(low, high) for _ in range(count)]


@pytest.mark.parametrize("dim", [128, 256, 512, 576])
@pytest.mark.parametrize("extras", ["causal", "window", "softcap_sinks"])
def test_varlen_packed(rng, dim, extras):
    lengths_k = random_lengths(rng, rng.randint(1, 5), 1, 300)
    lengths_q = [rng.randint(1, n) for n in lengths_k]
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    q = torch.randn(int(cu_q[-1]), 8, dim, dtype=torch.bfloat16)
    k, v = (torch.randn(int(cu_k[-1]), 2, dim, dtype=torch.bfloat16) for _ in range(2))
    window = (rng.randint(0, 64), 0) if extras == "window" else (-1, -1)
    softcap = 30.0 if extras == "softcap_sinks" else 0.0
    sinks = torch.randn(8) if extras == "softcap_sinks" else None
    out, lse = flash_attn_varlen_func(
        q.to(CUDA), k.to(CUDA), v.to(CUDA), cu_q.to(CUDA), cu_k.to(CUDA), max(lengths_q), max(lengths_k),
        causal=True, window_size=window, softcap=softcap, s_aux=None if sinks is None else sinks.to(CUDA),
        return_softmax_lse=True,
    )  # fmt: skip
    expected_o, expected_lse = packed_attention(q, k, v, cu_q, cu_k, causal=True, window=window, softcap=softcap,
                                                sinks=sinks)  # fmt: skip
    assert_close(out.cpu(), expected_o, BF16, "out")
    assert_close(lse.cpu(), expected_lse, 1e-3, "softmax_lse")


@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
def test_varlen_paged(rng, page_size):
    dim = 256
    lengths_k = random_lengths(rng, 4, 1, 700)
    lengths_q = [rng.choice([1, rng.randint(1, n)]) for n in lengths_k]  # decode and prefill mixed
    cu_q, cu_k = cumulative(lengths_q), cumulative(lengths_k)
    q = torch.randn(int(cu_q[-1]), 8, dim, dtype=torch.bfloat16)
    k, v = (torch.randn(int(cu_k[-1]), 2, dim, dtype=torch.bfloat16) for _ in range(2))
    k_cache, table = paged_cache(k, cu_k, page_size, rng)
    v_cache = same_pages(v, cu_k, table, k_cache.shape[0], page_size)
    used = torch.tensor(lengths_k, dtype=torch.int32)
    out = flash_attn_varlen_func(
        q.to(CUDA), k_cache.to(CUDA), v_cache.to(CUDA), cu_q.to(CUDA), None, max(lengths_q), max(lengths_k),
        causal=True, block_table=table.to(CUDA), seqused_k=used.to(CUDA),
    )  # fmt: skip
    expected, _ = packed_attention(q, k, v, cu_q, cu_k, causal=True)
    assert_close(out.cpu(), expected, BF16, "out")


def test_with_kvcache_appends_and_attends(rng):
    batch, n_cache, dim = 3, 300, 512
    q = torch.randn(batch, 1, 8, dim, dtype=torch.bfloat16, device=CUDA)
    k_cache, v_cache = (torch.randn(batch, n_cache, 2, dim, dtype=torch.bfloat16, device=CUDA) for _ in range(2))
    k_new, v_new = (torch.randn(batch, 1, 2, dim, dtype=torch.bfloat16, device=CUDA) for _ in range(2))
    cached = [rng.randint(0, n_cache - 2) for _ in range(batch)]
    out = flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=torch.tensor(cached, dtype=torch.int32, device=CUDA),
        causal=True,
    )  # fmt: skip
    for b in range(batch):
        assert torch.equal(k_cache[b, cached[b]], k_new[b, 0]) and torch.equal(v_cache[b, cached[b]], v_new[b, 0])
        used = cached[b] + 1
        expected, _ = sequence_attention(q[b].cpu(), k_cache[b, :used].cpu(), v_cache[b, :used].cpu(), causal=True)
        assert_close(out[b].cpu(), expected, BF16, f"out[{b}]")


def test_opcheck(rng):
    lengths = random_lengths(rng, 3, 1, 90)
    cu = cumulative(lengths).to(CUDA)
    q = torch.randn(int(cu[-1]), 8, 256, dtype=torch.bfloat16, device=CUDA).unsqueeze(0).transpose(1, 2)
    k, v = (torch.randn(int(cu[-1]), 2, 256, dtype=torch.bfloat16, device=CUDA).unsqueeze(0).transpose(1, 2)
            for _ in range(2))  # fmt: skip
    sinks = torch.randn(8, device=CUDA)
    arguments = (cu, cu, None, None, sinks, None, None, max(lengths), max(lengths), 0.0625, 2, 31, 0, 20.0, 0, True)
    torch.library.opcheck(
        torch.ops.ffpa_attn.serving_forward.default,
        (q, k, v, *arguments),
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


def test_compile_and_cuda_graph(rng):
    lengths = random_lengths(rng, 4, 1, 200)
    cu = cumulative(lengths).to(CUDA)
    q, k, v = (torch.randn(int(cu[-1]), 8, 512, dtype=torch.bfloat16, device=CUDA) for _ in range(3))
    cache = torch.randn(64, 16, 2, 512, dtype=torch.bfloat16, device=CUDA)
    table = torch.randperm(64, device=CUDA)[:32].view(4, 8).to(torch.int32)
    seqlens = torch.tensor([rng.randint(1, 128) for _ in range(4)], dtype=torch.int32, device=CUDA)

    def serve(q, k, v, cache, seqlens):
        packed = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, window_size=(63, 0))
        decoded = flash_attn_with_kvcache(q[:4, None], cache, cache, cache_seqlens=seqlens, block_table=table,
                                          causal=True)  # fmt: skip
        return packed, decoded

    eager = serve(q, k, v, cache, seqlens)
    compiled = torch.compile(serve, fullgraph=True)
    for got, expected in zip(compiled(q, k, v, cache, seqlens), eager, strict=True):
        assert torch.equal(got, expected)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        serve(q, k, v, cache, seqlens)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = serve(q, k, v, cache, seqlens)
    q.copy_(torch.randn_like(q))
    seqlens.copy_(torch.tensor([rng.randint(1, 128) for _ in range(4)], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    for got, expected in zip(captured, serve(q, k, v, cache, seqlens), strict=True):
        assert torch.equal(got, expected), "the replay follows the new inputs (lengths read on the device)"


# --- transformers -------------------------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")
HAS_GEMMA4 = hasattr(transformers, "Gemma4TextConfig")
needs_gemma4 = pytest.mark.skipif(not HAS_GEMMA4, reason=f"transformers {transformers.__version__}: no Gemma4")

if HAS_GEMMA4:
    import ffpa_attn.integrations.transformers  # noqa: E402,F401  (registers "ffpa")
    from transformers_models import (  # noqa: E402
        continuous_batching_tokens,
        gemma4,
        packed_batch,
        padded_batch,
        random_sequences,
        training_step,
    )


def gemma4_serving_sizes(dtype=torch.bfloat16, head_dim=256, global_head_dim=512):
    """Weights drawn wide enough (std 0.2) that the logits are decisive: two correct attentions' rounding
    does not flip a greedy token (at std 0.05 in bf16 it did, on the CPU reference against SDPA)."""
    return gemma4(head_dim, global_head_dim, dtype, CUDA, sliding_window=64, heads=8, kv_heads=2, hidden=256,
                  vocab=512, initializer_range=0.2)  # fmt: skip


@needs_gemma4
def test_transformers_padded_batch_matches_sdpa(rng):
    model = gemma4_serving_sizes()
    input_ids, mask, _ = padded_batch(random_sequences(rng, 4, 20, 150, vocab=512), CUDA)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=mask).logits.float()
        model.set_attn_implementation("ffpa")
        got = model(input_ids, attention_mask=mask).logits.float()
    real = mask.bool()
    assert_close(got[real].cpu(), expected[real].double().cpu(), 5e-2, "logits")


@needs_gemma4
def test_transformers_padding_free_training_step_matches_the_padded_step(rng):
    """bf16 steps against the float32 step of the same weights (SDPA, padded): the padding-free ffpa step is
    as close to it as transformers' own padded bf16 SDPA step is (bf16 rounds differently per batch layout,
    so the two bf16 steps are compared through the exact one)."""
    model = gemma4_serving_sizes()
    exact_model = gemma4_serving_sizes(torch.float32)
    exact_model.load_state_dict({name: t.float() for name, t in model.state_dict().items()})
    sequences = random_sequences(rng, 4, 20, 150, vocab=512)
    input_ids, mask, labels = padded_batch(sequences, CUDA)
    packed_ids, position_ids, packed_labels = packed_batch(sequences, CUDA)
    padded = dict(input_ids=input_ids, attention_mask=mask, labels=labels)
    exact_loss, exact_grads = training_step(exact_model, "sdpa", **padded)
    sdpa_loss, sdpa_grads = training_step(model, "sdpa", **padded)
    padded_loss, padded_grads = training_step(model, "ffpa", **padded)
    loss, grads = training_step(model, "ffpa", input_ids=packed_ids, position_ids=position_ids, labels=packed_labels)

    def error(got, expected):
        return ((got.double() - expected.double()).norm() / max(expected.double().norm().item(), 1e-12)).item()

    floor = error(sdpa_loss, exact_loss)
    for name, got in (("padded ffpa", padded_loss), ("padding-free ffpa", loss)):
        assert error(got, exact_loss) <= 2 * floor + 1e-3, f"{name} loss {got.item()} vs {exact_loss.item()}"
    assert grads.keys() == padded_grads.keys() == exact_grads.keys()
    for name in exact_grads:
        floor = error(sdpa_grads[name], exact_grads[name])
        for which, got in (("padded", padded_grads[name]), ("padding-free", grads[name])):
            assert error(got, exact_grads[name]) <= 2 * floor + 1e-2, f"{which} {name}: {error(got, exact_grads[name]):.3e}"


@needs_gemma4
def test_transformers_continuous_batching_gives_sdpas_greedy_tokens(rng):
    model = gemma4_serving_sizes(torch.float16, head_dim=512, global_head_dim=512)
    prompts = random_sequences(rng, 6, 3, 40, vocab=512)
    expected = continuous_batching_tokens(model, "paged|sdpa", prompts, 12, block_size=16, num_blocks=64)
    assert continuous_batching_tokens(model, "paged|ffpa", prompts, 12, block_size=16, num_blocks=64) == expected
