"""Example plugin for bench/attention_bench.py: attention written out in plain PyTorch, as an extra column.

    python3 bench/attention_bench.py --cases smoke --plugin bench/plugins/example_plugin.py

A plugin is a Python file with a register(registry) function; each
registry.add(name, forward, supports) call adds one column. forward(q, k, v, case)
gets q [B, Hq, Nq, D] and k, v [B, Hkv, Nkv, D] on the GPU and returns the output
[B, Hq, Nq, D]; `case` carries the shape (case.B, case.Hq, case.Hkv, case.Nq,
case.Nkv, case.D, case.dtype), case.causal (top-left, as SDPA's is_causal) and
case.gqa. supports(case) returns None, or why the column sits the case out (the
table shows n/a). The benchmark checks the output against its fp32 reference and
times forward like every other column.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# The naive method holds the full fp32 score matrix (and its softmax) in memory.
MAX_SCORE_BYTES = 2 << 30


def supports(case: Any) -> str | None:
    score_bytes = 4 * case.B * case.Hq * case.Nq * case.Nkv
    if score_bytes > MAX_SCORE_BYTES:
        return f"the fp32 scores would take {score_bytes / 2**30:.1f} GiB (this plugin stops at {MAX_SCORE_BYTES >> 30} GiB)"
    return None


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: Any) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v in float32, K/V heads repeated for GQA."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).float()
    v = v.repeat_interleave(group, dim=1).float()
    scores = q.float() @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    if case.causal:  # top-left: query i sees keys j <= i
        allowed = torch.ones(case.Nq, case.Nkv, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return (scores.softmax(dim=-1) @ v).to(q.dtype)


def register(registry: Any) -> None:
    registry.add("naive torch", naive_attention, supports=supports)
