"""Whether the drop-in takes routing.py's training rows measured on the Hopper backward for a call
(functional._hopper_backward_serves), asked of the library: its sm90 backward instances
(ffpa_library_info's sm90_backward_head_dims) and whether its sm_90a kernels run on the call's device
(ffpa_device_support), both answered here by doubles; and that the answer reaches routing."""

import pytest

torch = pytest.importorskip("torch")

from call_specs import served_call_spec  # noqa: E402
from ffpa_attn import explain, functional  # noqa: E402
from ffpa_attn._library import FFPAError  # noqa: E402
from ffpa_attn.decisions import Limits  # noqa: E402

NO_SM90_KERNELS = "the ffpa library runs no kernel on cuda:0: impl sm90_wgmma cannot run on this device"


def training_call(d_qk: int, d_v: int | None = None, **changes):
    """A bf16 CUDA call that needs grad, B 1, H 16, N 4096."""
    d_v = d_qk if d_v is None else d_v
    fields = dict(needs_grad=True) | changes
    return served_call_spec((1, 16, 4096, d_qk), (1, 16, 4096, d_qk), (1, 16, 4096, d_v), **fields)


def serves(call) -> bool:
    return functional._hopper_backward_serves(call, 0)


@pytest.fixture
def device_questions(monkeypatch):
    """A build with sm90 backward instances 256, 512 and 1024 on a GPU that runs its sm_90a kernels;
    returns the (device, impl) questions asked of the library."""
    questions = []

    def device_unsupported(device_index, impl):
        questions.append((device_index, impl))
        return None

    monkeypatch.setattr(functional, "_device_unsupported", device_unsupported)
    monkeypatch.setattr(functional, "_SM90_BACKWARD_HEAD_DIMS", (256, 512, 1024))
    return questions


def test_served_where_an_instance_is_as_wide_as_the_call(device_questions):
    assert serves(training_call(1024))
    assert serves(training_call(320))  # on the 512 instance
    assert serves(training_call(576, 512))  # absorbed MLA: the 1024 instance
    assert device_questions == [(0, "sm90_wgmma")] * 3


def test_the_wider_head_dim_needs_an_instance(device_questions, monkeypatch):
    monkeypatch.setattr(functional, "_SM90_BACKWARD_HEAD_DIMS", (256, 512))
    assert serves(training_call(512))
    assert not serves(training_call(576, 512))
    assert not serves(training_call(128, 640))
    monkeypatch.setattr(functional, "_SM90_BACKWARD_HEAD_DIMS", ())  # a build without sm_90a
    assert not serves(training_call(320))


def test_not_served_on_a_gpu_without_the_sm90_kernels(device_questions, monkeypatch):
    monkeypatch.setattr(functional, "_device_unsupported", lambda device_index, impl: NO_SM90_KERNELS)
    assert not serves(training_call(1024))

    def binding_error(device_index, impl):
        raise FFPAError("invalid_option", "device ordinal out of range")

    monkeypatch.setattr(functional, "_device_unsupported", binding_error)
    assert not serves(training_call(1024))


def test_calls_without_a_backward_or_off_cuda_never_ask(device_questions):
    assert not serves(training_call(1024, needs_grad=False))
    assert not serves(training_call(1024, device_type="cpu"))
    assert not functional._hopper_backward_serves(training_call(1024), None)
    assert device_questions == []


@pytest.mark.parametrize("hopper_backward", [False, True])
def test_the_answer_decides_a_training_call_at_d1024_n4096(monkeypatch, hopper_backward):
    # Portable backward: 0.97x SDPA's, so SDPA trains; Hopper backward: 4.47-5.53x, so ffpa trains.
    monkeypatch.setattr(functional, "fallback_reason", lambda spec, limits: None)  # as if served on a GPU
    monkeypatch.setattr(functional, "_LIBRARY_LIMITS", Limits(8, 1024, 8))
    monkeypatch.setattr(functional, "_LIBRARY_MISSING", None)
    monkeypatch.setattr(functional, "_device_unsupported", lambda device_index, impl: None)
    monkeypatch.setattr(functional, "_hopper_backward_serves", lambda spec, device_index: hopper_backward)
    q = torch.empty(1, 1, 4096, 1024, dtype=torch.bfloat16, requires_grad=True)
    k = v = torch.empty(1, 1, 4096, 1024, dtype=torch.bfloat16)
    told = explain(q, k, v)
    if hopper_backward:
        assert told.startswith("ffpa (impl auto)"), told
    else:
        assert told.startswith("PyTorch SDPA") and "training at D = 1024" in told, told
