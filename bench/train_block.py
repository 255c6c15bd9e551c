#!/usr/bin/env python3
"""A training step of a small decoder model with D = 512 GQA attention, patched and unpatched (issue 13).

The model: `--layers` decoder blocks (RMSNorm, attention with Hq query heads and Hkv KV heads of head
dim D through F.scaled_dot_product_attention, RMSNorm, a SwiGLU MLP), bf16, AdamW, a next-token loss on
random tokens. Two runs from the same seed, one process, the same batches: "unpatched" (PyTorch's SDPA)
and "patched" (ffpa_attn.monkey_patch(backend=CUDABackend(impl=...)): ffpa's forward and backward with an
explicit impl; with "auto" the drop-in's own routing, which trains on ffpa where routing.py measured it
faster and on SDPA elsewhere). Per run: the loss of every step and the median time of
a step (forward + backward + optimizer, CUDA events, after --warmup steps); the report compares the loss
curves (they agree within bf16 noise when ffpa's gradients are right) and the throughput.

Runs on one GPU (torchrun with --fsdp shards the model with FSDP2 over the launched processes: the
issue's two-GPU run where two GPUs are lent).

    python3 bench/train_block.py --out train_block.json            # Hq 32, Hkv 8, D 512, N 8192
    python3 bench/train_block.py --quick                           # a small shape, seconds
    torchrun --nproc-per-node 2 bench/train_block.py --fsdp ...    # FSDP2 over 2 GPUs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=512)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (the loss curve)")
    parser.add_argument("--warmup", type=int, default=3, help="steps not timed")
    parser.add_argument("--impl", default="ffpa",
                        help="CUDABackend impl of the patched run (auto: the drop-in's routing of training calls)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 over the torchrun processes")
    parser.add_argument("--quick", action="store_true", help="a small shape: 1 layer, hidden 1024, N 1024")
    parser.add_argument("--out", type=Path, default=None, help="the JSON report (rank 0)")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.heads_q, args.heads_kv, args.seq, args.vocab = 1, 1024, 8, 2, 1024, 4096
        args.steps, args.warmup = 6, 2
    return args


def build_model(args, torch, F):
    nn = torch.nn

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h, d = args.hidden, args.head_dim
            self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
            self.q = nn.Linear(h, args.heads_q * d, bias=False)
            self.k = nn.Linear(h, args.heads_kv * d, bias=False)
            self.v = nn.Linear(h, args.heads_kv * d, bias=False)
            self.o = nn.Linear(args.heads_q * d, h, bias=False)
            self.gate = nn.Linear(h, 2 * h, bias=False)
            self.up = nn.Linear(h, 2 * h, bias=False)
            self.down = nn.Linear(2 * h, h, bias=False)

        def forward(self, x):
            b, n, _ = x.shape
            y = self.norm1(x)
            q = self.q(y).view(b, n, args.heads_q, args.head_dim).transpose(1, 2)
            k = self.k(y).view(b, n, args.heads_kv, args.head_dim).transpose(1, 2)
            v = self.v(y).view(b, n, args.heads_kv, args.head_dim).transpose(1, 2)
            # Looked up at call time: the patch applies.
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, n, -1))
            y = self.norm2(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(args.vocab, args.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = RMSNorm(args.hidden)
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Model()


def run(args, torch, F, patched: bool, rank: int) -> dict:
    import ffpa_attn

    torch.manual_seed(args.seed)
    model = build_model(args, torch, F).to(device="cuda", dtype=torch.bfloat16)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    generator = torch.Generator(device="cuda").manual_seed(args.seed + rank)
    if patched:
        ffpa_attn.monkey_patch(backend=ffpa_attn.CUDABackend(impl=args.impl))
    losses, times = [], []
    try:
        for step in range(args.steps):
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device="cuda", generator=generator)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            end.record()
            torch.cuda.synchronize()
            losses.append(loss.item())
            if step >= args.warmup:
                times.append(start.elapsed_time(end))
            if rank == 0:
                print(f"{'patched' if patched else 'unpatched'} step {step}: loss {losses[-1]:.5f} "
                      f"{start.elapsed_time(end):.1f} ms", flush=True)
    finally:
        if patched:
            ffpa_attn.unpatch()
    tokens_per_step = args.batch * args.seq * (torch.distributed.get_world_size() if args.fsdp else 1)
    ms = statistics.median(times) if times else math.nan
    return {"losses": losses, "step_ms": ms, "step_ms_all": times, "tokens_per_s": tokens_per_step / ms * 1e3}


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO / "python"))
    import torch
    import torch.nn.functional as F

    rank = 0
    if args.fsdp:
        torch.distributed.init_process_group("nccl")
        rank = torch.distributed.get_rank()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    unpatched = run(args, torch, F, False, rank)
    patched = run(args, torch, F, True, rank)
    relative = [abs(p - u) / max(abs(u), 1e-12) for p, u in zip(patched["losses"], unpatched["losses"])]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "world_size": torch.distributed.get_world_size() if args.fsdp else 1,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "unpatched": unpatched,
        "patched": patched,
        "speedup": unpatched["step_ms"] / patched["step_ms"],
        "loss_max_relative_difference": max(relative) if relative else None,
    }
    if rank == 0:
        print(f"step: unpatched {unpatched['step_ms']:.1f} ms, patched {patched['step_ms']:.1f} ms "
              f"({report['speedup']:.2f}x); loss curves differ by at most {report['loss_max_relative_difference']:.2e} "
              "(relative)", flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    if args.fsdp:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
