#!/usr/bin/env python3
"""ffpa's own forward kernels at D <= 256 beside SDPA's backends, one process (issue 32).

Columns: the library's two families forced by impl (sm90_wgmma: at D <= 128 the row-split kernel,
at 256 the column-split one; sm80_split_d, what impl auto runs at D <= 128 today) and SDPA's cuDNN
and FlashAttention backends (the original F.scaled_dot_product_attention under sdpa_kernel), on the
same bf16 inputs [B, H, N, D]. Timing: CUDA events, --rounds interleaved rounds (the order reversed
every other round), each the median of --iters calls after --warmup; a column's time is the median
of its round medians. rel_err: a column's output against cuDNN's (relative L2 over the whole output),
a check that the columns compute the same thing, not an accuracy figure.

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/small_d_ab.py --json out.json

Cases: --cases "D:N:causal,..." (default: D 64 and 128, N 2048 and 8192, causal or not; and D 256,
N 8192, both), B = 1, H = 32 (--heads). About a minute on an H200.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_common as bc  # noqa: E402

DEFAULT_CASES = "64:2048:0,64:2048:1,64:8192:0,64:8192:1,128:2048:0,128:2048:1,128:8192:0,128:8192:1,256:8192:0,256:8192:1"


def parse_cases(text: str) -> list[tuple[int, int, bool]]:
    cases = []
    for item in text.split(","):
        d, n, causal = item.split(":")
        cases.append((int(d), int(n), causal == "1"))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=DEFAULT_CASES)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    gpu = bc.GpuSession(patched=False)
    torch = gpu.torch
    library = gpu.ffpa_attn._library
    rows = []
    for D, N, causal in parse_cases(args.cases):
        B, H = 1, args.heads
        sets = gpu.qkv_sets(B, H, H, N, N, D, "bf16", 1234, 2)
        scale = D ** -0.5
        flag = library.Causal.TOP_LEFT if causal else library.Causal.NONE

        def ffpa(impl):
            return lambda s: torch.ops.ffpa_attn.forward(*sets[s], None, 0.0, flag, scale,
                                                         library.Accumulation.F32, impl, 0, 0, False)[0]

        def sdpa(s):
            return gpu.original_sdpa(*sets[s], is_causal=causal, scale=scale)

        columns = {
            "sm90_wgmma": (ffpa(library.Impl.SM90_WGMMA), gpu.backend_context("ffpa")),
            "sm80_split_d": (ffpa(library.Impl.SM80_SPLIT_D), gpu.backend_context("ffpa")),
            "cudnn": (sdpa, gpu.backend_context("cudnn")),
            "flash": (sdpa, gpu.backend_context("flash")),
        }
        outputs, reasons = {}, {}
        for name, (call, context) in list(columns.items()):
            out, reason = gpu.first_call(call, context, name in ("cudnn", "flash"))
            if reason is not None:
                reasons[name] = reason
                del columns[name]
            else:
                outputs[name] = out.float()
        medians, _, errors = gpu.time_rounds(columns, 2, args.rounds, args.warmup,
                                             {name: args.iters for name in columns})
        reasons.update(errors)
        flops = bc.attention_flops(B, H, N, N, D, causal)
        row = {"D": D, "N": N, "B": B, "H": H, "causal": causal, "columns": {}}
        reference = outputs.get("cudnn")
        for name in ("sm90_wgmma", "sm80_split_d", "cudnn", "flash"):
            entry = {}
            if name in reasons:
                entry["reason"] = reasons[name][:300]
            elif medians.get(name):
                ms = statistics.median(medians[name])
                entry = {"ms": ms, "tflops": bc.tflops(flops, ms), "round_ms": medians[name]}
                if reference is not None and name in outputs:
                    diff = (outputs[name] - reference).norm() / reference.norm().clamp_min(1e-30)
                    entry["rel_err_vs_cudnn"] = float(diff)
            row["columns"][name] = entry
        rows.append(row)
        line = "  ".join(f"{k} {bc.fmt(v.get('tflops'), 0)}" if "tflops" in v else f"{k} -" for k, v in row["columns"].items())
        print(f"D{D} N{N} {'causal' if causal else 'full'}: {line} TFLOP/s", flush=True)
        del sets, outputs
        gpu.free()
    report = {"tool": "bench/small_d_ab.py", "environment": gpu.environment(), "git": bc.git_state(),
              "date": bc.now_utc(), "command": bc.command_line(), "rows": rows}
    if args.json:
        bc.write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
