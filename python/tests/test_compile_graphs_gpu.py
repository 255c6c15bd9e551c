"""torch integration on the GPU: the custom op passes torch.library.opcheck,
torch.compile(fullgraph=True) traces ffpa_attn_func without a graph break and
gives eager's outputs, and a CUDA graph captures it and replays it on new inputs."""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

from attention_inputs import odd_length, random_mask, random_qkv  # noqa: E402
from attention_reference import (  # noqa: E402
    assert_lse_close,
    assert_output_close,
    dropout_attention_float32,
    logsumexp_float64,
)
from ffpa_attn import CUDABackend, ffpa_attn_func  # noqa: E402

CUDA = "cuda"
# The C ABI's enums (include/ffpa/ffpa.h).
CAUSAL_TOP_LEFT, ACCUM_F32, IMPL_AUTO = 1, 0, 0


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: no cache hit hides a graph break or a recompile."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graph_targets(counter: CompileCounterWithBackend) -> list[str]:
    return [str(node.target) for gm in counter.graphs for node in gm.graph.nodes if node.op == "call_function"]


def assert_same_outputs(got, expected):
    got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
    for g, e in zip(got, expected, strict=True):
        assert (g.dtype, g.device, g.shape, g.stride()) == (e.dtype, e.device, e.shape, e.stride())
        assert torch.equal(g, e)


def test_opcheck():
    q, k, v = random_qkv(2, 4, 2, 37, 53, 136, torch.bfloat16, CUDA, layout="bnhd")
    mask = random_mask("batch-keys", torch.float32, 2, 4, 37, 53, CUDA)
    args = (q, k, v, mask, 0.0, CAUSAL_TOP_LEFT, 0.125, ACCUM_F32, IMPL_AUTO, 0, 0, True)
    torch.library.opcheck(
        torch.ops.ffpa_attn.forward.default,
        args,
        test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"),
    )


def test_compile_fullgraph_inductor(rng):
    b, hq, hkv, nq, nkv = 2, 4, 2, odd_length(rng, 3, 129), odd_length(rng, 3, 129)
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, 320, torch.bfloat16, CUDA)
    mask = random_mask("batch-keys", torch.bool, b, hq, nq, nkv, CUDA)

    def attention(q, k, v, mask):
        return ffpa_attn_func(q, k, v, attn_mask=mask, enable_gqa=True, return_lse=True)

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(attention, backend=counter, fullgraph=True)
    assert_same_outputs(compiled(q, k, v, mask), attention(q, k, v, mask))
    targets = graph_targets(counter)
    assert any("ffpa_attn" in t for t in targets), f"the graph calls the custom op: {targets}"
    assert not any("scaled_dot_product_attention" in t for t in targets), targets

    # New values, same shapes: the compiled graph is reused and follows the inputs.
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, 320, torch.bfloat16, CUDA)
    frames = counter.frame_count
    assert_same_outputs(compiled(q, k, v, mask), attention(q, k, v, mask))
    assert counter.frame_count == frames, "no recompilation"


def compile_case(case, rng):
    """(inputs, function of them, whether the library serves it) of a torch.compile case."""
    b, hq, nq, nkv = 2, 4, odd_length(rng, 3, 129), odd_length(rng, 3, 129)
    if case == "bottom-right-bnhd":
        inputs = random_qkv(b, hq, hq, nq, nkv, 512, torch.float16, CUDA, layout="bnhd")
        return (
            inputs,
            lambda q, k, v: ffpa_attn_func(
                q, k, v, is_causal=True, backend=CUDABackend(causal_alignment="bottom_right")
            ),
            True,
        )
    if case == "seeded-dropout":
        inputs = random_qkv(b, hq, hq, nq, nkv, 128, torch.bfloat16, CUDA)
        backend = CUDABackend(dropout_seed=rng.getrandbits(63), dropout_offset=rng.getrandbits(63))
        return inputs, lambda q, k, v: ffpa_attn_func(q, k, v, dropout_p=0.2, backend=backend), True
    if case == "f16-accumulation-scale":
        inputs = random_qkv(b, hq, hq, nq, nkv, 1024, torch.float16, CUDA)
        backend = CUDABackend(accumulation="f16")
        return inputs, lambda q, k, v: ffpa_attn_func(q, k, v, scale=0.02, backend=backend), True
    if case == "fallback-float32":
        inputs = random_qkv(b, hq, hq, nq, nkv, 64, torch.float32, CUDA)
        return inputs, lambda q, k, v: ffpa_attn_func(q, k, v, is_causal=True), False
    if case == "fallback-lse-D1032":
        inputs = random_qkv(b, hq, hq, nq, nkv, 1032, torch.bfloat16, CUDA)
        return inputs, lambda q, k, v: ffpa_attn_func(q, k, v, return_lse=True), False
    raise ValueError(case)


@pytest.mark.parametrize(
    "case", ["bottom-right-bnhd", "seeded-dropout", "f16-accumulation-scale", "fallback-float32", "fallback-lse-D1032"]
)
def test_compile_fullgraph_cases(rng, case):
    inputs, attention, served = compile_case(case, rng)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(attention, backend=counter, fullgraph=True)
    assert_same_outputs(compiled(*inputs), attention(*inputs))
    assert any("ffpa_attn" in t for t in graph_targets(counter)) == served


def test_compile_dynamic_sequence_lengths(rng):
    counter = CompileCounterWithBackend("aot_eager")

    def attention(q, k, v):
        return ffpa_attn_func(q, k, v, is_causal=True, return_lse=True)

    compiled = torch.compile(attention, backend=counter, fullgraph=True, dynamic=True)
    frames_of_first_call = None
    for nq, nkv in [(37, 129), (53, 77), (129, 41)]:
        q, k, v = random_qkv(1, 2, 2, nq, nkv, 256, torch.bfloat16, CUDA)
        assert_same_outputs(compiled(q, k, v), attention(q, k, v))
        frames_of_first_call = frames_of_first_call or counter.frame_count
    assert counter.frame_count == frames_of_first_call, "new sequence lengths reuse the dynamic graph"


def test_compiled_default_dropout_seed_is_drawn_per_call():
    q, k, v = random_qkv(1, 2, 2, 65, 65, 128, torch.bfloat16, CUDA)
    compiled = torch.compile(
        lambda q, k, v: ffpa_attn_func(q, k, v, dropout_p=0.3), fullgraph=True, backend="aot_eager"
    )
    assert not torch.equal(compiled(q, k, v), compiled(q, k, v)), "each call draws a fresh dropout seed"


# Prefill, and decode / spec-decode, whose calls split the keys over CTAs
# (partial rows in stream-ordered memory, then a combine kernel) and pack the
# query heads of a GQA group into one tile.
@pytest.mark.parametrize(
    "b, hq, hkv, nq, nkv",
    [(2, 4, 2, 65, 129), (2, 8, 2, 1, 3001), (1, 8, 2, 4, 2050)],
    ids=["prefill", "decode", "specdec"],
)
def test_cuda_graph_capture_and_replay(rng, b, hq, hkv, nq, nkv):
    pytest.importorskip("numpy")
    from sdpa_dropout_reference import sdpa_mem_efficient_keep_mask

    d, p = 512, 0.1
    dropout_seed = rng.getrandbits(63)
    backend = CUDABackend(causal_alignment="bottom_right", dropout_seed=dropout_seed)
    static_q, static_k, static_v = random_qkv(b, hq, hkv, nq, nkv, d, torch.bfloat16, CUDA)

    def attention():
        return ffpa_attn_func(
            static_q, static_k, static_v, dropout_p=p, is_causal=True, enable_gqa=True, backend=backend, return_lse=True
        )

    # Warm-up on a side stream before capture, as torch.cuda.graphs asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_lse = attention()

    keep = torch.from_numpy(sdpa_mem_efficient_keep_mask(dropout_seed, 0, b, hq, nq, nkv, p))
    previous = None
    for _ in range(2):
        q, k, v = random_qkv(b, hq, hkv, nq, nkv, d, torch.bfloat16, CUDA)
        for static, new in zip((static_q, static_k, static_v), (q, k, v)):
            static.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        expected = dropout_attention_float32(q, k, v, keep, p, causal="bottom_right")
        assert_output_close(static_out, expected, torch.bfloat16)
        assert_lse_close(static_lse, logsumexp_float64(q, k, causal="bottom_right"))
        assert previous is None or not torch.equal(previous, static_out), "replay wrote new outputs"
        previous = static_out.clone()
