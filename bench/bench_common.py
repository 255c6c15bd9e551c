"""What bench/dropin_sweep_full.py and bench/compass.py share: FLOPs, timing, inputs, reference, host-us.

Torch-free at import (the scripts' --help, --list and --dry-run run without
torch or a GPU). GpuSession imports torch, ffpa_attn and bench/attention_bench.py
when it is made: the timing is attention_bench's time_calls (CUDA events around
each call, the GPU held by a sleep kernel while the host queues the calls, so
the times are the kernels' own), its input-set rule (sets rotated beyond twice
the L2 cache) and its SDPA refusal messages, reused unchanged.

A run compares, in one process, what a patched model runs with what it ran
before: the original F.scaled_dot_product_attention is captured before
ffpa_attn.monkey_patch() and every SDPA column (default dispatch, one backend
under sdpa_kernel, the fp32 reference) calls that original, never the patch.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent

DTYPE_NAMES = ("bf16", "fp16")
ELEMENT_BYTES = 2  # bf16 and fp16

# SDPA's backends as columns: column name -> torch.nn.attention.SDPBackend member.
SDPA_BACKENDS = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}
# SDPA's math backend materializes the scores: skipped from this length on, and above this memory.
MATH_MAX_SEQ = 8192
MATH_MAX_BYTES = 8 << 30


# --- FLOPs (docs: shared/docs/compass-cases.md) ------------------------------------------


def attention_flops(B: int, Hq: int, Nq: int, Nkv: int, D: int, causal: bool, backward: bool = False) -> float:
    """The compass's count: 4*B*Hq*Nq*Nkv*D, halved for causal with Nq == Nkv; backward 2.5x the forward."""
    flops = 4.0 * B * Hq * Nq * Nkv * D
    if causal and Nq == Nkv:
        flops /= 2
    return flops * 2.5 if backward else flops


def tflops(flops: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else flops / ms / 1e9


def math_skip_reason(B: int, Hq: int, Hkv: int, Nq: int, Nkv: int, D: int) -> str | None:
    """Why SDPA's math backend sits a shape out, or None. Its memory: the scores and their softmax in
    the input dtype (plus an fp32 copy for the softmax) and, for GQA, K and V repeated to Hq heads."""
    if max(Nq, Nkv) >= MATH_MAX_SEQ and Nq > 1:
        return f"skipped: math backend at N >= {MATH_MAX_SEQ} (it materializes the scores)"
    scores = B * Hq * Nq * Nkv * (2 * ELEMENT_BYTES + 4)
    expanded = 2 * B * Hq * Nkv * D * ELEMENT_BYTES if Hq != Hkv else 0
    if scores + expanded > MATH_MAX_BYTES:
        return f"skipped: math backend would need ~{(scores + expanded) / 2**30:.1f} GiB (> {MATH_MAX_BYTES >> 30} GiB)"
    return None


# --- a rough model of H200 times: ETA weights, --list estimates, --dry-run's numbers ------

# TFLOP/s at large shapes, bf16, H200 (docs/perf/: attention_bench and the drop-in sweep, 2026-11-29/30).
_FFPA_RATE = ((64, 190), (128, 210), (256, 410), (512, 560), (1024, 310))
_FAST_RATE = {"flash": ((64, 470), (128, 620), (256, 650)), "cudnn": ((64, 470), (128, 640), (256, 720))}
_EFFICIENT_RATE = ((128, 260), (256, 280), (1024, 130))
_MATH_RATE = 40.0
_HBM_BYTES_PER_MS = {"ffpa": 2.2e9, "sdpa": 0.8e9}  # decode: K and V read once


def _rate(table: tuple[tuple[int, float], ...], D: int) -> float | None:
    for limit, rate in table:
        if D <= limit:
            return rate
    return None


def model_ms(column: str, B: int, Hq: int, Hkv: int, Nq: int, Nkv: int, D: int, causal: bool, masked: bool,
             backward: bool = False) -> float | None:
    """A rough guess of a column's time on an H200 (None: the column would refuse the call). Not a
    measurement: it only weighs progress, estimates runtimes and fills --dry-run."""
    flops = attention_flops(B, Hq, Nq, Nkv, D, causal, backward)
    size = min(1.0, (B * Hq * Nq * Nkv) / (32 * 2048 * 2048)) ** 0.5  # small calls fill the GPU less
    kv_bytes = 2 * B * Hkv * Nkv * D * ELEMENT_BYTES
    gqa = Hq != Hkv
    if column in ("patched", "unpatched"):
        if column == "patched" and D > 256:
            return model_ms("ffpa", B, Hq, Hkv, Nq, Nkv, D, causal, masked, backward)
        candidates = [model_ms(c, B, Hq, Hkv, Nq, Nkv, D, causal, masked, backward)
                      for c in ("cudnn", "flash", "efficient")]
        fast = [c for c in candidates if c is not None]
        return fast[0] if fast else model_ms("math", B, Hq, Hkv, Nq, Nkv, D, causal, masked, backward) or flops / 40e9
    if column == "ffpa":
        rate = _rate(_FFPA_RATE, D)
        penalty = 0.7 if masked else 1.0
        hbm = _HBM_BYTES_PER_MS["ffpa"]
    elif column in _FAST_RATE:
        if D > 256 or (masked and column == "flash") or (gqa and column == "cudnn"):
            return None
        rate, penalty, hbm = _rate(_FAST_RATE[column], D), 0.55 if masked else 1.0, _HBM_BYTES_PER_MS["sdpa"]
    elif column == "efficient":
        if gqa:
            return None
        rate, penalty, hbm = _rate(_EFFICIENT_RATE, D), 0.8 if masked else 1.0, _HBM_BYTES_PER_MS["sdpa"]
    elif column == "math":
        if math_skip_reason(B, Hq, Hkv, Nq, Nkv, D):
            return None
        rate, penalty, hbm = _MATH_RATE, 1.0, _HBM_BYTES_PER_MS["sdpa"] / 4
    else:
        raise ValueError(f"unknown column {column!r}")
    if rate is None:
        return None
    compute_ms = flops / (rate * 1e9 * penalty * max(size, 0.05))
    return max(0.006, compute_ms, kv_bytes / hbm)


# --- report helpers ------------------------------------------------------------------------


def git_state() -> dict[str, Any]:
    """The repository's HEAD commit and whether the work tree differs from it (None where git does not work)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit or None, "dirty": None if status is None else bool(status)}


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    return shlex.join(["python3"] + sys.argv)


def json_safe(value: Any) -> Any:
    """value with NaN and infinities as None (strict JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(path: str, report: Any) -> None:
    """Atomically: a run killed while writing leaves the previous complete file."""
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(json_safe(report), f, indent=1, allow_nan=False)
        f.write("\n")
    os.replace(temporary, path)


def write_text(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def output_path_error(option: str, path: str | None) -> str | None:
    if path and not os.path.isdir(os.path.dirname(os.path.abspath(path)) or "."):
        return f"{option} {path}: its directory does not exist"
    return None


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table: None as '-', 3 significant digits (more for large values)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def fmt_err(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def held_host_us(call: Callable[[], Any], calls: int = 600, warm: int = 100) -> float:
    """Host microseconds per call of `call` (a CUDA call), the GPU held by a ~0.1 s sleep kernel so
    that the host can neither wait for the GPU nor fill the launch queue: only the host is timed.
    Imports torch (bench/host_ab.py, bench/host_parts.py)."""
    import torch

    for _ in range(warm):
        call()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))
    start = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


class Progress:
    """A line per step on stderr with the elapsed time and an ETA from the steps' estimated weights."""

    def __init__(self, tool: str, weights: list[float]) -> None:
        self.tool = tool
        self.weights = [max(w, 1e-6) for w in weights]
        self.total = sum(self.weights)
        self.done = 0.0
        self.count = 0
        self.start = time.monotonic()

    def say(self, text: str) -> None:
        print(f"{self.tool}: {text}", file=sys.stderr, flush=True)

    def step(self, label: str, text: str) -> None:
        self.done += self.weights[self.count] if self.count < len(self.weights) else 0.0
        self.count += 1
        elapsed = time.monotonic() - self.start
        remaining = (self.total - self.done) * elapsed / self.done if self.done > 0 else float("nan")
        eta = f"eta {remaining:.0f} s" if math.isfinite(remaining) else "eta ?"
        print(f"[{self.count}/{len(self.weights)}] {label}: {text}  ({elapsed:.0f} s, {eta})", file=sys.stderr,
              flush=True)


# --- the GPU side --------------------------------------------------------------------------


class ContextLost(RuntimeError):
    """The CUDA context no longer works (a failed kernel poisoned it): the run cannot go on."""


@dataclass(frozen=True)
class Sample:
    """Where the output is checked: (batch, query head) pairs and query rows (None: every row)."""

    pairs: tuple[tuple[int, int], ...]
    rows: tuple[int, ...] | None

    def describe(self, Nq: int) -> dict[str, Any]:
        rows = Nq if self.rows is None else len(self.rows)
        return {"pairs": [list(p) for p in self.pairs], "rows": rows, "all_rows": self.rows is None}


def choose_sample(B: int, Hq: int, Nq: int, Nkv: int, heads: int = 2, rows: int = 512,
                  full_limit: int = 1 << 28) -> Sample:
    """The whole output when its fp32 scores total at most full_limit elements, else `heads`
    (batch, head) pairs (first and last) and `rows` query rows spread over Nq (first and last included)."""
    if B * Hq * Nq * Nkv <= full_limit:
        return Sample(tuple((b, h) for b in range(B) for h in range(Hq)), None)
    candidates = [(0, 0), (B - 1, Hq - 1), (0, Hq // 2), (B - 1, 0)]
    pairs = tuple(dict.fromkeys(candidates))[:heads]
    if Nq <= rows:
        return Sample(pairs, None)
    spread = sorted({round(i * (Nq - 1) / (rows - 1)) for i in range(rows)})
    return Sample(pairs, tuple(spread))


class GpuSession:
    """torch, ffpa_attn and the original SDPA, loaded once; patched=True installs ffpa_attn.monkey_patch().

    device: "cuda" for every measurement; another device only where a test stands in for CUDA's events."""

    def __init__(self, patched: bool, device: str = "cuda") -> None:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch")
        self.device = device
        if str(BENCH_DIR) not in sys.path:
            sys.path.insert(0, str(BENCH_DIR))
        import attention_bench  # time_calls, input_set_count's rule, refusal_reason, import_ffpa_attn

        self.torch = torch
        self.F = F
        self.SDPBackend = SDPBackend
        self.sdpa_kernel = sdpa_kernel
        self.ab = attention_bench
        self.ffpa_attn = attention_bench.import_ffpa_attn()
        self.original_sdpa = F.scaled_dot_product_attention  # captured before any patch
        if self.original_sdpa is self.ffpa_attn.ffpa_attn_func:
            raise RuntimeError("F.scaled_dot_product_attention is already ffpa_attn_func: run in a fresh process")
        self.patched = patched
        if patched:
            self.ffpa_attn.monkey_patch()
        torch.set_float32_matmul_precision("highest")  # the fp32 reference must not use TF32
        self.l2_bytes = int(torch.cuda.get_device_properties(0).L2_cache_size) if device == "cuda" else 50 << 20
        self.info = self.ffpa_attn.library_info()

    def close(self) -> None:
        if self.patched:
            self.ffpa_attn.unpatch()
            self.patched = False

    # environment

    def environment(self) -> dict[str, Any]:
        torch = self.torch
        properties = torch.cuda.get_device_properties(0)
        info = self.info
        return {
            "gpu": torch.cuda.get_device_name(0),
            "capability": "{}.{}".format(*torch.cuda.get_device_capability(0)),
            "sm_count": properties.multi_processor_count,
            "l2_bytes": self.l2_bytes,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "ffpa_attn_version": getattr(self.ffpa_attn, "__version__", None),
            "library": str(self.ffpa_attn.library_path()),
            "library_info": {
                "version": info.version,
                "head_dims": [info.min_head_dim, info.max_head_dim, info.head_dim_multiple],
                "max_sequence_length": info.max_sequence_length,
                "cuda_architectures": list(info.cuda_architectures),
                "split_d_head_dims": list(info.split_d_head_dims),
                "sm90_wgmma_head_dims": list(info.sm90_wgmma_head_dims),
                # which backward a training point ran (routing.py's hopper_backward rows)
                "sm90_backward_head_dims": list(info.sm90_backward_head_dims),
            },
        }

    def head_dim_refusal(self, D: int) -> str | None:
        """Why the loaded library takes no head dim D (ffpa_attn.library_info()), or None."""
        info = self.info
        if not info.min_head_dim <= D <= info.max_head_dim or D % info.head_dim_multiple:
            return (f"the library serves head dims {info.min_head_dim}..{info.max_head_dim} in steps of "
                    f"{info.head_dim_multiple}, not D={D}")
        return None

    def ffpa_kernel(self, D: int, route: str) -> str:
        """The kernel a call runs: 'sdpa' where routing hands it to SDPA; else the ffpa family that the
        library's impl auto takes by its documented rule (sm90_wgmma on sm_90 for 128 < D <= the largest
        sm90 instance, sm80_split_d otherwise): inferred, not observed."""
        if not route.startswith("ffpa"):
            return "sdpa"
        sm90 = self.info.sm90_wgmma_head_dims
        if self.torch.cuda.get_device_capability(0) == (9, 0) and sm90 and 128 < D <= max(sm90):
            return "ffpa sm90_wgmma (inferred)"
        return "ffpa sm80_split_d (inferred)"

    # inputs

    def dtype(self, name: str) -> Any:
        return {"bf16": self.torch.bfloat16, "fp16": self.torch.float16}[name]

    def set_count(self, set_bytes: int, cap: int = 256) -> int:
        """attention_bench's rule: input sets whose bytes together exceed twice the L2 (one when one does)."""
        count = 1 if set_bytes > 2 * self.l2_bytes else 2 * self.l2_bytes // max(set_bytes, 1) + 1
        return int(min(count, cap))

    def random(self, shape: Iterable[int], dtype: Any, seed: int, requires_grad: bool = False) -> Any:
        generator = self.torch.Generator(device=self.device).manual_seed(seed)
        t = self.torch.randn(tuple(shape), generator=generator, device=self.device, dtype=dtype)
        return t.requires_grad_() if requires_grad else t

    def qkv_sets(self, B: int, Hq: int, Hkv: int, Nq: int, Nkv: int, D: int, dtype: str, seed: int,
                 count: int) -> list[tuple[Any, Any, Any]]:
        t = self.dtype(dtype)
        return [(self.random((B, Hq, Nq, D), t, seed + 3 * i), self.random((B, Hkv, Nkv, D), t, seed + 3 * i + 1),
                 self.random((B, Hkv, Nkv, D), t, seed + 3 * i + 2)) for i in range(count)]

    def key_padding(self, B: int, Nkv: int, fraction: float = 0.1) -> Any:
        """Bool [B, Nkv], True = attend: the last ~fraction of the keys of every batch masked, never key 0."""
        keep = self.torch.ones(B, Nkv, dtype=self.torch.bool, device=self.device)
        masked = min(Nkv - 1, max(1, round(Nkv * fraction)))
        if Nkv > 1:
            keep[:, Nkv - masked:] = False
        return keep

    def causal_keep(self, Nq: int, Nkv: int, bottom_right: bool = False) -> Any:
        """Bool [Nq, Nkv]: j <= i (top-left, SDPA's is_causal) or j <= i + Nkv - Nq (bottom-right)."""
        diagonal = Nkv - Nq if bottom_right else 0
        return self.torch.ones(Nq, Nkv, dtype=self.torch.bool, device=self.device).tril(diagonal)

    def free(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    # contexts and calls

    def backend_context(self, column: str) -> Callable[[], Any]:
        """A factory of the context a column runs in: one SDPA backend for the SDPA_BACKENDS columns."""
        if column in SDPA_BACKENDS:
            backend = getattr(self.SDPBackend, SDPA_BACKENDS[column])
            return lambda: self.sdpa_kernel([backend])
        import contextlib

        return contextlib.nullcontext

    def check_context(self) -> None:
        """Raises ContextLost when CUDA no longer works (after an error, before trusting anything)."""
        try:
            self.torch.cuda.synchronize()
            self.torch.ones(1, device=self.device).add_(1).item()
        except Exception as error:  # noqa: BLE001 - anything here means the context is gone
            raise ContextLost(f"the CUDA context failed after an error: {first_line(error)}") from error

    def first_call(self, call: Callable[[int], Any], context: Callable[[], Any], sdpa: bool) -> tuple[Any, str | None]:
        """(output, None), or (None, why the column cannot run the call): NotImplementedError (ffpa with
        impl='ffpa'), SDPA's refusal (its warnings say why), out of memory, any other error."""
        torch = self.torch
        caught: list[warnings.WarningMessage] = []
        try:
            with context(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = call(0)
                torch.cuda.synchronize()
            return out, None
        except NotImplementedError as error:
            return None, f"NotImplementedError: {first_line(error)}"
        except torch.OutOfMemoryError as error:
            self.free()
            return None, f"out of memory: {first_line(error)}"
        except RuntimeError as error:
            self.check_context()
            return None, self.ab.refusal_reason(caught, error) if sdpa else f"RuntimeError: {first_line(error)}"
        except Exception as error:  # noqa: BLE001 - the column fails, the run goes on
            self.check_context()
            return None, f"{type(error).__name__}: {first_line(error)}"

    def probe_ms(self, call: Callable[[int], Any], context: Callable[[], Any]) -> float:
        """One call's time, host included (to choose how many calls to time)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with context():
            torch.cuda.synchronize()
            start.record()
            call(0)
            end.record()
            end.synchronize()
        return start.elapsed_time(end)

    def back_to_back_ms(self, call: Callable[[int], Any], sets: int, iters: int) -> float:
        """ms per call of `iters` calls queued back to back with no head start: where a call's host time
        exceeds its GPU time, this measures the host (what a model that launches one call after another sees)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for n in range(iters):
            call(n % sets)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters

    def time_rounds(self, columns: dict[str, tuple[Callable[[int], Any], Callable[[], Any]]], sets: int,
                    rounds: int, warmup: int, iters: dict[str, int], wall: Iterable[str] = ()
                    ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, str]]:
        """Interleaved timing: per round, every column in turn (the order reversed every other round),
        each the median of iters[column] calls (attention_bench.time_calls) after warm-up (`warmup` calls
        in the first round, one later). Columns in `wall` are also timed back to back (back_to_back_ms).
        Returns (round medians per column, back-to-back ms per column, errors of columns that failed)."""
        medians: dict[str, list[float]] = {name: [] for name in columns}
        walls: dict[str, list[float]] = {name: [] for name in wall if name in columns}
        errors: dict[str, str] = {}
        names = list(columns)
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                if name in errors:
                    continue
                call, context = columns[name]
                try:
                    with context():
                        median, _ = self.ab.time_calls(call, sets, warmup if r == 0 else 1, iters[name])
                        medians[name].append(median)
                        if name in walls:
                            walls[name].append(self.back_to_back_ms(call, sets, iters[name]))
                except self.torch.OutOfMemoryError as error:
                    self.free()
                    errors[name] = f"out of memory while timing: {first_line(error)}"
                except Exception as error:  # noqa: BLE001 - one column's failure ends that column only
                    self.check_context()
                    errors[name] = f"{type(error).__name__} while timing: {first_line(error)}"
        return medians, walls, errors

    # the fp32 reference

    def reference(self, q: Any, k: Any, v: Any, mask: Any, causal: str, sample: Sample,
                  scale: float | None = None, chunk_bytes: int = 64 << 20) -> list[Any]:
        """fp32 outputs [rows, D] for the sample's (batch, head) pairs: the original SDPA's math backend on
        upcast inputs, the full keys, chunked over query rows; mask broadcastable to [B, Hq, Nq, Nkv]
        (bool or additive), causal 'none', 'top_left' or 'bottom_right'."""
        torch = self.torch
        B, Hq, Nq, D = q.shape
        Hkv, Nkv = k.shape[1], k.shape[2]
        group = Hq // Hkv
        device = self.device
        rows = torch.arange(Nq, device=device) if sample.rows is None else torch.tensor(sample.rows, device=device)
        full_mask = None if mask is None else mask.expand(B, Hq, Nq, Nkv)
        keys = torch.arange(Nkv, device=self.device)
        per_chunk = max(1, chunk_bytes // (4 * Nkv))
        refs = []
        with self.sdpa_kernel([self.SDPBackend.MATH]):
            for b, h in sample.pairs:
                kf, vf = k[b, h // group].float()[None, None], v[b, h // group].float()[None, None]
                parts = []
                for start in range(0, rows.numel(), per_chunk):
                    r = rows[start:start + per_chunk]
                    qf = q[b, h].index_select(0, r).float()[None, None]
                    m = None
                    if full_mask is not None:
                        m = full_mask[b, h].index_select(0, r)
                        m = m if m.dtype == torch.bool else m.float()
                    if causal != "none":
                        offset = Nkv - Nq if causal == "bottom_right" else 0
                        keep = keys[None, :] <= (r[:, None] + offset)
                        if m is None:
                            m = keep
                        elif m.dtype == torch.bool:
                            m = m & keep
                        else:
                            m = m.masked_fill(~keep, -math.inf)
                    out = self.original_sdpa(qf, kf, vf, attn_mask=None if m is None else m[None, None], scale=scale)
                    parts.append(out[0, 0])
                refs.append(torch.cat(parts))
        return refs

    def rel_err(self, out: Any, refs: list[Any], sample: Sample) -> tuple[float, int]:
        """(relative L2 error of out against the reference over the sample, NaNs in the whole output)."""
        torch = self.torch
        nan_count = int(torch.isnan(out).sum().item())
        rows = None if sample.rows is None else torch.tensor(sample.rows, device=out.device)
        err = torch.zeros((), dtype=torch.float64, device=out.device)
        norm = torch.zeros((), dtype=torch.float64, device=out.device)
        for (b, h), ref in zip(sample.pairs, refs):
            got = out[b, h] if rows is None else out[b, h].index_select(0, rows)
            diff = got.float() - ref
            err += diff.double().square().sum()
            norm += ref.double().square().sum()
        return math.sqrt(err.item() / max(norm.item(), 1e-300)), nan_count

    # host time per eager call

    def host_us(self, rounds: int = 5, calls: int = 2000, warm: int = 200, breakdown: bool = True) -> dict[str, Any]:
        """Microseconds of host time per eager call on B=1, H=1, Nq=1, Nkv=16, D=512 bf16: wall time of
        `calls` calls without synchronizing (synchronized before and after the loop, the time taken before
        the closing synchronize; `*_with_sync` includes it), the median over `rounds` interleaved rounds.
        breakdown adds the parts of the ffpa path: the custom op called directly, torch.empty_like(q),
        torch.cuda.current_stream().cuda_stream, and an empty Python call (the loop's own cost)."""
        torch = self.torch
        fa = self.ffpa_attn
        dtype = torch.bfloat16
        q = self.random((1, 1, 1, 512), dtype, 7001)
        k = self.random((1, 1, 16, 512), dtype, 7002)
        v = self.random((1, 1, 16, 512), dtype, 7003)
        only_ffpa = fa.CUDABackend(impl="ffpa")
        sdpa = self.original_sdpa
        cases: dict[str, Callable[[], Any]] = {
            "ffpa_attn_func": lambda: fa.ffpa_attn_func(q, k, v),
            "ffpa_attn_func impl=ffpa": lambda: fa.ffpa_attn_func(q, k, v, backend=only_ffpa),
            "sdpa": lambda: sdpa(q, k, v),
        }
        if self.patched:
            patched = self.F  # looked up per call, as a model does
            cases["F.scaled_dot_product_attention (patched)"] = lambda: patched.scaled_dot_product_attention(q, k, v)
        errors: dict[str, str] = {}
        if breakdown:
            op_call, op_error = self._op_call(q, k, v)
            if op_call is not None:
                cases["torch.ops.ffpa_attn.forward"] = op_call
            else:
                errors["torch.ops.ffpa_attn.forward"] = op_error or "unavailable"
            cases["torch.empty_like(q)"] = lambda: torch.empty_like(q)
            cases["torch.cuda.current_stream().cuda_stream"] = lambda: torch.cuda.current_stream().cuda_stream
            cases["empty call (lambda: None)"] = lambda: None
        for name, call in list(cases.items()):  # each once, outside the timing: a failing one is reported
            try:
                call()
                torch.cuda.synchronize()
            except Exception as error:  # noqa: BLE001
                self.check_context()
                errors[name] = f"{type(error).__name__}: {first_line(error)}"
                del cases[name]
        loop: dict[str, list[float]] = {name: [] for name in cases}
        with_sync: dict[str, list[float]] = {name: [] for name in cases}
        names = list(cases)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                call = cases[name]
                for _ in range(warm):
                    call()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                middle = time.perf_counter()
                torch.cuda.synchronize()
                end = time.perf_counter()
                loop[name].append((middle - start) / calls * 1e6)
                with_sync[name].append((end - start) / calls * 1e6)
        import statistics

        result: dict[str, Any] = {
            "shape": "B=1, H=1, Nq=1, Nkv=16, D=512, bf16",
            "calls": calls,
            "rounds": rounds,
            "us": {name: statistics.median(loop[name]) for name in names},
            "us_with_sync": {name: statistics.median(with_sync[name]) for name in names},
            "rounds_us": loop,
        }
        if errors:
            result["errors"] = errors
        return result

    def _op_call(self, q: Any, k: Any, v: Any) -> tuple[Callable[[], Any] | None, str | None]:
        """torch.ops.ffpa_attn.forward with the arguments ffpa_attn_func gives it for an unmasked,
        non-causal, no-dropout call with impl auto, named from the op's schema (python/ffpa_attn/ops.py)."""
        try:
            from ffpa_attn._library import Accumulation, Causal, Impl

            op = self.torch.ops.ffpa_attn.forward
            schema = op.default._schema
        except Exception as error:  # noqa: BLE001
            return None, f"{type(error).__name__}: {first_line(error)}"
        known = {
            "q": q, "k": k, "v": v, "mask": None, "dropout_p": 0.0, "causal": int(Causal.NONE),
            "scale": 1.0 / math.sqrt(q.shape[-1]), "accumulation": int(Accumulation.F32), "impl": int(Impl.AUTO),
            "dropout_seed": 0, "dropout_offset": 0, "return_lse": False,
            # the inputs' precision (the op's defaults; the fp8_* arguments are then not read)
            "precision": 0, "fp8_qk_format": 0, "fp8_qk_scales": 0, "fp8_smooth_k": True, "fp8_early_rows": -1,
            "fp8_v_scales": 0, "fp8_smooth_v": False,
        }  # fmt: skip
        names = [argument.name for argument in schema.arguments]
        unknown = [n for n in names if n not in known]
        if unknown:
            return None, f"the op's schema has arguments this benchmark does not know: {unknown} ({schema})"
        arguments = [known[n] for n in names]
        return (lambda: op(*arguments)), None
