"""The gradients of torch.ops.ffpa_attn.forward on CUDA tensors (the library's portable backward kernels)
against the same op on the CPU reference (float64 copies of the same values, the same dropout seed: the
same keep mask): head dims 8..1024, GQA, both causal alignments, boolean and additive masks,
dropout, a loss that reads the lse too; and torch.compile (fullgraph) on CUDA. (D_qk != D_v: the C++ GPU
test, tests/gpu/test_gpu_backward.cpp; the op's forward serves D_qk == D_v only.)"""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from ffpa_attn import _library  # noqa: E402

import ffpa_attn.ops  # noqa: E402,F401

CAUSAL = {None: _library.Causal.NONE, "top_left": _library.Causal.TOP_LEFT, "bottom_right": _library.Causal.BOTTOM_RIGHT}
# Relative L2 of each gradient: P recomputed in fp32 and rounded with dS for the products.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 1e-2}


def attention(q, k, v, mask, causal, dropout_p, impl):
    return torch.ops.ffpa_attn.forward(
        q, k, v, mask, dropout_p, CAUSAL[causal], q.shape[-1] ** -0.5, _library.Accumulation.F32, impl, 1234, 77, True
    )


def relative_l2(actual, expected):
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-300)).item()


CASES = {
    "d64 mha odd": dict(shape=(2, 3, 3, 77, 131, 64, 64)),
    "d8 gqa": dict(shape=(1, 4, 2, 19, 23, 8, 8)),
    "d128 causal top-left gqa": dict(shape=(1, 8, 2, 128, 128, 128, 128), causal="top_left"),
    "d320 bool key padding": dict(shape=(2, 2, 2, 100, 90, 320, 320), mask="bool"),
    "d512 causal bottom-right": dict(shape=(1, 2, 1, 90, 200, 512, 512), causal="bottom_right"),
    "d1024 dropout": dict(shape=(1, 2, 2, 70, 80, 1024, 1024), dropout_p=0.2),
    "d192 mqa additive mask": dict(shape=(1, 8, 1, 50, 60, 192, 192), mask="additive"),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_gradients_match_the_cpu_reference(case, dtype):
    spec = CASES[case]
    b, hq, hkv, nq, nkv, d, dv = spec["shape"]
    q = torch.randn(b, hq, nq, d).to(dtype)
    k = torch.randn(b, hkv, nkv, d).to(dtype)
    v = torch.randn(b, hkv, nkv, dv).to(dtype)
    mask = None
    if spec.get("mask") == "bool":
        mask = torch.rand(b, 1, 1, nkv) < 0.8
    elif spec.get("mask") == "additive":
        mask = torch.randn(1, 1, nq, nkv).to(dtype)
    g_o, g_lse = torch.randn(b, hq, nq, dv), torch.randn(b, hq, nq)
    causal, dropout_p = spec.get("causal"), spec.get("dropout_p", 0.0)

    def gradients(device, cast, impl):
        leaves = [t.to(device=device, dtype=cast).requires_grad_(True) for t in (q, k, v)]
        m = None if mask is None else mask.to(device=device, dtype=mask.dtype if mask.dtype == torch.bool else cast)
        o, lse = attention(*leaves, m, causal, dropout_p, impl)
        loss = (o.double() * g_o.to(device, torch.float64)).sum() + (lse.double() * g_lse.to(device, torch.float64)).sum()
        return [t.double().cpu() for t in torch.autograd.grad(loss, leaves)]

    got = gradients("cuda", dtype, _library.Impl.AUTO)
    want = gradients("cpu", torch.float64, _library.Impl.CPU_REFERENCE)
    for name, a, w in zip(("d_q", "d_k", "d_v"), got, want):
        assert torch.isfinite(a).all(), f"{name} is not finite"
        error = relative_l2(a, w)
        assert error <= TOLERANCE[dtype], f"{name}: relative L2 {error:.3e}"


def test_torch_compile_fullgraph_on_cuda_gives_the_eager_gradients():
    q = torch.randn(1, 4, 96, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, 96, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 2, 96, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def loss(q, k, v):
        o, _ = attention(q, k, v, None, "top_left", 0.1, _library.Impl.AUTO)
        return o.float().square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(loss, fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("d", [64, 320, 512])
def test_ffpa_attn_func_trains_on_ffpa_when_asked(d):
    """backend impl="ffpa" with inputs that require grad: ffpa's forward and backward (the op's autograd),
    gradients against SDPA's math kernel in float32; under impl="auto" SDPA keeps such calls (routing.py)."""
    from attention_reference import sdpa_float32
    from ffpa_attn import CUDABackend, ffpa_attn_func

    q = torch.randn(1, 4, 77, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, 90, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 2, 90, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, 4, 77, d, device="cuda", dtype=torch.bfloat16)
    out = ffpa_attn_func(q, k, v, is_causal=True, enable_gqa=True, backend=CUDABackend(impl="ffpa"))
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    expected = sdpa_float32(*leaves, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad(expected, leaves, grad.float())
    for name, a, w in zip(("d_q", "d_k", "d_v"), got, want):
        error = relative_l2(a, w.double())
        assert error <= TOLERANCE[torch.bfloat16], f"{name}: relative L2 {error:.3e}"


@pytest.mark.parametrize("d", [512, 1024])
def test_cuda_graph_capture_and_replay_gives_the_eager_gradients(d):
    """Forward and backward captured in a CUDA graph (on Hopper the sm90 kernels: dV and dQ launched as
    programmatic dependents, captured as programmatic edges; at 1024 clusters of two) and replayed on new
    values: the eager gradients bit for bit (no atomics: every gradient is an ordered register sum)."""
    q = torch.randn(1, 4, 200, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, 230, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 2, 230, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(1, 4, 200, d, device="cuda", dtype=torch.bfloat16)

    def step():
        o, _ = attention(q, k, v, None, "bottom_right", 0.1, _library.Impl.AUTO)
        return torch.autograd.grad(o, (q, k, v), grad)

    # Warm-up on a side stream before capture, as torch.cuda.graphs asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, grad):
                t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for name, a, b in zip(("d_q", "d_k", "d_v"), captured, eager):
            assert torch.equal(a, b), f"{name}: the replay differs from the eager call"
