"""The custom op on CPU tensors runs the library's CPU reference (host pointers):
without a GPU this checks the ctypes plumbing (strides, broadcast masks, enums, lse)
against SDPA, and that the tests' Philox keep-mask is exactly the library's."""

import pytest

torch = pytest.importorskip("torch")

from ffpa_attn import _library  # noqa: E402

try:
    _library.load_library()
except _library.LibraryNotFoundError as error:
    pytest.skip(f"the ffpa C library does not load (set FFPA_LIBRARY): {error}", allow_module_level=True)

from attention_inputs import MASK_PATTERNS, identity_values, random_mask, random_qkv, uniform  # noqa: E402
from attention_reference import (  # noqa: E402
    CAUSAL_ALIGNMENTS,
    assert_lse_close,
    assert_output_close,
    causal_mask,
    logsumexp_float64,
    sdpa_float32,
)

import ffpa_attn.ops  # noqa: E402,F401 - registers torch.ops.ffpa_attn.forward

CPU = "cpu"


def reference_op(q, k, v, mask=None, causal=None, scale=None, dropout_p=0.0, seed=0, offset=0):
    """torch.ops.ffpa_attn.forward with impl cpu_reference: (o, lse)."""
    return torch.ops.ffpa_attn.forward(
        q,
        k,
        v,
        mask,
        dropout_p,
        _library.Causal[causal.upper()] if causal else _library.Causal.NONE,
        q.shape[-1] ** -0.5 if scale is None else scale,
        _library.Accumulation.F32,
        _library.Impl.CPU_REFERENCE,
        seed,
        offset,
        True,
    )


@pytest.mark.parametrize("layout", ["bhnd", "bnhd", "padded-rows"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_layouts_and_gqa(rng, dtype, layout):
    b, hq, hkv, nq, nkv, d = 2, 4, 2, 23, 31, rng.choice([8, 72, 136])
    q, k, v = random_qkv(b, hq, hkv, nq, nkv, d, dtype, CPU, layout)
    o, lse = reference_op(q, k, v, scale=0.2)
    assert o.stride() == torch.empty_like(q).stride()
    assert_output_close(o, sdpa_float32(q, k, v, scale=0.2, enable_gqa=True), dtype)
    assert_lse_close(lse, logsumexp_float64(q, k, scale=0.2))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("pattern", MASK_PATTERNS)
def test_masks(pattern, mask_dtype):
    b, h, nq, nkv, d = 2, 3, 21, 29, 64
    q, k, v = random_qkv(b, h, h, nq, nkv, d, torch.bfloat16, CPU)
    mask = random_mask(pattern, mask_dtype, b, h, nq, nkv, CPU)
    o, lse = reference_op(q, k, v, mask)
    assert_output_close(o, sdpa_float32(q, k, v, attn_mask=mask), torch.bfloat16)
    assert_lse_close(lse, logsumexp_float64(q, k, mask))


@pytest.mark.parametrize(("nq", "nkv"), [(13, 29), (29, 13)])
@pytest.mark.parametrize("alignment", CAUSAL_ALIGNMENTS)
def test_causal(alignment, nq, nkv):
    q, k, v = random_qkv(1, 2, 2, nq, nkv, 32, torch.float16, CPU)
    o, lse = reference_op(q, k, v, causal=alignment)
    assert_output_close(o, sdpa_float32(q, k, v, attn_mask=causal_mask(nq, nkv, alignment, CPU)), torch.float16)
    assert_lse_close(lse, logsumexp_float64(q, k, causal=alignment))


@pytest.mark.parametrize("dropout_p", [0.1, 0.5, 0.9])
def test_dropout_keep_mask_is_the_library_mask(rng, dropout_p):
    pytest.importorskip("numpy")
    from sdpa_dropout_reference import sdpa_mem_efficient_keep_mask

    b, h, nq, nkv, d = 2, 3, 37, 101, 128
    seed, offset = rng.getrandbits(63), rng.getrandbits(63)
    q = uniform((b, h, nq, d), -0.5, 0.5, torch.bfloat16, CPU)
    k = uniform((b, h, nkv, d), -0.5, 0.5, torch.bfloat16, CPU)
    o, _ = reference_op(
        q, k, identity_values(b, h, nkv, d, torch.bfloat16, CPU), dropout_p=dropout_p, seed=seed, offset=offset
    )
    kept = o[..., :nkv] != 0
    keep = torch.from_numpy(sdpa_mem_efficient_keep_mask(seed, offset, b, h, nq, nkv, dropout_p))
    assert torch.equal(kept, keep), f"{(kept != keep).sum().item()} of {keep.numel()} keep decisions differ"


def test_threads_each_use_their_own_params(rng):
    """Calls of one layout from several threads at once (each thread writes its
    pointers into its own FfpaForwardParams, ops._Slot): every result is its inputs'."""
    import threading

    inputs = [random_qkv(1, 2, 2, 9, 17, 32, torch.bfloat16, CPU) for _ in range(4)]
    expected = [sdpa_float32(q, k, v, scale=0.25) for q, k, v in inputs]
    failures = []

    def work(index):
        q, k, v = inputs[index]
        for _ in range(25):
            o, _ = reference_op(q, k, v, scale=0.25)
            try:
                assert_output_close(o, expected[index], torch.bfloat16)
            except AssertionError as error:
                failures.append(error)
                return

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[0]


def test_a_call_reentering_its_thread_takes_a_fresh_params(rng):
    """A call made while this thread's params of the layout are in use (a signal
    handler's) runs on params of its own and leaves the outer call's words alone."""
    q, k, v = random_qkv(1, 2, 2, 9, 17, 32, torch.float16, CPU)
    reference_op(q, k, v, scale=0.25)  # the layout's plan and this thread's slot
    options = (
        0.0, _library.Causal.NONE, 0.25, _library.Accumulation.F32, _library.Impl.CPU_REFERENCE,
        *ffpa_attn.ops.INPUT_PRECISION,
    )  # fmt: skip
    plan = ffpa_attn.ops.plan_for(q, k, v, None, True, options)
    slot = plan.threads.slot
    slot.busy = True  # as inside the outer call
    before = bytes(slot.words)
    try:
        q2, k2, v2 = random_qkv(1, 2, 2, 9, 17, 32, torch.float16, CPU)
        o, _ = reference_op(q2, k2, v2, scale=0.25)
        assert bytes(slot.words) == before
        assert slot.busy
    finally:
        slot.busy = False
    assert_output_close(o, sdpa_float32(q2, k2, v2, scale=0.25), torch.float16)


# The op's precision arguments reach the library's options (the C ABI's ffpa_fp8_options):
# its validation names the values it read; on host pointers FP8 itself is unavailable.
FP8_OP_CASES = {
    "precision-out-of-range": (dict(precision=7), "invalid_option", "options.precision = 7"),
    "qk-format-out-of-range": (dict(precision=1, fp8_qk_format=7), "invalid_option", "options.fp8.qk_format = 7"),
    "qk-scales-out-of-range": (dict(precision=1, fp8_qk_scales=5), "invalid_option", "options.fp8.qk_scales = 5"),
    "v-scales-out-of-range": (dict(precision=1, fp8_v_scales=5), "invalid_option", "options.fp8.v_scales = 5"),
    "smooth-v-with-dropout": (
        dict(dropout_p=0.25, precision=1, fp8_smooth_v=True),
        "invalid_option",
        "options.fp8.smooth_v with dropout",
    ),
    "early-rows-not-whole-tiles": (
        dict(precision=1, fp8_early_rows=65),
        "invalid_option",
        "options.fp8.early_rows = 65",
    ),
    "fp8-on-the-cpu-reference": (dict(precision=1), "impl_unavailable", "precision fp8 runs on impl sm90_wgmma only"),
}


@pytest.mark.parametrize("case", FP8_OP_CASES.values(), ids=FP8_OP_CASES.keys())
def test_fp8_arguments_reach_the_library(case):
    arguments, status, words = case
    arguments = dict(arguments)
    dropout_p = arguments.pop("dropout_p", 0.0)
    q, k, v = random_qkv(1, 2, 2, 9, 17, 64, torch.bfloat16, CPU)
    with pytest.raises(_library.FFPAError) as error:
        torch.ops.ffpa_attn.forward(
            q, k, v, None, dropout_p, _library.Causal.NONE, 0.125, _library.Accumulation.F32,
            _library.Impl.CPU_REFERENCE, 0, 0, False, **arguments,
        )  # fmt: skip
    assert error.value.status_name == status, error.value
    assert words in error.value.message, error.value.message


def test_fp8_knobs_without_precision_fp8_change_nothing():
    q, k, v = random_qkv(1, 2, 2, 9, 17, 64, torch.float16, CPU)
    plain, _ = reference_op(q, k, v)
    knobs = dict(
        fp8_qk_format=1, fp8_qk_scales=1, fp8_smooth_k=False, fp8_early_rows=64, fp8_v_scales=1, fp8_smooth_v=True
    )
    o, _ = torch.ops.ffpa_attn.forward(
        q, k, v, None, 0.0, _library.Causal.NONE, 0.125, _library.Accumulation.F32, _library.Impl.CPU_REFERENCE,
        0, 0, True, **knobs,
    )  # fmt: skip
    assert torch.equal(o, plain)
