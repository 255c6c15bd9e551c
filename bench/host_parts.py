"""Host time of the Python-side parts of an eager ffpa_attn_func call (B1 H1 Nq1 Nkv16 D512 bf16, impl
auto) next to SDPA's, the GPU held by a sleep kernel so that only the host is timed; 5 interleaved rounds,
median. Usage: python bench/host_parts.py OUT.json (results: docs/perf/h200-2026-12-01b/host_parts_python.txt)."""
import ctypes
import json
import statistics
import sys

import torch
import torch.nn.functional as F

import bench_common as bc
from ffpa_attn import decide
from ffpa_attn import _library, ffpa_attn_func, ops

dev = "cuda"
q = torch.randn(1, 1, 1, 512, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, 1, 16, 512, device=dev, dtype=torch.bfloat16)
v = torch.randn(1, 1, 16, 512, device=dev, dtype=torch.bfloat16)
B = decide.DEFAULT_BACKEND
decision, plan = decide.decide_cached(q, k, v, None, 0.0, False, None, False, B, False)
assert plan is not None, decision
out = ops.launch(plan, q, k, v, None, False, 0, 0)
params = _library.FfpaForwardParams.from_buffer_copy(plan.params)
w = memoryview(params).cast("B").cast("Q")
w[ops._Q_WORD], w[ops._K_WORD], w[ops._V_WORD], w[ops._O_WORD] = q.data_ptr(), k.data_ptr(), v.data_ptr(), out[0].data_ptr()
w[ops._STREAM_WORD] = ops._RAW_STREAM(0)
del w
lib = _library.load_library()
buf = ctypes.create_string_buffer(512)
cuda = ctypes.CDLL("libcuda.so.1")
attr = ctypes.c_uint()
qp = ctypes.c_uint64(q.data_ptr())
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
def cu_ptr():
    cuda.cuPointerGetAttribute(ctypes.byref(attr), CU_POINTER_ATTRIBUTE_MEMORY_TYPE, qp)
cases = {
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    "ffpa_attn_func": lambda: ffpa_attn_func(q, k, v),
    "decide.decide_cached": lambda: decide.decide_cached(q, k, v, None, 0.0, False, None, False, B, False),
    "ops.launch": lambda: ops.launch(plan, q, k, v, None, False, 0, 0),
    "torch.empty_like": lambda: torch.empty_like(q),
    "_library.forward (prepared params)": lambda: _library.forward(params),
    "raw ctypes ffpa_forward": lambda: lib._dll.ffpa_forward(ctypes.byref(params), buf, 512),
    "from_buffer_copy": lambda: _library.FfpaForwardParams.from_buffer_copy(plan.params),
    "cuPointerGetAttribute (ctypes)": cu_ptr,
    "empty lambda": lambda: None,
}
res = {}
for rnd in range(5):
    for name, f in (cases.items() if rnd % 2 == 0 else list(cases.items())[::-1]):
        res.setdefault(name, []).append(bc.held_host_us(f, 600))
med = {name: statistics.median(x) for name, x in res.items()}
for name, us in med.items():
    print(f"{name:40s} {us:8.2f} us  {[round(x, 2) for x in res[name]]}")
json.dump({"median": med, "rounds": res}, open(sys.argv[1], "w"), indent=1)
