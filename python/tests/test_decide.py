"""decide.py, the package's one place that decides: a call asks it once (counted: the decision, and
within it each rule and library question), an eager call looks its decision up by metadata, a failed
launch's fallback asks nothing again; and issue 31's finding 4c: a training call SDPA raises for (bf16,
D 1024, an fp32 additive mask) goes to ffpa and trains through ffpa's backward, while a call SDPA raises
for because it is invalid still gets SDPA's error.

CPU tensors stand for CUDA ones here: the call's spec says "cuda", the library's device answers say its
kernels run there, and the library's op computes on its CPU reference (forward and backward)."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from attention_inputs import random_qkv  # noqa: E402
from attention_reference import ORIGINAL_SDPA  # noqa: E402
from dispatch_probe import (  # noqa: E402
    assert_same_outcome,
    capture_fallback_reasons,
    fallback_reasons,
    run_and_check_served,
)
from ffpa_attn import _library, decide, explain, ffpa_attn_func  # noqa: E402
from ffpa_attn._library import FFPAError, Impl  # noqa: E402
from ffpa_attn.decisions import Limits  # noqa: E402


class Counts:
    """How often each of decide's steps ran: the decision, its rules, the library's answers."""

    def __init__(self, monkeypatch) -> None:
        self.calls: dict[str, int] = {}
        self.questions: dict[str, list] = {}  # the library's: their arguments
        for name in ("decide", "call_spec", "fallback_reason", "route", "sdpa_backends", "library_unusable"):
            self._count(monkeypatch, decide, name)
        for name in ("device_support", "backward_route"):
            self._count(monkeypatch, _library, name)

    def _count(self, monkeypatch, module, name: str) -> None:
        function = getattr(module, name)

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            self.questions.setdefault(name, []).append(args)
            return function(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)

    def take(self) -> dict[str, int]:
        taken, self.calls = self.calls, {}
        return taken


@pytest.fixture
def simulated_gpu(monkeypatch):
    """CPU calls decided as CUDA calls on a GPU the library runs its kernels on, whose backward is the
    portable one; the op then runs the library's CPU reference. Returns the double's forward failure
    setter: None, or the FFPAError ffpa_forward raises."""
    real_call_spec = decide.call_spec
    as_cuda = lambda *args: dataclasses.replace(real_call_spec(*args), device_type="cuda")  # noqa: E731
    monkeypatch.setattr(decide, "call_spec", as_cuda)
    monkeypatch.setattr(decide, "_LIBRARY_LIMITS", Limits(8, 1024, 8))
    monkeypatch.setattr(decide, "_LIBRARY_MISSING", None)
    monkeypatch.setattr(decide, "_DECISIONS", {})  # decisions cached by other tests' answers
    monkeypatch.setattr(_library, "device_support", lambda device, impl=Impl.AUTO: None)
    monkeypatch.setattr(_library, "backward_route", lambda device, dtype, d, dv, impl=Impl.AUTO: Impl.SM80_SPLIT_D)
    failure = {"error": None}
    real_forward_prepared, real_forward = _library.forward_prepared, _library.forward

    def forward_prepared(params_ref, message):
        if failure["error"] is not None:
            raise failure["error"]
        real_forward_prepared(params_ref, message)

    def forward(params):
        if failure["error"] is not None:
            raise failure["error"]
        real_forward(params)

    monkeypatch.setattr(_library, "forward_prepared", forward_prepared)
    monkeypatch.setattr(_library, "forward", forward)
    return lambda error: failure.update(error=error)


def d512_call():
    return random_qkv(1, 2, 2, 9, 21, 512, torch.bfloat16, "cpu")


def test_an_eager_call_asks_once_and_a_repeated_one_not_at_all(simulated_gpu, monkeypatch):
    _library.load_library()
    counts = Counts(monkeypatch)
    q, k, v = d512_call()
    ffpa_attn_func(q, k, v)
    asked = counts.take()
    assert asked["decide"] == 1, asked
    # Within the decision each rule runs once; the device is asked about the library's Hopper family (its
    # D 512 instance's rows) and about the impl: each question once.
    for step in ("call_spec", "fallback_reason", "route", "sdpa_backends", "library_unusable"):
        assert asked[step] == 1, (step, asked)
    assert sorted(counts.questions["device_support"]) == sorted({*counts.questions["device_support"]})
    assert "backward_route" not in asked, "a call without grad asks nothing of the backward"
    for _ in range(3):
        ffpa_attn_func(q, k, v)
    assert counts.take() == {}, "a repeated eager call is looked up by its metadata"
    ffpa_attn_func(q, k[:, :, :20], v[:, :, :20])
    assert counts.take()["decide"] == 1


def test_a_training_call_asks_its_backward_within_the_one_decision(simulated_gpu, monkeypatch):
    _library.load_library()
    counts = Counts(monkeypatch)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 9, 64, 512, torch.bfloat16, "cpu"))
    explain(q, k, v)
    asked = counts.take()
    assert asked["decide"] == 1 and asked["route"] == 1, asked
    # Whether a backward runs and whether it is the Hopper one: the binding keeps the library's answer.
    assert asked["backward_route"] == 2, asked


def test_a_failed_launch_falls_back_without_deciding_again(simulated_gpu, monkeypatch, caplog):
    _library.load_library()
    simulated_gpu(FFPAError("impl_unavailable", "cudaErrorLaunchOutOfResources: more registers than the device has"))
    capture_fallback_reasons(caplog)
    q, k, v = d512_call()
    counts = Counts(monkeypatch)
    out = ffpa_attn_func(q, k, v)
    assert torch.equal(out, ORIGINAL_SDPA(q, k, v))
    asked = counts.take()
    assert asked["decide"] == 1 and asked["sdpa_backends"] == 1, asked
    assert any("cudaErrorLaunchOutOfResources" in reason for reason in fallback_reasons(caplog))


def test_explain_and_a_call_on_tensor_subclasses_ask_once_each(simulated_gpu, monkeypatch):
    _library.load_library()
    counts = Counts(monkeypatch)
    q, k, v = d512_call()
    assert explain(q, k, v).startswith("ffpa (impl auto)")
    assert counts.take()["decide"] == 1
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (q, k, v)]
        for _ in range(2):  # not plain tensors: decided per call (as while tracing), not looked up
            assert ffpa_attn_func(*fake).shape == q.shape
            assert counts.take()["decide"] == 1


def test_a_traced_training_call_takes_the_library_s_backward_answer_as_a_constant(simulated_gpu, monkeypatch):
    # While torch.compile traces, the backward's answer is asked (assume_constant_result): no graph break.
    _library.load_library()
    asked = []
    monkeypatch.setattr(_library, "backward_route", lambda *args: asked.append(args) or Impl.SM90_WGMMA)
    q, k, v = (t.requires_grad_() for t in random_qkv(1, 2, 2, 9, 600, 512, torch.bfloat16, "cpu"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: ffpa_attn_func(q, k, v), fullgraph=True, backend="eager")
    out = compiled(q, k, v)
    torch.autograd.grad(out.float().sum(), (q, k, v))
    assert asked and {args[2:4] for args in asked} == {(512, 512)}
    torch._dynamo.reset()


# --- issue 31, finding 4c ------------------------------------------------------------------------------


def finding_4c_call(requires_grad=True):
    """bf16 q [2,1,1,1024], k/v [2,1,5,1024] (views of [B, N, H, D] memory), an fp32 additive mask."""
    q, k, v = random_qkv(2, 1, 1, 1, 5, 1024, torch.bfloat16, "cpu", "bnhd")
    mask = torch.randn(2, 1, 1, 5, dtype=torch.float32)
    mask[1, 0, 0, 3] = float("-inf")
    return [t.requires_grad_(requires_grad) for t in (q, k, v)], mask


def test_the_4c_training_call_goes_to_ffpa_and_trains_through_its_backward(simulated_gpu, monkeypatch):
    _library.load_library()
    (q, k, v), mask = finding_4c_call()
    said = explain(q, k, v, attn_mask=mask)
    assert said.startswith("ffpa (impl auto)") and "invalid dtype for bias" in said, said
    grad_out = torch.randn(2, 1, 1, 1024, dtype=torch.float64)
    backward_ran = []
    real_backward = _library.backward
    monkeypatch.setattr(_library, "backward", lambda params: backward_ran.append(1) or real_backward(params))
    out, served = run_and_check_served(lambda: ffpa_attn_func(q, k, v, attn_mask=mask))
    assert served, "the library's op ran the forward"
    grads = torch.autograd.grad((out.double() * grad_out).sum(), (q, k, v))
    assert backward_ran == [1], "ffpa_backward computed the gradients"

    reference = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want_out = ORIGINAL_SDPA(*reference, attn_mask=mask.double())
    want = torch.autograd.grad((want_out * grad_out).sum(), reference)
    assert ((out.double() - want_out).norm() / want_out.norm()).item() < 1e-2
    for name, got, expected in zip("qkv", grads, want):
        assert torch.isfinite(got).all(), name
        assert ((got.double() - expected).norm() / expected.norm()).item() < 2e-2, f"d{name}"


def test_the_same_call_without_the_refusal_stays_where_the_tables_put_it(simulated_gpu):
    _library.load_library()
    (q, k, v), mask = finding_4c_call()
    # A mask of the query's dtype is one SDPA's memory-efficient kernel takes: few keys train on SDPA.
    said = explain(q, k, v, attn_mask=mask.bfloat16())
    assert said.startswith("PyTorch SDPA") and "training with B x Hkv x Nkv = 10" in said, said
    (q, k, v), mask = finding_4c_call(requires_grad=False)
    assert "invalid dtype for bias" in explain(q, k, v, attn_mask=mask)


# Calls SDPA rejects as invalid, built on the 4c call: they stay SDPA's, errors and all.
INVALID_CALLS = {
    "key-dtype-differs": lambda q, k, v: dict(key=k.half()),
    "mask-not-broadcastable": lambda q, k, v: dict(attn_mask=torch.zeros(2, 1, 1, 6)),
    "causal-with-mask": lambda q, k, v: dict(is_causal=True),
    "gqa-without-enable-gqa": lambda q, k, v: dict(query=torch.cat([q, q], 1)),
}


@pytest.mark.parametrize("invalid", INVALID_CALLS)
def test_an_invalid_call_with_that_mask_still_gets_sdpa_s_error(simulated_gpu, invalid):
    _library.load_library()
    (q, k, v), mask = finding_4c_call()
    arguments = dict(query=q, key=k, value=v, attn_mask=mask) | INVALID_CALLS[invalid](q, k, v)
    assert explain(**arguments).startswith("PyTorch SDPA"), explain(**arguments)
    assert_same_outcome(lambda: ffpa_attn_func(**arguments), lambda: ORIGINAL_SDPA(**arguments))


# --- what an entry point that runs on ffpa or raises asks --------------------------------------------------


def test_library_refusal_says_why_the_library_cannot_run_such_a_call(monkeypatch):
    monkeypatch.setattr(decide, "_LIBRARY_LIMITS", Limits(8, 1024, 8))
    monkeypatch.setattr(decide, "_LIBRARY_MISSING", None)
    device_answer = {"error": None}
    monkeypatch.setattr(_library, "device_support", lambda device, impl=Impl.AUTO: device_answer["error"])
    backward_answer = {"value": Impl.SM80_SPLIT_D}
    monkeypatch.setattr(_library, "backward_route", lambda *args: backward_answer["value"])
    assert decide.library_refusal(0, "bfloat16", 576, 512) is None
    assert decide.library_refusal(0, "bfloat16", 576, 512, needs_grad=True) is None
    assert "float32 is not served" in decide.library_refusal(0, "float32", 64, 64)
    assert "value head dim 1032" in decide.library_refusal(0, "float16", 64, 1032)
    backward_answer["value"] = FFPAError("impl_unavailable", "sm80_backward: no kernel image for this device")
    assert decide.library_refusal(0, "bfloat16", 512, 512) is None, "a forward alone asks no backward"
    assert "runs no backward" in decide.library_refusal(0, "bfloat16", 512, 512, needs_grad=True)
    device_answer["error"] = FFPAError("impl_unavailable", "impl sm90_wgmma needs compute capability 9.0")
    assert "compute capability 9.0" in decide.library_refusal(0, "bfloat16", 512, 512, impl="sm90_wgmma")
    monkeypatch.setattr(decide, "_LIBRARY_MISSING", "ffpa_attn: cannot find the ffpa C library")
    assert "no ffpa library loads" in decide.library_refusal(0, "bfloat16", 512, 512)
