"""Dropout identical to SDPA's: with torch.manual_seed(s) before the call,
ffpa_attn_func keeps exactly the elements F.scaled_dot_product_attention keeps
(its memory-efficient kernel, the one SDPA runs for D > 256) and advances
torch's CUDA generator the same way (docs/kernels/sdpa_dropout.md)."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from attention_inputs import identity_values, odd_length, random_mask, uniform  # noqa: E402
from attention_reference import ORIGINAL_SDPA, assert_output_close  # noqa: E402
from dispatch_probe import run_and_check_served  # noqa: E402
from ffpa_attn import ffpa_attn_func  # noqa: E402

CUDA = "cuda"


def identity_call(rng, head_dim, dtype):
    """q, k small and v[j] = e_j: o[..., j] is nonzero exactly where key j is kept."""
    b, h = rng.randint(1, 3), rng.randint(1, 4)
    nq, nkv = odd_length(rng, 1, 200), odd_length(rng, 3, min(head_dim, 301))
    q = uniform((b, h, nq, head_dim), -0.5, 0.5, dtype, CUDA)
    k = uniform((b, h, nkv, head_dim), -0.5, 0.5, dtype, CUDA)
    v = identity_values(b, h, nkv, head_dim, dtype, CUDA)
    return q, k, v, nkv


@pytest.mark.parametrize("head_dim", [320, 512])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_dropout_keeps_what_sdpa_keeps(rng, seed, head_dim, causal, dtype):
    q, k, v, nkv = identity_call(rng, head_dim, dtype)
    p = rng.choice([0.1, 0.3, 0.6])
    torch.manual_seed(seed)
    ours, ran_ffpa = run_and_check_served(lambda: ffpa_attn_func(q, k, v, dropout_p=p, is_causal=causal))
    after_ours = torch.rand(4, device=CUDA)
    torch.manual_seed(seed)
    theirs = ORIGINAL_SDPA(q, k, v, dropout_p=p, is_causal=causal)
    after_theirs = torch.rand(4, device=CUDA)
    assert ran_ffpa, "D > 256: ffpa serves the call"
    kept, sdpa_kept = ours[..., :nkv] != 0, theirs[..., :nkv] != 0
    assert torch.equal(kept, sdpa_kept), f"{(kept != sdpa_kept).sum().item()} of {kept.numel()} keep decisions differ"
    assert_output_close(ours, theirs.float(), dtype)
    assert torch.equal(after_ours, after_theirs), "the generator advanced as SDPA advances it"


def test_dropout_with_a_mask_and_consecutive_calls_follow_sdpa(rng, seed):
    """A boolean mask, and three calls in a row (each starts where the last left the generator)."""
    q, k, v, nkv = identity_call(rng, 512, torch.bfloat16)
    b, h, nq = q.shape[0], q.shape[1], q.shape[2]
    mask = random_mask("batch-rows", torch.bool, b, h, nq, nkv, CUDA)
    torch.manual_seed(seed)
    ours = [ffpa_attn_func(q, k, v, attn_mask=mask, dropout_p=0.2) for _ in range(3)]
    torch.manual_seed(seed)
    theirs = [ORIGINAL_SDPA(q, k, v, attn_mask=mask, dropout_p=0.2) for _ in range(3)]
    for o, t in zip(ours, theirs):
        assert torch.equal(o[..., :nkv] != 0, t[..., :nkv] != 0)
    assert not torch.equal(ours[0], ours[1]), "each call draws new elements"
