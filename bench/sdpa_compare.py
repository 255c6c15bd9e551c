#!/usr/bin/env python3
"""Side-by-side attention forward benchmark: ffpa and PyTorch SDPA, one process.

ffpa is loaded from its shared library through the C ABI of include/ffpa/ffpa.h
(ctypes, no build step); every SDPA backend that accepts a shape is timed next
to it on the same inputs, with CUDA events (warm-up, then median and min of
the timed calls), rotating through enough input sets to exceed twice the L2
cache. ffpa's output is checked against SDPA computed in float32 on upcast
inputs (relative L2 error, on sampled heads when the shape is large).

    python3 bench/sdpa_compare.py --lib build/libffpa.so \\
        --json $OUT/bench.json --markdown $OUT/bench.md

The default sweep is the performance table of the core-library issue: bf16,
B=1, Hq=Hkv=32, N=8192, D in {320, 384, 512, 640, 768, 1024}, causal off and
on. --cases picks another named list; --dims/--seq/--heads/... change the
default sweep. Exit status: 0 when every ffpa call ran and passed its check,
1 otherwise, 2 for a bad command line or a library that does not load.
"""

import argparse
import ctypes
import datetime
import json
import shlex
import statistics
import sys
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# --- the C ABI (include/ffpa/ffpa.h), mirrored field by field -------------------

FFPA_DTYPE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2, torch.bool: 3}
FFPA_CAUSAL_NONE, FFPA_CAUSAL_TOP_LEFT = 0, 1
FFPA_IMPLS = {"auto": 0, "sm80": 2}  # ffpa_impl values; others may be given as integers


class FfpaTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
        ("stride", ctypes.c_int64 * 4),  # in elements
    ]


class FfpaOptions(ctypes.Structure):
    _fields_ = [
        ("has_scale", ctypes.c_int32),
        ("scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("accumulation", ctypes.c_int32),
        ("impl", ctypes.c_int32),
    ]


class FfpaForwardParams(ctypes.Structure):
    _fields_ = [
        ("q", FfpaTensor),
        ("k", FfpaTensor),
        ("v", FfpaTensor),
        ("o", FfpaTensor),
        ("mask", FfpaTensor),
        ("lse", FfpaTensor),
        ("options", FfpaOptions),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


# The sizes the C compiler gives these structs on x86-64 and aarch64.
assert ctypes.sizeof(FfpaTensor) == 80
assert ctypes.sizeof(FfpaOptions) == 40
assert ctypes.sizeof(FfpaForwardParams) == 544


class FfpaError(RuntimeError):
    pass


class Ffpa:
    """The library's forward entry point, called on torch tensors."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.ffpa_forward.argtypes = [ctypes.POINTER(FfpaForwardParams), ctypes.c_char_p, ctypes.c_size_t]
        self.lib.ffpa_forward.restype = ctypes.c_int
        self.lib.ffpa_status_name.argtypes = [ctypes.c_int]
        self.lib.ffpa_status_name.restype = ctypes.c_char_p
        self.lib.ffpa_version.argtypes = []
        self.lib.ffpa_version.restype = ctypes.c_char_p
        self.message = ctypes.create_string_buffer(2048)

    def version(self):
        return self.lib.ffpa_version().decode()

    def forward(self, params):
        status = self.lib.ffpa_forward(ctypes.byref(params), self.message, len(self.message))
        if status != 0:
            name = self.lib.ffpa_status_name(status).decode()
            raise FfpaError(f"{name}: {self.message.value.decode(errors='replace')}")


def ffpa_tensor(t):
    desc = FfpaTensor()
    if t is None:
        return desc  # data NULL: absent
    desc.data = t.data_ptr()
    desc.dtype = FFPA_DTYPE[t.dtype]
    desc.rank = t.dim()
    for i in range(t.dim()):
        desc.shape[i] = t.shape[i]
        desc.stride[i] = t.stride(i)
    return desc


def ffpa_params(inputs, o, case, impl, stream):
    p = FfpaForwardParams()
    p.q, p.k, p.v = ffpa_tensor(inputs.q), ffpa_tensor(inputs.k), ffpa_tensor(inputs.v)
    p.o = ffpa_tensor(o)
    p.mask = ffpa_tensor(inputs.mask)
    p.options.causal = FFPA_CAUSAL_TOP_LEFT if case.causal else FFPA_CAUSAL_NONE  # SDPA's is_causal
    p.options.dropout_p = case.dropout
    p.options.impl = impl
    p.stream = stream
    return p


# --- cases ------------------------------------------------------------------------

TORCH_DTYPE = {"bf16": torch.bfloat16, "f16": torch.float16}
TOLERANCE = {"bf16": 1e-2, "f16": 5e-3}  # relative L2 against fp32, as the GPU tests


@dataclass(frozen=True)
class Case:
    D: int
    causal: bool = False
    B: int = 1
    Hq: int = 32
    Hkv: int = 32
    Nq: int = 8192
    Nkv: int = 8192
    dtype: str = "bf16"
    mask: str = "none"  # none, or key-add: an additive [B, 1, 1, Nkv] mask in the input dtype
    dropout: float = 0.0

    def shape_label(self):
        heads = f"H{self.Hq}" if self.Hq == self.Hkv else f"H{self.Hq}/{self.Hkv}"
        seq = f"N{self.Nq}" if self.Nq == self.Nkv else f"Nq{self.Nq} Nkv{self.Nkv}"
        extras = "".join(
            [f" mask={self.mask}" if self.mask != "none" else "", f" dropout={self.dropout:g}" if self.dropout else ""]
        )
        return f"B{self.B} {heads} {seq} {self.dtype}{extras}"

    def flops(self):
        """4 * B * Hq * D * attended pairs; causal with Nq == Nkv counts half of Nq * Nkv."""
        if not self.causal:
            pairs = self.Nq * self.Nkv
        elif self.Nq == self.Nkv:
            pairs = self.Nq * self.Nkv / 2
        else:  # top-left: row i attends min(i + 1, Nkv) keys
            m = min(self.Nq, self.Nkv)
            pairs = m * (m + 1) / 2 + (self.Nq - m) * self.Nkv
        return 4.0 * self.B * self.Hq * self.D * pairs


ISSUE_DIMS = (320, 384, 512, 640, 768, 1024)


def grid(dims, causals, **shape):
    return [Case(D=d, causal=c, **shape) for d in dims for c in causals]


NAMED_CASES = {
    # The core-library issue's table: D x causal at the headline shape.
    "issue2": lambda: grid(ISSUE_DIMS, (False, True)),
    # The Hopper issue's table: D sweep, long sequence, causal, cross, GQA, fp16.
    "issue4": lambda: grid(ISSUE_DIMS, (False,))
    + [
        Case(D=512, Nq=16384, Nkv=16384),
        Case(D=512, causal=True),
        Case(D=512, Nq=1024),
        Case(D=512, Hkv=8),
        Case(D=512, dtype="f16"),
    ],
    # The remaining rows of the hopper notes: decode, additive key mask, dropout.
    "extras": lambda: [
        Case(D=512, Nq=1),
        Case(D=512, mask="key-add"),
        Case(D=512, dropout=0.1),
    ],
    # Small shapes that run in seconds: for quick checks of the whole path.
    "smoke": lambda: grid((128, 512), (False, True), B=2, Hq=8, Hkv=8, Nq=1024, Nkv=1024)
    + [
        Case(D=320, B=2, Hq=8, Hkv=2, Nq=777, Nkv=1029, causal=True),
        Case(D=1024, B=1, Hq=4, Hkv=4, Nq=513, Nkv=2048, mask="key-add"),
    ],
}


# --- inputs -----------------------------------------------------------------------


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor  # or None
    k_sdpa: torch.Tensor  # k and v with kv heads repeated for GQA: SDPA's fast
    v_sdpa: torch.Tensor  # kernels do not take Hq != Hkv at these head dims


def make_inputs(case):
    dtype = TORCH_DTYPE[case.dtype]

    def uniform(*shape):
        return torch.empty(shape, dtype=dtype, device="cuda").uniform_(-1, 1)

    q = uniform(case.B, case.Hq, case.Nq, case.D)
    k = uniform(case.B, case.Hkv, case.Nkv, case.D)
    v = uniform(case.B, case.Hkv, case.Nkv, case.D)
    mask = uniform(case.B, 1, 1, case.Nkv) if case.mask == "key-add" else None
    group = case.Hq // case.Hkv
    k_sdpa = k.repeat_interleave(group, dim=1) if group > 1 else k
    v_sdpa = v.repeat_interleave(group, dim=1) if group > 1 else v
    return Inputs(q, k, v, mask, k_sdpa, v_sdpa)


def input_set_count(case, l2_bytes):
    """Input sets whose bytes together exceed twice the L2 (one when one set does)."""
    element = torch.tensor([], dtype=TORCH_DTYPE[case.dtype]).element_size()
    set_bytes = element * (case.B * case.Hq * case.Nq * case.D + 2 * case.B * case.Hkv * case.Nkv * case.D)
    if case.mask != "none":
        set_bytes += element * case.B * case.Nkv
    return 1 if set_bytes > 2 * l2_bytes else 2 * l2_bytes // set_bytes + 1


# --- timing and checking ------------------------------------------------------------


def time_calls(call, sets, warmup, iters):
    """call(s) runs one forward on input set s. Returns (median ms, min ms)."""
    for n in range(warmup):
        call(n % sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for n in range(iters):
        starts[n].record()
        call((warmup + n) % sets)
        ends[n].record()
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(ms), min(ms)


def check_heads(case):
    """All query heads, or 4 spread ones when fp32 scores of all would pass 1 GiB."""
    if case.B * case.Hq * case.Nq * case.Nkv * 4 <= 1 << 30 or case.Hq <= 4:
        return list(range(case.Hq))
    return sorted({0, case.Hq // 3, 2 * case.Hq // 3, case.Hq - 1})


def reference(case, inputs, heads):
    """SDPA in float32 on upcast inputs (math backend, no TF32) for the given query heads."""
    group = case.Hq // case.Hkv
    kv_heads = [h // group for h in heads]
    q = inputs.q[:, heads].float()
    k = inputs.k[:, kv_heads].float()
    v = inputs.v[:, kv_heads].float()
    mask = inputs.mask.float() if inputs.mask is not None else None
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=case.causal)


def relative_l2(out, ref, heads):
    got = out[:, heads].float()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


def ffpa_column(impl_name):
    return "ffpa" if impl_name == "auto" else f"ffpa-{impl_name}"


def first_line(error):
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def run_case(case, ffpa, impls, backends, args, l2_bytes):
    sets = input_set_count(case, l2_bytes)
    inputs = [make_inputs(case) for _ in range(sets)]
    flops = case.flops()
    stream = torch.cuda.current_stream().cuda_stream
    heads = check_heads(case)
    ref = reference(case, inputs[0], heads) if case.dropout == 0 else None
    results = {}

    for impl_name, impl in impls:
        column = ffpa_column(impl_name)
        o = torch.empty_like(inputs[0].q)
        params = [ffpa_params(x, o, case, impl, stream) for x in inputs]
        try:
            o.fill_(float("nan"))  # anything the call leaves unwritten stays NaN
            ffpa.forward(params[0])
            torch.cuda.synchronize()
            entry = {"status": "ok", "nan_count": int(torch.isnan(o).sum().item())}
            entry["rel_l2"] = relative_l2(o, ref, heads) if ref is not None else None
            median, best = time_calls(lambda s: ffpa.forward(params[s]), sets, args.warmup, args.iters)
            entry.update(median_ms=median, min_ms=best, tflops=flops / median / 1e9, tflops_max=flops / best / 1e9)
        except FfpaError as error:
            entry = {"status": "error", "message": str(error)}
        results[column] = entry

    for name, backend in backends:

        def call(s):
            x = inputs[s]
            return F.scaled_dot_product_attention(
                x.q, x.k_sdpa, x.v_sdpa, attn_mask=x.mask, dropout_p=case.dropout, is_causal=case.causal
            )

        caught = []  # a refusal comes as warnings that say why, then an error
        try:
            with sdpa_kernel([backend]), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = call(0)
                torch.cuda.synchronize()
                entry = {"status": "ok", "rel_l2": relative_l2(out, ref, heads) if ref is not None else None}
                del out
                median, best = time_calls(call, sets, args.warmup, args.iters)
            entry.update(median_ms=median, min_ms=best, tflops=flops / median / 1e9, tflops_max=flops / best / 1e9)
        except RuntimeError as error:  # includes running out of memory
            reasons = [first_line(w.message) for w in caught] + [first_line(error)]
            entry = {"status": "n/a", "reason": "; ".join(reasons)[:500]}
        results[name] = entry

    first = results[ffpa_column(impls[0][0])]
    sdpa_ok = {n: r for n, r in results.items() if n in SDPA_BACKENDS and r["status"] == "ok"}
    best_sdpa = min(sdpa_ok, key=lambda n: sdpa_ok[n]["median_ms"]) if sdpa_ok else None
    speedup = None
    if best_sdpa and first["status"] == "ok":
        speedup = sdpa_ok[best_sdpa]["median_ms"] / first["median_ms"]
    passed = first["status"] == "ok" and first["nan_count"] == 0
    if passed and first["rel_l2"] is not None:
        passed = first["rel_l2"] <= TOLERANCE[case.dtype]
    return {
        "case": case.shape_label(),
        **asdict(case),
        "flops": flops,
        "input_sets": sets,
        "check_heads": heads if ref is not None else None,
        "check": "fp32 SDPA (math) on upcast inputs" if ref is not None else "skipped: dropout masks differ",
        "sdpa_kv_expanded": case.Hq != case.Hkv,
        "results": results,
        "best_sdpa": best_sdpa,
        "speedup": speedup,
        "ffpa_rel_l2": first.get("rel_l2"),
        "passed": passed,
    }


# --- output -------------------------------------------------------------------------


def cell(entry):
    return f"{entry['tflops']:.1f}" if entry["status"] == "ok" else entry["status"]


def progress_line(row):
    parts = []
    for name, r in row["results"].items():
        parts.append(f"{name} {r['median_ms']:.3f} ms ({r['tflops']:.1f} T)" if r["status"] == "ok" else f"{name} {r['status']}")
    err = row["ffpa_rel_l2"]
    tail = f"rel L2 {err:.2e}" if err is not None else "no check"
    speedup = f"{row['speedup']:.2f}x vs {row['best_sdpa']}" if row["speedup"] else "no speedup"
    return " | ".join(parts) + f" | {speedup} | {tail}" + ("" if row["passed"] else " | FAIL")


def markdown(report, columns):
    rows = report["rows"]
    shapes = sorted({r["case"] for r in rows})
    with_shape = len(shapes) > 1
    lines = [
        f"# ffpa vs PyTorch SDPA: {report['device']}, {report['date'][:10]}",
        "",
        f"Command: `{report['command']}`  ",
        f"torch {report['torch']}, ffpa {report['ffpa_version']}. TFLOP/s = 4·B·Hq·D·(attended pairs) / median time "
        f"(causal with Nq = Nkv: half of Nq·Nkv); median of {report['iters']} calls after {report['warmup']} "
        "warm-up, CUDA events, inputs rotated beyond 2x L2. n/a: the backend refused the shape. "
        "Error: ffpa's relative L2 error against fp32 SDPA on upcast inputs.",
        "",
    ]
    if not with_shape and shapes:
        lines += [f"Shape: {shapes[0]}", ""]
    head = (["shape"] if with_shape else []) + ["D", "causal"] + columns + ["speedup vs best SDPA", "ffpa error"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for r in rows:
        cells = ([r["case"]] if with_shape else []) + [str(r["D"]), "yes" if r["causal"] else "no"]
        cells += [cell(r["results"][c]) if c in r["results"] else "" for c in columns]
        cells.append(f"{r['speedup']:.2f}x ({r['best_sdpa']})" if r["speedup"] else "n/a")
        err = r["ffpa_rel_l2"]
        cells.append(("n/a" if err is None else f"{err:.1e}") + ("" if r["passed"] else " FAIL"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------


def parse_impl(text):
    if text in FFPA_IMPLS:
        return text, FFPA_IMPLS[text]
    try:
        return text, int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown impl {text!r}: auto, sm80 or an ffpa_impl integer")


def int_list(text):
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default="build/libffpa.so", help="the ffpa shared library (default build/libffpa.so)")
    parser.add_argument("--cases", choices=sorted(NAMED_CASES), help="a named list of cases instead of the sweep")
    parser.add_argument("--dims", type=int_list, help="head dims of the sweep (default 320,384,512,640,768,1024)")
    parser.add_argument("--seq", type=int, help="Nq = Nkv of the sweep (default 8192)")
    parser.add_argument("--seq-kv", type=int, help="Nkv of the sweep when it differs from --seq")
    parser.add_argument("--heads", type=int, help="query heads of the sweep (default 32)")
    parser.add_argument("--heads-kv", type=int, help="kv heads of the sweep (default: --heads)")
    parser.add_argument("--batch", type=int, help="batch of the sweep (default 1)")
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPE), help="dtype of the sweep (default bf16)")
    parser.add_argument("--causal", choices=["both", "false", "true"], help="causal of the sweep (default both)")
    parser.add_argument(
        "--impls", type=lambda t: [parse_impl(x) for x in t.split(",")], default=[("auto", 0)],
        help="ffpa implementations to time, e.g. auto,sm80 (default auto); the first is compared with SDPA",
    )
    parser.add_argument("--with-math", action="store_true", help="also time SDPA's math backend (slow)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls, at least 10 (default 10)")
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--markdown", help="write the markdown table here")
    args = parser.parse_args(argv)
    sweep_options = [args.dims, args.seq, args.seq_kv, args.heads, args.heads_kv, args.batch, args.dtype, args.causal]
    if args.cases and any(o is not None for o in sweep_options):
        parser.error("--cases and the sweep options (--dims, --seq, ...) exclude each other")
    if args.iters < 10:
        parser.error("--iters must be at least 10 (the median of fewer is noise)")
    return args


def selected_cases(args):
    if args.cases:
        return NAMED_CASES[args.cases]()
    if all(o is None for o in [args.dims, args.seq, args.seq_kv, args.heads, args.heads_kv, args.batch, args.dtype, args.causal]):
        return NAMED_CASES["issue2"]()
    causals = {"both": (False, True), "false": (False,), "true": (True,)}[args.causal or "both"]
    seq = args.seq or 8192
    heads = args.heads or 32
    return grid(
        args.dims or ISSUE_DIMS, causals, B=args.batch or 1, Hq=heads, Hkv=args.heads_kv or heads,
        Nq=seq, Nkv=args.seq_kv or seq, dtype=args.dtype or "bf16",
    )


def main(argv):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("sdpa_compare: no CUDA device visible to torch", file=sys.stderr)
        return 2
    try:
        ffpa = Ffpa(args.lib)
    except OSError as error:
        print(f"sdpa_compare: cannot load {args.lib}: {error}", file=sys.stderr)
        return 2
    torch.set_float32_matmul_precision("highest")  # the fp32 reference must not use TF32
    torch.manual_seed(0x1234)
    properties = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(properties, "L2_cache_size", 50 << 20)
    backends = [(n, b) for n, b in SDPA_BACKENDS.items() if n != "math" or args.with_math]
    ffpa_columns = [ffpa_column(name) for name, _ in args.impls]
    cases = selected_cases(args)

    report = {
        "tool": "sdpa_compare",
        "device": torch.cuda.get_device_name(0),
        "capability": "%d.%d" % torch.cuda.get_device_capability(0),
        "l2_bytes": l2_bytes,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "ffpa_version": ffpa.version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python3"] + sys.argv),
        "warmup": args.warmup,
        "iters": args.iters,
        "rows": [],
    }
    print(f"sdpa_compare on {report['device']} (torch {report['torch']}, ffpa {report['ffpa_version']}): "
          f"{len(cases)} cases", flush=True)
    for n, case in enumerate(cases, 1):
        label = f"[{n}/{len(cases)}] D={case.D} causal={case.causal} {case.shape_label()}"
        print(f"{label} ...", flush=True)
        try:
            row = run_case(case, ffpa, args.impls, backends, args, l2_bytes)
        except RuntimeError as error:  # out of memory, or a CUDA error outside the library
            row = {"case": case.shape_label(), **asdict(case), "results": {}, "error": first_line(error),
                   "speedup": None, "best_sdpa": None, "ffpa_rel_l2": None, "passed": False}
        report["rows"].append(row)
        print(f"{label}: " + (progress_line(row) if "error" not in row else f"FAIL: {row['error']}"), flush=True)
        torch.cuda.empty_cache()

    table = markdown(report, ffpa_columns + [n for n, _ in backends])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    print()
    print(table, end="")
    failed = [r["case"] + f" D={r['D']} causal={r['causal']}" for r in report["rows"] if not r["passed"]]
    if failed:
        print(f"sdpa_compare: {len(failed)} case(s) failed: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
