"""ffpa_attn.fp8_kv_cache on CPU tensors (the library's CPU model writes the cache):
the tensors have the library's layout (its query, not restated), dequantized they
give back k and v within the formats' rounding, the padding is zero, the means
are absent where their knob is off, and what the library refuses raises its
FFPAError (an FP8 attention call needs a Hopper GPU). The bytes against the
model and the GPU are tests/cpu/test_fp8_kv_cache.cpp's and tests/gpu/'s."""

import pytest

torch = pytest.importorskip("torch")

from ffpa_attn import CUDABackend, _library  # noqa: E402
from ffpa_attn import fp8_kv_cache  # noqa: E402

try:
    _library.load_library()
except _library.LibraryNotFoundError as error:
    pytest.skip(f"the ffpa C library does not load (set FFPA_LIBRARY): {error}", allow_module_level=True)

B, H, N, D = 2, 3, 203, 40
PITCH_D, PITCH_N = 48, 208  # D and Nkv rounded up to 16 bytes


def kv(dtype=torch.bfloat16, offset=4.0):
    generator = torch.Generator().manual_seed(11)
    k = (torch.randn(B, H, N, D, generator=generator) + offset).to(dtype)  # per-channel offsets: smooth-K's job
    v = torch.randn(B, H, N, D, generator=generator).to(dtype)
    return k, v


def k_scale_of_keys(cache, per_block):
    """Each key's K scale [B, H, N] (per block: one per 128 keys; per thread group: 4 a block)."""
    j = torch.arange(N)
    index = j // 128 if per_block else (j // 128) * 4 + (j % 8) // 2
    return cache.k_scales[:, :, index]


@pytest.mark.parametrize("per_block", [False, True], ids=["per_thread_group", "per_block"])
def test_int8_keys_come_back_within_half_a_step(per_block):
    k, v = kv()
    backend = CUDABackend(precision="fp8", fp8_qk_scales="per_block" if per_block else "per_thread_group")
    cache = fp8_kv_cache.quantize_kv(k, v, backend)
    assert cache.k_codes.shape == (B, H, N, PITCH_D) and cache.k_codes.dtype == torch.uint8
    assert cache.k_scales.shape == (B, H, 2 * (1 if per_block else 4))
    assert (cache.k_codes[..., D:] == 0).all(), "rows padded with zeros"
    scale = k_scale_of_keys(cache, per_block)[..., None]
    codes = cache.k_codes[..., :D].view(torch.int8).float()
    restored = codes * scale + cache.k_mean[:, :, None, :]
    assert (restored - k.float()).abs().le(scale / 2 * 1.001 + 1e-6).all()


def test_e4m3_values_come_back_within_their_rounding():
    k, v = kv()
    cache = fp8_kv_cache.quantize_kv(k, v, CUDABackend(precision="fp8", fp8_qk="e4m3", fp8_smooth_v=True))
    # V^T per head, keys padded to 208 with zeros, per-channel scales, smooth-V's mean.
    assert cache.v_codes.shape == (B, H, D, PITCH_N) and cache.v_scales.shape == (B, H, D)
    assert (cache.v_codes[..., N:] == 0).all()
    v_centered = v.float() - cache.v_mean[:, :, None, :]
    v_codes = cache.v_codes[..., :N].view(torch.float8_e4m3fn).float().transpose(2, 3)
    v_restored = v_codes * cache.v_scales[:, :, None, :]
    bound = v_centered.abs() / 16 + cache.v_scales[:, :, None, :] * 2.0**-9  # 3 mantissa bits; subnormals
    assert (v_restored - v_centered).abs().le(bound).all()
    k_centered = k.float() - cache.k_mean[:, :, None, :]
    k_scale = k_scale_of_keys(cache, per_block=False)[..., None]
    k_restored = cache.k_codes[..., :D].view(torch.float8_e4m3fn).float() * k_scale
    assert (k_restored - k_centered).abs().le(k_centered.abs() / 16 + k_scale * 2.0**-9).all()


def test_means_are_absent_where_their_knob_is_off_and_calls_repeat_exactly():
    k, v = kv(torch.float16)
    backend = CUDABackend(precision="fp8", fp8_smooth_k=False, fp8_v_scales="per_block")
    first, second = fp8_kv_cache.quantize_kv(k, v, backend), fp8_kv_cache.quantize_kv(k, v, backend)
    assert first.k_mean is None and first.v_mean is None
    assert first.v_scales.shape == (B, H, 2)
    for name in ("k_codes", "k_scales", "v_codes", "v_scales"):
        assert torch.equal(getattr(first, name), getattr(second, name)), name
    # The library's own layout, asked, matches what was allocated.
    layout = _library.load_library().fp8_kv_cache_layout(B, H, N, D, first.fp8_options)
    assert tuple(layout.k_codes.shape) == tuple(first.k_codes.shape)
    assert tuple(layout.v_scales.shape[:3]) == tuple(first.v_scales.shape)


def test_what_the_library_refuses_raises_its_error():
    k, v = kv()
    with pytest.raises(_library.FFPAError) as refused:
        fp8_kv_cache.quantize_kv(k, v[..., :32].contiguous())
    assert refused.value.status_name == "impl_unavailable" and "Dv" in refused.value.message
    cache = fp8_kv_cache.quantize_kv(k, v)
    q = torch.randn(B, 2 * H, 64, D).to(torch.bfloat16)
    # FP8 attention runs on the sm90 family only: host tensors are refused, saying so.
    with pytest.raises(_library.FFPAError) as refused:
        fp8_kv_cache.attention(q, cache)
    assert refused.value.status_name in ("impl_unavailable", "wrong_memory_space")
    assert "fp8" in refused.value.message
