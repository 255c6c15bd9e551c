"""ffpa_attn.integrations.transformers on CPU tensors (the library's CPU reference): tiny Gemma4 text models
(sliding layers at head_dim 16, full layers at global_head_dim 32, GQA, random weights, fp32) under
attn_implementation "ffpa" against transformers' own "sdpa": padded batches, padding-free packed batches
(forward, and a training step's loss and gradients against the padded step's), and continuous batching
("paged|ffpa" against "paged|sdpa") giving the same greedy tokens. test_serving_gpu.py runs the same on CUDA."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4TextConfig"):
    pytest.skip(f"transformers {transformers.__version__} has no Gemma4TextConfig", allow_module_level=True)

import ffpa_attn.integrations.transformers as ffpa_transformers  # noqa: E402
from transformers_models import (  # noqa: E402
    continuous_batching_tokens,
    gemma4,
    generate_tokens,
    packed_batch,
    padded_batch,
    random_sequences,
    training_step,
)

CPU = "cpu"
TOLERANCE = 1e-4  # fp32 model; ffpa's CPU reference accumulates in f64, SDPA's math in f32


@pytest.fixture
def cpu_memory(monkeypatch):
    """transformers sizes the continuous-batching cache from the host's memory, read through psutil (not
    installed here): a fixed 1 GiB instead."""
    from transformers.generation.continuous_batching import cache

    monkeypatch.setattr(cache, "get_device_and_memory_breakdown", lambda: (torch.device(CPU), 1 << 30, 0, 0))


def test_registered_names():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert AttentionInterface._global_mapping["ffpa"] is ffpa_transformers.ffpa_attention_forward
    assert AttentionInterface._global_mapping["paged|ffpa"] is ffpa_transformers.ffpa_paged_attention_forward
    assert "ffpa" in AttentionMaskInterface._global_mapping


def test_padded_batch_matches_sdpa(rng):
    model = gemma4(16, 32, torch.float32, CPU)
    input_ids, mask, _ = padded_batch(random_sequences(rng, 3, 2, 13), CPU)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=mask).logits
        model.set_attn_implementation("ffpa")
        got = model(input_ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=TOLERANCE, atol=TOLERANCE)


def test_padding_free_forward_matches_the_padded_one(rng):
    """The packed path (flash_attn_varlen_func: windows per sequence, GQA, D 16 and 32) gives each
    sequence's logits of the padded batch."""
    model = gemma4(16, 32, torch.float32, CPU)
    sequences = random_sequences(rng, 3, 2, 13)
    input_ids, mask, _ = padded_batch(sequences, CPU)
    packed_ids, position_ids, _ = packed_batch(sequences, CPU)
    with torch.no_grad():
        expected = model(input_ids, attention_mask=mask).logits[mask.bool()]
        model.set_attn_implementation("ffpa")
        got = model(packed_ids, position_ids=position_ids).logits[0]
    torch.testing.assert_close(got, expected, rtol=TOLERANCE, atol=TOLERANCE)


def test_padding_free_training_step_matches_the_padded_step(rng):
    model = gemma4(16, 32, torch.float32, CPU)
    sequences = random_sequences(rng, 3, 2, 13)
    input_ids, mask, labels = padded_batch(sequences, CPU)
    packed_ids, position_ids, packed_labels = packed_batch(sequences, CPU)
    expected_loss, expected_grads = training_step(model, "sdpa", input_ids=input_ids, attention_mask=mask, labels=labels)
    padded_loss, padded_grads = training_step(model, "ffpa", input_ids=input_ids, attention_mask=mask, labels=labels)
    loss, grads = training_step(model, "ffpa", input_ids=packed_ids, position_ids=position_ids, labels=packed_labels)
    torch.testing.assert_close(padded_loss, expected_loss, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(loss, padded_loss, rtol=TOLERANCE, atol=TOLERANCE)
    assert grads.keys() == padded_grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(padded_grads[name], expected_grads[name], rtol=1e-3, atol=1e-5, msg=name)
        torch.testing.assert_close(grad, padded_grads[name], rtol=1e-3, atol=1e-5, msg=name)


def test_continuous_batching_gives_sdpas_greedy_tokens(rng, cpu_memory):
    """transformers' continuous batching keeps one head dim for its paged cache, so its Gemma4 here has
    head_dim == global_head_dim (a 256 / 512 model fails in transformers' PagedAttentionCache)."""
    model = gemma4(16, 16, torch.float32, CPU)
    prompts = random_sequences(rng, 4, 1, 11)
    expected = continuous_batching_tokens(model, "paged|sdpa", prompts, 7)
    assert expected == generate_tokens(model, "sdpa", prompts, 7), "transformers' own paths agree"
    assert continuous_batching_tokens(model, "paged|ffpa", prompts, 7) == expected


def test_paged_forward_without_a_cache_says_so():
    model = gemma4(16, 16, torch.float32, CPU)
    model.set_attn_implementation("paged|ffpa")
    with pytest.raises(ValueError, match="paged attention cache"):
        with torch.no_grad():
            model(torch.tensor([[3, 4, 5]]), use_cache=False)
