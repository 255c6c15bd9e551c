"""monkey_patch() / unpatch(), and ffpa_attn_func installed as
F.scaled_dot_product_attention: the drop-in promise of the package."""

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from attention_inputs import random_mask, random_qkv  # noqa: E402
from attention_reference import ORIGINAL_SDPA, assert_output_close  # noqa: E402
from dispatch_probe import capture_fallback_reasons, fallback_reasons, run_and_check_served  # noqa: E402
from ffpa_attn import ffpa_attn_func, monkey_patch, unpatch  # noqa: E402


@pytest.fixture(autouse=True)
def restored_sdpa():
    """Every test leaves F.scaled_dot_product_attention as it found it, even when it fails."""
    before = F.scaled_dot_product_attention
    yield before
    unpatch()
    F.scaled_dot_product_attention = before


def test_monkey_patch_installs_and_unpatch_restores(restored_sdpa):
    monkey_patch()
    assert F.scaled_dot_product_attention is ffpa_attn_func
    unpatch()
    assert F.scaled_dot_product_attention is restored_sdpa


def test_patch_and_unpatch_are_idempotent(restored_sdpa):
    unpatch()  # not patched: nothing to do
    assert F.scaled_dot_product_attention is restored_sdpa
    monkey_patch()
    monkey_patch()
    assert F.scaled_dot_product_attention is ffpa_attn_func
    unpatch()
    assert F.scaled_dot_product_attention is restored_sdpa
    unpatch()
    assert F.scaled_dot_product_attention is restored_sdpa


def test_monkey_patch_with_a_backend(restored_sdpa):
    from ffpa_attn import CUDABackend

    backend = CUDABackend(impl="ffpa")
    monkey_patch(backend=backend)
    patched = F.scaled_dot_product_attention
    assert patched.func is ffpa_attn_func and patched.keywords == {"backend": backend}
    assert patched.__name__ == ffpa_attn_func.__name__
    monkey_patch()  # another backend replaces the first, unpatch still restores the original
    assert F.scaled_dot_product_attention is ffpa_attn_func
    unpatch()
    assert F.scaled_dot_product_attention is restored_sdpa
    with pytest.raises(TypeError):
        monkey_patch(backend="ffpa")
    assert F.scaled_dot_product_attention is restored_sdpa


def patch_by(installation, monkeypatch):
    """Installs ffpa_attn_func the package's way or the issue's way (plain assignment)."""
    if installation == "monkey_patch":
        monkey_patch()
    else:
        monkeypatch.setattr(F, "scaled_dot_product_attention", ffpa_attn_func)


@pytest.mark.parametrize("installation", ["monkey_patch", "assignment"])
def test_patched_fallback_calls_original_sdpa_without_recursion(installation, monkeypatch):
    q, k, v = random_qkv(2, 4, 4, 11, 13, 32, torch.float32, "cpu")
    expected = ORIGINAL_SDPA(q, k, v, is_causal=True)
    patch_by(installation, monkeypatch)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True), expected)


def test_patched_multihead_attention_is_unchanged_on_cpu(caplog):
    # Distinct query, key and value keep MultiheadAttention off its fused fast path,
    # so that it calls F.scaled_dot_product_attention.
    attention = torch.nn.MultiheadAttention(64, 4, batch_first=True).eval()
    query, key, value = torch.randn(2, 17, 64), torch.randn(2, 23, 64), torch.randn(2, 23, 64)
    with torch.no_grad():
        expected, _ = attention(query, key, value, need_weights=False)
        monkey_patch()
        capture_fallback_reasons(caplog)
        out, _ = attention(query, key, value, need_weights=False)
    assert fallback_reasons(caplog), "MultiheadAttention went through ffpa_attn_func"
    assert torch.equal(out, expected)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def mixed_calls():
    """(name, served by ffpa?, kwargs): a batch of SDPA calls, some the library serves."""
    cuda, bf16, f16 = "cuda", torch.bfloat16, torch.float16
    q, k, v = random_qkv(2, 8, 8, 257, 257, 512, bf16, cuda)
    gq, gk, gv = random_qkv(1, 8, 2, 77, 301, 320, f16, cuda, layout="bnhd")
    cq, ck, cv = random_qkv(2, 4, 4, 65, 129, 1024, bf16, cuda)
    mask = random_mask("batch-keys", torch.bool, 1, 8, 77, 301, cuda)
    grad_q = q.detach().clone().requires_grad_()  # training at D 512 with 2 x 8 x 257 keys: ffpa (measured faster)
    fq, fk, fv = random_qkv(1, 2, 2, 65, 65, 512, bf16, cuda)
    few_keys_q = fq.detach().clone().requires_grad_()  # 130 keys: SDPA trains it (routing.py)
    wide = random_qkv(1, 2, 2, 33, 47, 1032, bf16, cuda)
    odd = random_qkv(1, 2, 2, 33, 47, 100, bf16, cuda)
    fp32 = random_qkv(1, 4, 4, 63, 63, 256, torch.float32, cuda)
    host = random_qkv(1, 2, 2, 19, 23, 64, bf16, "cpu")
    small = random_qkv(2, 4, 4, 129, 129, 128, bf16, cuda)
    return [
        ("bf16-D512-causal", True, dict(query=q, key=k, value=v, is_causal=True)),
        ("fp16-D320-gqa-mask-bnhd", True, dict(query=gq, key=gk, value=gv, attn_mask=mask, enable_gqa=True)),
        ("bf16-D1024-scale", True, dict(query=cq, key=ck, value=cv, scale=0.05)),
        ("requires-grad", True, dict(query=grad_q, key=k, value=v)),
        ("requires-grad-few-keys", False, dict(query=few_keys_q, key=fk, value=fv)),
        ("D1032", False, dict(zip(("query", "key", "value"), wide))),
        ("D100", False, dict(zip(("query", "key", "value"), odd))),
        ("float32", False, dict(zip(("query", "key", "value"), fp32))),
        ("cpu", False, dict(zip(("query", "key", "value"), host))),
        ("bf16-D128-sdpa-faster", False, dict(zip(("query", "key", "value"), small))),
    ]


@needs_cuda
@pytest.mark.parametrize("installation", ["monkey_patch", "assignment"])
def test_drop_in_mixed_batch_matches_sdpa(installation, monkeypatch, caplog):
    calls = mixed_calls()
    expected = {name: ORIGINAL_SDPA(**kwargs) for name, _, kwargs in calls}

    patch_by(installation, monkeypatch)
    capture_fallback_reasons(caplog)
    for name, served, kwargs in calls:
        caplog.clear()
        out, ran_ffpa = run_and_check_served(lambda: F.scaled_dot_product_attention(**kwargs))
        assert ran_ffpa == served, f"{name}: {'expected' if served else 'unexpected'} ffpa_attn::forward"
        assert bool(fallback_reasons(caplog)) == (not served), f"{name}: a fallback and only a fallback logs its reason"
        assert out.device == kwargs["query"].device and out.dtype == kwargs["query"].dtype, name
        if served:
            assert_output_close(out, expected[name], out.dtype)
        else:
            assert torch.equal(out, expected[name]), name
            assert out.requires_grad == kwargs["query"].requires_grad, name
