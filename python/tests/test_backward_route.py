"""ffpa_backward_route, the library's answer to which backward it runs for a call (device, dtype, D, Dv),
and its use: the binding asks once per arguments and returns the answer (an FFPAError, not raised, when
none runs); the drop-in's decision takes routing.py's training rows measured on the Hopper backward
exactly where the library says it runs that one, and sends a training call to SDPA where the library
runs no backward for it. Torch-free above the line; the decision on fake CUDA tensors below (no GPU)."""

import ctypes
import sys

import pytest

from ffpa_attn import _library
from ffpa_attn._library import DType, FFPAError, Impl

FFPA_OK, FFPA_IMPL_UNAVAILABLE = 0, 15  # ffpa_status


class RouteDll:
    """Stands in for the C library's ffpa_backward_route and ffpa_status_name."""

    def __init__(self, status: int, impl: Impl = Impl.SM80_SPLIT_D, message: bytes = b"") -> None:
        self.status, self.impl, self.message, self.calls = status, impl, message, []

    def ffpa_backward_route(self, device, dtype, head_dim, value_dim, requested, impl, message, size):
        self.calls.append((device, dtype, head_dim, value_dim, requested))
        ctypes.memmove(message, self.message + b"\0", len(self.message) + 1)
        if self.status == FFPA_OK:
            impl._obj.value = int(self.impl)
        return self.status

    def ffpa_status_name(self, status):
        return {FFPA_OK: b"ok", FFPA_IMPL_UNAVAILABLE: b"impl_unavailable"}[status]


def library_with(dll: RouteDll) -> _library.Library:
    library = _library.Library.__new__(_library.Library)  # no file: the entry points are the double's
    library._dll = dll
    library._backward_routes = {}
    return library


def test_the_answer_is_an_impl_asked_once_per_arguments():
    dll = RouteDll(FFPA_OK, Impl.SM90_WGMMA)
    library = library_with(dll)
    assert library.backward_route(0, DType.BF16, 576, 512) is Impl.SM90_WGMMA
    assert library.backward_route(0, DType.BF16, 576, 512) is Impl.SM90_WGMMA
    library.backward_route(0, DType.BF16, 576, 576)
    library.backward_route(1, DType.F16, 576, 512, Impl.SM80_SPLIT_D)
    assert dll.calls == [(0, DType.BF16, 576, 512, Impl.AUTO), (0, DType.BF16, 576, 576, Impl.AUTO),
                         (1, DType.F16, 576, 512, Impl.SM80_SPLIT_D)]


def test_where_none_runs_the_answer_is_the_error_returned():
    library = library_with(RouteDll(FFPA_IMPL_UNAVAILABLE, message=b"impl auto needs a CUDA device: no driver"))
    answer = library.backward_route(0, DType.BF16, 1024, 1024)
    assert isinstance(answer, FFPAError) and answer.status_name == "impl_unavailable"
    assert "needs a CUDA device" in answer.message


def loaded_library() -> _library.Library:
    try:
        return _library.load_library()
    except _library.LibraryNotFoundError as error:
        pytest.skip(f"the ffpa C library does not load (build it, or set FFPA_LIBRARY): {error}")


def test_the_library_answers_for_device_0():
    # Without a GPU (CI): impl_unavailable saying why; with one, the impl its plan runs.
    loaded_library()
    for requested in (Impl.AUTO, Impl.SM80_SPLIT_D, Impl.SM90_WGMMA):
        answer = _library.backward_route(0, DType.BF16, 512, 512, requested)
        if isinstance(answer, FFPAError):
            assert answer.status_name == "impl_unavailable", answer
        else:
            assert answer in (Impl.SM80_SPLIT_D, Impl.SM90_WGMMA)
            assert requested == Impl.AUTO or answer == requested


def test_bad_arguments_have_their_status():
    library = loaded_library()
    assert library.backward_route(0, DType.BF16, 512, 512, Impl.CPU_REFERENCE).status_name == "invalid_option"
    assert library.backward_route(-1, DType.BF16, 512, 512).status_name == "invalid_option"
    assert library.backward_route(0, DType.BF16, 7, 512).status_name == "unsupported_head_dim"
    assert library.backward_route(0, DType.F32, 64, 64).status_name == "unsupported_dtype"


# --- the decision follows the library's answer (torch) ---------------------------------------------------


@pytest.fixture
def gpu_answers(monkeypatch):
    """A GPU the library runs its kernels on (ffpa_device_support: None), whose backward answer
    (ffpa_backward_route) the test sets: returns the list of questions asked, and a setter."""
    torch = pytest.importorskip("torch")
    from ffpa_attn import decide
    from ffpa_attn.decisions import Limits

    questions = []
    answer = {"value": Impl.SM90_WGMMA}

    def backward_route(device, dtype, head_dim, value_dim, impl=Impl.AUTO):
        questions.append((device, dtype, head_dim, value_dim, impl))
        return answer["value"]

    monkeypatch.setattr(_library, "device_support", lambda device, impl=Impl.AUTO: None)
    monkeypatch.setattr(_library, "backward_route", backward_route)
    monkeypatch.setattr(decide, "_LIBRARY_LIMITS", Limits(8, 1024, 8))
    monkeypatch.setattr(decide, "_LIBRARY_MISSING", None)
    monkeypatch.setattr(decide, "_DECISIONS", {})
    return torch, questions, lambda value: answer.update(value=value)


def fake_cuda_call(torch, d_qk, d_v=None, n=4096, heads=1, requires_grad=True, mask=None):
    """explain() of a bf16 call on fake CUDA tensors (metadata only), B 1, Nq = Nkv = n."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ffpa_attn import explain

    d_v = d_qk if d_v is None else d_v
    with FakeTensorMode():
        q = torch.empty(1, heads, n, d_qk, device="cuda", dtype=torch.bfloat16, requires_grad=requires_grad)
        k = torch.empty(1, heads, n, d_qk, device="cuda", dtype=torch.bfloat16)
        v = torch.empty(1, heads, n, d_v, device="cuda", dtype=torch.bfloat16)
        attn_mask = None if mask is None else torch.zeros(1, 1, 1, n, device="cuda", dtype=mask)
        return explain(q, k, v, attn_mask=attn_mask)


def test_a_training_call_at_d1024_n4096_follows_the_answer(gpu_answers):
    # The portable backward: 0.97x SDPA's, so SDPA trains; the Hopper backward: 4.47-5.53x, so ffpa trains.
    torch, questions, answer = gpu_answers
    told = fake_cuda_call(torch, 1024)
    assert told.startswith("ffpa (impl auto)"), told
    # Asked for both answers (whether one runs, whether it is the Hopper one); the library keeps its answer.
    assert set(questions) == {(0, DType.BF16, 1024, 1024, Impl.AUTO)}
    answer(Impl.SM80_SPLIT_D)
    told = fake_cuda_call(torch, 1024)
    assert told.startswith("PyTorch SDPA") and "training at D = 1024" in told, told


def test_the_call_s_own_head_dims_are_asked(gpu_answers):
    torch, questions, answer = gpu_answers
    fake_cuda_call(torch, 576, 512, heads=8)
    assert {q[2:4] for q in questions} == {(576, 512)}


def test_where_the_library_runs_no_backward_sdpa_trains_with_the_reason(gpu_answers):
    torch, questions, answer = gpu_answers
    assert fake_cuda_call(torch, 512).startswith("ffpa (impl auto)")  # measured faster on either backward
    answer(FFPAError("impl_unavailable", "sm80_backward: its kernels need 120000 bytes of shared memory"))
    told = fake_cuda_call(torch, 512)
    assert told.startswith("PyTorch SDPA") and "runs no backward" in told and "shared memory" in told, told


def test_calls_without_a_backward_never_ask(gpu_answers):
    torch, questions, answer = gpu_answers
    assert fake_cuda_call(torch, 1024, requires_grad=False).startswith("ffpa")
    with torch.no_grad():
        fake_cuda_call(torch, 1024)
    assert questions == []
