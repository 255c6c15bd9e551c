"""CUDABackend(precision="fp8") on a Hopper GPU: ffpa_attn_func runs the library's
FP8 path (its quantization pre-pass and 8-bit wgmma kernels), within the FP8
accuracy budget against SDPA's math backend in float32 (relative L2 <= 5e-2,
cosine >= 0.998; docs/kernels/fp8_model.md measures about 3.7e-2 on random
inputs), never routed to SDPA under impl="auto", and gives the same bits under
torch.compile(fullgraph=True) and replayed from a CUDA graph as in eager mode
(the FP8 path is deterministic: its pre-pass reduces in a fixed order and it
does not split the keys)."""

import pytest

from sm90_requirements import require_sm90_kernels

require_sm90_kernels()
torch = pytest.importorskip("torch")

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from attention_inputs import random_qkv  # noqa: E402
from attention_reference import relative_l2, sdpa_float32  # noqa: E402
from dispatch_probe import run_and_check_served  # noqa: E402
from ffpa_attn import CUDABackend, explain, ffpa_attn_func  # noqa: E402


CUDA = "cuda"
B, H, N, D = 1, 4, 1024, 512
DTYPES = [torch.bfloat16, torch.float16]
FP8 = CUDABackend(precision="fp8")
# The FP8 accuracy budget (issue 11's, relaxed to what 8-bit P V gives: docs/kernels/fp8_model.md).
MAX_RELATIVE_L2 = 5e-2
MIN_COSINE = 0.998


def fp8_attention(q, k, v, causal):
    return ffpa_attn_func(q, k, v, is_causal=causal, backend=FP8)


def cosine(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double().flatten(), expected.double().flatten()
    return (torch.dot(a, e) / (a.norm() * e.norm()).clamp_min(1e-300)).item()


def assert_fp8_accuracy(out, q, k, v, causal):
    """out within the FP8 budget against float32 SDPA math; q's dtype, device and shape."""
    assert (out.dtype, out.device, out.shape) == (q.dtype, q.device, q.shape)
    assert not out.isnan().any(), "the output holds NaN"
    expected = sdpa_float32(q, k, v, is_causal=causal)
    error, similarity = relative_l2(out, expected), cosine(out, expected)
    assert error <= MAX_RELATIVE_L2, f"relative L2 error {error:.3e} > {MAX_RELATIVE_L2:.0e} ({q.dtype})"
    assert similarity >= MIN_COSINE, f"cosine {similarity:.6f} < {MIN_COSINE} ({q.dtype})"
    return error


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: no cache hit hides a graph break or a recompile."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_accuracy_on_the_library(dtype, causal):
    q, k, v = random_qkv(B, H, H, N, N, D, dtype, CUDA)
    out, ran_ffpa = run_and_check_served(lambda: fp8_attention(q, k, v, causal))
    assert ran_ffpa, "impl='auto' with precision='fp8' must run the library, not SDPA"
    fp8_error = assert_fp8_accuracy(out, q, k, v, causal)
    # It ran in FP8: the inputs' precision (same kernels, 16-bit operands) is several times closer.
    input_out = ffpa_attn_func(q, k, v, is_causal=causal, backend=CUDABackend(impl="ffpa"))
    input_error = relative_l2(input_out, sdpa_float32(q, k, v, is_causal=causal))
    assert fp8_error > input_error, f"FP8 error {fp8_error:.3e} <= the inputs' precision's {input_error:.3e}"


@pytest.mark.parametrize("head_dim", [128, 256])
def test_fp8_at_small_head_dims_is_not_routed_to_sdpa(head_dim):
    # Without FP8, impl="auto" gives these to SDPA's faster kernels; SDPA has no FP8.
    # (The library serves them on its D = 512 FP8 instance, padded.)
    q, k, v = random_qkv(1, 2, 2, 256, 256, head_dim, torch.bfloat16, CUDA)
    said = explain(q, k, v, backend=FP8)
    assert said.startswith("ffpa (impl auto, precision fp8)"), said
    out, ran_ffpa = run_and_check_served(lambda: fp8_attention(q, k, v, False))
    assert ran_ffpa
    assert_fp8_accuracy(out, q, k, v, False)


def test_fp8_knobs_reach_the_library():
    # Each knob changes what runs, and every setting stays within twice the defaults' budget
    # (e4m3 Q K is less accurate than int8: docs/kernels/fp8_model.md).
    q, k, v = random_qkv(B, H, H, N, N, D, torch.bfloat16, CUDA)
    default = fp8_attention(q, k, v, True)
    for backend in (
        CUDABackend(precision="fp8", fp8_qk="e4m3"),
        CUDABackend(precision="fp8", fp8_qk_scales="per_block"),
        CUDABackend(precision="fp8", fp8_early_rows=0),
        CUDABackend(precision="fp8", impl="sm90_wgmma", fp8_smooth_k=False),
        CUDABackend(precision="fp8", fp8_v_scales="per_block"),
        CUDABackend(precision="fp8", fp8_smooth_v=True),
    ):
        out = ffpa_attn_func(q, k, v, is_causal=True, backend=backend)
        assert not torch.equal(out, default), backend
        error = relative_l2(out, sdpa_float32(q, k, v, is_causal=True))
        assert error <= 2 * MAX_RELATIVE_L2, f"{backend}: relative L2 error {error:.3e}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_under_torch_compile_fullgraph(dtype, causal):
    q, k, v = random_qkv(B, H, H, N, N, D, dtype, CUDA)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(lambda q, k, v: fp8_attention(q, k, v, causal), backend=counter, fullgraph=True)
    got = compiled(q, k, v)
    eager = fp8_attention(q, k, v, causal)
    assert (got.dtype, got.shape, got.stride()) == (eager.dtype, eager.shape, eager.stride())
    assert torch.equal(got, eager), "the compiled graph gives eager's bits"
    assert_fp8_accuracy(got, q, k, v, causal)
    targets = [str(node.target) for gm in counter.graphs for node in gm.graph.nodes if node.op == "call_function"]
    assert any("ffpa_attn" in t for t in targets), f"the graph calls the custom op: {targets}"
    assert not any("scaled_dot_product_attention" in t for t in targets), targets

    # New values, same shapes: the graph is reused and follows the inputs.
    q, k, v = random_qkv(B, H, H, N, N, D, dtype, CUDA)
    frames = counter.frame_count
    assert torch.equal(compiled(q, k, v), fp8_attention(q, k, v, causal))
    assert counter.frame_count == frames, "no recompilation"


def test_opcheck_with_fp8_arguments():
    q, k, v = random_qkv(1, 2, 2, 256, 256, D, torch.bfloat16, CUDA)
    # Causal top-left, scale, f32 accumulation, impl auto, no dropout, lse; FP8: int8 Q K
    # scaled per thread group, smooth-K, 64 early rows.
    args = (q, k, v, None, 0.0, 1, D**-0.5, 0, 0, 0, 0, True, 1, 0, 0, True, 64)
    torch.library.opcheck(
        torch.ops.ffpa_attn.forward.default,
        args,
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_in_a_cuda_graph(dtype, causal):
    static_q, static_k, static_v = random_qkv(B, H, H, N, N, D, dtype, CUDA)

    def attention():
        return fp8_attention(static_q, static_k, static_v, causal)

    # Warm-up on a side stream before capture, as torch.cuda.graphs asks (it also
    # plans the call: its FP8 workspace comes from the graph's pool under capture).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = attention()

    previous = None
    for _ in range(2):
        q, k, v = random_qkv(B, H, H, N, N, D, dtype, CUDA)
        for static, new in zip((static_q, static_k, static_v), (q, k, v)):
            static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, fp8_attention(q, k, v, causal)), "the replay gives eager's bits"
        assert_fp8_accuracy(static_out, q, k, v, causal)
        assert previous is None or not torch.equal(previous, static_out), "replay wrote new outputs"
        previous = static_out.clone()
