#!/usr/bin/env python3
"""One forward and one backward through ffpa_attn's op: the launch a profiler looks at, or (--time N) the
backward's median time over N calls (CUDA events, after two warm-up calls) and its TFLOP/s (2.5x the
forward's 4 B H N^2 D, halved for causal): a quick look, not a comparison (bench/compass.py is that).

    ncu -k regex:backward_kernel python3 bench/backward_once.py --head-dim 512 --impl auto
    python3 bench/backward_once.py --head-dim 1024 --impl sm90_wgmma --time 5

Shape B, H, N, D (bf16, random inputs); --impl auto | sm80_split_d | sm90_wgmma; --causal.
Needs the library (FFPA_LIBRARY) and python/ on PYTHONPATH.
"""

from __future__ import annotations

import argparse

import torch

import ffpa_attn
from ffpa_attn import _library


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--head-dim", type=int, default=512)
    parser.add_argument("--impl", default="auto", choices=("auto", "sm80_split_d", "sm90_wgmma"))
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--time", type=int, default=0, help="time the backward over this many calls")
    args = parser.parse_args()
    impl = {"auto": _library.Impl.AUTO, "sm80_split_d": _library.Impl.SM80_SPLIT_D,
            "sm90_wgmma": _library.Impl.SM90_WGMMA}[args.impl]
    causal = _library.Causal.TOP_LEFT if args.causal else _library.Causal.NONE
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out, _ = torch.ops.ffpa_attn.forward(q, k, v, None, 0.0, causal, args.head_dim ** -0.5, _library.Accumulation.F32,
                                         impl, 0, 0, True)
    grad = torch.randn_like(out)
    torch.autograd.grad(out, (q, k, v), grad, retain_graph=args.time > 0)
    torch.cuda.synchronize()
    print(f"ffpa_attn {ffpa_attn.__version__}: forward + backward of {shape} bf16, impl {args.impl}: done")
    if args.time > 0:
        times = []
        for i in range(args.time + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            end.record()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
        flops = 2.5 * 4 * args.batch * args.heads * args.seq * args.seq * args.head_dim / (2 if args.causal else 1)
        print(f"backward: {ms:.3f} ms median of {args.time}, {flops / ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
