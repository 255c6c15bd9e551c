"""The custom op's fake (meta) implementation: what torch.compile and CUDA-graph
tracing see before anything runs. o is torch.empty_like(q) (q's dtype, device and
memory layout); lse is fp32 [B, Hq, Nq] contiguous, or empty when not requested."""

import pytest

torch = pytest.importorskip("torch")

import ffpa_attn.ops  # noqa: E402,F401 - registers torch.ops.ffpa_attn.forward

# The C ABI's enums (include/ffpa/ffpa.h).
CAUSAL_NONE, CAUSAL_BOTTOM_RIGHT = 0, 2
ACCUM_F32, IMPL_AUTO = 0, 0


def meta_input(shape, dtype, layout):
    b, h, n, d = shape
    if layout == "bnhd":
        return torch.empty((b, n, h, d), dtype=dtype, device="meta").transpose(1, 2)
    return torch.empty(shape, dtype=dtype, device="meta")


def forward(q, k, v, mask=None, return_lse=False):
    return torch.ops.ffpa_attn.forward(
        q, k, v, mask, 0.1, CAUSAL_BOTTOM_RIGHT, 0.125, ACCUM_F32, IMPL_AUTO, 1234, 0, return_lse
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_fake_outputs(dtype, layout, return_lse):
    b, hq, hkv, nq, nkv, d = 3, 8, 2, 37, 53, 520
    q = meta_input((b, hq, nq, d), dtype, layout)
    k = meta_input((b, hkv, nkv, d), dtype, layout)
    v = meta_input((b, hkv, nkv, d), dtype, layout)
    mask = torch.empty((b, 1, 1, nkv), dtype=torch.bool, device="meta")
    o, lse = forward(q, k, v, mask, return_lse)

    like_q = torch.empty_like(q)
    assert (o.shape, o.dtype, o.device) == (q.shape, dtype, q.device)
    assert o.stride() == like_q.stride(), f"o strides {o.stride()}, empty_like(q) {like_q.stride()}"
    assert lse.dtype == torch.float32 and lse.device == q.device
    if return_lse:
        assert lse.shape == (b, hq, nq) and lse.is_contiguous()
    else:
        assert lse.numel() == 0


def test_fake_outputs_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = (torch.empty((2, 4, 9, 64), dtype=torch.bfloat16) for _ in range(3))
        o, lse = forward(q, k, v, None, True)
        assert o.shape == q.shape and lse.shape == (2, 4, 9)
