"""The custom op's fake (meta) implementation: what torch.compile and CUDA-graph
tracing see before anything runs. o is torch.empty_like(q) (q's dtype, device and
memory layout); lse is fp32 [B, Hq, Nq] contiguous, or empty when not requested."""

import pytest

torch = pytest.importorskip("torch")

import ffpa_attn.ops  # noqa: E402 - registers torch.ops.ffpa_attn.forward

# The C ABI's enums (include/ffpa/ffpa.h).
CAUSAL_NONE, CAUSAL_BOTTOM_RIGHT = 0, 2
ACCUM_F32, IMPL_AUTO = 0, 0
PRECISION_FP8, FP8_QK_E4M3, FP8_QK_SCALES_PER_BLOCK, FP8_V_SCALES_PER_BLOCK = 1, 1, 1, 1


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


def test_precision_arguments_are_in_the_schema_with_the_input_defaults():
    # Appended with defaults: callers of the twelve-argument op keep working, and
    # torch.compile and CUDA graphs see plain int and bool arguments.
    schema = torch.ops.ffpa_attn.forward.default._schema
    defaults = {a.name: a.default_value for a in schema.arguments}
    assert [a.name for a in schema.arguments][-7:] == [
        "precision",
        "fp8_qk_format",
        "fp8_qk_scales",
        "fp8_smooth_k",
        "fp8_early_rows",
        "fp8_v_scales",
        "fp8_smooth_v",
    ]
    assert (defaults["precision"], defaults["fp8_qk_format"], defaults["fp8_qk_scales"]) == (0, 0, 0)
    assert defaults["fp8_smooth_k"] is True and defaults["fp8_early_rows"] == -1
    assert defaults["fp8_v_scales"] == 0 and defaults["fp8_smooth_v"] is False
    assert ffpa_attn.ops.INPUT_PRECISION == (0, 0, 0, True, -1, 0, False)


@pytest.mark.parametrize("return_lse", [False, True])
def test_fake_outputs_with_fp8(return_lse):
    q = meta_input((1, 4, 1024, 512), torch.bfloat16, "bhnd")
    k = v = meta_input((1, 4, 1024, 512), torch.bfloat16, "bhnd")
    o, lse = torch.ops.ffpa_attn.forward(
        q, k, v, None, 0.0, CAUSAL_BOTTOM_RIGHT, 0.04, ACCUM_F32, IMPL_AUTO, 0, 0, return_lse,
        PRECISION_FP8, FP8_QK_E4M3, FP8_QK_SCALES_PER_BLOCK, False, 256, FP8_V_SCALES_PER_BLOCK, True,
    )  # fmt: skip
    assert (o.shape, o.dtype, o.stride()) == (q.shape, q.dtype, torch.empty_like(q).stride())
    assert lse.shape == ((1, 4, 1024) if return_lse else (0,))
