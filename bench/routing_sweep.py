#!/usr/bin/env python3
"""Where should impl="auto" send training calls and D_qk != D_v calls? ffpa against SDPA, measured.

The drop-in keeps a call on SDPA until ffpa is measured faster for it (python/ffpa_attn/routing.py).
This sweep measures the two kinds of call that routing.py still hands to SDPA for want of numbers:

  train  a training call: forward and backward of one attention call (q, k, v require grad; the
         backward of out with a fixed random grad), bf16, B = 1; ffpa_attn_func with
         CUDABackend(impl="ffpa") (ffpa's forward and its GPU backward) against the original
         F.scaled_dot_product_attention (SDPA's own dispatch, enable_gqa for GQA points).
         Points: D in {128, 256, 320, 384, 512, 640, 768, 1024} x N in {1024, 2048, 4096, 8192} x {causal, not},
         H = 32 (H = 16 from D = 768 on), and GQA Hq 32 / Hkv 8 at D = 512.
  train_extra  training calls with a key-padding mask, with dropout 0.1 (causal or not) at D 512 and
         1024, N 2048 and 8192, and with D_qk != D_v (576/512 Hq 32 / Hkv 1, 192/128 H 32, causal).
  dv     a forward with D_qk != D_v (no grad): MLA's absorbed shape (Hq = 128, Hkv = 1, D_qk 576,
         D_v 512) at N in {1024, 4096}, causal or not, its decode (Nq = 1, B = 8, Nkv 8192) and the
         non-absorbed prefill shape (H = 32, D_qk 192, D_v 128) at N in {1024, 4096}.

Timing: CUDA events around each call (a training call: forward + backward, the grads zeroed outside
the timing), --rounds interleaved rounds (column order reversed every other round), each the median
of --iters calls after --warmup; a column's time is the median of its round medians. ratio = SDPA ms /
ffpa ms (above 1: ffpa faster). rel_err: ffpa's out and dq against SDPA's (the same inputs), relative L2.

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/routing_sweep.py --json out.json --markdown out.md

Runtime on an H200: about 3 minutes for both kinds (--kinds train or dv for one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import ffpa_attn
from ffpa_attn import CUDABackend

SDPA = F.scaled_dot_product_attention  # captured before anything patches it


@dataclass(frozen=True)
class Point:
    kind: str  # "train" or "dv"
    B: int
    Hq: int
    Hkv: int
    Nq: int
    Nkv: int
    D: int
    Dv: int
    causal: bool
    mask: bool = False  # a boolean key-padding mask [B, 1, 1, Nkv], the last 10 % of keys masked
    dropout: float = 0.0

    def label(self) -> str:
        heads = f"H{self.Hq}" if self.Hq == self.Hkv else f"Hq{self.Hq}/Hkv{self.Hkv}"
        seq = f"N{self.Nq}" if self.Nq == self.Nkv else f"Nq{self.Nq}/Nkv{self.Nkv}"
        dims = f"D{self.D}" if self.D == self.Dv else f"D{self.D}/Dv{self.Dv}"
        extras = (" causal" if self.causal else "") + (" key-padding" if self.mask else "")
        extras += f" dropout {self.dropout}" if self.dropout else ""
        return f"{self.kind} B{self.B} {heads} {seq} {dims}{extras}"


def make_points(kinds: tuple[str, ...]) -> list[Point]:
    points = []
    if "train" in kinds:
        for D in (128, 256, 320, 384, 512, 640, 768, 1024):
            H = 32 if D < 768 else 16
            for N in (1024, 2048, 4096, 8192):
                for causal in (False, True):
                    points.append(Point("train", 1, H, H, N, N, D, D, causal))
        for N in (2048, 8192):
            for causal in (False, True):
                points.append(Point("train", 1, 32, 8, N, N, 512, 512, causal))
    if "train_extra" in kinds:  # masks, dropout and D_qk != D_v in training calls
        for D in (512, 1024):
            H = 32 if D < 768 else 16
            for N in (2048, 8192):
                points.append(Point("train", 1, H, H, N, N, D, D, False, mask=True))
                points.append(Point("train", 1, H, H, N, N, D, D, False, dropout=0.1))
                points.append(Point("train", 1, H, H, N, N, D, D, True, dropout=0.1))
        for N in (1024, 4096):
            points.append(Point("train", 1, 32, 1, N, N, 576, 512, True))
            points.append(Point("train", 1, 32, 32, N, N, 192, 128, True))
    if "dv" in kinds:
        for N in (1024, 4096):
            for causal in (False, True):
                points.append(Point("dv", 1, 128, 1, N, N, 576, 512, causal))
                points.append(Point("dv", 1, 32, 32, N, N, 192, 128, causal))
        points.append(Point("dv", 8, 128, 1, 1, 8192, 576, 512, False))
    return points


def inputs(p: Point, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    grad = p.kind == "train"

    def rand(*shape):
        t = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)
        return t.requires_grad_(grad)

    q = rand(p.B, p.Hq, p.Nq, p.D)
    k = rand(p.B, p.Hkv, p.Nkv, p.D)
    v = rand(p.B, p.Hkv, p.Nkv, p.Dv)
    d_out = torch.randn(p.B, p.Hq, p.Nq, p.Dv, device="cuda", dtype=torch.bfloat16, generator=g)
    mask = None
    if p.mask:
        mask = torch.ones(p.B, 1, 1, p.Nkv, device="cuda", dtype=torch.bool)
        mask[..., p.Nkv - p.Nkv // 10 :] = False
    return q, k, v, d_out, mask


def make_call(p: Point, which: str, q, k, v, d_out, mask):
    gqa = p.Hq != p.Hkv
    backend = CUDABackend(impl="ffpa")

    def attend():
        if which == "sdpa":
            return SDPA(q, k, v, attn_mask=mask, dropout_p=p.dropout, is_causal=p.causal, enable_gqa=gqa)
        return ffpa_attn.ffpa_attn_func(q, k, v, attn_mask=mask, dropout_p=p.dropout, is_causal=p.causal,
                                        enable_gqa=gqa, backend=backend)

    if p.kind == "dv":
        return attend
    params = (q, k, v)

    def train():
        out = attend()
        grads = torch.autograd.grad(out, params, d_out)
        return out, grads

    return train


def time_column(call, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        ms.append(start.elapsed_time(end))
    return statistics.median(ms)


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def run_point(p: Point, args: argparse.Namespace) -> dict:
    row = {"point": p.label(), **asdict(p)}
    q, k, v, d_out, mask = inputs(p, args.seed)
    calls = {which: make_call(p, which, q, k, v, d_out, mask) for which in ("sdpa", "ffpa")}
    try:
        first = {which: call() for which, call in calls.items()}
    except (RuntimeError, NotImplementedError) as error:  # e.g. out of memory
        row["error"] = str(error).strip().splitlines()[0][:300]
        return row
    if p.dropout:
        pass  # different keep-masks: nothing to compare
    elif p.kind == "train":
        row["rel_err_out"] = rel_l2(first["ffpa"][0], first["sdpa"][0])
        row["rel_err_dq"] = rel_l2(first["ffpa"][1][0], first["sdpa"][1][0])
        row["rel_err_dk"] = rel_l2(first["ffpa"][1][1], first["sdpa"][1][1])
    else:
        row["rel_err_out"] = rel_l2(first["ffpa"], first["sdpa"])
    del first
    rounds = {which: [] for which in calls}
    order = list(calls)
    for r in range(args.rounds):
        for which in order if r % 2 == 0 else reversed(order):
            rounds[which].append(time_column(calls[which], args.warmup if r == 0 else 1, args.iters))
    for which in calls:
        row[f"{which}_ms"] = statistics.median(rounds[which])
    row["ratio"] = row["sdpa_ms"] / row["ffpa_ms"]
    return row


def markdown(report: dict) -> str:
    lines = [f"# Routing sweep: ffpa (impl='ffpa') against SDPA — {report['device']}, {report['date']}", "",
             f"Command: `{report['command']}`  ", f"torch {report['torch']}, commit {report['commit']}.", "",
             "train: forward + backward of one call (ms); dv: a forward with D_qk != D_v. "
             "ratio = SDPA ms / ffpa ms (> 1: ffpa faster).", "",
             "| point | SDPA ms | ffpa ms | ratio | rel err (out, dq) |", "|---|---|---|---|---|"]
    for row in report["rows"]:
        if "error" in row:
            lines.append(f"| {row['point']} | - | - | - | {row['error']} |")
            continue
        err = "-" if "rel_err_out" not in row else f"{row['rel_err_out']:.1e}"
        err += f", {row['rel_err_dq']:.1e}" if "rel_err_dq" in row else ""
        lines.append(f"| {row['point']} | {row['sdpa_ms']:.3g} | {row['ffpa_ms']:.3g} | {row['ratio']:.2f}x | {err} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default="train,dv", help="train, train_extra, dv (comma-separated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--min-head-dim", type=int, default=0,
                        help="only the points whose wider head dim (D or Dv) is at least this")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
              "commit": commit, "command": "python3 bench/routing_sweep.py " + " ".join(argv or sys.argv[1:]),
              "rows": []}
    for p in make_points(kinds):
        if max(p.D, p.Dv) < args.min_head_dim:
            continue
        row = run_point(p, args)
        report["rows"].append(row)
        torch.cuda.empty_cache()
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else row.get("error")
        print(f"{p.label():45s} sdpa {row.get('sdpa_ms', 0):8.3f} ms  ffpa {row.get('ffpa_ms', 0):8.3f} ms  {ratio}",
              flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
