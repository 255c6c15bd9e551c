"""The gradients of torch.ops.ffpa_attn.forward on CPU tensors (the library's CPU reference behind
torch.ops.ffpa_attn.backward): torch.autograd.gradcheck in double on every feature, the gradients of a
loss that reads the lse too against autograd of the formula in float64, bf16 inputs, torch.compile
(fullgraph), activation checkpointing with dropout, and an additive mask's gradient summed over its
broadcast dims."""

import pytest

torch = pytest.importorskip("torch")

from ffpa_attn import _library  # noqa: E402

try:
    _library.load_library()
except _library.LibraryNotFoundError as error:
    pytest.skip(f"the ffpa C library does not load (set FFPA_LIBRARY): {error}", allow_module_level=True)

from attention_reference import attention_scores, repeat_kv_heads  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

import ffpa_attn.ops  # noqa: E402,F401 - registers torch.ops.ffpa_attn.forward, .backward and the autograd

CAUSAL = {None: _library.Causal.NONE, "top_left": _library.Causal.TOP_LEFT, "bottom_right": _library.Causal.BOTTOM_RIGHT}


def attention(q, k, v, mask=None, causal=None, scale=None, dropout_p=0.0, seed=0, return_lse=True):
    """torch.ops.ffpa_attn.forward on the CPU reference: (o, lse)."""
    return torch.ops.ffpa_attn.forward(
        q, k, v, mask, dropout_p, CAUSAL[causal], q.shape[-1] ** -0.5 if scale is None else scale,
        _library.Accumulation.F32, _library.Impl.CPU_REFERENCE, seed, 12345, return_lse,
    )  # fmt: skip


def formula(q, k, v, mask=None, causal=None, scale=None):
    """(o, lse) from the formula in float64 with torch's own autograd; rows with no key give o = 0."""
    scores = attention_scores(q, k, mask, causal, scale, torch.float64)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ repeat_kv_heads(v.double(), q.shape[1]), lse


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def qkv(batch, heads_q, heads_kv, seq_q, seq_kv, dim, dtype=torch.float64):
    q = torch.randn(batch, heads_q, seq_q, dim, dtype=dtype)
    k = torch.randn(batch, heads_kv, seq_kv, dim, dtype=dtype)
    v = torch.randn(batch, heads_kv, seq_kv, dim, dtype=dtype)
    return leaves(q, k, v)


GRADCHECK_CASES = {
    "mha": dict(shape=(1, 2, 2, 5, 7, 8)),
    "gqa 4:2, odd sizes": dict(shape=(2, 4, 2, 3, 5, 16)),
    "mqa, causal top-left, Nq > Nkv (rows without a key)": dict(shape=(1, 3, 1, 6, 4, 8), causal="top_left"),
    "causal bottom-right, Nq < Nkv": dict(shape=(1, 2, 2, 3, 7, 8), causal="bottom_right"),
    "dropout 0.3": dict(shape=(1, 2, 1, 4, 9, 8), dropout_p=0.3),
    "scale 0.7, D 24": dict(shape=(1, 1, 1, 5, 6, 24), scale=0.7),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck(case):
    spec = dict(GRADCHECK_CASES[case])
    q, k, v = qkv(*spec.pop("shape"))
    seed = 7  # fixed: the keep mask is the same in every evaluation gradcheck makes

    def o_of(q, k, v):
        return attention(q, k, v, seed=seed, **spec)[0]

    assert torch.autograd.gradcheck(o_of, (q, k, v))


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 1, 7), (2, 2, 5, 7), (1, 2, 5, 1)], ids=str)
def test_gradcheck_additive_mask(mask_shape):
    q, k, v = qkv(2, 2, 1, 5, 7, 8)
    (mask,) = leaves(torch.randn(mask_shape, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda q, k, v, m: attention(q, k, v, m, causal="bottom_right")[0], (q, k, v, mask))


def test_gradcheck_boolean_mask_with_a_fully_masked_row():
    q, k, v = qkv(1, 2, 2, 4, 6, 8)
    mask = torch.rand(1, 1, 4, 6) < 0.7
    mask[..., 2, :] = False  # row 2 sees no key: o = 0 and no gradient reaches its query
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, mask)[0], (q, k, v))
    attention(q, k, v, mask)[0].sum().backward()
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))


@pytest.mark.parametrize("return_lse", [True, False])
def test_a_loss_reading_o_and_lse_matches_the_formula(return_lse):
    """The lse's gradient enters (d_lse); without return_lse the backward recomputes the lse it needs."""
    q, k, v = qkv(2, 4, 2, 5, 9, 16)
    (mask,) = leaves(torch.randn(2, 1, 5, 9, dtype=torch.float64))
    g_o, g_lse = torch.randn(2, 4, 5, 16, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    o, lse = attention(q, k, v, mask, causal="bottom_right", return_lse=return_lse)
    loss = (o * g_o).sum() + ((lse.double() * g_lse).sum() if return_lse else 0.0)
    got = torch.autograd.grad(loss, (q, k, v, mask))
    fq, fk, fv, fmask = leaves(q, k, v, mask)
    o_ref, lse_ref = formula(fq, fk, fv, fmask, "bottom_right")
    loss_ref = (o_ref * g_o).sum() + ((lse_ref * g_lse).sum() if return_lse else 0.0)
    want = torch.autograd.grad(loss_ref, (fq, fk, fv, fmask))
    for name, a, b in zip(("q", "k", "v", "mask"), got, want):
        # lse is float32: its gradient path is exact, its value rounded (1e-7 relative)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda m: f"d_{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sixteen_bit_inputs_get_the_float64_gradients_rounded(dtype):
    q, k, v = qkv(1, 4, 2, 7, 11, 24, dtype)
    g = torch.randn(1, 4, 7, 24).to(dtype)
    o, _ = attention(q, k, v, causal="top_left")
    got = torch.autograd.grad(o, (q, k, v), g)
    fq, fk, fv = leaves(q.double(), k.double(), v.double())
    want = torch.autograd.grad(formula(fq, fk, fv, causal="top_left")[0], (fq, fk, fv), g.double())
    eps = torch.finfo(dtype).eps  # one unit in the last place at 1: the rounding, up to a tie's side
    for a, b in zip(got, want):
        assert a.dtype == dtype
        error = (a.double() - b).abs()
        assert (error <= eps * b.abs() + 1e-6).all(), f"largest error {error.max().item():.3e}"


def test_torch_compile_fullgraph_gives_the_eager_gradients():
    q, k, v = qkv(1, 2, 1, 6, 10, 16)
    (mask,) = leaves(torch.randn(1, 1, 6, 10, dtype=torch.float64))

    def loss(q, k, v, mask):
        o, lse = attention(q, k, v, mask, dropout_p=0.25, seed=3)
        return (o * o).sum() + lse.double().sum()

    eager = torch.autograd.grad(loss(q, k, v, mask), (q, k, v, mask))
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    traced = torch.autograd.grad(compiled(q, k, v, mask), (q, k, v, mask))
    for a, b in zip(traced, eager):
        assert torch.equal(a, b)


def test_checkpointing_recomputes_the_same_dropout_mask():
    q, k, v = qkv(1, 2, 2, 8, 8, 16)
    g = torch.randn(1, 2, 8, 16, dtype=torch.float64)

    def block(q, k, v):
        return attention(q, k, v, causal="top_left", dropout_p=0.4, seed=11)[0] * 2.0

    def gradients(run):
        for t in (q, k, v):
            t.grad = None
        run().backward(g)  # .backward: the reentrant checkpoint does not support autograd.grad
        return [t.grad.clone() for t in (q, k, v)]

    plain = gradients(lambda: block(q, k, v))
    for use_reentrant in (False, True):
        recomputed = gradients(lambda: checkpoint(block, q, k, v, use_reentrant=use_reentrant))
        for a, b in zip(recomputed, plain):
            assert torch.equal(a, b)


def test_the_mask_gradient_is_none_unless_asked():
    q, k, v = qkv(1, 1, 1, 3, 5, 8)
    mask = torch.randn(1, 1, 3, 5, dtype=torch.float64)  # no requires_grad
    o, _ = attention(q, k, v, mask)
    o.sum().backward()
    assert mask.grad is None and q.grad is not None


def test_opcheck_of_both_ops():
    """torch.library.opcheck: schemas, fake implementations against the real ones, the autograd
    registration and AOT dispatch (torch.compile's view of the ops)."""
    q, k, v = qkv(1, 2, 1, 5, 6, 8)
    (mask,) = leaves(torch.randn(1, 1, 5, 6, dtype=torch.float64))
    options = (0.2, int(_library.Causal.TOP_LEFT), 0.3, int(_library.Accumulation.F32), int(_library.Impl.CPU_REFERENCE))
    torch.library.opcheck(torch.ops.ffpa_attn.forward.default, (q, k, v, mask, *options, 5, 9, True))
    o, lse = torch.ops.ffpa_attn.forward(q, k, v, mask, *options, 5, 9, True)
    d_o, d_lse = torch.randn_like(o), torch.randn_like(lse)
    backward_args = (q.detach(), k.detach(), v.detach(), mask.detach(), o.detach(), lse.detach(), d_o, d_lse, True)
    torch.library.opcheck(torch.ops.ffpa_attn.backward.default, (*backward_args, *options, 5, 9))


@pytest.mark.parametrize("value_dim", [8, 24])
def test_unequal_value_head_dim(value_dim):
    """D_qk != D_v (absorbed MLA's shape, small): o [B, H, N, Dv] against SDPA's math kernel, o's layout
    follows q's (bnhd), the fake implementation's shape, and gradcheck in double."""
    q, k, _ = qkv(1, 4, 1, 5, 7, 16)
    (v,) = leaves(torch.randn(1, 1, 7, value_dim, dtype=torch.float64))
    o, lse = attention(q, k, v, causal="bottom_right")
    assert o.shape == (1, 4, 5, value_dim)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.expand(1, 4, 7, 16), v.expand(1, 4, 7, value_dim),
        attn_mask=torch.ones(5, 7, dtype=torch.bool).tril(2),
    )  # fmt: skip
    torch.testing.assert_close(o, expected)
    q_bnhd = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    o_bnhd, _ = attention(q_bnhd, k.detach(), v.detach())
    assert o_bnhd.transpose(1, 2).is_contiguous(), "o keeps q's [B, N, H, D] memory order"
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    fakes = [mode.from_tensor(t.detach()) for t in (q, k, v)]
    with mode:
        fake = attention(*fakes)
    assert fake[0].shape == (1, 4, 5, value_dim)
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, causal="bottom_right")[0], (q, k, v))

