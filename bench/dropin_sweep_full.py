#!/usr/bin/env python3
"""Issue 16's drop-in sweep with every SDPA backend: does monkey_patch() ever make a model slower or different?

Per point, in one process, on the same inputs (a superset of the columns of the first sweep, bench/dropin_sweep.py, removed 2026-12-01):
  patched    F.scaled_dot_product_attention after ffpa_attn.monkey_patch(), i.e. ffpa_attn_func with
             the default backend (impl "auto": ffpa's kernel or SDPA, python/ffpa_attn/routing.py)
  unpatched  the original F.scaled_dot_product_attention (captured before patching), SDPA's own dispatch
  ffpa       ffpa_attn_func(..., backend=CUDABackend(impl="ffpa")): the library's kernel, never SDPA
             (null with the NotImplementedError's reason where the library cannot serve the call)
  flash, efficient, cudnn, math
             the original SDPA under torch.nn.attention.sdpa_kernel([SDPBackend.X]) (null with SDPA's
             reason where the backend refuses; math skipped from Nq = Nkv = 8192 on, or above ~8 GiB)

Points: D in {64, 128, 256, 320, 512, 1024} x N in {128, 512, 2048, 8192} x {non-causal, causal} x
{no mask, key-padding bool mask [B,1,1,N] with the last 10 % of keys masked} (causal with a mask: one
bool [B,1,N,N] mask, key padding and j <= i together, as SDPA takes no is_causal with attn_mask; no row
is ever fully masked), plus decode (Nq=1, Nkv in {2048, 8192}, D in {128, 256, 512}) and GQA (Hq=H,
Hkv=H/4, N in {2048, 8192}, D in {128, 512}, enable_gqa=True), and the decode rules' edges (decode_batch:
B=8 MHA, Nq=1, Nkv in {512, ..., 8192}, D in {320, 512, 640, 1024}; B=1 D=256 MHA and GQA 4, Nkv in
{512, ..., 32768}). bf16, B=1, H=32 by default.

Timing: bench/attention_bench.py's time_calls (CUDA events around each call, the GPU held by a sleep
kernel while the host queues the calls: the kernels' own time, not the host's), inputs rotated through
enough random sets to exceed twice the L2, interleaved within the point: --rounds rounds (default 5),
the column order reversed every other round, each round the median of K calls after warm-up (K from
--min-iters to --iters, about --target-ms of GPU time per column and round). A column's time is the
median of its round medians. patched/unpatched (`ratio`) is balanced over the column order: the
per-round ratios (`ratio_rounds`, their spread is the noise) of the rounds in each order, each order's
median, and the geometric mean of the two (at calls of ~20 us the order alone moved a round's ratio by
~5 % either way on the H200, 2026-12-01, and 5 rounds put 3 in one order); `ratio_of_medians` is the
plain ratio of the two columns' times. Where the unpatched call takes under --wall-below-ms, patched and
unpatched are also timed back to back without the head start (`*_wall_ms`, `wall_ratio`): there the
host's time per call shows. TFLOP/s: 4*B*Hq*Nq*Nkv*D, halved for causal with Nq == Nkv (the compass's
formula, docs: shared/docs/compass-cases.md; masked points count as unmasked). Correctness: the relative
L2 error of every column's first output against SDPA's math backend in fp32 on upcast inputs, on the
whole output for small points, else 2 heads x 512 query rows over the full keys (`sample`).

host-us (its own JSON key): host microseconds per eager call on B=1, H=1, Nq=1, Nkv=16, D=512 bf16, the
wall time of 2000 calls without synchronizing, median of 5 interleaved rounds, for ffpa_attn_func
(default backend and impl="ffpa"), the original SDPA and the patched F.scaled_dot_product_attention,
with a breakdown of the ffpa path: torch.ops.ffpa_attn.forward called directly, torch.empty_like(q),
torch.cuda.current_stream().cuda_stream and an empty call.

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/dropin_sweep_full.py \\
        --json out/dropin.json --markdown out/dropin.md --charts out/dropin_charts

Runtime on an H200 (estimated from the measured times of docs/perf/h200-2026-11-30-dropin/ and the
method's fixed costs; --list prints the estimate for a selection): the full sweep (134 points, 7 columns,
5 rounds) about 4 minutes, --quick (18 points, 3 rounds) under a minute. --dry-run measures nothing:
it fills the report with the model's guesses (no torch, no GPU) to exercise the JSON, markdown and charts.
--render-only JSON redraws the markdown and charts of a saved report.

Exit status: 0 when the run completed, 2 for a bad command line or nothing to load, 3 when the CUDA
context failed mid-run (the report so far is written, "aborted" says why; rerun without the column that
broke it, --columns).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Any

import bench_common as bc

HEAD_DIMS = (64, 128, 256, 320, 512, 1024)
LENGTHS = (128, 512, 2048, 8192)
DECODE_DIMS, DECODE_LENGTHS = (128, 256, 512), (2048, 8192)
GQA_DIMS, GQA_LENGTHS = (128, 512), (2048, 8192)
# Decode where routing.py's decode rules draw their lines: MHA over many rows
# (B = 8, B x Hq = 256) and few keys at D 320-1024, and B = 1 decode at D = 256
# (MHA and GQA 4), where ffpa's split-KV kernel may beat SDPA's flash/cuDNN.
DECODE_BATCH_DIMS, DECODE_BATCH_LENGTHS, DECODE_BATCH_B = (320, 512, 640, 1024), (512, 1024, 2048, 4096, 8192), 8
DECODE_SMALL_D_LENGTHS = (512, 2048, 8192, 32768)
QUICK_DIMS, QUICK_LENGTHS = (128, 512), (512, 2048)
KINDS = ("sweep", "decode", "gqa", "decode_batch")
COLUMNS = ("patched", "unpatched", "ffpa", "flash", "efficient", "cudnn", "math")
SDPA_COLUMNS = ("unpatched", *bc.SDPA_BACKENDS)  # refusals read from SDPA's warnings
TOLERANCE = {"bf16": 1e-2, "fp16": 5e-3}  # relative L2 against fp32, as the GPU tests
RATIO_BAR = 1.03  # issue 16: patched / unpatched <= 1.03 at every point


@dataclass(frozen=True)
class Point:
    kind: str  # sweep, decode, gqa, decode_batch
    D: int
    Nq: int
    Nkv: int
    B: int
    Hq: int
    Hkv: int
    causal: bool
    mask: bool
    dtype: str

    @property
    def gqa(self) -> bool:
        return self.Hq != self.Hkv

    def label(self) -> str:
        heads = f"H{self.Hq}" if not self.gqa else f"Hq{self.Hq}/Hkv{self.Hkv}"
        seq = f"N{self.Nq}" if self.Nq == self.Nkv else f"Nq{self.Nq}/Nkv{self.Nkv}"
        extras = (" causal" if self.causal else "") + (" keypad" if self.mask else "")
        return f"{self.kind} D{self.D} {seq} B{self.B} {heads} {self.dtype}{extras}"

    def flops(self) -> float:
        return bc.attention_flops(self.B, self.Hq, self.Nq, self.Nkv, self.D, self.causal)

    def shape(self) -> tuple[int, int, int, int, int, int]:
        return self.B, self.Hq, self.Hkv, self.Nq, self.Nkv, self.D

    def seed(self, base: int) -> int:
        return base + zlib.crc32(self.label().encode()) % 1_000_000 * 10


def csv_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from error
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def csv_choice(choices: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
        unknown = [v for v in values if v not in choices]
        if unknown or not values:
            wrong = ", ".join(unknown) or repr(text)
            raise argparse.ArgumentTypeError(f"unknown {wrong}: choose from {', '.join(choices)}")
        return values

    return parse


def make_points(args: argparse.Namespace) -> list[Point]:
    dims = QUICK_DIMS if args.quick else HEAD_DIMS
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    keep_d = (lambda d: d in args.dims) if args.dims else (lambda d: True)
    keep_n = (lambda n: n in args.lengths) if args.lengths else (lambda n: True)
    B, H, dtype = args.B, args.H, args.dtype
    points = []
    if "sweep" in args.kinds:
        for d in filter(keep_d, args.dims or dims):
            for n in filter(keep_n, args.lengths or lengths):
                for causal in (False, True):
                    for mask in (False, True):
                        points.append(Point("sweep", d, n, n, B, H, H, causal, mask, dtype))
    if "decode" in args.kinds:
        for d in filter(keep_d, (512,) if args.quick else DECODE_DIMS):
            for n in filter(keep_n, (2048,) if args.quick else DECODE_LENGTHS):
                points.append(Point("decode", d, 1, n, B, H, H, False, False, dtype))
    if "decode_batch" in args.kinds and not args.quick:
        for d in filter(keep_d, DECODE_BATCH_DIMS):
            for n in filter(keep_n, DECODE_BATCH_LENGTHS):
                points.append(Point("decode_batch", d, 1, n, DECODE_BATCH_B, H, H, False, False, dtype))
        for n in filter(keep_n, DECODE_SMALL_D_LENGTHS):
            if keep_d(256):
                points.append(Point("decode_batch", 256, 1, n, 1, H, H, False, False, dtype))
                points.append(Point("decode_batch", 256, 1, n, 1, H, max(1, H // 4), False, False, dtype))
    if "gqa" in args.kinds:
        for d in filter(keep_d, (512,) if args.quick else GQA_DIMS):
            for n in filter(keep_n, (2048,) if args.quick else GQA_LENGTHS):
                points.append(Point("gqa", d, n, n, B, H, max(1, H // 4), False, False, dtype))
    return points


# --- estimates ------------------------------------------------------------------------------

SLEEP_S = 0.02  # attention_bench.time_calls's head start per timed round (40 M cycles)


def column_skip(column: str, p: Point) -> str | None:
    return bc.math_skip_reason(*p.shape()) if column == "math" else None


def estimate_seconds(p: Point, args: argparse.Namespace) -> float:
    """A guess of the point's run time on an H200: inputs, reference, first calls, rounds."""
    total = 0.4  # inputs, reference, explain, first calls (cuDNN builds a graph per new shape)
    for column in args.columns:
        if column_skip(column, p):
            continue
        ms = bc.model_ms(column, *p.shape(), p.causal, p.mask)
        if ms is None:
            continue
        iters = min(args.iters, max(args.min_iters, math.ceil(args.target_ms / ms)))
        calls = 2 + args.warmup + (args.rounds - 1) + args.rounds * iters
        total += args.rounds * SLEEP_S + calls * max(ms, 0.03) / 1e3
        if column in ("patched", "unpatched") and ms < args.wall_below_ms:
            total += args.rounds * iters * 0.05 / 1e3
    return total


def host_us_seconds(args: argparse.Namespace) -> float:
    return 0.0 if args.skip_host_us else args.host_rounds * 8 * (args.host_calls + 200) * 40e-6


# --- measuring one point ----------------------------------------------------------------------


def point_row(p: Point) -> dict[str, Any]:
    return {**asdict(p), "label": p.label(), "flops": p.flops()}


def run_point(gpu: bc.GpuSession, p: Point, args: argparse.Namespace) -> dict[str, Any]:
    """One point's row; its tensors are freed when it returns (the caller empties the cache)."""
    row = point_row(p)
    set_bytes = bc.ELEMENT_BYTES * p.B * (p.Hq * p.Nq + 2 * p.Hkv * p.Nkv) * p.D
    count = gpu.set_count(set_bytes)
    sets = gpu.qkv_sets(*p.shape(), p.dtype, p.seed(args.seed), count)
    mask, is_causal = None, p.causal
    if p.mask:
        mask = gpu.key_padding(p.B, p.Nkv)[:, None, None, :]  # [B, 1, 1, Nkv]
        if p.causal:  # SDPA takes no is_causal with a mask: one [B, 1, N, N] mask, as a model passes it
            mask, is_causal = mask & gpu.causal_keep(p.Nq, p.Nkv)[None, None], False
    kwargs = {"attn_mask": mask, "is_causal": is_causal, "enable_gqa": p.gqa}
    row.update(input_sets=count, mask_shape=None if mask is None else list(mask.shape), is_causal_arg=is_causal)

    q0, k0, v0 = sets[0]
    row["route"] = gpu.ffpa_attn.explain(q0, k0, v0, **kwargs)
    row["kernel"] = gpu.ffpa_kernel(p.D, row["route"])
    sample = bc.choose_sample(p.B, p.Hq, p.Nq, p.Nkv)
    refs = gpu.reference(q0, k0, v0, mask, "top_left" if is_causal else "none", sample)
    row["sample"] = sample.describe(p.Nq)

    F, sdpa, fa = gpu.F, gpu.original_sdpa, gpu.ffpa_attn
    only_ffpa = fa.CUDABackend(impl="ffpa")
    calls = {
        "patched": lambda s: F.scaled_dot_product_attention(*sets[s], **kwargs),  # ffpa_attn_func, patched in
        "unpatched": lambda s: sdpa(*sets[s], **kwargs),
        "ffpa": lambda s: fa.ffpa_attn_func(*sets[s], backend=only_ffpa, **kwargs),
        **{name: (lambda s: sdpa(*sets[s], **kwargs)) for name in bc.SDPA_BACKENDS},
    }
    active: dict[str, tuple[Any, Any]] = {}
    iters: dict[str, int] = {}
    probes: dict[str, float] = {}
    for column in args.columns:
        context = gpu.backend_context(column)
        skip = column_skip(column, p)
        out, reason = (None, skip) if skip else gpu.first_call(calls[column], context, column in SDPA_COLUMNS)
        if reason is not None:
            row[f"{column}_ms"] = None
            row[f"{column}_reason"] = reason[:400]
            continue
        row[f"{column}_rel_err"], row[f"{column}_nan"] = gpu.rel_err(out, refs, sample)
        del out
        probes[column] = gpu.probe_ms(calls[column], context)
        iters[column] = min(args.iters, max(args.min_iters, math.ceil(args.target_ms / max(probes[column], 1e-3))))
        active[column] = (calls[column], context)
    del refs

    wall = ()
    if "patched" in active and "unpatched" in active:
        iters["patched"] = iters["unpatched"] = max(iters["patched"], iters["unpatched"])  # the pair alike
        if probes["unpatched"] < args.wall_below_ms:
            wall = ("patched", "unpatched")
    medians, walls, errors = gpu.time_rounds(active, count, args.rounds, args.warmup, iters, wall)
    for column in active:
        if column in errors or not medians[column]:
            row[f"{column}_ms"] = None
            row[f"{column}_reason"] = errors.get(column, "not timed")
            continue
        ms = statistics.median(medians[column])
        row.update({f"{column}_ms": ms, f"{column}_tflops": bc.tflops(p.flops(), ms),
                    f"{column}_rounds_ms": medians[column], f"{column}_iters": iters[column]})
        if column in walls and walls[column]:
            row[f"{column}_wall_ms"] = statistics.median(walls[column])
    summarize(row)
    return row


def order_balanced(ratios: list[float]) -> float:
    """The geometric mean of the median ratio of the rounds in each column order (even, odd rounds)."""
    first, second = ratios[0::2], ratios[1::2]
    if not second:
        return statistics.median(first)
    return math.sqrt(statistics.median(first) * statistics.median(second))


def summarize(row: dict[str, Any]) -> None:
    """The derived fields of a row: ratio, which of ffpa and SDPA's default is faster, best SDPA backend."""
    patched, unpatched, ffpa = row.get("patched_ms"), row.get("unpatched_ms"), row.get("ffpa_ms")
    row["ratio_of_medians"] = patched / unpatched if patched and unpatched else None
    rounds_p, rounds_u = row.get("patched_rounds_ms"), row.get("unpatched_rounds_ms")
    row["ratio_rounds"] = [a / b for a, b in zip(rounds_p, rounds_u)] if rounds_p and rounds_u else None
    row["ratio"] = order_balanced(row["ratio_rounds"]) if row["ratio_rounds"] else row["ratio_of_medians"]
    wall_p, wall_u = row.get("patched_wall_ms"), row.get("unpatched_wall_ms")
    row["wall_ratio"] = wall_p / wall_u if wall_p and wall_u else None
    row["ffpa_speedup"] = unpatched / ffpa if ffpa and unpatched else None  # > 1: ffpa faster than SDPA's default
    row["faster"] = None if row["ffpa_speedup"] is None else ("ffpa" if row["ffpa_speedup"] > 1 else "sdpa")
    backends = {n: row.get(f"{n}_ms") for n in bc.SDPA_BACKENDS if row.get(f"{n}_ms")}
    row["best_sdpa"] = min(backends, key=backends.get) if backends else None
    row["best_sdpa_ms"] = backends[row["best_sdpa"]] if backends else None
    row["rel_err"] = row.get("patched_rel_err")
    if row["kind"] == "decode":
        kv_bytes = 2 * row["B"] * row["Hkv"] * row["Nkv"] * row["D"] * bc.ELEMENT_BYTES
        for column in ("patched", "unpatched", "ffpa"):
            if row.get(f"{column}_ms"):
                row[f"{column}_kv_gbps"] = kv_bytes / row[f"{column}_ms"] / 1e6


def progress_text(row: dict[str, Any]) -> str:
    if row.get("error"):
        return f"FAILED: {row['error']}"
    parts = [f"{c} {bc.fmt(row.get(f'{c}_ms'))} ms" if row.get(f"{c}_ms") else f"{c} n/a" for c in COLUMNS
             if f"{c}_ms" in row]
    ratio = f"patched/unpatched {row['ratio']:.3f}" if row.get("ratio") else "no ratio"
    error = f"rel err {row['rel_err']:.1e}" if row.get("rel_err") is not None else "no check"
    return " | ".join([ratio, *parts, error])


# --- dry run ------------------------------------------------------------------------------------


def synthetic_row(p: Point, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """A row with the model's guesses and noise instead of measurements (--dry-run)."""
    row = point_row(p)
    mask_shape = None
    if p.mask:
        mask_shape = [p.B, 1, p.Nq, p.Nkv] if p.causal else [p.B, 1, 1, p.Nkv]
    row.update(input_sets=1, mask_shape=mask_shape, is_causal_arg=p.causal and not p.mask)
    to_ffpa = p.D > 256
    row["route"] = ("ffpa (impl auto): dry run" if to_ffpa else "PyTorch SDPA (its own choice): dry run")
    row["kernel"] = "ffpa sm90_wgmma (inferred)" if to_ffpa else "sdpa"
    row["sample"] = bc.choose_sample(p.B, p.Hq, p.Nq, p.Nkv).describe(p.Nq)
    for column in args.columns:
        skip = column_skip(column, p)
        ms = None if skip else bc.model_ms(column, *p.shape(), p.causal, p.mask)
        if ms is None:
            row[f"{column}_ms"] = None
            row[f"{column}_reason"] = skip or "dry run: the model says this backend refuses the call"
            continue
        rounds = [ms * rng.uniform(0.98, 1.03) for _ in range(args.rounds)]
        median = statistics.median(rounds)
        row.update({f"{column}_ms": median, f"{column}_tflops": bc.tflops(p.flops(), median),
                    f"{column}_rounds_ms": rounds, f"{column}_iters": args.min_iters,
                    f"{column}_rel_err": rng.uniform(1.5e-3, 3e-3), f"{column}_nan": 0})
        if column in ("patched", "unpatched") and ms < args.wall_below_ms:
            row[f"{column}_wall_ms"] = max(median, 0.02 if column == "patched" else 0.016)
    summarize(row)
    return row


def synthetic_host_us() -> dict[str, Any]:
    us = {"ffpa_attn_func": 18.6, "ffpa_attn_func impl=ffpa": 19.5, "sdpa": 15.0,
          "F.scaled_dot_product_attention (patched)": 18.7, "torch.ops.ffpa_attn.forward": 60.0,
          "torch.empty_like(q)": 1.8, "torch.cuda.current_stream().cuda_stream": 7.4, "empty call (lambda: None)": 0.05}
    return {"shape": "B=1, H=1, Nq=1, Nkv=16, D=512, bf16", "calls": 2000, "rounds": 5, "us": us,
            "us_with_sync": {k: v * 1.01 for k, v in us.items()}, "rounds_us": {k: [v] * 5 for k, v in us.items()},
            "dry_run": True}


# --- markdown --------------------------------------------------------------------------------------


def md_ms(row: dict[str, Any], column: str) -> str:
    if f"{column}_ms" not in row:
        return "–"
    return bc.fmt(row[f"{column}_ms"]) if row[f"{column}_ms"] else "n/a"


def render_markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    good = [r for r in rows if r.get("ratio") is not None]
    lines = [
        "# Drop-in sweep: patched / unpatched and every SDPA backend — "
        f"{report.get('gpu')}, {str(report.get('date'))[:10]}",
        "",
        f"Command: `{report.get('command')}`  ",
        f"torch {report.get('torch')} (CUDA {report.get('cuda')}, cuDNN {report.get('cudnn')}), ffpa commit "
        f"{report.get('commit')}{' (dirty)' if report.get('dirty') else ''}, library {report.get('library')}.",
        "",
        "Times: GPU ms per call (CUDA events, calls queued behind a sleep kernel, inputs rotated beyond 2x L2), the "
        f"median of {report['settings']['rounds']} interleaved rounds, each the median of K calls. patched: "
        "F.scaled_dot_product_attention after ffpa_attn.monkey_patch(); unpatched: SDPA's own dispatch; ffpa: "
        "impl='ffpa'; flash/efficient/cudnn/math: SDPA with that backend alone (n/a: refused or skipped, reasons in "
        "the JSON). TFLOP/s: 4·B·Hq·Nq·Nkv·D, halved for causal. faster: ffpa (impl='ffpa') or SDPA's default. "
        "rel err: patched against fp32 math on upcast inputs (sampled for large points).",
        "",
    ]
    if report.get("aborted"):
        lines += [f"**Aborted: {report['aborted']}**", ""]
    if not report.get("complete", True):
        lines += [f"**Incomplete: {len(rows)} of {report.get('points_planned')} points.**", ""]
    if report.get("dry_run"):
        lines += ["**Dry run: synthetic numbers from the model, nothing was measured.**", ""]
    if good:
        worst = max(good, key=lambda r: r["ratio"])
        over = [r for r in good if r["ratio"] > RATIO_BAR]
        lines += [
            f"- {len(good)} points with a ratio; worst patched/unpatched {worst['ratio']:.3f} ({worst['label']}); "
            f"best {min(r['ratio'] for r in good):.3f}. The ratio is balanced over the column order (the geometric "
            "mean of each order's median per-round ratio); the plain ratio of the medians"
            + (f", worst {max(r.get('ratio_of_medians') or 0 for r in good):.3f}, is in the JSON."
               if any(r.get('ratio_of_medians') for r in good) else " is in the JSON."),
            f"- Above {RATIO_BAR}: {len(over)}" + (": " + "; ".join(f"{r['label']} {r['ratio']:.3f}" for r in over)
                                                  if over else "."),
        ]
        wall = [r for r in good if r.get("wall_ratio") is not None]
        if wall:
            worst_wall = max(wall, key=lambda r: r["wall_ratio"])
            lines.append(f"- Back to back (host included, {len(wall)} small points): worst wall ratio "
                         f"{worst_wall['wall_ratio']:.3f} ({worst_wall['label']}).")
        tolerance = TOLERANCE.get(report["settings"].get("dtype", "bf16"), 1e-2)
        bad = [r for r in rows if r.get("rel_err") is not None and (r["rel_err"] > tolerance or r.get("patched_nan"))]
        lines.append(f"- patched rel err above {tolerance:g} or NaN: {len(bad)}"
                     + (": " + "; ".join(r["label"] for r in bad) if bad else "."))
        routed_sdpa_slower = [r for r in good if r.get("kernel") == "sdpa" and r.get("faster") == "ffpa"]
        if routed_sdpa_slower:
            lines.append("- Routed to SDPA where impl='ffpa' measured faster: "
                         + "; ".join(f"{r['label']} ({r['ffpa_speedup']:.2f}x)" for r in routed_sdpa_slower))
        lines.append("")
    head = ["kind", "D", "N", "heads", "causal", "mask", "patched ms", "unpatched ms", "patched / unpatched",
            "wall ratio", "ffpa ms", "ffpa TFLOP/s", "SDPA default TFLOP/s", "faster", "flash ms", "efficient ms",
            "cudnn ms", "math ms", "rel err", "runs"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['kind']} | {r['D']} | {r['Nq']}/{r['Nkv']} | {r['Hq']}/{r['Hkv']} | "
                         f"{'yes' if r['causal'] else 'no'} | {'yes' if r['mask'] else 'no'} | FAILED: {r['error']} |"
                         + " |" * (len(head) - 7))
            continue
        seq = str(r["Nq"]) if r["Nq"] == r["Nkv"] else f"{r['Nq']}/{r['Nkv']}"
        heads = str(r["Hq"]) if r["Hq"] == r["Hkv"] else f"{r['Hq']}/{r['Hkv']}"
        faster = "-"
        if r.get("faster") is not None:
            faster = f"{r['faster']} ({max(r['ffpa_speedup'], 1 / r['ffpa_speedup']):.2f}x)"
        ratio = "-"
        if r.get("ratio") is not None:
            ratio = f"{r['ratio']:.3f}" + (f" **> {RATIO_BAR}**" if r["ratio"] > RATIO_BAR else "")
        runs = r.get("route", "").split(":")[0]
        cells = [r["kind"], str(r["D"]), seq, heads, "yes" if r["causal"] else "no", "yes" if r["mask"] else "no",
                 md_ms(r, "patched"), md_ms(r, "unpatched"),
                 ratio,
                 "-" if r.get("wall_ratio") is None else f"{r['wall_ratio']:.3f}",
                 md_ms(r, "ffpa"), bc.fmt(r.get("ffpa_tflops")), bc.fmt(r.get("unpatched_tflops")), faster,
                 md_ms(r, "flash"), md_ms(r, "efficient"), md_ms(r, "cudnn"), md_ms(r, "math"),
                 bc.fmt_err(r.get("rel_err")), runs]
        lines.append("| " + " | ".join(cells) + " |")
    host = report.get("host_us")
    if host and host.get("us"):
        lines += ["", f"## host-us: host µs per eager call ({host['shape']}, {host['calls']} calls, "
                      f"median of {host['rounds']} rounds)", "", "| call | µs | µs incl. final sync |", "|---|---|---|"]
        for name, us in host["us"].items():
            lines.append(f"| {name} | {us:.2f} | {host['us_with_sync'].get(name, float('nan')):.2f} |")
        for name, error in host.get("errors", {}).items():
            lines.append(f"| {name} | n/a: {error} | |")
    return "\n".join(lines) + "\n"


# --- charts ----------------------------------------------------------------------------------------


def render_charts(report: dict[str, Any], directory: str) -> list[str]:
    """patched_unpatched_ratio.png (the ratio per point, one panel per D, decode and GQA apart) and
    ffpa_vs_sdpa_tflops.png (ffpa impl='ffpa' and SDPA's default, TFLOP/s by D, one panel per N)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    rows = [r for r in report["rows"] if not r.get("error")]
    title = (f"{report.get('gpu')}, {str(report.get('date'))[:10]}, torch {report.get('torch')}, "
             f"ffpa {str(report.get('commit'))[:10]}" + (" — DRY RUN, synthetic" if report.get("dry_run") else ""))
    paths = []

    groups: list[tuple[str, list[dict[str, Any]]]] = []
    for d in sorted({r["D"] for r in rows if r["kind"] == "sweep"}):
        groups.append((f"D={d}", [r for r in rows if r["kind"] == "sweep" and r["D"] == d]))
    others = [r for r in rows if r["kind"] != "sweep"]
    if others:
        groups.append(("decode and GQA", others))
    if groups:
        ncols = 2 if len(groups) > 1 else 1
        nrows = math.ceil(len(groups) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(9 * ncols, 3.6 * nrows + 1), squeeze=False,
                                 layout="constrained")
        ratios = [r["ratio"] for _, group in groups for r in group if r.get("ratio")]
        top = max([RATIO_BAR, *ratios]) * 1.15  # one linear scale for every panel, room for the labels
        for ax, (name, group) in zip(axes.flat, groups):
            labels, values, colors = [], [], []
            for r in group:
                if r["kind"] == "sweep":
                    label = f"{r['Nq']}" + ("c" if r["causal"] else "") + ("m" if r["mask"] else "")
                else:
                    label = f"{r['kind']}\nD{r['D']} {r['Nq']}/{r['Nkv']}"
                labels.append(label)
                values.append(r.get("ratio") or float("nan"))
                colors.append("#d62728" if r.get("kernel", "").startswith("ffpa") else "#1f77b4")
            bars = ax.bar(range(len(values)), values, color=colors)
            ax.bar_label(bars, labels=[f"{v:.3f}" if v == v else "n/a" for v in values], fontsize=6, rotation=90,
                         padding=2)
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.axhline(RATIO_BAR, color="#ff7f0e", linewidth=0.8, linestyle="--")
            ax.set_ylim(0, top)
            ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=0 if group[0]["kind"] == "sweep" else 45)
            ax.set_title(name + ("  (x: N, c = causal, m = key-padding mask)" if group[0]["kind"] == "sweep" else ""),
                         fontsize=10)
            ax.set_ylabel("patched / unpatched (GPU time)")
            ax.grid(axis="y", alpha=0.3)
        for ax in list(axes.flat)[len(groups):]:
            ax.set_visible(False)
        handles = [plt.Rectangle((0, 0), 1, 1, color="#d62728"), plt.Rectangle((0, 0), 1, 1, color="#1f77b4"),
                   plt.Line2D([], [], color="#ff7f0e", linestyle="--")]
        fig.legend(handles, ["patched runs ffpa", "patched runs SDPA", f"bar: {RATIO_BAR}"], loc="outside lower center",
                   ncol=3)
        fig.suptitle(f"patched / unpatched per point (below 1: the patch is faster) — {title}", fontsize=11)
        paths.append(os.path.join(directory, "patched_unpatched_ratio.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    sweep = [r for r in rows if r["kind"] == "sweep"]
    lengths = sorted({r["Nq"] for r in sweep})
    if lengths:
        ncols = 2 if len(lengths) > 1 else 1
        nrows = math.ceil(len(lengths) / ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(8 * ncols, 4.2 * nrows + 1), squeeze=False,
                                 layout="constrained")
        variants = [(False, False, "-", "o"), (True, False, "--", "s"), (False, True, ":", "^"),
                    (True, True, "-.", "v")]
        for ax, n in zip(axes.flat, lengths):
            for causal, masked, style, marker in variants:
                subset = sorted((r for r in sweep if r["Nq"] == n and r["causal"] == causal and r["mask"] == masked),
                                key=lambda r: r["D"])
                if not subset:
                    continue
                variant = ("causal" if causal else "non-causal") + (", mask" if masked else "")
                for column, color, name in (("ffpa", "#d62728", "ffpa"), ("unpatched", "#1f77b4", "SDPA default")):
                    xs = [str(r["D"]) for r in subset]
                    ys = [r.get(f"{column}_tflops") or float("nan") for r in subset]
                    ax.plot(xs, ys, linestyle=style, marker=marker, color=color, label=f"{name}, {variant}")
            ax.set_title(f"N = {n}", fontsize=10)
            ax.set_xlabel("head dim D")
            ax.set_ylabel("TFLOP/s (higher is better)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
        for ax in list(axes.flat)[len(lengths):]:
            ax.set_visible(False)
        fig.suptitle(f"ffpa (impl='ffpa') vs SDPA's default dispatch, by D — {title}", fontsize=11)
        paths.append(os.path.join(directory, "ffpa_vs_sdpa_tflops.png"))
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


# --- command line --------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", type=csv_ints, help="head dims to run (a subset, or others), e.g. 128,512")
    parser.add_argument("--lengths", type=csv_ints, help="sequence lengths to run (N; Nkv for decode), e.g. 2048,8192")
    parser.add_argument("--kinds", type=csv_choice(KINDS), default=KINDS, help="sweep,decode,gqa,decode_batch (default all)")
    parser.add_argument("--columns", type=csv_choice(COLUMNS), default=COLUMNS,
                        help=f"columns to run (default all: {','.join(COLUMNS)})")
    parser.add_argument("--B", type=int, default=1, help="batch (default 1)")
    parser.add_argument("--H", type=int, default=32, help="query heads (default 32; GQA points use H/4 KV heads)")
    parser.add_argument("--dtype", choices=bc.DTYPE_NAMES, default="bf16")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny subset: D {128, 512} x N {512, 2048}, one decode and one GQA point, 3 rounds")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per point (default 5; 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before a column's first round (default 3)")
    parser.add_argument("--iters", type=int, default=20, help="most timed calls per column and round (default 20)")
    parser.add_argument("--min-iters", type=int, default=5, help="fewest timed calls per column and round (default 5)")
    parser.add_argument("--target-ms", type=float, default=30.0,
                        help="GPU time aimed at per column and round, which sets K between the two (default 30)")
    parser.add_argument("--wall-below-ms", type=float, default=1.0,
                        help="also time patched and unpatched back to back where SDPA's call is shorter (default 1)")
    parser.add_argument("--seed", type=int, default=1234, help="base of the inputs' seeds (default 1234)")
    parser.add_argument("--skip-host-us", action="store_true", help="do not measure host-us")
    parser.add_argument("--host-us-only", action="store_true", help="measure host-us alone, no sweep")
    parser.add_argument("--host-rounds", type=int, default=5)
    parser.add_argument("--host-calls", type=int, default=2000)
    parser.add_argument("--json", metavar="PATH", help="write the report (rewritten after every point)")
    parser.add_argument("--markdown", metavar="PATH", help="write a markdown table")
    parser.add_argument("--charts", metavar="DIR", help="write PNG charts (matplotlib)")
    parser.add_argument("--list", action="store_true", help="print the points and the runtime estimate, run nothing")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU, no torch: synthetic numbers from the model, to exercise the outputs")
    parser.add_argument("--render-only", metavar="JSON", help="redraw --markdown / --charts from a saved report")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    if args.rounds < 1 or args.min_iters < 1 or args.iters < args.min_iters or args.warmup < 0:
        parser.error("need --rounds >= 1, 1 <= --min-iters <= --iters, --warmup >= 0")
    if args.B < 1 or args.H < 1:
        parser.error("--B and --H must be >= 1")
    if args.skip_host_us and args.host_us_only:
        parser.error("--skip-host-us and --host-us-only exclude each other")
    if args.render_only and not (args.markdown or args.charts):
        parser.error("--render-only needs --markdown and/or --charts")
    for option in ("json", "markdown"):
        if error := bc.output_path_error(f"--{option}", getattr(args, option)):
            parser.error(error)
    if args.charts and not args.list:
        try:
            import matplotlib  # noqa: F401  (checked now, not after minutes of measuring)
        except ImportError:
            parser.error("--charts needs matplotlib, which does not import here")
    return args


def settings(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("B", "H", "dtype", "rounds", "warmup", "iters", "min_iters", "target_ms", "wall_below_ms", "seed",
            "quick", "columns", "kinds", "dims", "lengths", "host_rounds", "host_calls")
    return {k: getattr(args, k) for k in keys}


def write_outputs(report: dict[str, Any], args: argparse.Namespace, final: bool) -> None:
    if args.json:
        bc.write_json(args.json, report)
    if final and args.markdown:
        bc.write_text(args.markdown, render_markdown(report))
    if final and args.charts:
        for path in render_charts(report, args.charts):
            print(f"dropin_sweep_full: wrote {path}", file=sys.stderr)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.render_only:
        import json

        with open(args.render_only) as f:
            report = json.load(f)
        for row in report["rows"]:  # the derived fields as this version computes them
            summarize(row)
        if args.markdown:
            bc.write_text(args.markdown, render_markdown(report))
        if args.charts:
            for path in render_charts(report, args.charts):
                print(path)
        return 0

    points = [] if args.host_us_only else make_points(args)
    weights = [estimate_seconds(p, args) for p in points]
    if args.list:
        for p, w in zip(points, weights):
            print(f"{p.label():<48} {p.flops() / 1e9:10.1f} GFLOP  ~{w:5.1f} s")
        total = sum(weights) + host_us_seconds(args)
        print(f"{len(points)} points; estimated {total:.0f} s ({total / 60:.1f} min) on an H200, host-us included")
        return 0

    report: dict[str, Any] = {"tool": "dropin_sweep_full", "date": bc.now_utc(), "command": bc.command_line(),
                              **bc.git_state(), "settings": settings(args), "points_planned": len(points),
                              "complete": False, "rows": []}
    progress = bc.Progress("dropin_sweep_full", weights + ([host_us_seconds(args)] if not args.skip_host_us else []))
    if args.dry_run:
        rng = random.Random(args.seed)
        report.update(gpu="(dry run)", torch="(dry run)", dry_run=True, library=None)
        for p in points:
            report["rows"].append(synthetic_row(p, args, rng))
            progress.step(p.label(), progress_text(report["rows"][-1]))
        if not args.skip_host_us:
            report["host_us"] = synthetic_host_us()
            progress.step("host-us", "synthetic")
        report["complete"] = True
        write_outputs(report, args, final=True)
        print(render_markdown(report))
        return 0

    try:
        gpu = bc.GpuSession(patched=True)
    except (ImportError, OSError, RuntimeError) as error:
        print(f"dropin_sweep_full: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    status = 0
    try:
        report.update(gpu.environment())
        progress.say(f"{report['gpu']}, torch {report['torch']}, library {report['library']}: {len(points)} points, "
                     f"estimated {sum(progress.weights):.0f} s")
        for p in points:
            began = time.monotonic()
            try:
                row = run_point(gpu, p, args)
            except gpu.torch.OutOfMemoryError as error:
                gpu.free()
                row = {**point_row(p), "error": f"out of memory: {bc.first_line(error)}"}
            except bc.ContextLost:
                raise
            except Exception as error:  # noqa: BLE001 - one point's failure is its row's, the sweep goes on
                gpu.check_context()
                row = {**point_row(p), "error": f"{type(error).__name__}: {bc.first_line(error)}"}
            row["seconds"] = time.monotonic() - began
            gpu.free()
            report["rows"].append(row)
            progress.step(p.label(), progress_text(row))
            write_outputs(report, args, final=False)
        if not args.skip_host_us:
            report["host_us"] = gpu.host_us(rounds=args.host_rounds, calls=args.host_calls)
            progress.step("host-us", ", ".join(f"{k} {v:.1f} us" for k, v in report["host_us"]["us"].items()))
        report["complete"] = True
    except bc.ContextLost as error:
        report["aborted"] = str(error)
        print(f"dropin_sweep_full: {error}; the report so far is written", file=sys.stderr)
        status = 3
    finally:
        gpu.close()
    write_outputs(report, args, final=True)
    print(render_markdown(report))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
