"""ffpa_attn.fp8_kv_cache on a Hopper GPU (run on the H200): attention over a cache
from quantize_kv gives the very bits of the FP8 call without a cache
(ffpa_attn_func with CUDABackend(precision="fp8") and the same knobs), O and LSE,
for int8 and e4m3 Q K^T, both scale granularities, smooth-K off, smooth-V, V per
block, GQA, causal with and without hybrid rows (k and v passed where those rows
read them)."""

import pytest

from sm90_requirements import require_sm90_kernels

require_sm90_kernels()
torch = pytest.importorskip("torch")

from attention_inputs import random_qkv  # noqa: E402
from ffpa_attn import CUDABackend, ffpa_attn_func, fp8_kv_cache  # noqa: E402


KNOBS = {
    "defaults": {},
    "int8_per_block": {"fp8_qk_scales": "per_block"},
    "e4m3": {"fp8_qk": "e4m3"},
    "e4m3_per_block": {"fp8_qk": "e4m3", "fp8_qk_scales": "per_block"},
    "no_smooth_k": {"fp8_smooth_k": False},
    "smooth_v_per_block": {"fp8_smooth_v": True, "fp8_v_scales": "per_block"},
}


@pytest.mark.parametrize("knobs", KNOBS, ids=str)
@pytest.mark.parametrize(
    "shape, causal, early_rows",
    [((1, 4, 4, 300, 500, 512), False, 0), ((2, 4, 2, 200, 333, 320), True, 0), ((1, 2, 1, 300, 300, 512), True, 256)],
    ids=["d512", "gqa_causal", "causal_hybrid256"],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_attention_over_the_cache_is_bit_identical(knobs, shape, causal, early_rows, dtype):
    b, hq, hkv, nq, nkv, d = shape
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, d, dtype, "cuda")
    backend = CUDABackend(precision="fp8", fp8_early_rows=early_rows, **KNOBS[knobs])
    scale = d**-0.5
    want, want_lse = ffpa_attn_func(
        q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hkv, backend=backend, return_lse=True
    )
    cache = fp8_kv_cache.quantize_kv(k, v, backend)
    given = {"k": k, "v": v} if early_rows > 0 else {}  # hybrid rows run the 16-bit kernel on k and v
    got, got_lse = fp8_kv_cache.attention(
        q, cache, is_causal=causal, scale=scale, early_rows=early_rows, return_lse=True, **given
    )
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
