"""Host us per eager call with the GPU held by a sleep kernel (the GPU's own time per call cannot
throttle the host), and the compass's way (no hold), interleaved, 5 rounds, median. argv[1]: json out."""
import json, sys, time, math, statistics
import torch
import torch.nn.functional as F
from ffpa_attn import CUDABackend, ffpa_attn_func, _library, ops
dev = "cuda"
q = torch.randn(1, 1, 1, 512, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, 1, 16, 512, device=dev, dtype=torch.bfloat16)
v = torch.randn(1, 1, 16, 512, device=dev, dtype=torch.bfloat16)
FFPA = CUDABackend(impl="ffpa")
cases = {
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    "ffpa_attn_func": lambda: ffpa_attn_func(q, k, v),
    "ffpa_attn_func impl=ffpa": lambda: ffpa_attn_func(q, k, v, backend=FFPA),
    "torch.empty_like": lambda: torch.empty_like(q),
    "empty lambda": lambda: None,
}
def measure(f, n, held):
    for _ in range(100): f()
    torch.cuda.synchronize()
    if held: torch.cuda._sleep(int(2e8))  # ~100 ms of GPU time ahead of the calls
    t = time.perf_counter()
    for _ in range(n): f()
    el = time.perf_counter() - t
    torch.cuda.synchronize()
    return el / n * 1e6
res = {}
for rnd in range(5):
    for held, n in ((True, 600), (False, 2000)):
        for name, f in cases.items():
            res.setdefault(f"{name} {'held' if held else 'free'}", []).append(measure(f, n, held))
out = {name: statistics.median(v) for name, v in res.items()}
for name, us in out.items(): print(f"{name:40s} {us:8.2f} us  {[round(x,1) for x in res[name]]}")
json.dump({"median": out, "rounds": res}, open(sys.argv[1], "w"), indent=1)
