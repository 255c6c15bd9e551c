#!/usr/bin/env python3
"""Side-by-side attention forward benchmark: ffpa and PyTorch SDPA, one process.

ffpa runs through the ffpa_attn package with an explicit implementation
(CUDABackend(impl="sm80_split_d") by default), so a call it cannot serve is
reported as n/a instead of silently falling back to SDPA. Next to it, on the
same inputs, every SDPA backend (flash, efficient, cudnn; math with
--with-math) runs under torch.nn.attention.sdpa_kernel; a backend that refuses
the shape is n/a, with its reason kept in the JSON. For GQA, SDPA gets
enable_gqa=True, and when no fast backend accepts that, also K/V with the heads
repeated by hand outside the timing (columns "<backend> (K/V expanded)").

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/attention_bench.py \\
        --json out/attention_bench.json --markdown out/attention_bench.md --charts out/charts

Timing: CUDA events around each call, --warmup untimed calls, then the median
and min of --iters timed calls (at least 10); the inputs rotate through enough
random sets to exceed twice the L2 cache; the GPU sleeps while the host queues
the timed calls, so the times are the kernels' own, not the host's launch path.
TFLOP/s = 4 * B * Hq * D * attended (query, key) pairs / time, causal
(top-left, as SDPA's is_causal) counting the exact pairs; decode rows also
report the achieved GB/s of reading K and V. Each implementation's output is
compared with SDPA computed in float32 on upcast inputs (relative L2 error, on
sampled batches and heads when the shape is large); ffpa fails a case beyond
1e-2 (bf16) or 5e-3 (fp16).

Sweeps (--cases, comma-separated, default all = every sweep but smoke and decode_grid):
  head_dim  bf16, B=1, H=32, N=8192, D in 64..1024, causal no and yes
  seq_len   bf16, B=1, H=32, D=512, N in 1024..16384
  gqa       bf16, Hq=32, Hkv=8, N=8192, D in {512, 1024}
  cross     bf16, H=32, Nq=1024, Nkv=8192, D in {512, 1024}
  decode    bf16, H=32, Nq=1, Nkv in {8192, 32768}, B in {1, 8}, D=512
            (not causal: SDPA's top-left causal would let one query see only key 0)
  decode_grid  bf16, Hq=32, Nq=1, D=512, Nkv in {512 .. 131072} x B in {1, 8, 64} x GQA in
            {1, 4, 8}, the points whose K and V fit 24 GB (split-KV decode, issue 12)
  fp16      fp16, B=1, H=32, N=8192, D=512, causal no and yes
  smoke     small shapes that run in seconds, for quick checks of the whole path

Plugins: --plugin FILE (repeatable) imports FILE and calls its
register(registry); registry.add(name, forward, supports=None) adds a column.
forward(q, k, v, case) returns the output [B, Hq, Nq, D] for q [B, Hq, Nq, D],
k and v [B, Hkv, Nkv, D] (case: a Case, with fields sweep, D, causal, B, Hq,
Hkv, Nq, Nkv, dtype and the property gqa); supports(case) returns None or the
reason it refuses the case (then n/a). Example: bench/plugins/example_plugin.py.

--render-only JSON redraws the markdown and charts of a saved report (no GPU).
--list prints the selected cases and columns (no GPU).

Exit status: 0 when ffpa ran every case and passed its check, 1 otherwise,
2 for a bad command line, no CUDA device, or ffpa_attn or a plugin not loading.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import re
import shlex
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

REPO_ROOT = Path(__file__).resolve().parent.parent

# --- cases ------------------------------------------------------------------------------

TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}
TOLERANCE = {"bf16": 1e-2, "f16": 5e-3}  # relative L2 against fp32, as the GPU tests


@dataclass(frozen=True)
class Case:
    """One attention shape. Plugins receive it as their `case` argument."""

    sweep: str
    D: int
    causal: bool = False
    B: int = 1
    Hq: int = 32
    Hkv: int = 32
    Nq: int = 8192
    Nkv: int = 8192
    dtype: str = "bf16"

    @property
    def gqa(self) -> bool:
        return self.Hq != self.Hkv

    def label(self) -> str:
        heads = f"H{self.Hq}" if not self.gqa else f"Hq{self.Hq}/Hkv{self.Hkv}"
        seq = f"N{self.Nq}" if self.Nq == self.Nkv else f"Nq{self.Nq}/Nkv{self.Nkv}"
        return f"B{self.B} {heads} {seq} D{self.D} {self.dtype}" + (" causal" if self.causal else "")

    def attended_pairs(self) -> int:
        """(query, key) pairs the softmax sees: all of them, or top-left causal's j <= i."""
        if not self.causal:
            return self.Nq * self.Nkv
        # Row i attends min(i + 1, Nkv) keys: a triangle, then full rows once i >= Nkv.
        m = min(self.Nq, self.Nkv)
        return m * (m + 1) // 2 + (self.Nq - m) * self.Nkv

    def flops(self) -> int:
        return 4 * self.B * self.Hq * self.D * self.attended_pairs()  # QK^T and PV, 2 FLOPs per MAC

    def kv_bytes(self) -> int:
        return 2 * self.B * self.Hkv * self.Nkv * self.D * TORCH_DTYPE[self.dtype].itemsize


@dataclass(frozen=True)
class Sweep:
    name: str
    title: str
    metric: str  # what its table and chart show: "tflops", or "kv_gb_per_s" where memory bound
    cases: tuple[Case, ...]


HEAD_DIMS = (64, 128, 256, 320, 384, 512, 640, 768, 1024)
HEAD_DIM_SWEEP = "head_dim"  # drawn on its own chart: TFLOP/s and speedup per D


def define_sweeps() -> dict[str, Sweep]:
    def sweep(name: str, title: str, cases: list[Case], metric: str = "tflops") -> Sweep:
        return Sweep(name, title, metric, tuple(cases))

    return {
        s.name: s
        for s in [
            sweep(HEAD_DIM_SWEEP, "Head-dim sweep",
                  [Case(HEAD_DIM_SWEEP, D=d, causal=c) for d in HEAD_DIMS for c in (False, True)]),
            sweep("seq_len", "Sequence-length sweep",
                  [Case("seq_len", D=512, Nq=n, Nkv=n) for n in (1024, 2048, 4096, 8192, 16384)]),
            sweep("gqa", "Grouped-query attention", [Case("gqa", D=d, Hkv=8) for d in (512, 1024)]),
            sweep("cross", "Cross-attention", [Case("cross", D=d, Nq=1024) for d in (512, 1024)]),
            sweep("decode", "Decode (one query)",
                  [Case("decode", D=512, B=b, Nq=1, Nkv=n) for b in (1, 8) for n in (8192, 32768)],
                  metric="kv_gb_per_s"),
            # Issue 12's grid: Nkv x B x GQA (Hq = 32) at D = 512, the points whose K and V
            # fit 24 GB (rotated input sets come on top).
            sweep("decode_grid", "Decode grid (Nq = 1, D = 512, Hq = 32)",
                  [Case("decode_grid", D=512, B=b, Hkv=32 // g, Nq=1, Nkv=n)
                   for g in (1, 4, 8) for b in (1, 8, 64) for n in (512, 2048, 8192, 32768, 131072)
                   if 2 * b * (32 // g) * n * 512 * 2 <= 24 * 2**30],
                  metric="kv_gb_per_s"),
            sweep("fp16", "fp16", [Case("fp16", D=512, causal=c, dtype="f16") for c in (False, True)]),
            sweep("smoke", "Smoke (small shapes)",
                  [Case("smoke", D=d, causal=c, B=2, Hq=8, Hkv=8, Nq=1024, Nkv=1024) for d in (128, 512)
                   for c in (False, True)]
                  + [Case("smoke", D=320, causal=True, B=2, Hq=8, Hkv=2, Nq=777, Nkv=1029),
                     Case("smoke", D=1024, B=2, Hq=4, Hkv=4, Nq=1, Nkv=2048)]),
        ]
    }


SWEEPS = define_sweeps()
DEFAULT_SWEEPS = [name for name in SWEEPS if name not in ("smoke", "decode_grid")]


def parse_sweep_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return DEFAULT_SWEEPS
    unknown = [n for n in names if n not in SWEEPS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown sweep(s) {', '.join(unknown) or repr(text)}: choose from all, {', '.join(SWEEPS)}")
    return list(dict.fromkeys(names))


# --- implementations --------------------------------------------------------------------

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Case], torch.Tensor]
Supports = Callable[[Case], str | None]

KV_EXPANDED = " (K/V expanded)"


@dataclass(frozen=True)
class Implementation:
    """One column: a forward function and when it applies."""

    name: str
    forward: Forward
    supports: Supports | None = None  # returns the reason for refusing a case, or None
    kind: str = "plugin"  # "ffpa", "sdpa" or "plugin": the speedup is ffpa's over the best "sdpa"
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext  # around every call
    kv_expanded: bool = False  # gets K/V with the heads repeated to Hq (SDPA's way around GQA)


class ImplementationRegistry:
    """The columns in order; plugins call add()."""

    def __init__(self) -> None:
        self.implementations: list[Implementation] = []

    def add(self, name: str, forward: Forward, supports: Supports | None = None) -> None:
        """Adds a plugin column: forward(q, k, v, case) -> output, supports(case) -> refusal reason or None."""
        self.add_implementation(Implementation(name, forward, supports))

    def add_implementation(self, implementation: Implementation) -> None:
        name = implementation.name
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"implementation name must be a non-empty str, got {name!r}")
        if any(i.name == name for i in self.implementations):
            raise ValueError(f"implementation name {name!r} is already taken")
        if not callable(implementation.forward):
            raise TypeError(f"forward of {name!r} must be callable, got {type(implementation.forward).__name__}")
        if implementation.supports is not None and not callable(implementation.supports):
            raise TypeError(f"supports of {name!r} must be callable or None")
        self.implementations.append(implementation)


LIBRARY_CHOICE = "library"  # --ffpa-impl: what the C library's auto picks, never the package's SDPA fallback


def ffpa_implementation(ffpa_attn: Any, impl: str) -> Implementation:
    # An explicit impl raises NotImplementedError instead of falling back; "library"
    # runs impl auto and refuses the calls the package would hand to SDPA.
    # The fallback check is decided once per case, outside the timed calls after the first.
    backend = ffpa_attn.CUDABackend(impl="auto" if impl == LIBRARY_CHOICE else impl)
    refusals: dict[Case, str | None] = {}

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: Case) -> torch.Tensor:
        if impl == LIBRARY_CHOICE:
            if case not in refusals:
                from ffpa_attn._library import limits
                from ffpa_attn.decide import call_spec
                from ffpa_attn.decisions import fallback_reason

                spec = call_spec(q, k, v, None, 0.0, case.causal, None, case.gqa)
                refusals[case] = fallback_reason(spec, limits())
            if refusals[case] is not None:
                raise NotImplementedError(f"ffpa_attn would hand this call to SDPA: {refusals[case]}")
        return ffpa_attn.ffpa_attn_func(q, k, v, is_causal=case.causal, enable_gqa=case.gqa, backend=backend)

    return Implementation("ffpa", forward, kind="ffpa")


SDPA_FAST_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}


def sdpa_implementation(name: str, backend: SDPBackend, kv_expanded: bool = False) -> Implementation:
    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, case: Case) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, enable_gqa=case.gqa and not kv_expanded)

    return Implementation(name + (KV_EXPANDED if kv_expanded else ""), forward, kind="sdpa",
                          context=lambda: sdpa_kernel([backend]), kv_expanded=kv_expanded)


def builtin_registry(ffpa: Implementation | None, with_math: bool) -> ImplementationRegistry:
    """ffpa, SDPA's fast backends, math if asked, then the K/V-expanded variants of the fast ones."""
    registry = ImplementationRegistry()
    if ffpa is not None:
        registry.add_implementation(ffpa)
    for name, backend in SDPA_FAST_BACKENDS.items():
        registry.add_implementation(sdpa_implementation(name, backend))
    if with_math:
        registry.add_implementation(sdpa_implementation("math", SDPBackend.MATH))
    for name, backend in SDPA_FAST_BACKENDS.items():
        registry.add_implementation(sdpa_implementation(name, backend, kv_expanded=True))
    return registry


class PluginError(Exception):
    pass


def load_plugin(path: str, registry: ImplementationRegistry) -> None:
    if not os.path.isfile(path):
        raise PluginError(f"--plugin {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"attention_bench_plugin_{Path(path).stem}", path)
    if spec is None or spec.loader is None:
        raise PluginError(f"--plugin {path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # a plugin's import error is the plugin's, reported with its path
        raise PluginError(f"--plugin {path}: import failed: {type(error).__name__}: {error}") from error
    register = getattr(module, "register", None)
    if not callable(register):
        raise PluginError(f"--plugin {path}: defines no register(registry) function")
    try:
        register(registry)
    except (TypeError, ValueError) as error:
        raise PluginError(f"--plugin {path}: register() failed: {error}") from error


def import_ffpa_attn() -> Any:
    """The installed ffpa_attn, or else the one in the repository's python/."""
    try:
        import ffpa_attn
    except ModuleNotFoundError as error:
        if error.name != "ffpa_attn":
            raise
        sys.path.insert(0, str(REPO_ROOT / "python"))
        import ffpa_attn
    return ffpa_attn


# --- inputs, reference, timing ----------------------------------------------------------


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    expanded_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # made once, for every expanded column

    def operands(self, kv_expanded: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not kv_expanded:
            return self.q, self.k, self.v
        if self.expanded_kv is None:
            group = self.q.shape[1] // self.k.shape[1]
            self.expanded_kv = (self.k.repeat_interleave(group, dim=1), self.v.repeat_interleave(group, dim=1))
        return (self.q, *self.expanded_kv)


def make_inputs(case: Case) -> Inputs:
    def uniform(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=TORCH_DTYPE[case.dtype], device="cuda").uniform_(-1, 1)

    return Inputs(uniform(case.B, case.Hq, case.Nq, case.D), uniform(case.B, case.Hkv, case.Nkv, case.D),
                  uniform(case.B, case.Hkv, case.Nkv, case.D))


def input_set_count(case: Case, l2_bytes: int) -> int:
    """Input sets whose bytes together exceed twice the L2 (one when one set does)."""
    set_bytes = TORCH_DTYPE[case.dtype].itemsize * case.B * case.Hq * case.Nq * case.D + case.kv_bytes()
    return 1 if set_bytes > 2 * l2_bytes else 2 * l2_bytes // set_bytes + 1


@dataclass(frozen=True)
class CheckSample:
    batches: list[int]
    heads: list[int]  # query heads


REFERENCE_BYTES_LIMIT = 1 << 30


def check_sample(case: Case) -> CheckSample:
    """Every batch and head, or two batches and four spread heads when the fp32 reference would pass 1 GiB."""
    reference_bytes = 4 * case.B * (case.Hq * case.Nq * case.Nkv + case.Hq * case.Nq * case.D + 2 * case.Hkv * case.Nkv * case.D)
    if reference_bytes <= REFERENCE_BYTES_LIMIT:
        return CheckSample(list(range(case.B)), list(range(case.Hq)))
    return CheckSample(sorted({0, case.B - 1}), sorted({0, case.Hq // 3, 2 * case.Hq // 3, case.Hq - 1}))


def sampled(t: torch.Tensor, batches: list[int], heads: list[int]) -> torch.Tensor:
    batch_index = torch.tensor(batches, device=t.device)
    head_index = torch.tensor(heads, device=t.device)
    return t.index_select(0, batch_index).index_select(1, head_index)


def reference_output(case: Case, inputs: Inputs, sample: CheckSample) -> torch.Tensor:
    """SDPA in float32 on upcast inputs (math backend, no TF32) for the sampled batches and heads."""
    group = case.Hq // case.Hkv
    kv_heads = [h // group for h in sample.heads]
    q = sampled(inputs.q, sample.batches, sample.heads).float()
    k = sampled(inputs.k, sample.batches, kv_heads).float()
    v = sampled(inputs.v, sample.batches, kv_heads).float()
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)


def relative_l2(out: torch.Tensor, ref: torch.Tensor, sample: CheckSample) -> float:
    got = sampled(out, sample.batches, sample.heads).float()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# About 20 ms at the H200's 1.98 GHz: far longer than the host needs to queue the timed calls.
HOST_HEADSTART_CYCLES = 40_000_000


def time_calls(call: Callable[[int], object], sets: int, warmup: int, iters: int) -> tuple[float, float]:
    """call(s) runs one forward on input set s. Returns (median ms, min ms) of the timed calls."""
    for n in range(warmup):
        call(n % sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    # The GPU sleeps while the host queues every timed call, so no call waits for the host: the
    # events time the kernels, not the Python/launch path (the same for every implementation).
    torch.cuda._sleep(HOST_HEADSTART_CYCLES)
    for n in range(iters):
        starts[n].record()
        call((warmup + n) % sets)
        ends[n].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(ms), min(ms)


# --- running a case ---------------------------------------------------------------------

TORCH_WARNING_SOURCE = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?")
MAX_REASON_CHARS = 400


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def refusal_reason(caught: list[warnings.WarningMessage], error: BaseException) -> str:
    """SDPA says why a backend refused in warnings before its error. It logs every backend's check in
    turn: dropping the headers ("... not used because:") and the backends that sdpa_kernel disabled
    leaves the reason of the one that was asked for."""
    reasons = []
    for w in caught:
        text = TORCH_WARNING_SOURCE.sub("", str(w.message)).strip()
        if text and not text.endswith("because:") and "has been runtime disabled" not in text:
            reasons.append(text)
    reasons.append(first_line(error))
    return "; ".join(dict.fromkeys(reasons))[:MAX_REASON_CHARS]


def measure(impl: Implementation, case: Case, sets: list[Inputs], ref: torch.Tensor, sample: CheckSample,
            args: argparse.Namespace) -> dict[str, Any]:
    """One column of one case: status, and when it ran, times, rates and its error against the reference."""
    if impl.supports is not None:
        reason = impl.supports(case)
        if reason:
            return {"status": "n/a", "reason": str(reason)}

    caught: list[warnings.WarningMessage] = []
    try:
        operands = [s.operands(impl.kv_expanded) for s in sets]  # expanding K/V stays out of the timing

        def call(s: int) -> torch.Tensor:
            return impl.forward(*operands[s], case)

        with impl.context():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = call(0)
                torch.cuda.synchronize()
            expected = (case.B, case.Hq, case.Nq, case.D)
            if tuple(out.shape) != expected:
                return {"status": "error", "message": f"returned shape {tuple(out.shape)}, expected {expected}"}
            entry: dict[str, Any] = {"status": "ok", "nan_count": int(torch.isnan(out).sum().item()),
                                     "rel_l2": relative_l2(out, ref, sample)}
            del out
            median, best = time_calls(call, len(sets), args.warmup, args.iters)
    except NotImplementedError as error:  # ffpa with an explicit impl, or a plugin, refusing the call
        return {"status": "n/a", "reason": first_line(error)}
    except torch.OutOfMemoryError as error:
        torch.cuda.empty_cache()
        return {"status": "n/a", "reason": "out of memory: " + first_line(error)}
    except RuntimeError as error:
        if impl.kind == "sdpa":  # no kernel of the chosen backend takes the shape
            return {"status": "n/a", "reason": refusal_reason(caught, error)}
        return {"status": "error", "message": f"{type(error).__name__}: {first_line(error)}"}
    except Exception as error:  # the column fails, the run goes on; ffpa's failure fails the case
        return {"status": "error", "message": f"{type(error).__name__}: {first_line(error)}"}
    entry.update(median_ms=median, min_ms=best, tflops=case.flops() / median / 1e9,
                 tflops_max=case.flops() / best / 1e9, kv_gb_per_s=case.kv_bytes() / median / 1e6)
    return entry


def fast_sdpa_accepted(results: dict[str, dict[str, Any]]) -> bool:
    return any(results.get(name, {}).get("status") == "ok" for name in SDPA_FAST_BACKENDS)


def case_row(case: Case) -> dict[str, Any]:
    return {"sweep": case.sweep, "case": case.label(), **asdict(case), "flops": case.flops(),
            "kv_bytes": case.kv_bytes()}


def run_case(case: Case, registry: ImplementationRegistry, args: argparse.Namespace, l2_bytes: int) -> dict[str, Any]:
    sets = [make_inputs(case) for _ in range(input_set_count(case, l2_bytes))]
    sample = check_sample(case)
    ref = reference_output(case, sets[0], sample)
    results: dict[str, dict[str, Any]] = {}
    for impl in registry.implementations:
        # SDPA's GQA workaround, measured only where enable_gqa=True has no fast kernel.
        if impl.kv_expanded and (not case.gqa or fast_sdpa_accepted(results)):
            continue
        results[impl.name] = measure(impl, case, sets, ref, sample, args)

    kinds = {i.name: i.kind for i in registry.implementations}
    sdpa_ok = {n: r for n, r in results.items() if kinds[n] == "sdpa" and r["status"] == "ok"}
    best_sdpa = min(sdpa_ok, key=lambda n: sdpa_ok[n]["median_ms"]) if sdpa_ok else None
    ffpa = results.get("ffpa", {"status": "n/a", "reason": "not measured"})
    speedup = sdpa_ok[best_sdpa]["median_ms"] / ffpa["median_ms"] if best_sdpa and ffpa["status"] == "ok" else None
    passed = ffpa["status"] == "ok" and ffpa["nan_count"] == 0 and ffpa["rel_l2"] <= TOLERANCE[case.dtype]
    return {
        **case_row(case),
        "input_sets": len(sets),
        "check": {"reference": "fp32 SDPA (math) on upcast inputs", "batches": sample.batches,
                  "heads": sample.heads, "tolerance": TOLERANCE[case.dtype]},
        "results": results,
        "best_sdpa": best_sdpa,
        "speedup": speedup,
        "ffpa_rel_l2": ffpa.get("rel_l2"),
        "passed": passed,
    }


def progress_line(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"FAIL: {row['error']}"
    parts = []
    for name, r in row["results"].items():
        parts.append(f"{name} {r['median_ms']:.3f} ms ({r['tflops']:.1f} T)" if r["status"] == "ok"
                     else f"{name} {r['status']}")
    speedup = f"{row['speedup']:.2f}x vs {row['best_sdpa']}" if row["speedup"] else "no speedup"
    error = f"rel L2 {row['ffpa_rel_l2']:.2e}" if row["ffpa_rel_l2"] is not None else "no check"
    return " | ".join(parts + [speedup, error]) + ("" if row["passed"] else " | FAIL")


# --- markdown ---------------------------------------------------------------------------

METRIC_LABEL = {"tflops": "TFLOP/s", "kv_gb_per_s": "K+V GB/s"}
CASE_FIELDS = ("dtype", "B", "H", "Hq", "Hkv", "N", "Nq", "Nkv", "D", "causal")


def case_fields(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Each shape field's text per row; H and N stand for Hq = Hkv and Nq = Nkv where every row has that."""
    same_heads = all(r["Hq"] == r["Hkv"] for r in rows)
    same_seq = all(r["Nq"] == r["Nkv"] for r in rows)
    skipped = {"Hq", "Hkv"} if same_heads else {"H"}
    skipped |= {"Nq", "Nkv"} if same_seq else {"N"}
    source = {"H": "Hq", "N": "Nq"}
    fields = {}
    for name in CASE_FIELDS:
        if name not in skipped:
            values = [r[source.get(name, name)] for r in rows]
            fields[name] = [("yes" if v else "no") if isinstance(v, bool) else str(v) for v in values]
    return fields


def split_fields(rows: list[dict[str, Any]]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(fields that vary between rows, {field: value} of those that do not)."""
    fields = case_fields(rows)
    varying = {n: v for n, v in fields.items() if len(set(v)) > 1}
    constant = {n: v[0] for n, v in fields.items() if len(set(v)) == 1}
    return varying, constant


def case_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Short per-row labels from the fields that vary (the full label when none does), one field a line
    when more than two vary, so that neighbouring labels do not run into each other."""
    varying, _ = split_fields(rows)
    if not varying:
        return [r["case"] for r in rows]
    separator = "\n" if len(varying) > 2 else " "
    return [separator.join(f"{n}={values[i]}" for n, values in varying.items()) for i in range(len(rows))]


def shape_text(constant: dict[str, str]) -> str:
    return ", ".join(f"{n}={v}" if n != "dtype" else v for n, v in constant.items())


def format_metric(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def columns_of(report: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    names = [i["name"] for i in report["implementations"]]
    return [n for n in names if any(n in r["results"] for r in rows)]


def sweep_rows(report: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(name, metadata, rows) of every sweep with rows, in the report's order."""
    for name, meta in report["sweeps"].items():
        rows = [r for r in report["rows"] if r["sweep"] == name]
        if rows:
            yield name, meta, rows


def markdown_sweep(meta: dict[str, Any], rows: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
    varying, constant = split_fields(rows)
    columns = columns_of(report, rows)
    ran = [c for c in columns if any(r["results"].get(c, {}).get("status") == "ok" for r in rows)]
    refused = [c for c in columns if c not in ran]
    metric = meta["metric"]
    head = list(varying) + [f"{c} {METRIC_LABEL[metric]}" for c in ran] + ["ffpa speedup vs best SDPA", "ffpa rel L2"]
    lines = [f"## {meta['title']}", ""] + ([f"Shape: {shape_text(constant)}.", ""] if constant else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        cells = [values[i] for values in varying.values()]
        for c in ran:
            entry = r["results"].get(c)
            cells.append("–" if entry is None else format_metric(entry[metric]) if entry["status"] == "ok"
                         else entry["status"])
        cells.append(f"{r['speedup']:.2f}x ({r['best_sdpa']})" if r.get("speedup") else "n/a")
        error = r.get("ffpa_rel_l2")
        cells.append(("n/a" if error is None else f"{error:.1e}") + ("" if r["passed"] else " FAIL"))
        lines.append("| " + " | ".join(cells) + " |")
    if refused:
        lines += ["", "Not in the table, n/a or failing in every case:", ""]
    for c in refused:
        first = next(r["results"][c] for r in rows if c in r["results"])
        lines.append(f"- {c}: {first.get('reason') or first.get('message')}")
    if any(r.get("error") for r in rows):
        lines += [""] + [f"{r['case']}: FAIL, {r['error']}" for r in rows if r.get("error")]
    return lines + [""]


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Attention forward, ffpa vs PyTorch SDPA: {report['device']}, {report['date'][:10]}",
        "",
        f"Command: `{report['command']}`  ",
        f"torch {report['torch']} (CUDA {report['cuda']}, cuDNN {report['cudnn']}), ffpa_attn "
        f"{report['ffpa_version']} with impl={report['ffpa_impl']}.",
        "",
        f"Median of {report['iters']} calls after {report['warmup']} warm-up, CUDA events, inputs rotated "
        "beyond 2x L2. TFLOP/s = 4·B·Hq·D·(attended pairs) / median time, causal (top-left) counting the "
        "exact pairs; K+V GB/s = bytes of K and V / median time. n/a: the backend refused the shape "
        "(reasons in the JSON); –: not run (K/V expanded runs only for GQA where no fast SDPA backend "
        "accepts enable_gqa=True). Speedup: ffpa's time against the fastest SDPA column. Error: ffpa's "
        "relative L2 error against fp32 SDPA on upcast inputs; FAIL: beyond tolerance, or ffpa did not run.",
        "",
    ]
    if not report.get("complete", True):
        lines += [f"**Incomplete run: {len(report['rows'])} of {report['cases_planned']} cases.**", ""]
    for _, meta, rows in sweep_rows(report):
        lines += markdown_sweep(meta, rows, report)
    return "\n".join(lines)


# --- charts -----------------------------------------------------------------------------

BUILTIN_COLORS = {"ffpa": "#d62728", "flash": "#1f77b4", "efficient": "#2ca02c", "cudnn": "#9467bd",
                  "math": "#7f7f7f"}
PLUGIN_COLORS = ("#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
CHART_FILES = {"head_dim": "head_dim_sweep.png", "other": "other_sweeps.png"}


def implementation_styles(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One look per column across every chart; K/V-expanded variants hatch their backend's color."""
    styles = {}
    plugins = iter(PLUGIN_COLORS * (1 + len(report["implementations"]) // len(PLUGIN_COLORS)))
    for impl in report["implementations"]:
        name = impl["name"]
        base = name.removesuffix(KV_EXPANDED)
        color = BUILTIN_COLORS.get(base) if impl["kind"] != "plugin" else None
        styles[name] = {"color": color or next(plugins), "edgecolor": "white",
                        "hatch": "//" if name.endswith(KV_EXPANDED) else None}
    return styles


def grouped_bars(ax: Any, labels: list[str], series: list[tuple[str, list[float | None]]],
                 styles: dict[str, dict[str, Any]], value_format: Callable[[float], str]) -> None:
    """A group of bars per label, one per series that has a value there (None: no bar, and the group
    closes up), each with its value written on top."""
    width = min(0.84 / max(len(series), 1), 0.28)
    positions: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in series}
    for x in range(len(labels)):
        present = [(name, values[x]) for name, values in series if values[x] is not None]
        for i, (name, value) in enumerate(present):
            positions[name].append((x + (i - (len(present) - 1) / 2) * width, value))
    for name, points in positions.items():
        if points:
            bars = ax.bar([p[0] for p in points], [p[1] for p in points], width, label=name, **styles[name])
            ax.bar_label(bars, labels=[value_format(p[1]) for p in points], fontsize=7, padding=2,
                         rotation=90 if len(series) > 2 else 0)  # upright while they fit
    ax.set_xticks(range(len(labels)), labels)
    top = max((v for _, values in series for v in values if v is not None), default=1.0)
    ax.set_ylim(0, top * 1.22)  # room for the rotated value labels
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def metric_series(rows: list[dict[str, Any]], columns: list[str], metric: str) -> list[tuple[str, list[float | None]]]:
    """(column, value per row) for the columns that ran in at least one row."""
    series = []
    for c in columns:
        values = [r["results"][c][metric] if r["results"].get(c, {}).get("status") == "ok" else None for r in rows]
        if any(v is not None for v in values):
            series.append((c, values))
    return series


def chart_title(report: dict[str, Any], what: str) -> str:
    return (f"{what} — {report['device']}, {report['date'][:10]}\n"
            f"ffpa_attn {report['ffpa_version']} ({report['ffpa_impl']}) vs torch {report['torch']} SDPA, "
            f"median of {report['iters']} calls")


def head_dim_chart(plt: Any, report: dict[str, Any], meta: dict[str, Any], rows: list[dict[str, Any]],
                   path: str) -> None:
    """TFLOP/s per D (non-causal and causal panels) and ffpa's speedup over the best SDPA per D."""
    styles = implementation_styles(report)
    columns = columns_of(report, rows)
    panels = [(c, [r for r in rows if r["causal"] == c]) for c in (False, True)]
    panels = [(c, rs) for c, rs in panels if rs]
    fig = plt.figure(figsize=(17, 10.5), layout="constrained")
    grid = fig.add_gridspec(2, len(panels), height_ratios=(3, 2))
    _, constant = split_fields(rows)
    constant.pop("causal", None)
    share = None
    for n, (causal, panel_rows) in enumerate(panels):
        ax = fig.add_subplot(grid[0, n], sharey=share)
        share = ax
        grouped_bars(ax, [str(r["D"]) for r in panel_rows], metric_series(panel_rows, columns, "tflops"), styles,
                     format_metric)
        ax.set_title(("causal (top-left)" if causal else "non-causal") + f", {shape_text(constant)}")
        ax.set_xlabel("head dim D")
        ax.set_ylabel("TFLOP/s (higher is better)")
        ax.legend(loc="upper left", fontsize=8, ncol=2)

    ax = fig.add_subplot(grid[1, :])
    d_values = sorted({r["D"] for r in rows})
    series = []
    for causal, panel_rows in panels:
        by_d = {r["D"]: r.get("speedup") for r in panel_rows}
        series.append(("causal" if causal else "non-causal", [by_d.get(d) for d in d_values]))
    beaten = [sorted({r["best_sdpa"] for r in rows if r["D"] == d and r.get("best_sdpa")}) for d in d_values]
    labels = [f"{d}\nvs {'/'.join(names)}" if names else str(d) for d, names in zip(d_values, beaten)]
    speedup_styles = {"non-causal": {"color": "#d62728"}, "causal": {"color": "#f4a6a6"}}
    grouped_bars(ax, labels, series, speedup_styles, lambda v: f"{v:.2f}x")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_title("ffpa speedup over the fastest SDPA backend that accepts the shape")
    ax.set_xlabel("head dim D")
    ax.set_ylabel("speedup (x)")
    ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(chart_title(report, f"Attention forward, {meta['title'].lower()}"), fontsize=13)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def other_sweeps_chart(plt: Any, report: dict[str, Any], sweeps: list[tuple[dict[str, Any], list[dict[str, Any]]]],
                       path: str) -> None:
    """One panel per sweep: each column's TFLOP/s (GB/s for decode) per case, ffpa's speedup under each group."""
    styles = implementation_styles(report)
    ncols = 1 if len(sweeps) == 1 else 2
    nrows = (len(sweeps) + ncols - 1) // ncols
    width = 8.5 * ncols if ncols > 1 else 12.0
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, 4.8 * nrows + 1.2), layout="constrained", squeeze=False)
    handles: dict[str, Any] = {}
    for ax, (meta, rows) in zip(axes.flat, sweeps):
        metric = meta["metric"]
        labels = [f"{label}\nffpa {r['speedup']:.2f}x" if r.get("speedup") else label
                  for label, r in zip(case_labels(rows), rows)]
        grouped_bars(ax, labels, metric_series(rows, columns_of(report, rows), metric), styles, format_metric)
        varying, constant = split_fields(rows)
        ax.set_title(f"{meta['title']}: {shape_text(constant)}" if constant else meta["title"], fontsize=10)
        ax.set_ylabel(METRIC_LABEL[metric] + " (higher is better)")
        ax.set_xlabel(", ".join(varying) + "; ffpa speedup over the fastest SDPA backend" if varying else "case")
        for handle, name in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(name, handle)
    for ax in list(axes.flat)[len(sweeps):]:
        ax.set_visible(False)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(len(handles), 6))
    titles = ", ".join(meta["title"] for meta, _ in sweeps)
    fig.suptitle(chart_title(report, f"Attention forward: {titles}"), fontsize=12)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def render_charts(report: dict[str, Any], directory: str) -> list[str]:
    """Writes the charts of a report into directory; returns their paths. At most two files, so that a
    run on the lent GPU machine (few files come back) can carry them: the head-dim sweep, and the others."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    sweeps = list(sweep_rows(report))
    paths = []
    head_dim = [(meta, rows) for name, meta, rows in sweeps if name == HEAD_DIM_SWEEP]
    if head_dim:
        paths.append(os.path.join(directory, CHART_FILES["head_dim"]))
        head_dim_chart(plt, report, *head_dim[0], paths[-1])
    others = [(meta, rows) for name, meta, rows in sweeps if name != HEAD_DIM_SWEEP]
    if others:
        paths.append(os.path.join(directory, CHART_FILES["other"]))
        other_sweeps_chart(plt, report, others, paths[-1])
    return paths


def write_outputs(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        temporary = args.json + ".tmp"
        with open(temporary, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(temporary, args.json)  # a run killed while writing leaves the previous complete file
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render_markdown(report))


# --- command line -----------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=parse_sweep_names, default=DEFAULT_SWEEPS,
                        help=f"comma-separated sweeps: all (default), {', '.join(SWEEPS)}")
    parser.add_argument("--ffpa-impl", default=LIBRARY_CHOICE,
                        help="the ffpa column: library (default: the kernel the C library's auto picks for the "
                             "device and shape; a call the package would hand to SDPA is n/a), or a "
                             "CUDABackend.impl (sm80_split_d, sm90_wgmma); auto is refused: it may fall back to "
                             "SDPA silently")
    parser.add_argument("--with-math", action="store_true", help="also time SDPA's math backend (slow)")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE",
                        help="a Python file whose register(registry) adds columns (repeatable)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per column and case (default 3)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per column and case, >= 10 (default 10)")
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON (rewritten after every case)")
    parser.add_argument("--markdown", metavar="FILE", help="write one markdown table per sweep")
    parser.add_argument("--charts", metavar="DIR", help="write PNG charts into DIR (matplotlib)")
    parser.add_argument("--render-only", metavar="JSON",
                        help="measure nothing: render --markdown and --charts from a saved --json report")
    parser.add_argument("--list", action="store_true", help="print the selected cases and columns, run nothing")
    args = parser.parse_args(argv)
    if args.iters < 10:
        parser.error("--iters must be at least 10 (the median of fewer is noise)")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.ffpa_impl == "auto":
        parser.error("--ffpa-impl auto may fall back to SDPA without saying so; name an implementation")
    if args.render_only and not (args.markdown or args.charts):
        parser.error("--render-only needs --markdown and/or --charts to write")
    if args.render_only and args.json:
        parser.error("--render-only reads a report; --json would only copy it")
    for option in ("json", "markdown"):
        path = getattr(args, option)
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            parser.error(f"--{option} {path}: its directory does not exist")
    if args.charts:
        try:
            import matplotlib  # noqa: F401  (checked now, not after minutes of measuring)
        except ImportError:
            parser.error("--charts needs matplotlib, which does not import here")
    return args


def selected_cases(args: argparse.Namespace) -> list[Case]:
    return [case for name in args.cases for case in SWEEPS[name].cases]


def list_cases(cases: list[Case], registry: ImplementationRegistry) -> None:
    print("columns: ffpa (not loaded by --list), " + ", ".join(i.name for i in registry.implementations))
    for case in cases:
        refusals = [f"{i.name}: {reason}" for i in registry.implementations
                    if i.supports is not None and (reason := i.supports(case))]
        print(f"{case.sweep:<9} {case.label():<42} {case.flops() / 1e9:12.1f} GFLOP  "
              f"{case.kv_bytes() / 1e6:9.1f} MB K+V" + ("  refused by " + "; ".join(refusals) if refusals else ""))


def render_saved(args: argparse.Namespace) -> int:
    with open(args.render_only) as f:
        report = json.load(f)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render_markdown(report))
    if args.charts:
        for path in render_charts(report, args.charts):
            print(path)
    return 0


def new_report(args: argparse.Namespace, registry: ImplementationRegistry, ffpa_attn: Any, cases: list[Case],
               l2_bytes: int) -> dict[str, Any]:
    properties = torch.cuda.get_device_properties(0)
    return {
        "tool": "attention_bench",
        "device": torch.cuda.get_device_name(0),
        "capability": "%d.%d" % torch.cuda.get_device_capability(0),
        "sm_count": properties.multi_processor_count,
        "l2_bytes": l2_bytes,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "ffpa_version": ffpa_attn.__version__,
        "ffpa_library": str(ffpa_attn.library_path()),
        "ffpa_impl": args.ffpa_impl,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python3"] + sys.argv),
        "warmup": args.warmup,
        "iters": args.iters,
        "implementations": [{"name": i.name, "kind": i.kind} for i in registry.implementations],
        "sweeps": {name: {"title": SWEEPS[name].title, "metric": SWEEPS[name].metric} for name in args.cases},
        "cases_planned": len(cases),
        "complete": False,
        "rows": [],
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.render_only:
        return render_saved(args)
    cases = selected_cases(args)
    try:
        if args.list:
            registry = builtin_registry(None, args.with_math)
        else:
            if not torch.cuda.is_available():
                print("attention_bench: no CUDA device visible to torch", file=sys.stderr)
                return 2
            ffpa_attn = import_ffpa_attn()
            registry = builtin_registry(ffpa_implementation(ffpa_attn, args.ffpa_impl), args.with_math)
        for path in args.plugin:
            load_plugin(path, registry)
    except (ImportError, OSError, ValueError, TypeError, PluginError) as error:
        print(f"attention_bench: {error}", file=sys.stderr)
        return 2
    if args.list:
        list_cases(cases, registry)
        return 0

    torch.set_float32_matmul_precision("highest")  # the fp32 reference must not use TF32
    torch.manual_seed(0x1234)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    report = new_report(args, registry, ffpa_attn, cases, l2_bytes)
    print(f"attention_bench on {report['device']} (torch {report['torch']}, ffpa_attn {report['ffpa_version']}, "
          f"impl {args.ffpa_impl}): {len(cases)} cases", file=sys.stderr, flush=True)
    for n, case in enumerate(cases, 1):
        label = f"[{n}/{len(cases)}] {case.sweep} {case.label()}"
        print(f"{label} ...", file=sys.stderr, flush=True)
        try:
            row = run_case(case, registry, args, l2_bytes)
        except RuntimeError as error:  # out of memory, or a CUDA error, outside any one column
            row = {**case_row(case), "results": {}, "error": first_line(error), "best_sdpa": None,
                   "speedup": None, "ffpa_rel_l2": None, "passed": False}
        torch.cuda.empty_cache()
        report["rows"].append(row)
        print(f"{label}: {progress_line(row)}", file=sys.stderr, flush=True)
        write_outputs(report, args)

    report["complete"] = True
    write_outputs(report, args)
    if args.charts:
        for path in render_charts(report, args.charts):
            print(f"attention_bench: wrote {path}", file=sys.stderr)
    print(render_markdown(report))
    failed = [f"{r['sweep']} {r['case']}" for r in report["rows"] if not r["passed"]]
    if failed:
        print(f"attention_bench: {len(failed)} case(s) failed: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
