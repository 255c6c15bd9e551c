#!/usr/bin/env python3
"""The compass's serving rows (shared/docs/compass-cases.md, issue 31): paged decode, varlen prefill, a mixed
batch and a sliding window, ffpa beside what a user would otherwise run, in one process.

On the H200, from the repository root (about 1-2 minutes; --list prints the estimate):

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/compass_serving.py \\
        --out docs/perf/compass.json --markdown docs/perf/compass_serving.md

Cases (bf16, Hq=32, Hkv=4, D=512 unless named; every case causal, FlashAttention's bottom-right alignment):
  paged-decode-gemma4-b32  B=32 decode rows (Nq=1), contexts log-normal around 8192 (max 32768), page size 16
  paged-decode-p1, -p64    the same batch (the same lengths) with page sizes 1 and 64
  fp8kv-decode-d512        the same batch, page size 16, an e4m3 cache (the engines' format: one f32 descale per
                           tensor for k and one for v, given as k_descale / v_descale [B, Hkv] with stride 0)
  varlen-prefill-d512      8 sequences, log-normal lengths that sum to exactly 32768 tokens, Nq = Nkv
  mixed-batch-d512         one 4096-token prefill chunk (its first: Nq = Nkv = 4096) and 64 decode rows at
                           8192 keys each, one call over a paged cache (page size 16)
  d256-window1024          B=1, H=32, N=8192, D=256, causal with a window of 1024 keys (window_size=(1023, 0))

Lengths: log-normal with sigma 0.5 and the named mean (mu = ln(mean) - sigma^2 / 2), drawn by Python's
random.Random(seed).normalvariate with seed = --seed + crc32(the draw's name) (cases sharing a draw get the
same lengths), rounded, clipped to [1, max]; the prefill draw scales 8 such draws to the total (largest
remainders get the rounding's tokens). Paged caches are vLLM's NHD [num_blocks, page_size, Hkv, D], k and v
separate, exactly the pages the batch needs, block ids shuffled (random.Random(seed + page size)); unused
table entries are 0, as vLLM pads.

Per case, on the same inputs:
  ffpa            ffpa_attn.flash_attn_interface: decode flash_attn_with_kvcache(q [B, 1, Hq, D], k_cache,
                  v_cache, cache_seqlens=, block_table=, causal=True); prefill and the window
                  flash_attn_varlen_func on packed q, k, v with cu_seqlens; the mixed batch
                  flash_attn_varlen_func on packed q over the paged cache (block_table + seqused_k, vLLM's call)
  dense_ffpa      the dense reference: one torch.ops.ffpa_attn.forward call (the library's impl auto) with the
                  same number of sequences, every one at the batch's mean Nq and mean Nkv (bf16, bottom-right
                  causal where the case is causal, no window); dense_ffpa_split_d: the same with impl
                  sm80_split_d, the family that serves sequence batches today
  SDPA            the original F.scaled_dot_product_attention on right-padded dense tensors: decode rows with a
                  key-padding mask [B, 1, 1, Nkv_max]; prefill is_causal (right padding keeps every real row
                  off the padding); the window as a bool band mask. Each backend alone (flash, efficient,
                  cudnn, math; math under compass.py's size rule), the default dispatch (enable_gqa=True:
                  at D 512 with GQA that is the math backend, K/V repeated to Hq heads), and with GQA
                  "efficient (GQA by hand)": decode queries as rows of their KV head ([B, Hkv, Hq/Hkv, D]),
                  prefill K/V repeated to Hq heads. Paged cases: the gather from the cache into the padded
                  tensors (and the e4m3 cache's dequantization) is timed with SDPA ("gather + <backend>":
                  sdpa_best_ms, sdpa_default_ms); SDPA alone on pre-gathered tensors is sdpa_alone_*, the
                  gather alone gather_ms. The mixed batch is two SDPA calls (the prefill chunk, the decode
                  rows), timed together. Unpaged cases' padded tensors are made outside the timing.
  copy            once per run: a device-to-device torch copy of 2 GiB, (bytes read + written) / time:
                  copy_gbps, the measured HBM bandwidth; decode rows report hbm_fraction = ffpa_gbps / it
Rates: ffpa_gbps = bytes of K/V read / time, bytes = sum over sequences of the keys at least one query attends
x Hkv x (D + Dv) x element bytes (2 bf16, 1 e4m3); TFLOP/s = 2 x Hq x (D + Dv) x attended (query, key) pairs /
time, pairs per sequence: Nq x Nkv / 2 for causal with Nq == Nkv (the compass's halving), counted exactly for
bottom-right causal with Nq < Nkv and for windows. vs_dense: {"gbps": ffpa_gbps / dense_ffpa_gbps, "tflops":
ffpa_tflops / dense_ffpa_tflops}; goal: the issue's "done when" for the row (paged decode >= 0.90 of the dense
bandwidth at page sizes 16 and 64, >= 0.75 at 1; varlen prefill >= 0.95 of the dense TFLOP/s; the e4m3 cache
half the bytes at >= 0.85 of the copy bandwidth). rel_err: ffpa's output against SDPA's math backend in fp32 on
upcast inputs (the e4m3 cache dequantized), over the first, last, longest and shortest sequences (every head
and row of small ones, else compass.py's sample: 2 heads x 512 rows); every SDPA column that runs has its own
rel_err against the same reference (its padding, masks and gathers compute the same attention). A case ffpa
cannot run has "ffpa_ms": null and the library's "reason".

Timing: bench/attention_bench.py's time_calls (CUDA events, the calls queued behind a sleep kernel), every
case's inputs beyond twice the L2 (one input set), the columns interleaved over --rounds rounds (order reversed
every other round), each the median of --iters calls (10 for an SDPA column whose first call took over 25 ms);
a column's time is the median of its round medians.

Output: --out merges the rows into a compass JSON: rows with the same case id replaced in place, the others and
the file's top-level fields kept, this run's facts under "serving_run", "date", "commit" and "dirty" set to
this run's only with --stamp, a missing file created. Run it after bench/compass.py, whose --out rewrites the
whole file. --markdown writes the serving table. --dry-run fills synthetic numbers without torch or a GPU;
--list prints the cases, their batches and the runtime estimate; --cases takes ids or shell patterns. --tiny
runs every case at toy sizes (its rows say "tiny"), and with --device cpu on the library's CPU reference with
wall-clock times: a check of the plumbing, not a measurement. Neither --tiny nor --dry-run writes into the
repository's docs/perf/compass.json or compass_serving.md.

Exit status: 0 when the run completed, 2 for a bad command line or nothing to load, 3 when the CUDA context
failed mid-run (the rows so far are written, "aborted" says why).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import itertools
import json
import math
import os
import random
import statistics
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import bench_common as bc

SIGMA = 0.5  # the log-normal draws' sigma
COPY_BYTES = 2 << 30  # the copy that measures the HBM bandwidth (read once, written once)
TINY_COPY_BYTES = 16 << 20
KV_ELEMENT_BYTES = {"bf16": 2, "e4m3": 1}
E4M3_MAX = 448.0


@dataclass(frozen=True)
class ServingCase:
    """One serving case: a batch of sequences, their keys packed or in a paged cache."""

    id: str
    # decode (Nq = 1 rows, paged) | prefill (Nq = Nkv, packed) | mixed (a prefill chunk + decode rows, paged) | window
    kind: str
    B: int  # sequences in the batch
    tokens: int  # decode: the contexts' mean; prefill: the total; mixed: each decode row's keys; window: N
    Hq: int = 32
    Hkv: int = 4
    D: int = 512
    page_size: int = 0  # 0: packed k and v (no cache)
    max_len: int = 0  # decode: contexts clipped to this
    prefill: int = 0  # mixed: the prefill chunk's tokens
    window_left: int = -1  # -1: no window
    kv_dtype: str = "bf16"  # bf16, or e4m3 (the engines' FP8 cache: one descale per tensor)
    draw: str = ""  # the name of the length draw: cases with the same draw get the same lengths
    causal: bool = True

    @property
    def Dv(self) -> int:
        return self.D

    def describe(self) -> str:
        heads = f"H{self.Hq}" if self.Hq == self.Hkv else f"Hq{self.Hq}/Hkv{self.Hkv}"
        cache = f", page {self.page_size} NHD" if self.page_size else ", packed k/v"
        kv = ", e4m3 cache" if self.kv_dtype == "e4m3" else ""
        if self.kind == "decode":
            batch = f"B{self.B} decode, contexts log-normal mean {self.tokens} (max {self.max_len})"
        elif self.kind == "prefill":
            batch = f"{self.B} sequences, log-normal, {self.tokens} tokens in all, causal"
        elif self.kind == "mixed":
            batch = f"1 prefill chunk of {self.prefill} + {self.B - 1} decode rows at {self.tokens}, causal"
        else:
            batch = f"B{self.B} N{self.tokens}, causal, window {self.window_left + 1}"
        return f"{batch}, {heads} D{self.D}{cache}{kv}"


DECODE = {"kind": "decode", "B": 32, "tokens": 8192, "max_len": 32768, "draw": "gemma4-b32"}
# shared/docs/compass-cases.md's serving table and the d256-window1024, in the order.
CASES: tuple[ServingCase, ...] = (
    ServingCase("paged-decode-gemma4-b32", page_size=16, **DECODE),
    ServingCase("paged-decode-p1", page_size=1, **DECODE),
    ServingCase("paged-decode-p64", page_size=64, **DECODE),
    ServingCase("varlen-prefill-d512", "prefill", B=8, tokens=32768, draw="varlen-prefill-d512"),
    ServingCase("mixed-batch-d512", "mixed", B=65, tokens=8192, prefill=4096, page_size=16),
    ServingCase("d256-window1024", "window", B=1, tokens=8192, Hkv=32, D=256, window_left=1023),
    ServingCase("fp8kv-decode-d512", page_size=16, kv_dtype="e4m3", **DECODE),
)

# The "done when", per case: (the metric, the least value).
GOALS: dict[str, tuple[str, float]] = {
    "paged-decode-gemma4-b32": ("vs_dense_gbps", 0.90),
    "paged-decode-p64": ("vs_dense_gbps", 0.90),
    "paged-decode-p1": ("vs_dense_gbps", 0.75),
    "varlen-prefill-d512": ("vs_dense_tflops", 0.95),
    "fp8kv-decode-d512": ("hbm_fraction", 0.85),
}


def tiny(case: ServingCase) -> ServingCase:
    """The case at toy sizes (same kind, page size, GQA and options): --tiny, for checking the plumbing."""
    heads = {"Hq": 4, "Hkv": 2 if case.Hq != case.Hkv else 4, "D": 64}
    sizes = {
        "decode": {"B": 4, "tokens": 40, "max_len": 160},
        "prefill": {"B": 3, "tokens": 96},
        "mixed": {"B": 4, "tokens": 72, "prefill": 24},
        "window": {"tokens": 80, "window_left": 15},
    }[case.kind]
    return replace(case, **heads, **sizes)


def select_cases(patterns: list[str] | None) -> list[ServingCase]:
    if patterns is None:
        return list(CASES)
    return [c for c in CASES if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def parse_patterns(text: str) -> list[str]:
    patterns = [p.strip() for p in text.split(",") if p.strip()]
    ids = [c.id for c in CASES]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(i, p) for i in ids)]
    if unmatched or not patterns:
        raise argparse.ArgumentTypeError(f"no case matches {', '.join(unmatched) or repr(text)}; ids: {', '.join(ids)}")
    return patterns


# --- the batch: lengths, pages, pairs, bytes, FLOPs (torch-free) ------------------------------------------


def draw_seed(base: int, name: str) -> int:
    return base + zlib.crc32(name.encode()) % 1_000_000


def lognormal_lengths(count: int, mean: float, max_len: int, seed: int, sigma: float = SIGMA) -> list[int]:
    """count lengths, log-normal with the given mean (mu = ln(mean) - sigma^2/2), rounded, clipped to [1, max_len]."""
    rng = random.Random(seed)
    mu = math.log(mean) - sigma * sigma / 2
    return [min(max_len, max(1, round(math.exp(rng.normalvariate(mu, sigma))))) for _ in range(count)]


def lognormal_split(total: int, count: int, seed: int, sigma: float = SIGMA) -> list[int]:
    """count lengths of at least 1 that sum to exactly total, in proportion to log-normal weights; the tokens
    rounding leaves go to the largest remainders."""
    if total < count:
        raise ValueError(f"cannot split {total} tokens into {count} sequences of at least 1")
    rng = random.Random(seed)
    weights = [math.exp(rng.normalvariate(0.0, sigma)) for _ in range(count)]
    spare = total - count  # every sequence has one token; the rest in proportion
    shares = [spare * w / sum(weights) for w in weights]
    lengths = [1 + math.floor(s) for s in shares]
    by_remainder = sorted(range(count), key=lambda i: shares[i] - math.floor(shares[i]), reverse=True)
    for i in by_remainder[: total - sum(lengths)]:
        lengths[i] += 1
    return lengths


def case_sequences(case: ServingCase, seed: int) -> list[tuple[int, int]]:
    """(Nq, Nkv) of every sequence of the case's batch, in the batch's order."""
    if case.kind == "decode":
        return [(1, n) for n in lognormal_lengths(case.B, case.tokens, case.max_len, draw_seed(seed, case.draw))]
    if case.kind == "prefill":
        return [(n, n) for n in lognormal_split(case.tokens, case.B, draw_seed(seed, case.draw))]
    if case.kind == "mixed":
        return [(case.prefill, case.prefill)] + [(1, case.tokens)] * (case.B - 1)
    if case.kind == "window":
        return [(case.tokens, case.tokens)] * case.B
    raise ValueError(f"unknown kind {case.kind!r}")


def page_counts(lengths: list[int], page_size: int) -> list[int]:
    return [-(-n // page_size) for n in lengths]


def shuffled_block_table(lengths: list[int], page_size: int, seed: int) -> tuple[list[list[int]], int]:
    """(block table rows, num_blocks): exactly the pages the sequences need, each used once, ids shuffled;
    rows padded with 0 to the longest."""
    counts = page_counts(lengths, page_size)
    num_blocks = max(1, sum(counts))
    ids = list(range(num_blocks))
    random.Random(seed).shuffle(ids)
    width = max([1, *counts])
    table, at = [], 0
    for count in counts:
        table.append(ids[at:at + count] + [0] * (width - count))
        at += count
    return table, num_blocks


def _sum_min(n: int, cap: int | None) -> int:
    """sum of min(p, cap) over p in [0, n) (cap None: unbounded)."""
    if n <= 0:
        return 0
    if cap is None or n <= cap + 1:
        return n * (n - 1) // 2
    return cap * (cap + 1) // 2 + (n - cap - 1) * cap


def attended_pairs(nq: int, nkv: int, causal: bool, window_left: int = -1) -> float:
    """(query, key) pairs of one sequence the FLOP count takes: nq x nkv without a mask; nq x nkv / 2 for
    causal with nq == nkv and no window (the compass's halving); else the exact count under bottom-right
    alignment (row i at position p = i + nkv - nq attends keys max(0, p - window_left) .. p)."""
    if nq <= 0 or nkv <= 0:
        return 0
    if not causal:
        if window_left >= 0:
            raise ValueError("a window without causal (a right bound) is not a case here")
        return nq * nkv
    if nq == nkv and window_left < 0:
        return nq * nkv / 2
    cap = window_left if window_left >= 0 else None
    first = max(0, nkv - nq)  # rows at p < 0 (nq > nkv) attend nothing
    return _sum_min(nkv, cap) - _sum_min(first, cap) + (nkv - first)


def keys_read(nq: int, nkv: int, causal: bool, window_left: int = -1) -> int:
    """Keys of one sequence that at least one of its queries attends (each is read at least once)."""
    if nq <= 0 or nkv <= 0:
        return 0
    if not causal or window_left < 0:
        return nkv
    first_position = max(0, nkv - nq)
    return nkv - max(0, first_position - window_left)


@dataclass(frozen=True)
class Batch:
    """A case's sequences and what they cost."""

    case: ServingCase
    seqs: tuple[tuple[int, int], ...]  # (Nq, Nkv)

    @property
    def nq(self) -> list[int]:
        return [s[0] for s in self.seqs]

    @property
    def nkv(self) -> list[int]:
        return [s[1] for s in self.seqs]

    def kv_bytes(self) -> int:
        c = self.case
        keys = sum(keys_read(q, k, c.causal, c.window_left) for q, k in self.seqs)
        return keys * c.Hkv * (c.D + c.Dv) * KV_ELEMENT_BYTES[c.kv_dtype]

    def flops(self) -> float:
        c = self.case
        return sum(2.0 * c.Hq * (c.D + c.Dv) * attended_pairs(q, k, c.causal, c.window_left) for q, k in self.seqs)

    def dense_shape(self) -> tuple[int, int, int]:
        """(B, Nq, Nkv) of the dense reference: as many sequences, each at the batch's mean lengths."""
        B = len(self.seqs)
        return B, max(1, round(sum(self.nq) / B)), max(1, round(sum(self.nkv) / B))

    def dense_kv_bytes(self) -> int:
        c = self.case
        B, _, nkv = self.dense_shape()
        return B * nkv * c.Hkv * (c.D + c.Dv) * KV_ELEMENT_BYTES["bf16"]

    def dense_flops(self) -> float:
        c = self.case
        B, nq, nkv = self.dense_shape()
        return B * 2.0 * c.Hq * (c.D + c.Dv) * attended_pairs(nq, nkv, c.causal)

    def sample_sequences(self) -> list[int]:
        """The sequences rel_err checks: the first, the last, the longest and the shortest (by Nq x Nkv)."""
        work = [q * k for q, k in self.seqs]
        picks = [0, len(self.seqs) - 1, work.index(max(work)), work.index(min(work))]
        return sorted(set(picks))

    def summary(self) -> dict[str, Any]:
        nq, nkv = self.nq, self.nkv
        return {"sequences": len(self.seqs), "total_q": sum(nq), "total_kv": sum(nkv), "nkv_mean": sum(nkv) / len(nkv),
                "nkv_min": min(nkv), "nkv_max": max(nkv), "nq": nq, "nkv": nkv}


def draw_text(case: ServingCase, seed: int) -> str:
    if case.kind == "decode":
        return (f"log-normal contexts, sigma {SIGMA}, mean {case.tokens}, clipped to [1, {case.max_len}], "
                f"seed {draw_seed(seed, case.draw)} ('{case.draw}')")
    if case.kind == "prefill":
        return (f"log-normal weights, sigma {SIGMA}, scaled to {case.tokens} tokens, "
                f"seed {draw_seed(seed, case.draw)} ('{case.draw}')")
    return "fixed lengths"


def goal_of(case_id: str, row: dict[str, Any]) -> dict[str, Any] | None:
    """The issue's "done when" for the row, and whether it is met (None: not measured)."""
    if case_id not in GOALS:
        return None
    metric, least = GOALS[case_id]
    value = row.get(metric)
    if metric.startswith("vs_dense_"):
        value = (row.get("vs_dense") or {}).get(metric.removeprefix("vs_dense_"))
        text = f"ffpa_{metric.removeprefix('vs_dense_')} >= {least:.2f} x dense_ffpa_{metric.removeprefix('vs_dense_')}"
    else:
        text = f"half the bf16 bytes at hbm_fraction >= {least:.2f}"
    met = None if value is None else value >= least
    if metric == "hbm_fraction" and met is not None:
        met = met and row.get("kv_bytes_vs_bf16") == 0.5
    return {"text": text, "value": value, "met": met}


# --- the compass JSON and the markdown ---------------------------------------------------------------------


def merge_report(existing: dict[str, Any] | None, rows: list[dict[str, Any]], run: dict[str, Any],
                 stamp: bool) -> dict[str, Any]:
    """The compass JSON with these rows: a row with the same case id replaced in place, new ones before the
    host-us row (else at the end), the other rows and the top-level fields kept; this run's facts under
    "serving_run"; with stamp, "date", "commit" and "dirty" set to this run's. existing None: a new file."""
    if existing is None:
        report: dict[str, Any] = {"gpu": run.get("gpu"), "date": run.get("date"), "commit": run.get("commit"),
                                  "dirty": run.get("dirty"), "torch": run.get("torch"), "rows": []}
    else:
        report = dict(existing)
        report["rows"] = list(existing.get("rows", []))
    fresh = {r["case"]: r for r in rows}
    merged = [fresh.pop(r.get("case"), r) for r in report["rows"]]
    at = next((i for i, r in enumerate(merged) if r.get("case") == "host-us"), len(merged))
    merged[at:at] = [r for r in rows if r["case"] in fresh]
    report["rows"] = merged
    report["serving_run"] = run
    if stamp:
        report.update(date=run.get("date"), commit=run.get("commit"), dirty=run.get("dirty"))
    return report


def write_merged(path: str, rows: list[dict[str, Any]], run: dict[str, Any], stamp: bool) -> None:
    existing = None
    if os.path.exists(path):
        with open(path) as f:
            existing = json.load(f)
    bc.write_json(path, merge_report(existing, rows, run, stamp))


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_markdown(run: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    settings = run.get("settings", {})
    lines = [
        f"# Compass, serving rows: ffpa vs PyTorch SDPA — {run.get('gpu')}, {str(run.get('date'))[:10]}",
        "",
        f"Command: `{run.get('command')}`  ",
        f"torch {run.get('torch')}, commit {run.get('commit')}{' (dirty)' if run.get('dirty') else ''}, "
        f"library {run.get('library')}; measured copy bandwidth {bc.fmt(run.get('copy_gbps'))} GB/s "
        "(device-to-device torch copy, bytes read + written).",
        "",
        ("ms: wall-clock time per call on the host" if run.get("device") == "cpu" else
         "ms: GPU time per call (CUDA events, calls queued behind a sleep kernel)") + ", median of "
        f"{settings.get('rounds')} interleaved rounds of {settings.get('iters')} calls. GB/s: bytes of K/V read "
        "(keys attended at least once x Hkv x (D + Dv) x element bytes). TFLOP/s: 2·Hq·(D+Dv)·attended pairs "
        "(Nq·Nkv/2 for causal Nq == Nkv, exact otherwise). dense: one ffpa call with as many sequences, each at "
        "the batch's mean lengths. HBM: ffpa GB/s over the measured copy bandwidth. SDPA on padded tensors; paged "
        "cases: the gather into them timed with SDPA (SDPA alone in the second table). bench/compass_serving.py's "
        "docstring has the details.",
        "",
    ]
    if run.get("dry_run"):
        lines += ["**Dry run: synthetic numbers, nothing was measured.**", ""]
    if run.get("tiny"):
        lines += [f"**Tiny shapes on {run.get('device')}: a check of the plumbing, not a measurement.**", ""]
    if run.get("aborted"):
        lines += [f"**Aborted: {run['aborted']}**", ""]
    head = ["case", "shape", "ffpa ms", "ffpa GB/s", "ffpa TFLOP/s", "dense GB/s", "dense TFLOP/s", "vs dense",
            "HBM", "SDPA best ms", "SDPA best", "SDPA default ms", "vs SDPA best", "rel err", "goal / reason"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['case']} | {r.get('shape', '')} | FAILED: {r['error']} |" + " |" * (len(head) - 3))
            continue
        vs = r.get("vs_dense") or {}
        primary = "gbps" if r.get("kind") == "decode" else "tflops"
        goal = r.get("goal")
        note = r.get("reason") or ""
        if goal:
            mark = {True: "met", False: "NOT met", None: "not measured"}[goal["met"]]
            note = f"{goal['text']}: {mark}" + (f"; {note}" if note else "")
        speed = r.get("speedup_vs_sdpa_best")
        cells = [r["case"], r.get("shape", ""), bc.fmt(r.get("ffpa_ms")), bc.fmt(r.get("ffpa_gbps")),
                 bc.fmt(r.get("ffpa_tflops")), bc.fmt(r.get("dense_ffpa_gbps")), bc.fmt(r.get("dense_ffpa_tflops")),
                 f"{_ratio(vs.get(primary))} ({'GB/s' if primary == 'gbps' else 'TFLOP/s'})",
                 _ratio(r.get("hbm_fraction")), bc.fmt(r.get("sdpa_best_ms")), r.get("sdpa_best_backend") or "-",
                 bc.fmt(r.get("sdpa_default_ms")), "-" if speed is None else f"{speed:.2f}x",
                 bc.fmt_err(r.get("rel_err")), note.replace("|", "/")[:300]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| case | sequences (Nkv min / mean / max) | K/V GB read | GFLOP | dense B x Nq x Nkv | dense ms | "
              "dense split_d ms | gather ms | SDPA alone best ms | SDPA alone best | SDPA alone default ms |",
              "|" + "---|" * 11]
    for r in rows:
        if r.get("error"):
            continue
        b = r.get("batch", {})
        dense = r.get("dense", {})
        sequences = f"{b.get('sequences')} ({b.get('nkv_min')} / {bc.fmt(b.get('nkv_mean'))} / {b.get('nkv_max')})"
        cells = [r["case"], sequences, bc.fmt(r.get("kv_bytes", 0) / 1e9), bc.fmt(r.get("flops", 0) / 1e9),
                 f"{dense.get('B')} x {dense.get('Nq')} x {dense.get('Nkv')}", bc.fmt(r.get("dense_ffpa_ms")),
                 bc.fmt(r.get("dense_ffpa_split_d_ms")), bc.fmt(r.get("gather_ms")),
                 bc.fmt(r.get("sdpa_alone_best_ms")), r.get("sdpa_alone_best_backend") or "-",
                 bc.fmt(r.get("sdpa_alone_default_ms"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- rows from the columns' results ------------------------------------------------------------------------

SDPA_VARIANTS = ("default", *bc.SDPA_BACKENDS, "efficient (GQA by hand)")
GATHER = "gather + "
SLOW_MS = 25.0  # an SDPA column whose first call takes longer is timed with MIN_ITERS calls a round
MIN_ITERS = 10


def case_row(case: ServingCase, batch: Batch, seed: int, tiny_run: bool) -> dict[str, Any]:
    B, nq, nkv = batch.dense_shape()
    row = {"case": case.id, "shape": case.describe(), **{k: v for k, v in asdict(case).items() if k != "id"},
           "Dv": case.Dv, "batch": {**batch.summary(), "draw": draw_text(case, seed)},
           "kv_bytes": batch.kv_bytes(), "flops": batch.flops(),
           "dense": {"B": B, "Nq": nq, "Nkv": nkv, "causal": "bottom_right" if case.causal else "none",
                     "kv_bytes": batch.dense_kv_bytes(), "flops": batch.dense_flops(), "dtype": "bf16"}}
    if case.kv_dtype != "bf16":
        row["kv_bytes_vs_bf16"] = KV_ELEMENT_BYTES[case.kv_dtype] / KV_ELEMENT_BYTES["bf16"]
    if tiny_run:
        row["tiny"] = True
    return row


def gbps(nbytes: float, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else nbytes / ms / 1e6


def finish_row(row: dict[str, Any], results: dict[str, dict[str, Any]], copy_gbps: float | None) -> None:
    """The serving row's fields from the columns' results (ms per column; ffpa's rel_err)."""
    ffpa, dense, split_d = (results.get(k, {}) for k in ("ffpa", "dense_ffpa", "dense_ffpa_split_d"))
    paged = any(name.startswith(GATHER) for name in results)
    prefix = GATHER if paged else ""  # what a user runs: a paged cache needs the gather

    def best(prefix: str) -> tuple[str | None, float | None]:
        """(column, ms) of the fastest SDPA backend among the columns named prefix + variant; the default
        dispatch where no backend alone ran."""
        timed = {name: r["ms"] for name, r in results.items() if r.get("ms") and name.startswith(prefix)
                 and name[len(prefix):] in SDPA_VARIANTS and name[len(prefix):] != "default"}
        if timed:
            name = min(timed, key=timed.get)
            return name, timed[name]
        default = results.get(prefix + "default", {}).get("ms")
        return (prefix + "default", default) if default else (None, None)

    kv_bytes, flops = row["kv_bytes"], row["flops"]
    dense_bytes, dense_flops = row["dense"]["kv_bytes"], row["dense"]["flops"]
    best_name, best_ms = best(prefix)
    default_result = results.get(prefix + "default", {})
    row.update(
        ffpa_ms=ffpa.get("ms"), ffpa_tflops=bc.tflops(flops, ffpa.get("ms")), ffpa_gbps=gbps(kv_bytes, ffpa.get("ms")),
        dense_ffpa_ms=dense.get("ms"), dense_ffpa_gbps=gbps(dense_bytes, dense.get("ms")),
        dense_ffpa_tflops=bc.tflops(dense_flops, dense.get("ms")),
        dense_ffpa_split_d_ms=split_d.get("ms"), dense_ffpa_split_d_gbps=gbps(dense_bytes, split_d.get("ms")),
        dense_ffpa_split_d_tflops=bc.tflops(dense_flops, split_d.get("ms")),
        sdpa_best_ms=best_ms, sdpa_best_backend=best_name, sdpa_default_ms=default_result.get("ms"),
        rel_err=ffpa.get("rel_err"), copy_gbps=copy_gbps,
    )
    if default_result.get("reason"):
        row["sdpa_default_reason"] = default_result["reason"]
    if paged:
        alone_name, alone_ms = best("")
        row.update(sdpa_alone_best_ms=alone_ms, sdpa_alone_best_backend=alone_name,
                   sdpa_alone_default_ms=results.get("default", {}).get("ms"),
                   gather_ms=results.get("gather", {}).get("ms"))
    vs = {}
    if row["ffpa_gbps"] and row["dense_ffpa_gbps"]:
        vs["gbps"] = row["ffpa_gbps"] / row["dense_ffpa_gbps"]
    if row["ffpa_tflops"] and row["dense_ffpa_tflops"]:
        vs["tflops"] = row["ffpa_tflops"] / row["dense_ffpa_tflops"]
    row["vs_dense"] = vs or None
    if row["kind"] == "decode" and copy_gbps:
        row["hbm_fraction"] = row["ffpa_gbps"] / copy_gbps if row["ffpa_gbps"] else None
        row["dense_hbm_fraction"] = row["dense_ffpa_gbps"] / copy_gbps if row["dense_ffpa_gbps"] else None
    if row["ffpa_ms"] and row["sdpa_best_ms"]:
        row["speedup_vs_sdpa_best"] = row["sdpa_best_ms"] / row["ffpa_ms"]
    if row["ffpa_ms"] and row["sdpa_default_ms"]:
        row["speedup_vs_sdpa_default"] = row["sdpa_default_ms"] / row["ffpa_ms"]
    if ffpa.get("reason"):
        row["reason"] = ffpa["reason"]
    if ffpa.get("nan"):
        row["ffpa_nan"] = ffpa["nan"]
    row["goal"] = goal_of(row["case"], row)
    row["columns"] = results


def progress_text(row: dict[str, Any]) -> str:
    if row.get("error"):
        return f"FAILED: {row['error']}"
    parts = [f"ffpa {bc.fmt(row.get('ffpa_ms'))} ms, {bc.fmt(row.get('ffpa_gbps'))} GB/s, "
             f"{bc.fmt(row.get('ffpa_tflops'))} TFLOP/s" if row.get("ffpa_ms") else f"ffpa null ({row.get('reason')})"]
    vs = row.get("vs_dense") or {}
    parts.append(f"dense {bc.fmt(row.get('dense_ffpa_ms'))} ms, vs dense GB/s {_ratio(vs.get('gbps'))} "
                 f"TFLOP/s {_ratio(vs.get('tflops'))}")
    parts.append(f"SDPA best {bc.fmt(row.get('sdpa_best_ms'))} ms ({row.get('sdpa_best_backend')})")
    if row.get("rel_err") is not None:
        parts.append(f"rel err {row['rel_err']:.1e}")
    return " | ".join(parts)


# --- estimates and the dry run -----------------------------------------------------------------------------

SYNTHETIC_COPY_GBPS = 4000.0
# The committed results, which toy and synthetic rows must not replace.
COMMITTED_OUTPUTS = {str(bc.REPO_ROOT / "docs/perf/compass.json"), str(bc.REPO_ROOT / "docs/perf/compass_serving.md")}


def model_ms(batch: Batch) -> dict[str, float]:
    """A rough guess of the columns' H200 times (ms): weighs progress, estimates runtimes, fills --dry-run."""
    c = batch.case
    hbm = SYNTHETIC_COPY_GBPS * 1e6  # bytes per ms
    padded = len(batch.seqs) * max(batch.nkv) * c.Hkv * (c.D + c.Dv) * 2
    fraction = {1: 0.7}.get(c.page_size, 0.88)
    ffpa = max(batch.kv_bytes() / (hbm * fraction), batch.flops() / 450e9, 0.01)
    dense = max(batch.dense_kv_bytes() / (hbm * 0.9), batch.dense_flops() / 500e9, 0.01)
    sdpa = max(padded / (hbm * 0.5), batch.flops() * 2 / 150e9, 0.02)
    fastest = "efficient" if c.Hq == c.Hkv else "efficient (GQA by hand)"
    out = {"ffpa": ffpa, "dense_ffpa": dense, "dense_ffpa_split_d": dense * 1.15, fastest: sdpa,
           "default": sdpa * (1.0 if c.Hq == c.Hkv else 8.0)}
    if c.page_size:
        gather = padded * 2 / hbm * 1.3
        out.update({"gather": gather, **{GATHER + k: v + gather for k, v in list(out.items()) if k in SDPA_VARIANTS}})
    return out


def estimate_seconds(batch: Batch, args: argparse.Namespace) -> float:
    calls = args.warmup + (args.rounds - 1) + args.rounds * args.iters + 1
    columns = model_ms(batch)
    return 4.0 + sum(calls * max(ms, 0.03) / 1e3 + args.rounds * 0.02 for ms in columns.values())


def synthetic_results(batch: Batch, rng: random.Random, rounds: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    refusal = "dry run: SDPA's flash and cudnn backends take no head dim above 256"
    for name, ms in model_ms(batch).items():
        medians = [ms * rng.uniform(0.98, 1.03) for _ in range(rounds)]
        results[name] = {"ms": statistics.median(medians), "rounds_ms": medians}
    for name in ("flash", "cudnn", "efficient", "math"):
        if name in results:
            continue
        for prefix in ("", GATHER) if batch.case.page_size else ("",):
            results[prefix + name] = {"ms": None, "reason": refusal}
    results["ffpa"]["rel_err"] = rng.uniform(1.5e-3, 3e-3)
    if batch.case.kv_dtype == "e4m3":
        results["ffpa"] = {"ms": None, "reason": "dry run: the e4m3 cache is not served on the GPU yet"}
    return results


# --- the torch side ----------------------------------------------------------------------------------------


class HostSession(bc.GpuSession):
    """--device cpu: CPU tensors (ffpa on the library's CPU reference), wall-clock times; the plumbing only."""

    def __init__(self) -> None:
        super().__init__(patched=False, device="cpu")

    def environment(self) -> dict[str, Any]:
        return {"gpu": "cpu (the library's CPU reference)", "torch": self.torch.__version__,
                "library": str(self.ffpa_attn.library_path())}

    def check_context(self) -> None:
        pass

    def free(self) -> None:
        pass

    def first_call(self, call: Callable[[int], Any], context: Callable[[], Any], sdpa: bool) -> tuple[Any, str | None]:
        caught: list[warnings.WarningMessage] = []
        try:
            with context(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return call(0), None
        except NotImplementedError as error:
            return None, f"NotImplementedError: {bc.first_line(error)}"
        except RuntimeError as error:
            return None, self.ab.refusal_reason(caught, error) if sdpa else f"RuntimeError: {bc.first_line(error)}"
        except Exception as error:  # noqa: BLE001 - the column fails, the run goes on
            return None, f"{type(error).__name__}: {bc.first_line(error)}"

    def time_rounds(self, columns, sets, rounds, warmup, iters, wall=()):
        medians: dict[str, list[float]] = {name: [] for name in columns}
        names = list(columns)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                call, context = columns[name]
                with context():
                    for n in range(warmup if r == 0 else 1):
                        call(n % sets)
                    times = []
                    for n in range(iters[name]):
                        start = time.perf_counter()
                        call(n % sets)
                        times.append((time.perf_counter() - start) * 1e3)
                medians[name].append(statistics.median(times))
        return medians, {}, {}


def measure_copy_gbps(gpu: bc.GpuSession, nbytes: int, rounds: int) -> dict[str, Any]:
    """The device's copy bandwidth: bytes read + written per second of a torch copy of nbytes."""
    torch = gpu.torch
    source = torch.ones(nbytes, dtype=torch.uint8, device=gpu.device)
    target = torch.empty_like(source)
    column = {"copy": (lambda _: target.copy_(source), contextlib.nullcontext)}
    medians, _, errors = gpu.time_rounds(column, 1, rounds, 3, {"copy": 10})
    del source, target
    gpu.free()
    if errors:
        return {"gbps": None, "reason": errors["copy"]}
    ms = statistics.median(medians["copy"])
    return {"gbps": gbps(2 * nbytes, ms), "ms": ms, "bytes": nbytes, "rounds_ms": medians["copy"]}


class ServingInputs:
    """A case's tensors: ffpa's (packed or batched q, packed k/v or the paged cache with its table) and the
    views of one sequence that the reference reads."""

    def __init__(self, gpu: bc.GpuSession, batch: Batch, seed: int, table_seed: int) -> None:
        torch = gpu.torch
        case = batch.case
        bf16, device = torch.bfloat16, gpu.device
        self.gpu, self.batch, self.case = gpu, batch, case
        self.scale = case.D ** -0.5
        nq, nkv = batch.nq, batch.nkv
        self.cu_q, self.cu_k = list(itertools.accumulate(nq, initial=0)), list(itertools.accumulate(nkv, initial=0))
        if case.kind == "decode":
            self.q = gpu.random((len(nq), 1, case.Hq, case.D), bf16, seed)
        else:
            self.q = gpu.random((sum(nq), case.Hq, case.D), bf16, seed)
        int32 = {"dtype": torch.int32, "device": device}
        self.cu_q_t, self.cu_k_t = torch.tensor(self.cu_q, **int32), torch.tensor(self.cu_k, **int32)
        self.k_descale = self.v_descale = None
        self.descales = (1.0, 1.0)
        if case.page_size:
            self.table, num_blocks = shuffled_block_table(nkv, case.page_size, table_seed)
            self.table_t = torch.tensor(self.table, **int32)
            self.seqused_t = torch.tensor(nkv, **int32)
            shape = (num_blocks, case.page_size, case.Hkv, case.D)
            self.k, self.v = gpu.random(shape, bf16, seed + 1), gpu.random(shape, bf16, seed + 2)
            if case.kv_dtype == "e4m3":
                (self.k, k_descale), (self.v, v_descale) = self.to_e4m3(self.k), self.to_e4m3(self.v)
                self.descales = (k_descale, v_descale)
                # One descale per tensor, as the engines keep it: a [1, 1] value viewed as [B, Hkv].
                self.k_descale, self.v_descale = (
                    torch.tensor([[d]], dtype=torch.float32, device=device).expand(len(nq), case.Hkv)
                    for d in self.descales)
        else:
            self.k = gpu.random((sum(nkv), case.Hkv, case.D), bf16, seed + 1)
            self.v = gpu.random((sum(nkv), case.Hkv, case.Dv), bf16, seed + 2)

    def to_e4m3(self, cache: Any) -> tuple[Any, float]:
        """(e4m3 codes, descale) of a bf16 cache, one descale for the tensor: amax / 448."""
        torch = self.gpu.torch
        descale = float(cache.abs().amax().float().item()) / E4M3_MAX
        codes = torch.empty(cache.shape, dtype=torch.float8_e4m3fn, device=cache.device)
        for start in range(0, cache.shape[0], 4096):  # chunked: the f32 intermediate stays small
            codes[start:start + 4096] = (cache[start:start + 4096].float() / descale).to(torch.float8_e4m3fn)
        return codes, descale

    def ffpa_call(self) -> Callable[[int], Any]:
        from ffpa_attn.flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache

        case, batch = self.case, self.batch
        if case.kind == "decode":
            return lambda _: flash_attn_with_kvcache(
                self.q, self.k, self.v, cache_seqlens=self.seqused_t, block_table=self.table_t, causal=case.causal,
                k_descale=self.k_descale, v_descale=self.v_descale)
        window = (case.window_left, 0) if case.window_left >= 0 else (-1, -1)
        if case.page_size:
            return lambda _: flash_attn_varlen_func(
                self.q, self.k, self.v, self.cu_q_t, None, max(batch.nq), max(batch.nkv), causal=case.causal,
                window_size=window, block_table=self.table_t, seqused_k=self.seqused_t,
                k_descale=self.k_descale, v_descale=self.v_descale)
        return lambda _: flash_attn_varlen_func(
            self.q, self.k, self.v, self.cu_q_t, self.cu_k_t, max(batch.nq), max(batch.nkv), causal=case.causal,
            window_size=window)

    # one sequence, as the reference reads it

    def rows_of(self, t: Any, b: int) -> Any:
        """Sequence b's rows of q or of the output (q's layout) as [1, H, Nq_b, D]."""
        if self.case.kind == "decode":
            return t[b:b + 1].transpose(1, 2)
        return t[self.cu_q[b]:self.cu_q[b + 1]].transpose(0, 1)[None]

    def kv_of(self, b: int) -> tuple[Any, Any]:
        """[1, Hkv, Nkv_b, D] keys and values of sequence b (an e4m3 cache dequantized, f32)."""
        nkv = self.batch.nkv[b]
        if not self.case.page_size:
            return tuple(t[self.cu_k[b]:self.cu_k[b + 1]].transpose(0, 1)[None] for t in (self.k, self.v))
        used = self.table[b][:page_counts([nkv], self.case.page_size)[0]]
        pages = self.gpu.torch.tensor(used, device=self.gpu.device)
        out = []
        for cache, descale in zip((self.k, self.v), self.descales):
            rows = gather_pages(cache, pages[None], nkv)[0]  # [Hkv, nkv, D]
            out.append((rows.float() * descale if self.case.kv_dtype == "e4m3" else rows)[None])
        return out[0], out[1]


def gather_pages(cache: Any, table: Any, n: int) -> Any:
    """cache [num_blocks, page_size, Hkv, D] read through table [G, W] as [G, Hkv, n, D] (n <= W x page_size):
    what a user does to hand a paged cache to SDPA. An e4m3 cache is gathered as bytes (its values unchanged)."""
    import torch

    G, W = table.shape
    source = cache.view(torch.uint8) if cache.dtype == torch.float8_e4m3fn else cache
    rows = source[table].view(G, W * cache.shape[1], *cache.shape[2:])[:, :n]
    if cache.dtype == torch.float8_e4m3fn:
        rows = rows.view(torch.float8_e4m3fn)
    return rows.transpose(1, 2)


def window_keep(torch: Any, nq: int, nkv: int, window_left: int, device: Any) -> Any:
    """Bool [nq, nkv], True = attend: bottom-right causal with window_left keys before each row's own."""
    positions = torch.arange(nq, device=device)[:, None] + (nkv - nq)
    keys = torch.arange(nkv, device=device)[None, :]
    return (keys <= positions) & (keys >= positions - window_left)


@dataclass
class SdpaGroup:
    """Sequences SDPA takes in one call: decode rows (Nq = 1) or prefill (Nq = Nkv), right-padded."""

    indices: list[int]
    q: Any  # [G, Hq, Nq_max, D]
    nkv_max: int
    mask: Any  # bool, broadcastable to [G, Hq, Nq_max, Nkv_max], or None
    is_causal: bool
    rows: bool  # decode rows: GQA by hand puts a KV head's queries in rows
    k: Any = None  # [G, Hkv, Nkv_max, D]: made outside the timing (packed), or the pre-gathered cache (paged)
    v: Any = None
    table: Any = None  # paged: [G, pages of Nkv_max]


def sdpa_groups(inputs: ServingInputs) -> list[SdpaGroup]:
    torch, gpu, case, batch = inputs.gpu.torch, inputs.gpu, inputs.case, inputs.batch
    device = gpu.device
    rows = [i for i, (nq, nkv) in enumerate(batch.seqs) if nq == 1 and nkv > 1]
    square = [i for i, (nq, nkv) in enumerate(batch.seqs) if nq == nkv and i not in rows]
    if len(rows) + len(square) != len(batch.seqs):
        raise ValueError("SDPA's side takes decode rows and Nq == Nkv sequences only")
    groups = []
    for indices, is_rows in ((rows, True), (square, False)):
        if not indices:
            continue
        nkv = [batch.nkv[i] for i in indices]
        nkv_max, nq_max = max(nkv), max(batch.nq[i] for i in indices)
        if is_rows and indices == list(range(indices[0], indices[-1] + 1)) and case.kind != "decode":
            q = inputs.q[inputs.cu_q[indices[0]]:inputs.cu_q[indices[-1] + 1]].unsqueeze(2)  # packed rows: a view
        elif case.kind == "decode":
            q = inputs.q.transpose(1, 2)
        else:  # right-padded [G, Nq_max, Hq, D], made outside the timing
            padded = torch.zeros((len(indices), nq_max, case.Hq, case.D), dtype=inputs.q.dtype, device=device)
            for g, i in enumerate(indices):
                padded[g, :batch.nq[i]] = inputs.q[inputs.cu_q[i]:inputs.cu_q[i + 1]]
            q = padded.transpose(1, 2)
        mask, is_causal = None, False
        if case.window_left >= 0:  # prefill rows only (Nq == Nkv): the band is the same for every sequence
            mask = window_keep(torch, nq_max, nkv_max, case.window_left, device)[None, None]
        elif not is_rows and case.causal:
            is_causal = True  # right padding: a real row never reaches a padded key
        elif len(set(nkv)) > 1:  # decode rows attend every key they have: a key-padding mask
            keep = torch.arange(nkv_max, device=device)[None, :] < torch.tensor(nkv, device=device)[:, None]
            mask = keep[:, None, None, :]
        group = SdpaGroup(indices, q, nkv_max, mask, is_causal, is_rows)
        if case.page_size:
            width = page_counts([nkv_max], case.page_size)[0]
            group.table = inputs.table_t[torch.tensor(indices, device=device), :width]
        else:
            kv = []
            for t in (inputs.k, inputs.v):
                padded = torch.zeros((len(indices), nkv_max, case.Hkv, t.shape[-1]), dtype=t.dtype, device=device)
                for g, i in enumerate(indices):
                    padded[g, :batch.nkv[i]] = t[inputs.cu_k[i]:inputs.cu_k[i + 1]]
                kv.append(padded.transpose(1, 2))
            group.k, group.v = kv
        groups.append(group)
    return groups


def gather_group(inputs: ServingInputs, group: SdpaGroup) -> tuple[Any, Any]:
    """The group's padded K and V from the cache (the e4m3 cache dequantized to bf16)."""
    torch = inputs.gpu.torch
    out = []
    for cache, descale in zip((inputs.k, inputs.v), inputs.descales):
        dense = gather_pages(cache, group.table, group.nkv_max)
        if inputs.case.kv_dtype == "e4m3":
            dense = dense.to(torch.bfloat16) * descale
        out.append(dense)
    return out[0], out[1]


def sdpa_group_call(gpu: bc.GpuSession, inputs: ServingInputs, group: SdpaGroup, k: Any, v: Any, by_hand: bool,
                    expanded: bool = False) -> Any:
    """One SDPA call over a group; by_hand: GQA by hand (decode rows as rows of their KV head; prefill K/V
    repeated to Hq heads unless `expanded` says they already are)."""
    case = inputs.case
    gqa = case.Hq != case.Hkv
    q = group.q
    if by_hand and group.rows:
        G = q.shape[0]
        q = q.reshape(G, case.Hkv, case.Hq // case.Hkv, case.D)
    elif by_hand and not expanded:
        group_size = case.Hq // case.Hkv
        k, v = k.repeat_interleave(group_size, dim=1), v.repeat_interleave(group_size, dim=1)
    return gpu.original_sdpa(q, k, v, attn_mask=group.mask, is_causal=group.is_causal, scale=inputs.scale,
                             enable_gqa=gqa and not by_hand)


def sdpa_columns(gpu: bc.GpuSession, inputs: ServingInputs, groups: list[SdpaGroup], ref: Reference
                 ) -> tuple[dict[str, tuple[Callable[[int], Any], Callable[[], Any]]], dict[str, dict[str, Any]]]:
    """SDPA's columns that run (name -> (call, context)) and the results of all (a refusal's reason; for those
    that run, the rel_err of SDPA alone against the reference: the padding, masks and gathers are right)."""
    case = inputs.case
    paged = bool(case.page_size)
    results: dict[str, dict[str, Any]] = {}
    active: dict[str, tuple[Callable[[int], Any], Callable[[], Any]]] = {}
    if paged:  # the padded K/V gathered once, for the "SDPA alone" columns
        for group in groups:
            group.k, group.v = gather_group(inputs, group)
    expanded: dict[int, tuple[Any, Any]] = {}
    variants = [v for v in SDPA_VARIANTS if v != "efficient (GQA by hand)" or case.Hq != case.Hkv]
    for variant in variants:
        by_hand = variant == "efficient (GQA by hand)"
        backend = "efficient" if by_hand else variant
        context = gpu.backend_context(backend) if backend != "default" else contextlib.nullcontext
        skip = None
        if backend == "math":  # compass.py's rule; the default dispatch is timed whatever it takes, as there
            skip = next(filter(None, (bc.math_skip_reason(len(g.indices), case.Hq, case.Hkv, g.q.shape[2], g.nkv_max,
                                                            case.D) for g in groups)), None)
        if skip:
            results[variant] = {"ms": None, "reason": skip}
            if paged:
                results[GATHER + variant] = {"ms": None, "reason": skip}
            continue
        if by_hand:
            for g, group in enumerate(groups):
                if not group.rows:  # K/V repeated to Hq heads outside the timing, as compass.py's expanded columns
                    size = case.Hq // case.Hkv
                    expanded[g] = (group.k.repeat_interleave(size, dim=1), group.v.repeat_interleave(size, dim=1))

        def alone(_: int, by_hand: bool = by_hand) -> Any:
            outs = []
            for g, group in enumerate(groups):
                k, v = expanded.get(g, (group.k, group.v)) if by_hand else (group.k, group.v)
                outs.append(sdpa_group_call(gpu, inputs, group, k, v, by_hand, expanded=by_hand and g in expanded))
            return outs

        began = time.perf_counter()
        outs, reason = gpu.first_call(alone, context, sdpa=True)
        first_ms = (time.perf_counter() - began) * 1e3
        if reason is not None:
            results[variant] = {"ms": None, "reason": reason[:400]}
            if paged:
                results[GATHER + variant] = {"ms": None, "reason": reason[:400]}
            continue
        results[variant] = {"rel_err": ref.rel_err(gpu.torch, lambda b: group_rows(inputs, groups, outs, b))}
        if first_ms > SLOW_MS:  # e.g. the default dispatch's math backend on K/V it repeats to Hq heads
            results[variant]["iters"] = MIN_ITERS
        del outs
        active[variant] = (alone, context)
        if paged:

            def gathered(_: int, by_hand: bool = by_hand) -> Any:
                outs = []
                for group in groups:
                    k, v = gather_group(inputs, group)
                    outs.append(sdpa_group_call(gpu, inputs, group, k, v, by_hand))
                return outs

            results[GATHER + variant] = {k: v for k, v in results[variant].items() if k == "iters"}
            active[GATHER + variant] = (gathered, context)
    if paged:
        results["gather"] = {}
        active["gather"] = (lambda _: [gather_group(inputs, g) for g in groups], contextlib.nullcontext)
    return active, results


def group_rows(inputs: ServingInputs, groups: list[SdpaGroup], outs: list[Any], b: int) -> Any:
    """Sequence b's rows [1, Hq, Nq_b, Dv] of SDPA's outputs, one per group (GQA by hand's decode rows come
    back as [G, Hkv, Hq/Hkv, Dv])."""
    for group, out in zip(groups, outs):
        if b in group.indices:
            g = group.indices.index(b)
            if out.shape[1] != inputs.case.Hq:
                out = out.reshape(out.shape[0], inputs.case.Hq, 1, out.shape[-1])
            return out[g:g + 1, :, :inputs.batch.nq[b]]
    raise IndexError(f"sequence {b} is in no SDPA group")


def dense_inputs(gpu: bc.GpuSession, batch: Batch, seed: int) -> tuple[Any, Any, Any]:
    case = batch.case
    B, nq, nkv = batch.dense_shape()
    t = gpu.torch.bfloat16
    return (gpu.random((B, case.Hq, nq, case.D), t, seed), gpu.random((B, case.Hkv, nkv, case.D), t, seed + 1),
            gpu.random((B, case.Hkv, nkv, case.Dv), t, seed + 2))


@dataclass
class Reference:
    """fp32 outputs of the sampled sequences (SDPA's math backend on upcast inputs, the e4m3 cache dequantized):
    per sequence, its sample (bc.choose_sample: every head and row of small ones) and the rows' outputs."""

    sequences: list[tuple[int, bc.Sample, list[Any]]]

    def describe(self, batch: Batch) -> dict[str, Any]:
        return {"sequences": [{"sequence": b, "Nq": batch.seqs[b][0], "Nkv": batch.seqs[b][1],
                               **sample.describe(batch.seqs[b][0])} for b, sample, _ in self.sequences]}

    def rel_err(self, torch: Any, rows_of: Callable[[int], Any]) -> float:
        """Relative L2 error over the sample of an output whose sequence b is rows_of(b) [1, Hq, Nq_b, Dv]."""
        err = norm = 0.0
        for b, sample, refs in self.sequences:
            got_all = rows_of(b)
            rows = None if sample.rows is None else torch.tensor(sample.rows, device=got_all.device)
            for (_, h), ref in zip(sample.pairs, refs):
                got = got_all[0, h] if rows is None else got_all[0, h].index_select(0, rows)
                err += (got.double() - ref.double()).square().sum().item()
                norm += ref.double().square().sum().item()
        return math.sqrt(err / max(norm, 1e-300))


def reference(gpu: bc.GpuSession, inputs: ServingInputs) -> Reference:
    case, batch = inputs.case, inputs.batch
    sequences = []
    for b in batch.sample_sequences():
        nq, nkv = batch.seqs[b]
        q, (k, v) = inputs.rows_of(inputs.q, b), inputs.kv_of(b)
        sample = bc.choose_sample(1, case.Hq, nq, nkv)
        if case.window_left >= 0:
            mask, causal = window_keep(gpu.torch, nq, nkv, case.window_left, gpu.device)[None, None], "none"
        else:
            mask, causal = None, "bottom_right" if case.causal else "none"
        sequences.append((b, sample, gpu.reference(q, k, v, mask, causal, sample, scale=inputs.scale)))
    return Reference(sequences)


def measure_case(gpu: bc.GpuSession, batch: Batch, args: argparse.Namespace, copy_gbps: float | None,
                 row: dict[str, Any]) -> None:
    case = batch.case
    torch = gpu.torch
    seed = args.seed + zlib.crc32(case.id.encode()) % 1_000_000 * 10
    table_seed = draw_seed(args.seed, case.draw or case.id) + case.page_size
    inputs = ServingInputs(gpu, batch, seed, table_seed)
    row["input_sets"] = 1  # every case's K/V exceeds twice an H200's L2 (60 MiB) on its own
    row["set_bytes"] = sum(t.numel() * t.element_size() for t in (inputs.q, inputs.k, inputs.v))
    library = gpu.ffpa_attn._library
    results: dict[str, dict[str, Any]] = {}
    active: dict[str, tuple[Callable[[int], Any], Callable[[], Any]]] = {}
    nothing = contextlib.nullcontext

    ref = reference(gpu, inputs)
    row["sample"] = ref.describe(batch)
    ffpa = inputs.ffpa_call()
    out, reason = gpu.first_call(ffpa, nothing, sdpa=False)
    if reason is not None:
        results["ffpa"] = {"ms": None, "reason": reason[:400]}
    else:
        results["ffpa"] = {"rel_err": ref.rel_err(torch, lambda b: inputs.rows_of(out, b)),
                           "nan": int(torch.isnan(out).sum().item())}
        active["ffpa"] = (ffpa, nothing)
    del out

    dq, dk, dv = dense_inputs(gpu, batch, seed + 100)
    causal = library.Causal.BOTTOM_RIGHT if case.causal else library.Causal.NONE
    for column, impl in (("dense_ffpa", library.Impl.AUTO), ("dense_ffpa_split_d", library.Impl.SM80_SPLIT_D)):

        def dense(_: int, impl: Any = impl) -> Any:
            return torch.ops.ffpa_attn.forward(dq, dk, dv, None, 0.0, int(causal), case.D ** -0.5,
                                               int(library.Accumulation.F32), int(impl), 0, 0, False)[0]

        out, reason = gpu.first_call(dense, nothing, sdpa=False)
        del out
        results[column] = {"ms": None, "reason": reason[:400]} if reason else {}
        if reason is None:
            active[column] = (dense, nothing)

    sdpa_active, sdpa_results = sdpa_columns(gpu, inputs, sdpa_groups(inputs), ref)
    results.update(sdpa_results)
    active.update(sdpa_active)

    iters = {column: min(args.iters, results[column].get("iters", args.iters)) for column in active}
    medians, _, errors = gpu.time_rounds(active, 1, args.rounds, args.warmup, iters)
    for column in active:
        if column in errors or not medians[column]:
            results[column] = {"ms": None, "reason": errors.get(column, "not timed")}
            continue
        results[column].update(ms=statistics.median(medians[column]), rounds_ms=medians[column], iters=iters[column])
    finish_row(row, results, copy_gbps)


# --- command line ------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=parse_patterns, help="comma-separated ids or shell patterns (default: all)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per case (default 3; 1 with --tiny)")
    parser.add_argument("--iters", type=int, help="timed calls per column and round, >= 10 (default 20; 3 with --tiny)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before a column's first round (default 3)")
    parser.add_argument("--seed", type=int, default=4321,
                        help="base of the length draws' and inputs' seeds (default 4321)")
    parser.add_argument("--out", help="merge the rows into this compass JSON (none written unless given)")
    parser.add_argument("--stamp", action="store_true",
                        help="with --out: also set the file's top-level date, commit and dirty to this run's")
    parser.add_argument("--markdown", metavar="PATH", help="write the serving table")
    parser.add_argument("--list", action="store_true",
                        help="print the selected cases, their batches and the runtime estimate")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU, no torch: synthetic numbers, to exercise the outputs")
    parser.add_argument("--tiny", action="store_true",
                        help="every case at toy sizes: checks the plumbing, measures nothing")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu (with --tiny): the library's CPU reference, wall-clock times")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.tiny else 3
    if args.iters is None:
        args.iters = 3 if args.tiny else 20
    if args.rounds < 1 or args.warmup < 0 or args.iters < 1:
        parser.error("need --rounds >= 1, --iters >= 1 and --warmup >= 0")
    if args.iters < 10 and not args.tiny:
        parser.error("--iters must be at least 10 (the compass's median of at least 10 calls) unless --tiny")
    if args.device == "cpu" and not args.tiny and not args.dry_run and not args.list:
        parser.error("--device cpu needs --tiny (the CPU reference at the real sizes would take hours)")
    if args.stamp and not args.out:
        parser.error("--stamp needs --out")
    for option in ("out", "markdown"):
        if error := bc.output_path_error(f"--{option}", getattr(args, option)):
            parser.error(error)
        path = getattr(args, option)
        if (args.tiny or args.dry_run) and path and os.path.abspath(path) in COMMITTED_OUTPUTS:
            parser.error(f"--{option} {path}: --tiny and --dry-run rows would replace the measured ones there")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cases = [tiny(c) if args.tiny else c for c in select_cases(args.cases)]
    batches = [Batch(c, tuple(case_sequences(c, args.seed))) for c in cases]
    weights = [estimate_seconds(b, args) for b in batches]
    if args.list:
        for b, w in zip(batches, weights):
            s = b.summary()
            print(f"{b.case.id:<26} {b.case.describe()}\n{'':<26} {s['sequences']} sequences, Nkv {s['nkv_min']}..."
                  f"{s['nkv_max']} (mean {s['nkv_mean']:.0f}), K/V {b.kv_bytes() / 1e9:.2f} GB, "
                  f"{b.flops() / 1e12:.3f} TFLOP, dense {'x'.join(map(str, b.dense_shape()))}  ~{w:4.1f} s")
        total = sum(weights) + 2
        print(f"{len(batches)} cases; estimated {total:.0f} s ({total / 60:.1f} min) on an H200, the copy included")
        return 0

    state = bc.git_state()
    run: dict[str, Any] = {"tool": "bench/compass_serving.py", "command": bc.command_line(), "date": bc.now_utc(),
                           "commit": state["commit"], "dirty": state["dirty"], "gpu": None, "torch": None,
                           "settings": {"rounds": args.rounds, "iters": args.iters, "warmup": args.warmup,
                                        "seed": args.seed, "sigma": SIGMA},
                           "cases": [c.id for c in cases], "complete": False}
    if args.tiny:
        run.update(tiny=True, device=args.device)
    rows: list[dict[str, Any]] = []
    progress = bc.Progress("compass_serving", [2.0] + weights)

    def write(final: bool) -> None:
        if args.out:
            write_merged(args.out, rows, run, args.stamp)
        if final and args.markdown:
            bc.write_text(args.markdown, render_markdown(run, rows))

    if args.dry_run:
        rng = random.Random(args.seed)
        run.update(gpu="(dry run)", torch="(dry run)", dry_run=True, copy_gbps=SYNTHETIC_COPY_GBPS)
        progress.step("copy", f"{SYNTHETIC_COPY_GBPS:.0f} GB/s (synthetic)")
        for batch in batches:
            row = case_row(batch.case, batch, args.seed, args.tiny)
            row["dry_run"] = True
            finish_row(row, synthetic_results(batch, rng, args.rounds), SYNTHETIC_COPY_GBPS)
            rows.append(row)
            progress.step(batch.case.id, progress_text(row))
        run["complete"] = True
        write(final=True)
        print(render_markdown(run, rows))
        return 0

    try:
        gpu = HostSession() if args.device == "cpu" else bc.GpuSession(patched=False)
    except (ImportError, OSError, RuntimeError) as error:
        print(f"compass_serving: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    status = 0
    try:
        environment = gpu.environment()
        run.update(environment)
        copy = measure_copy_gbps(gpu, TINY_COPY_BYTES if args.tiny else COPY_BYTES, args.rounds)
        run.update(copy_gbps=copy["gbps"], copy=copy)
        progress.step("copy", f"{bc.fmt(copy['gbps'])} GB/s")
        for batch in batches:
            began = time.monotonic()
            row = case_row(batch.case, batch, args.seed, args.tiny)
            try:
                measure_case(gpu, batch, args, copy["gbps"], row)
            except gpu.torch.OutOfMemoryError as error:
                gpu.free()
                row.update(ffpa_ms=None, reason=f"out of memory: {bc.first_line(error)}", error="out of memory")
            except bc.ContextLost:
                raise
            except Exception as error:  # noqa: BLE001 - one case's failure is its row's
                gpu.check_context()
                message = f"{type(error).__name__}: {bc.first_line(error)}"
                row.update(ffpa_ms=None, reason=message, error=message)
            row["seconds"] = time.monotonic() - began
            gpu.free()
            rows.append(row)
            progress.step(batch.case.id, progress_text(row))
            write(final=False)
        run["complete"] = True
    except bc.ContextLost as error:
        run["aborted"] = str(error)
        print(f"compass_serving: {error}; the rows so far are written", file=sys.stderr)
        status = 3
    write(final=True)
    print(render_markdown(run, rows))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
