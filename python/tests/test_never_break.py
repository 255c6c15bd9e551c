"""Never break a model (issue 16, part 5): where the library cannot run a call the
drop-in would give it -- no library loads, a GPU the build has no kernel image for,
a driver older than the library's CUDA runtime, a launch that fails on the device
for a resource reason -- impl="auto" hands the call to SDPA with the reason at
DEBUG on logger "ffpa_attn"; an explicit impl raises with the reason; other
failures still raise.

Simulated on CPU tensors through the library's Python wrapper (_library): the
call is made to look like one the library serves on a GPU (fallback_reason finds
nothing to decline), and the wrapper answers as the C library does on such a
device: ffpa_device_support's FFPAError, or ffpa_forward's. The C side of these
statuses is tested by tests/cpu/test_device_support.cpp; the wrapper's binding
torch-free by test_device_support.py.
"""

import pytest

torch = pytest.importorskip("torch")

from attention_inputs import random_qkv  # noqa: E402
from attention_reference import ORIGINAL_SDPA  # noqa: E402
from dispatch_probe import capture_fallback_reasons, fallback_reasons  # noqa: E402
from ffpa_attn import CUDABackend, _library, decide, explain, ffpa_attn_func  # noqa: E402
from ffpa_attn._library import FFPAError, Impl  # noqa: E402
from ffpa_attn.decisions import Limits  # noqa: E402

# What the C library says on such devices (src/host/cuda_status.cpp, dispatch.cpp).
NO_KERNEL_IMAGE = FFPAError(
    "impl_unavailable",
    "impl auto: no GPU kernel of this build runs on device 0: impl sm80_split_d cannot run on this device: "
    "cudaFuncGetAttributes returned cudaErrorNoKernelImageForDevice: this build has no kernel image this "
    "device loads: rebuild with the device's architecture in CMAKE_CUDA_ARCHITECTURES",
)
DRIVER_TOO_OLD = FFPAError(
    "impl_unavailable",
    "impl auto needs a CUDA device: the CUDA driver supports CUDA 12.4, older than the CUDA runtime 13.0 "
    "this library was built with: update the driver",
)
LAUNCH_WITHOUT_RESOURCES = FFPAError(
    "impl_unavailable",
    "impl sm80_split_d cannot run on this device: cudaGetLastError() returned cudaErrorLaunchOutOfResources: "
    "the kernel asks for more registers, threads or cluster resources than this device gives it",
)
DEVICE_ANSWERS = {"no-kernel-image": NO_KERNEL_IMAGE, "driver-too-old": DRIVER_TOO_OLD}
EXPLICIT_IMPLS = {"ffpa": Impl.AUTO, "sm80_split_d": Impl.SM80_SPLIT_D, "sm90_wgmma": Impl.SM90_WGMMA}


class LibraryDouble:
    """The wrapper's answers on a simulated GPU: ffpa_device_support's (None: the
    device runs the build's kernels) and ffpa_forward's (None: the call runs)."""

    def __init__(self, device_error: FFPAError | None = None, forward_error: FFPAError | None = None) -> None:
        self.device_error = device_error
        self.forward_error = forward_error
        self.device_questions: list[tuple[object, Impl]] = []
        self.forward_calls = 0

    def device_support(self, device, impl=Impl.AUTO):
        self.device_questions.append((device, impl))
        return self.device_error

    def forward(self, params) -> None:
        self.forward_calls += 1
        if self.forward_error is not None:
            raise self.forward_error

    def forward_prepared(self, params_ref, message) -> None:  # the eager path's call (ops.launch)
        self.forward(params_ref)


@pytest.fixture
def simulated_gpu(monkeypatch):
    """Installs a LibraryDouble (returned; set its answers before calling) behind a
    drop-in that takes these CPU calls for calls it serves on a GPU."""
    double = LibraryDouble()
    monkeypatch.setattr(_library, "device_support", double.device_support)
    monkeypatch.setattr(_library, "forward", double.forward)
    monkeypatch.setattr(_library, "forward_prepared", double.forward_prepared)
    monkeypatch.setattr(decide, "fallback_reason", lambda spec, limits: None)
    monkeypatch.setattr(decide, "_LIBRARY_LIMITS", Limits(8, 1024, 8))
    monkeypatch.setattr(decide, "_LIBRARY_MISSING", None)
    monkeypatch.setattr(decide, "_DECISIONS", {})  # decisions cached by other tests' answers
    return double


def large_head_dim_call():
    """A bf16 call at D = 512: served by ffpa under impl="auto" wherever the library runs."""
    return random_qkv(2, 4, 2, 33, 47, 512, torch.bfloat16, "cpu")


def assert_sdpa_served(got, q, k, v, **kwargs):
    assert torch.equal(got, ORIGINAL_SDPA(q, k, v, **kwargs))


@pytest.mark.parametrize("answer", DEVICE_ANSWERS)
def test_auto_on_a_device_the_library_runs_no_kernel_on_is_sdpa_with_the_reason(simulated_gpu, caplog, answer):
    simulated_gpu.device_error = DEVICE_ANSWERS[answer]
    capture_fallback_reasons(caplog)
    q, k, v = large_head_dim_call()
    out = ffpa_attn_func(q, k, v, is_causal=True, enable_gqa=True)
    assert_sdpa_served(out, q, k, v, is_causal=True, enable_gqa=True)
    assert simulated_gpu.forward_calls == 0, "nothing was launched"
    assert simulated_gpu.device_questions and all(impl == Impl.AUTO for _, impl in simulated_gpu.device_questions)
    reasons = fallback_reasons(caplog)
    assert any(DEVICE_ANSWERS[answer].message in reason for reason in reasons), reasons
    assert "runs no kernel" in explain(q, k, v, is_causal=True, enable_gqa=True)


def test_the_device_is_asked_once_per_decision(simulated_gpu):
    simulated_gpu.device_error = NO_KERNEL_IMAGE
    q, k, v = large_head_dim_call()
    for _ in range(3):
        ffpa_attn_func(q, k, v, enable_gqa=True)
    assert len(simulated_gpu.device_questions) == 1, "eager calls reuse the cached decision"


def test_return_lse_and_bottom_right_causal_hold_on_that_fallback(simulated_gpu):
    simulated_gpu.device_error = NO_KERNEL_IMAGE
    q, k, v = large_head_dim_call()
    backend = CUDABackend(causal_alignment="bottom_right")
    out, lse = ffpa_attn_func(q, k, v, is_causal=True, enable_gqa=True, backend=backend, return_lse=True)
    mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2])
    assert_sdpa_served(out, q, k, v, attn_mask=mask, enable_gqa=True)
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32


@pytest.mark.parametrize("impl", EXPLICIT_IMPLS)
def test_an_explicit_impl_on_such_a_device_raises_with_the_reason(simulated_gpu, impl):
    simulated_gpu.device_error = NO_KERNEL_IMAGE
    q, k, v = large_head_dim_call()
    with pytest.raises(NotImplementedError, match="cudaErrorNoKernelImageForDevice") as error:
        ffpa_attn_func(q, k, v, enable_gqa=True, backend=CUDABackend(impl=impl))
    assert repr(impl) in str(error.value)
    assert simulated_gpu.device_questions[-1][1] == EXPLICIT_IMPLS[impl]
    assert simulated_gpu.forward_calls == 0


def test_auto_after_a_launch_that_fails_on_the_device_is_sdpa_with_the_reason(simulated_gpu, caplog):
    simulated_gpu.forward_error = LAUNCH_WITHOUT_RESOURCES
    capture_fallback_reasons(caplog)
    q, k, v = large_head_dim_call()
    for _ in range(2):  # the decision is cached as ffpa's: each call tries, fails and falls back
        caplog.clear()
        out = ffpa_attn_func(q, k, v, scale=0.25, enable_gqa=True)
        assert_sdpa_served(out, q, k, v, scale=0.25, enable_gqa=True)
        reasons = fallback_reasons(caplog)
        assert any("cudaErrorLaunchOutOfResources" in reason for reason in reasons), reasons
    assert simulated_gpu.forward_calls == 2


def test_a_failed_launch_gives_lse_too(simulated_gpu):
    simulated_gpu.forward_error = LAUNCH_WITHOUT_RESOURCES
    q, k, v = large_head_dim_call()
    out, lse = ffpa_attn_func(q, k, v, enable_gqa=True, return_lse=True)
    assert_sdpa_served(out, q, k, v, enable_gqa=True)
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32


@pytest.mark.parametrize("impl", EXPLICIT_IMPLS)
def test_an_explicit_impl_after_a_failed_launch_raises_with_the_reason(simulated_gpu, impl):
    simulated_gpu.forward_error = LAUNCH_WITHOUT_RESOURCES
    q, k, v = large_head_dim_call()
    with pytest.raises(NotImplementedError, match="cudaErrorLaunchOutOfResources"):
        ffpa_attn_func(q, k, v, enable_gqa=True, backend=CUDABackend(impl=impl))


def test_other_failures_still_raise_under_auto(simulated_gpu):
    # A fault of the call or a broken context is not hidden behind SDPA.
    simulated_gpu.forward_error = FFPAError(
        "cuda_error", "cudaGetLastError(): cudaErrorIllegalAddress (an illegal memory access was encountered)"
    )
    q, k, v = large_head_dim_call()
    with pytest.raises(FFPAError, match="cudaErrorIllegalAddress"):
        ffpa_attn_func(q, k, v, enable_gqa=True)


def test_auto_without_a_library_is_sdpa_with_the_reason(simulated_gpu, monkeypatch, caplog):
    missing = "ffpa_attn: cannot find the ffpa C library. FFPA_LIBRARY is not set, and: ..."
    monkeypatch.setattr(decide, "_LIBRARY_MISSING", missing)
    monkeypatch.setattr(decide, "_LIBRARY_LIMITS", None)
    capture_fallback_reasons(caplog)
    q, k, v = large_head_dim_call()
    assert_sdpa_served(ffpa_attn_func(q, k, v, enable_gqa=True), q, k, v, enable_gqa=True)
    assert any("no ffpa library loads" in reason for reason in fallback_reasons(caplog))
    with pytest.raises(NotImplementedError, match="cannot find the ffpa C library"):
        ffpa_attn_func(q, k, v, enable_gqa=True, backend=CUDABackend(impl="sm80_split_d"))
    assert simulated_gpu.device_questions == [] and simulated_gpu.forward_calls == 0


def test_compiled_call_on_such_a_device_is_sdpa_without_a_graph_break(simulated_gpu):
    # The device is asked while tracing (the answer is fixed for the process), so the
    # graph holds SDPA and nothing of the library.
    torch._dynamo.reset()
    simulated_gpu.device_error = NO_KERNEL_IMAGE
    q, k, v = large_head_dim_call()

    def attention(q, k, v):
        return ffpa_attn_func(q, k, v, is_causal=True, enable_gqa=True)

    compiled = torch.compile(attention, fullgraph=True, backend="eager")
    assert_sdpa_served(compiled(q, k, v), q, k, v, is_causal=True, enable_gqa=True)
    assert simulated_gpu.device_questions and simulated_gpu.forward_calls == 0
    torch._dynamo.reset()


def test_compiled_call_whose_launch_fails_raises(simulated_gpu):
    # Documented: a compiled graph cannot switch paths after tracing; the failure raises.
    torch._dynamo.reset()
    simulated_gpu.forward_error = LAUNCH_WITHOUT_RESOURCES
    q, k, v = large_head_dim_call()
    compiled = torch.compile(lambda q, k, v: ffpa_attn_func(q, k, v, enable_gqa=True), fullgraph=True, backend="eager")
    with pytest.raises(FFPAError, match="cudaErrorLaunchOutOfResources"):
        compiled(q, k, v)
    torch._dynamo.reset()


# precision="fp8" runs on the sm90 family only: the device is asked about that family.
NO_SM90 = FFPAError("impl_unavailable", "impl sm90_wgmma needs compute capability 9.0; device 0 has 8.0")


def test_fp8_on_a_device_without_the_sm90_family_is_sdpa_saying_fp8(simulated_gpu, caplog):
    simulated_gpu.device_error = NO_SM90
    capture_fallback_reasons(caplog)
    q, k, v = large_head_dim_call()
    backend = CUDABackend(precision="fp8")
    out = ffpa_attn_func(q, k, v, is_causal=True, enable_gqa=True, backend=backend)
    assert_sdpa_served(out, q, k, v, is_causal=True, enable_gqa=True)
    assert simulated_gpu.forward_calls == 0
    assert [impl for _, impl in simulated_gpu.device_questions] == [Impl.SM90_WGMMA]
    reasons = fallback_reasons(caplog)
    assert any("fp8" in reason and NO_SM90.message in reason for reason in reasons), reasons
    said = explain(q, k, v, is_causal=True, enable_gqa=True, backend=backend)
    assert said.startswith("PyTorch SDPA") and "fp8" in said, said


@pytest.mark.parametrize("impl", ["ffpa", "sm90_wgmma"])
def test_fp8_with_an_explicit_impl_on_such_a_device_raises_saying_fp8(simulated_gpu, impl):
    simulated_gpu.device_error = NO_SM90
    q, k, v = large_head_dim_call()
    with pytest.raises(NotImplementedError, match="compute capability 9.0") as error:
        ffpa_attn_func(q, k, v, enable_gqa=True, backend=CUDABackend(impl=impl, precision="fp8"))
    assert "precision='fp8'" in str(error.value)
    assert simulated_gpu.device_questions[-1][1] == Impl.SM90_WGMMA


def test_fp8_after_a_launch_the_library_declines_is_sdpa_saying_fp8(simulated_gpu, caplog):
    # E.g. a head dim above the build's largest FP8 instance: impl_unavailable from ffpa_forward.
    simulated_gpu.forward_error = FFPAError(
        "impl_unavailable", "fp8: head dim 1024 is above 512, the largest FP8 instance of this build"
    )
    capture_fallback_reasons(caplog)
    q, k, v = large_head_dim_call()
    out = ffpa_attn_func(q, k, v, enable_gqa=True, backend=CUDABackend(precision="fp8"))
    assert_sdpa_served(out, q, k, v, enable_gqa=True)
    reasons = fallback_reasons(caplog)
    assert any("precision='fp8'" in reason and "largest FP8 instance" in reason for reason in reasons), reasons


def test_fp8_where_the_library_runs_it_is_ffpa_with_fp8_in_the_explanation(simulated_gpu):
    q, k, v = large_head_dim_call()
    said = explain(q, k, v, enable_gqa=True, backend=CUDABackend(precision="fp8"))
    assert said.startswith("ffpa (impl auto, precision fp8)"), said
