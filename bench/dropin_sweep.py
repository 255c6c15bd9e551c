#!/usr/bin/env python3
"""Does the drop-in ever make a model slower? patched / unpatched over issue 16's sweep.

For every point, in one process and interleaved (the order flips every round):
  patched    ffpa_attn_func with the default backend: what F.scaled_dot_product_attention
             runs after ffpa_attn.monkey_patch() (impl "auto": ffpa or SDPA, routing.py)
  unpatched  the original F.scaled_dot_product_attention (SDPA's own dispatch)
  ffpa       ffpa_attn_func with impl "ffpa": the library's kernel, never SDPA
Timing: CUDA events around `iters` back-to-back calls queued behind a sleep
kernel, so they measure the GPU's time alone (the compass's method; host time
is its own row, host-us), the median over the rounds; `*_wall_ms` the same calls
without the sleep, where a call shorter than its host time measures the host. Points: D in {64, 128, 256, 320,
512, 1024} x N in {128, 512, 2048, 8192} x {non-causal, causal} x {no mask,
key-padding bool mask [B,1,1,N] with the last 10 % of keys masked; with causal,
one [1,1,N,N] mask, as SDPA takes no is_causal with a mask}, plus decode
(Nq = 1) and GQA (Hq = 32, Hkv = 8). bf16, B = 1, H = 32. Then host-us: host
microseconds per eager call on B=1, H=1, Nq=1, Nkv=16, D=512 (wall time of
2000 calls without synchronizing), ffpa_attn_func and SDPA, median of 5 rounds.

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/dropin_sweep.py \\
        --json sweep.json --markdown sweep.md      # about 5 minutes on an H200
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import ffpa_attn
from ffpa_attn import CUDABackend, explain, ffpa_attn_func

UNPATCHED = F.scaled_dot_product_attention
FFPA_ONLY = CUDABackend(impl="ffpa")
HEAD_DIMS = (64, 128, 256, 320, 512, 1024)
LENGTHS = (128, 512, 2048, 8192)


def points(quick: bool) -> list[dict]:
    dims, lengths = ((128, 512), (512, 2048)) if quick else (HEAD_DIMS, LENGTHS)
    out = []
    for d in dims:
        for n in lengths:
            for causal in (False, True):
                for mask in (False, True):
                    out.append(dict(kind="sweep", d=d, nq=n, nkv=n, hq=32, hkv=32, causal=causal, mask=mask))
    for d in (128, 256, 512) if not quick else (512,):
        for nkv in (2048, 8192):
            out.append(dict(kind="decode", d=d, nq=1, nkv=nkv, hq=32, hkv=32, causal=False, mask=False))
    for d in (128, 512) if not quick else (512,):
        for n in (2048, 8192):
            out.append(dict(kind="gqa", d=d, nq=n, nkv=n, hq=32, hkv=8, causal=False, mask=False))
    return out


def flops(pt: dict) -> float:
    f = 4.0 * pt["hq"] * pt["nq"] * pt["nkv"] * pt["d"]
    return f / 2 if pt["causal"] and pt["nq"] == pt["nkv"] else f


def inputs(pt: dict) -> tuple:
    g = torch.Generator(device="cuda").manual_seed(1234)
    q = torch.randn(1, pt["hq"], pt["nq"], pt["d"], device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, pt["hkv"], pt["nkv"], pt["d"], device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, pt["hkv"], pt["nkv"], pt["d"], device="cuda", dtype=torch.bfloat16, generator=g)
    mask, is_causal = None, pt["causal"]
    if pt["mask"]:
        mask = torch.ones(1, 1, 1, pt["nkv"], device="cuda", dtype=torch.bool)
        mask[..., pt["nkv"] - pt["nkv"] // 10 :] = False
        if is_causal:
            # SDPA takes no is_causal with a mask: a model passes both as one mask.
            causal = torch.ones(pt["nq"], pt["nkv"], device="cuda", dtype=torch.bool).tril()
            mask, is_causal = mask & causal, False  # [1, 1, N, N]
    kwargs = dict(attn_mask=mask, is_causal=is_causal, enable_gqa=pt["hq"] != pt["hkv"])
    return q, k, v, kwargs


def timed_ms(call, iters: int, device_only: bool = False) -> float:
    """ms per call over `iters` back-to-back calls. device_only: the GPU's time alone
    (a sleep kernel first holds the GPU while the host queues every call)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if device_only:
        torch.cuda.synchronize()
        torch.cuda._sleep(int(iters * 200_000))  # ~100 us of cycles per queued call
    start.record()
    for _ in range(iters):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def measure(pt: dict, rounds: int) -> dict:
    q, k, v, kwargs = inputs(pt)
    calls = {
        "patched": lambda: ffpa_attn_func(q, k, v, **kwargs),
        "unpatched": lambda: UNPATCHED(q, k, v, **kwargs),
        "ffpa": lambda: ffpa_attn_func(q, k, v, backend=FFPA_ONLY, **kwargs),
    }
    row = dict(pt, route=explain(q, k, v, **kwargs))
    errors = {}
    for name, call in list(calls.items()):
        try:
            call()
        except Exception as error:  # noqa: BLE001 - a path that cannot serve the point is recorded
            errors[name] = f"{type(error).__name__}: {error}"[:200]
            del calls[name]
    torch.cuda.synchronize()
    # About 100 ms per measurement: fewer calls for the big points.
    probe = timed_ms(calls["unpatched"], 2)
    iters = max(3, min(200, int(100 / max(probe, 1e-3))))
    times = {name: [] for name in calls}
    wall = {name: [] for name in calls}
    for r in range(rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(calls))
        for name in order:
            times[name].append(timed_ms(calls[name], iters, device_only=True))
            wall[name].append(timed_ms(calls[name], iters))
    for name in ("patched", "unpatched", "ffpa"):
        if name in times:
            ms = statistics.median(times[name])
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = flops(pt) / ms / 1e9
            row[f"{name}_wall_ms"] = statistics.median(wall[name])
        else:
            row[f"{name}_ms"] = None
            row[f"{name}_error"] = errors.get(name)
    row["ratio"] = row["patched_ms"] / row["unpatched_ms"]
    row["wall_ratio"] = row["patched_wall_ms"] / row["unpatched_wall_ms"]
    row["iters"] = iters
    del q, k, v, kwargs
    return row


def host_us(rounds: int = 5, calls: int = 2000) -> dict:
    q = torch.randn(1, 1, 1, 512, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 1, 16, 512, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 1, 16, 512, device="cuda", dtype=torch.bfloat16)
    cases = {"ffpa_us": lambda: ffpa_attn_func(q, k, v), "sdpa_us": lambda: UNPATCHED(q, k, v)}
    result = {name: [] for name in cases}
    for r in range(rounds):
        for name, call in cases.items() if r % 2 == 0 else reversed(cases.items()):
            for _ in range(200):
                call()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(calls):
                call()
            result[name].append((time.perf_counter() - t) / calls * 1e6)
            torch.cuda.synchronize()
    return {"case": "host-us", **{name: statistics.median(v) for name, v in result.items()}, "rounds": result}


def markdown(rows: list[dict], host: dict) -> str:
    lines = [
        "| kind | D | Nq | Nkv | Hq/Hkv | causal | mask | patched ms | unpatched ms | ffpa ms | patched / unpatched "
        "| wall: patched / unpatched | runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ffpa = f"{r['ffpa_ms']:.4f}" if r["ffpa_ms"] is not None else "-"
        runs = r["route"].split(":")[0]
        lines.append(
            f"| {r['kind']} | {r['d']} | {r['nq']} | {r['nkv']} | {r['hq']}/{r['hkv']} | {r['causal']} | {r['mask']} "
            f"| {r['patched_ms']:.4f} | {r['unpatched_ms']:.4f} | {ffpa} | {r['ratio']:.3f} | {r['wall_ratio']:.3f} "
            f"| {runs} |"
        )
    worst = max(rows, key=lambda r: r["ratio"])
    lines += [
        "",
        f"Worst patched / unpatched: {worst['ratio']:.3f} ({worst['kind']} D={worst['d']} N={worst['nq']}/{worst['nkv']}"
        f" causal={worst['causal']} mask={worst['mask']}).",
        f"host-us: ffpa_attn_func {host['ffpa_us']:.1f} us, SDPA {host['sdpa_us']:.1f} us per eager call.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    pts = points(args.quick)
    rows, begin = [], time.time()
    for i, pt in enumerate(pts):
        rows.append(measure(pt, args.rounds))
        torch.cuda.empty_cache()
        elapsed = time.time() - begin
        r = rows[-1]
        print(
            f"[{i + 1}/{len(pts)}] {r['kind']} D={r['d']} N={r['nq']}/{r['nkv']} causal={r['causal']} mask={r['mask']}: "
            f"patched/unpatched {r['ratio']:.3f}  (eta {elapsed / (i + 1) * (len(pts) - i - 1):.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    host = host_us()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
    except OSError:
        commit = None
    report = dict(
        gpu=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        commit=commit,
        torch=torch.__version__,
        library=ffpa_attn.library_path(),
        rows=rows,
        host_us=host,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    text = markdown(rows, host)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
