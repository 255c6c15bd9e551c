"""Host microseconds per eager call (B1 H1 Nq1 Nkv16 D512 bf16), the GPU held by a sleep kernel: SDPA and
ffpa_attn_func, 5 interleaved rounds, median, one line labelled argv[1]. For an A/B of two versions of the
package, run it alternately in fresh processes with PYTHONPATH on each (docs/perf/h200-2026-12-01b/host_slots_ab.txt)."""
import statistics
import sys

import torch
import torch.nn.functional as F

import bench_common as bc
from ffpa_attn import ffpa_attn_func
q = torch.randn(1, 1, 1, 512, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 1, 16, 512, device="cuda", dtype=torch.bfloat16)
v = torch.randn(1, 1, 16, 512, device="cuda", dtype=torch.bfloat16)
cases = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v), "ffpa_attn_func": lambda: ffpa_attn_func(q, k, v)}
res = {}
for r in range(5):
    for name, f in (cases.items() if r % 2 == 0 else list(cases.items())[::-1]):
        res.setdefault(name, []).append(bc.held_host_us(f))
print(sys.argv[1], " ".join(f"{n} {statistics.median(x):.2f}" for n, x in res.items()), flush=True)
