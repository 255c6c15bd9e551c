#!/usr/bin/env python3
"""Paged decode by page size: where a paged cache's time goes (issue 31's "paged decode >= 90 % of the dense
bandwidth"), beside the same batch on a dense (batched) cache, in one process.

On the H200, from the repository root (about 30 s):

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/paged_decode_sweep.py --out sweep.json

The batch: B decode rows (Nq = 1), Hq/Hkv, D (defaults: compass_serving's paged-decode-gemma4-b32, B32 Hq32/Hkv4
D512 bf16, causal), contexts either all --context long (--lengths equal) or compass_serving's log-normal draw
(--lengths lognormal). Columns, each ffpa_attn.flash_attn_with_kvcache on the same keys:
  dense        compass_serving's dense reference: one dense call, every sequence at the mean context (its own
               bytes), through torch.ops.ffpa_attn.forward (bhnd, bottom-right causal)
  batched      cache [B, Nmax, Hkv, D] with cache_seqlens (a sequence batch without pages)
  page P       vLLM's NHD cache [num_blocks, P, Hkv, D], the block table shuffled, for each --pages P
--kv-dtype e4m3: the caches (batched and paged) in e4m3, the engines' FP8 format, with descales of 1 given as
k_descale / v_descale [B, Hkv] of stride 0 (the dense column stays bf16: the reference the issue measures
against); GB/s then counts a byte a code. --impl takes a comma list (auto,sm80_split_d): a column per impl.
Timing: CUDA events around --iters calls after warm-up, the median of --rounds interleaved rounds (order reversed
every other round). GB/s: K/V bytes of the attended keys / time. Per column, one call under torch.profiler gives
its kernels (name, microseconds), so the plan, the attention kernel and the combine show apart.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from typing import Any

import torch

import compass_serving as cs
import ffpa_attn


def make_inputs(args: argparse.Namespace, lengths: list[int]) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    B, Hq, Hkv, D = len(lengths), args.heads_q, args.heads_kv, args.head_dim
    nmax = max(lengths)
    dense_k = torch.randn(B, nmax, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    dense_v = torch.randn(B, nmax, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q = torch.randn(B, 1, Hq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    seqlens = torch.tensor(lengths, device="cuda", dtype=torch.int32)
    return {"q": q, "k": dense_k, "v": dense_v, "seqlens": seqlens}


def paged_cache(inputs: dict[str, Any], lengths: list[int], page: int, seed: int) -> tuple[torch.Tensor, ...]:
    table_rows, num_blocks = cs.shuffled_block_table(lengths, page, seed + page)
    _, _, Hkv, D = inputs["k"].shape
    k_cache = torch.zeros(num_blocks, page, Hkv, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    for b, n in enumerate(lengths):
        pages = -(-n // page)
        ids = torch.tensor(table_rows[b][:pages], device="cuda", dtype=torch.long)
        padded = pages * page
        for src, dst in ((inputs["k"], k_cache), (inputs["v"], v_cache)):
            rows = torch.zeros(padded, Hkv, D, device="cuda", dtype=torch.bfloat16)
            rows[:n] = src[b, :n]
            dst[ids] = rows.view(pages, page, Hkv, D)
    table = torch.tensor(table_rows, device="cuda", dtype=torch.int32)
    return k_cache, v_cache, table


def kernels_of(call) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out.append((e.name[:140], e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total))
    return out


def time_columns(columns: dict[str, Any], rounds: int, iters: int) -> dict[str, float]:
    names = list(columns)
    for name in names:
        for _ in range(3):
            columns[name]()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)
            start.record()
            for _ in range(iters):
                columns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / iters)
    return {n: statistics.median(t) for n, t in times.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=512)
    parser.add_argument("--lengths", choices=["equal", "lognormal"], default="lognormal")
    parser.add_argument("--context", type=int, default=8192, help="mean (lognormal) or every (equal) context")
    parser.add_argument("--pages", default="1,8,16,32,64,128,256")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--seed", type=int, default=4321)
    parser.add_argument("--impl", default="auto", help="an impl, or a comma list of them: a column each")
    parser.add_argument("--kv-dtype", choices=["bf16", "e4m3"], default="bf16")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.lengths == "equal":
        lengths = [args.context] * args.batch
    else:
        lengths = cs.lognormal_lengths(args.batch, args.context, 4 * args.context, cs.draw_seed(args.seed, "gemma4-b32"))
    inputs = make_inputs(args, lengths)
    q, seqlens = inputs["q"], inputs["seqlens"]
    codes = args.kv_dtype == "e4m3"
    element_bytes = 1 if codes else 2
    kv_bytes = sum(lengths) * args.heads_kv * 2 * args.head_dim * element_bytes
    impls = args.impl.split(",")
    descales = {}
    if codes:
        one = torch.ones(1, 1, device="cuda", dtype=torch.float32).expand(len(lengths), args.heads_kv)
        descales = {"k_descale": one, "v_descale": one}

    def cache(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float8_e4m3fn) if codes else t

    def suffix(impl: str) -> str:
        return "" if len(impls) == 1 else f" {impl}"

    batched_k, batched_v = cache(inputs["k"]), cache(inputs["v"])
    columns: dict[str, Any] = {}
    for impl in impls:
        columns["batched" + suffix(impl)] = (lambda impl=impl: ffpa_attn.flash_attn_with_kvcache(
            q, batched_k, batched_v, cache_seqlens=seqlens, causal=True, impl=impl, **descales))
    mean = round(sum(lengths) / len(lengths))
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    dq = torch.randn(len(lengths), args.heads_q, 1, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
    dk, dv = (torch.randn(len(lengths), args.heads_kv, mean, args.head_dim, device="cuda", dtype=torch.bfloat16,
                          generator=gen) for _ in range(2))
    dense_bytes = len(lengths) * mean * args.heads_kv * 2 * args.head_dim * 2
    columns["dense"] = lambda: torch.ops.ffpa_attn.forward(dq, dk, dv, None, 0.0, 2, args.head_dim ** -0.5, 0,
                                                           0, 0, 0, False)[0]
    reference = columns["batched" + suffix(impls[0])]().float()
    errors: dict[str, float] = {}
    for name in list(columns):
        if name.startswith("batched"):
            errors[name] = float((columns[name]().float() - reference).abs().max())
    for page in [int(p) for p in args.pages.split(",")]:
        k_cache, v_cache, table = paged_cache(inputs, lengths, page, args.seed)
        k_cache, v_cache = cache(k_cache), cache(v_cache)
        for impl in impls:
            call = (lambda k_cache=k_cache, v_cache=v_cache, table=table, impl=impl: ffpa_attn.flash_attn_with_kvcache(
                q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True, impl=impl, **descales))
            columns[f"page {page}" + suffix(impl)] = call
            errors[f"page {page}" + suffix(impl)] = float((call().float() - reference).abs().max())
    ms = time_columns(columns, args.rounds, args.iters)
    rows = []
    print(f"{torch.cuda.get_device_name()}, B{len(lengths)} Hq{args.heads_q}/Hkv{args.heads_kv} D{args.head_dim}, "
          f"contexts {args.lengths} (min {min(lengths)}, mean {sum(lengths) / len(lengths):.0f}, max {max(lengths)}), "
          f"K/V {kv_bytes / 1e9:.2f} GB ({args.kv_dtype})")
    for name, t in ms.items():
        kernels = kernels_of(columns[name])
        nbytes = dense_bytes if name == "dense" else kv_bytes
        row = {"column": name, "ms": t, "gbps": nbytes / t / 1e6, "vs_batched": ms["batched" + suffix(impls[0])] / t,
               "max_abs_diff_vs_batched": errors.get(name, 0.0), "kernels": kernels}
        rows.append(row)
        print(f"{name:>10}: {t:.3f} ms  {row['gbps']:.0f} GB/s  {row['vs_batched']:.2f} of batched  "
              f"diff {row['max_abs_diff_vs_batched']:.1e}")
        for kname, us in kernels:
            print(f"{'':>14}{us:9.1f} us  {kname}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "args": vars(args), "lengths": lengths,
                       "kv_bytes": kv_bytes, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
