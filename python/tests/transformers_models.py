"""Tiny Gemma4 text models from configs with random weights (nothing downloaded) and the batches the
transformers integration tests feed them: padded, padding-free packed, and continuous batching's prompts."""

import torch
from transformers import ContinuousBatchingConfig, Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig


def gemma4(head_dim, global_head_dim, dtype, device, sliding_window=5, layers=4, heads=4, kv_heads=2, hidden=64,
           vocab=97, initializer_range=0.02):  # fmt: skip
    """A Gemma4ForCausalLM of `layers` layers alternating sliding (head_dim) and full (global_head_dim)
    attention, GQA, no per-layer embeddings, seeded weights, in eval mode."""
    config = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, global_head_dim=global_head_dim,
        sliding_window=sliding_window, layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=vocab, max_position_embeddings=512,
        pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=initializer_range,
    )  # fmt: skip
    torch.manual_seed(1234)
    return Gemma4ForCausalLM(config).to(device=device, dtype=dtype).eval()


def padded_batch(sequences, device):
    """input_ids, attention_mask and labels [B, max_len], right-padded (padding: id 0, label -100)."""
    longest = max(len(s) for s in sequences)
    input_ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    mask = torch.zeros(len(sequences), longest, dtype=torch.long)
    for b, tokens in enumerate(sequences):
        input_ids[b, : len(tokens)] = torch.tensor(tokens)
        mask[b, : len(tokens)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)
    return input_ids.to(device), mask.to(device), labels.to(device)


def packed_batch(sequences, device):
    """input_ids, position_ids and labels [1, total]: the sequences one after another, positions restarting,
    each sequence's first label -100 (transformers' DataCollatorWithFlattening), so that the packed loss
    counts the tokens the padded one does."""
    input_ids = torch.tensor([[t for s in sequences for t in s]])
    position_ids = torch.tensor([[i for s in sequences for i in range(len(s))]])
    labels = input_ids.clone()
    labels[position_ids == 0] = -100
    return input_ids.to(device), position_ids.to(device), labels.to(device)


def random_sequences(rng, count, low, high, vocab=97):
    return [[rng.randint(3, vocab - 1) for _ in range(rng.randint(low, high))] for _ in range(count)]


def training_step(model, implementation, **batch):
    """The loss and the parameters' gradients of one step under attention `implementation`."""
    model.set_attn_implementation(implementation)
    model.train()
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    model.eval()
    return loss.detach(), grads


def continuous_batching_tokens(model, implementation, prompts, new_tokens, block_size=4, num_blocks=64):
    """Greedy tokens of transformers' continuous batching (generate_batch) under `implementation`
    ("paged|..."), per prompt in order."""
    model.set_attn_implementation(implementation)
    generation = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    batching = ContinuousBatchingConfig(
        block_size=block_size, num_blocks=num_blocks, max_batch_tokens=64, use_cuda_graph=False
    )
    outputs = model.generate_batch(prompts, generation_config=generation, continuous_batching_config=batching,
                                   warmup=False)  # fmt: skip
    by_id = {int(name.removeprefix("req_")): output.generated_tokens for name, output in outputs.items()}
    assert sorted(by_id) == list(range(len(prompts))), f"{implementation}: requests failed (transformers' log says why)"
    return [by_id[i] for i in range(len(prompts))]


def generate_tokens(model, implementation, prompts, new_tokens):
    """Greedy tokens of model.generate (a DynamicCache), one prompt at a time."""
    model.set_attn_implementation(implementation)
    tokens = []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(prompt) :].tolist())
    return tokens
