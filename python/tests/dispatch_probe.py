"""How ffpa_attn_func handled a call: which path served it (the library's custom op
shows in the profiler; the SDPA fallback logs its reason at DEBUG on logger
"ffpa_attn"), and whether a call SDPA rejects or treats its own way gets SDPA's
exact outcome."""

from __future__ import annotations

import logging
from typing import Any, Callable

import pytest
import torch

CUSTOM_OP_NAME = "ffpa_attn::forward"


def run_and_check_served(call: Callable[[], Any]) -> tuple[Any, bool]:
    """call()'s result, and whether it ran the library's custom op."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], acc_events=True) as profile:
        result = call()
    return result, any(event.name.startswith(CUSTOM_OP_NAME) for event in profile.events())


def fallback_reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The DEBUG messages of logger "ffpa_attn" captured so far (caplog must be at DEBUG for it)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("ffpa_attn") and r.levelno == logging.DEBUG]


def capture_fallback_reasons(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ffpa_attn")


# Plain SDPA arguments, built on q, k, v ([B, H>=4, N, D>=8]), that SDPA rejects or
# treats in its own way (on CPU it accepts is_causal with a mask).
SDPA_OWN_CASES: dict[str, Callable[..., dict]] = {
    "causal-with-mask": lambda q, k, v: dict(
        attn_mask=torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device), is_causal=True
    ),
    "fp16-mask-with-bf16": lambda q, k, v: dict(
        attn_mask=torch.zeros(q.shape[2], k.shape[2], dtype=torch.float16, device=q.device)
    ),
    "mask-not-broadcastable": lambda q, k, v: dict(
        attn_mask=torch.zeros(q.shape[2], k.shape[2] + 1, dtype=q.dtype, device=q.device)
    ),
    "mask-1d": lambda q, k, v: dict(attn_mask=torch.ones(k.shape[2], dtype=torch.bool, device=q.device)),
    "gqa-ratio-not-integer": lambda q, k, v: dict(key=k[:, :3], value=v[:, :3], enable_gqa=True),
}

# Invalid SDPA arguments that ffpa_attn_func rejects itself with a RuntimeError (the
# type SDPA raises) naming the argument, without calling SDPA: on CUDA, PyTorch
# 2.11's SDPA fails inside cuDNN for these and a repeated call crashes the process.
REJECTED_CASES: dict[str, tuple[Callable[..., dict], str]] = {
    "key-head-dim-differs": (lambda q, k, v: dict(key=k[..., : k.shape[-1] // 2]), "head dim"),
    "dropout-above-1": (lambda q, k, v: dict(dropout_p=1.5), "dropout_p"),
}


def outcome(call: Callable[[], Any]) -> tuple[Any, Any]:
    """("ok", result) or (exception type, message): what a call did."""
    try:
        return "ok", call()
    except Exception as error:  # noqa: BLE001 - the point is to compare whatever SDPA raises
        return type(error), str(error)


def assert_same_outcome(got_call: Callable[[], Any], sdpa_call: Callable[[], Any]) -> None:
    """Both return equal tensors, or both raise the same exception type with the same message."""
    got, expected = outcome(got_call), outcome(sdpa_call)
    assert got[0] == expected[0], f"got {got[0]} {got[1]!s:.300}; SDPA: {expected[0]} {expected[1]!s:.300}"
    if expected[0] == "ok":
        assert torch.equal(got[1], expected[1])
    else:
        assert got[1] == expected[1]
