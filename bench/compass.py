#!/usr/bin/env python3
"""The compass: every case of shared/docs/compass-cases.md, ffpa and PyTorch SDPA in one process.

Per case, on the same inputs:
  ffpa_ms        ffpa_attn_func with the default backend: what a model runs after monkey_patch()
                 (impl "auto": ffpa's kernel, or SDPA where routing.py hands the call to SDPA, e.g. D <= 256;
                 `route` says which, from ffpa_attn.explain). specdec: CUDABackend(causal_alignment=
                 "bottom_right"), the FlashAttention-style alignment.
  ffpa_impl_ms   the same with impl="ffpa": the library's kernel, never SDPA
  sdpa_default_ms  the original F.scaled_dot_product_attention, SDPA's own dispatch
  sdpa_backends  each backend alone under sdpa_kernel (flash, efficient, cudnn; math below N = 8192 and
                 ~8 GiB): time, or why it refuses; for GQA also flash/efficient/cudnn on K and V repeated
                 to Hq heads outside the timing ("<backend> (K/V expanded)", what many models do). The
                 fastest is sdpa_best_ms / sdpa_best_backend ("default" where no backend alone ran it).
                 SDPA has no bottom-right is_causal: for specdec it gets the equivalent bool [Nq, Nkv] mask.
fp8-* rows: ffpa_ms is ffpa_attn_func with CUDABackend(precision="fp8") (the pre-pass included; bf16 in
and out), ffpa_impl_ms the library's bf16 path on the same inputs, fp8_speedup_vs_bf16 their ratio; SDPA is
timed on the bf16 inputs. bwd-* rows: the backward alone (dq, dk, dv from a saved forward): ffpa_ms the
library's GPU backward through the op's autograd (impl auto), ffpa_impl_ms the portable kernels alone (impl
sm80_split_d), SDPA's per backend and default. Cases the library cannot
run have "ffpa_ms": null and a "reason" (e.g. a head dim outside ffpa_attn.library_info()'s limits).

Timing: bench/attention_bench.py's time_calls (CUDA events around each call, the calls queued behind
a sleep kernel: the kernels' own time), inputs rotated beyond twice the L2, columns interleaved over
--rounds rounds (order reversed every other round), each the median of --iters calls (at least 10)
after warm-up; a column's time is the median of its round medians. FLOPs: 4*B*Hq*Nq*Nkv*D, halved for
causal with Nq == Nkv, backward 2.5x the forward. rel_err: ffpa_attn_func's output (default backend)
against SDPA's math backend in fp32 on upcast inputs, on the whole output for small cases, else 2
(batch, head) pairs x 512 query rows spread over Nq, against the full keys (`sample`); null for dropout.
The host-us row: host microseconds per eager call on B=1, H=1, Nq=1, Nkv=16, D=512 bf16 (wall time of
2000 calls without synchronizing, median of 5 rounds) for ffpa_attn_func and SDPA, with a breakdown.

    PYTHONPATH=python FFPA_LIBRARY=build/libffpa.so python3 bench/compass.py \\
        --out docs/perf/compass.json --markdown docs/perf/compass.md

Runtime on an H200 (estimated from docs/perf's measured times and the method's fixed costs; --list
prints it for a selection): every case, 2 rounds of 10 calls, about 2.5 minutes; --quick (8 cases,
1 round) under 30 s. --dry-run fills synthetic numbers without torch or a GPU (no file is written
unless --out is given). --cases takes comma-separated ids or shell patterns: --cases 'd512*,decode-*'.

Exit status: 0 when the run completed, 2 for a bad command line or nothing to load, 3 when the CUDA
context failed mid-run (the rows so far are written, "aborted" says why).
"""

from __future__ import annotations

import argparse
import fnmatch
import random
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from typing import Any

import bench_common as bc

DEFAULT_OUT = "docs/perf/compass.json"  # relative to the repository root


@dataclass(frozen=True)
class Case:
    """One compass case (shared/docs/compass-cases.md): bf16, B=1, Hq=Hkv=32, N=8192, non-causal,
    no mask, forward, unless named."""

    id: str
    D: int
    B: int = 1
    Hq: int = 32
    Hkv: int = 32
    Nq: int = 8192
    Nkv: int = 8192
    dtype: str = "bf16"
    causal: str = "none"  # none, top_left (SDPA's is_causal), bottom_right
    mask: str = "none"  # none, add-keys (additive [1,1,1,N] in the input dtype), bool-keypad ([B,1,1,N], 10 %)
    dropout: float = 0.0
    mode: str = "fwd"  # fwd; fp8 (FP8 path: bf16 in and out, quantization included); bwd (backward only)
    Dv: int = 0  # the value's head dim (issue 14's D_qk != D_v rows); 0: D

    @property
    def gqa(self) -> bool:
        return self.Hq != self.Hkv

    @property
    def value_dim(self) -> int:
        return self.Dv or self.D

    def flops(self) -> float:
        # 2 B Hq Nq Nkv (D + Dv): the compass's 4 B Hq Nq Nkv D with D the mean of the two head dims.
        return bc.attention_flops(self.B, self.Hq, self.Nq, self.Nkv, (self.D + self.value_dim) / 2,
                                  self.causal != "none", backward=self.mode == "bwd")

    def hbm_bound_ms(self, bandwidth: float = 4.8e12) -> float:
        """Reading q, k, v and writing o once at the H200's HBM bandwidth (what decode approaches)."""
        elements = self.B * (self.Hq * self.Nq * (self.D + self.value_dim) + self.Hkv * self.Nkv * (self.D + self.value_dim))
        return elements * bc.ELEMENT_BYTES / bandwidth * 1e3

    def shape(self) -> tuple[int, int, int, int, int, int]:
        return self.B, self.Hq, self.Hkv, self.Nq, self.Nkv, self.D

    def describe(self) -> str:
        heads = f"H{self.Hq}" if not self.gqa else f"Hq{self.Hq}/Hkv{self.Hkv}"
        seq = f"N{self.Nq}" if self.Nq == self.Nkv else f"Nq{self.Nq}/Nkv{self.Nkv}"
        extras = [self.dtype] + ([self.causal.replace("_", "-") + " causal"] if self.causal != "none" else [])
        extras += [f"mask {self.mask}"] if self.mask != "none" else []
        extras += [f"dropout {self.dropout:g}"] if self.dropout else []
        extras += [self.mode] if self.mode != "fwd" else []
        dims = f"D{self.D}" if self.value_dim == self.D else f"D{self.D}/Dv{self.value_dim}"
        return f"B{self.B} {heads} {seq} {dims} " + " ".join(extras)


HEAD_DIMS = (64, 128, 256, 320, 384, 448, 512, 576, 640, 768, 896, 1024)
TOP_LEFT, BOTTOM_RIGHT = "top_left", "bottom_right"

# The compass-cases.md table, one entry a case, in its order.
CASES: tuple[Case, ...] = (
    *(Case(f"d{d}", d) for d in HEAD_DIMS),
    Case("d320-causal", 320, causal=TOP_LEFT),
    Case("d512-causal", 512, causal=TOP_LEFT),
    Case("d1024-causal", 1024, causal=TOP_LEFT),
    # Issue 32: ffpa's own kernels at D <= 256 (ffpa_impl_*), beside the routed call.
    Case("d128-causal", 128, causal=TOP_LEFT),
    Case("d256-causal", 256, causal=TOP_LEFT),
    Case("d192-128", 192, Hq=128, Hkv=128, causal=TOP_LEFT, Dv=128),
    Case("d512-n16k", 512, Nq=16384, Nkv=16384),
    Case("d512-n32k-h8", 512, Hq=8, Hkv=8, Nq=32768, Nkv=32768),
    Case("d512-gqa32-8", 512, Hkv=8),
    Case("d512-mask-add-keys", 512, mask="add-keys"),
    Case("d512-mask-bool-keypad", 512, B=2, Hq=16, Hkv=16, mask="bool-keypad"),
    Case("d512-dropout", 512, dropout=0.1),
    Case("d512-cross", 512, Nq=1024),
    Case("d512-fp16", 512, dtype="fp16"),
    Case("d512-short-b8-n1024-causal", 512, B=8, Hq=16, Hkv=16, Nq=1024, Nkv=1024, causal=TOP_LEFT),
    Case("d512-short-b16-n512-causal", 512, B=16, Hq=16, Hkv=16, Nq=512, Nkv=512, causal=TOP_LEFT),
    Case("decode-b1-n8k", 512, Nq=1),
    Case("decode-b1-n32k", 512, Nq=1, Nkv=32768),
    Case("decode-b8-gqa32-8", 512, B=8, Hkv=8, Nq=1),
    Case("specdec-b4-q4-gqa32-8", 512, B=4, Hkv=8, Nq=4, causal=BOTTOM_RIGHT),
    Case("d256-local-b2-h16-n4k-causal", 256, B=2, Hq=16, Hkv=16, Nq=4096, Nkv=4096, causal=TOP_LEFT),
    Case("d128-b4-n4k-causal", 128, B=4, Nq=4096, Nkv=4096, causal=TOP_LEFT),
    Case("fp8-d320", 320, mode="fp8"),
    Case("fp8-d512", 512, mode="fp8"),
    Case("fp8-d1024", 1024, mode="fp8"),
    Case("fp8-d512-causal", 512, causal=TOP_LEFT, mode="fp8"),
    # Issue 14: absorbed MLA (D_qk 576, D_v 512, one KV head shared by every query head).
    Case("mla-prefill-576-512", 576, Hq=128, Hkv=1, Nq=4096, Nkv=4096, causal=TOP_LEFT, Dv=512),
    Case("mla-decode-b64-n8k", 576, B=64, Hq=128, Hkv=1, Nq=1, Nkv=8192, Dv=512),
    Case("bwd-d128", 128, mode="bwd"),
    Case("bwd-d256", 256, mode="bwd"),
    Case("bwd-d512", 512, mode="bwd"),
    Case("bwd-d512-causal", 512, causal=TOP_LEFT, mode="bwd"),
    Case("bwd-d1024", 1024, mode="bwd"),
)
QUICK_CASES = ("d128", "d512", "d512-causal", "d512-mask-bool-keypad", "decode-b1-n8k", "specdec-b4-q4-gqa32-8",
               "fp8-d512", "bwd-d512")

NOT_YET: dict[str, str] = {}
SDPA_COLUMNS = ("sdpa_default", *bc.SDPA_BACKENDS)
FAST_BACKENDS = ("flash", "efficient", "cudnn")
KV_EXPANDED = " (K/V expanded)"


def select_cases(patterns: list[str] | None, quick: bool) -> list[Case]:
    if patterns is None:
        return [c for c in CASES if c.id in QUICK_CASES] if quick else list(CASES)
    return [c for c in CASES if any(fnmatch.fnmatchcase(c.id, p) for p in patterns)]


def parse_patterns(text: str) -> list[str]:
    patterns = [p.strip() for p in text.split(",") if p.strip()]
    ids = [c.id for c in CASES]
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(i, p) for i in ids)]
    if unmatched or not patterns:
        raise argparse.ArgumentTypeError(f"no case matches {', '.join(unmatched) or repr(text)}; ids: {', '.join(ids)}")
    return patterns


# --- estimates --------------------------------------------------------------------------------

SLEEP_S = 0.02  # attention_bench.time_calls's head start per timed round


def column_skip(column: str, case: Case) -> str | None:
    return bc.math_skip_reason(*case.shape()) if column == "math" else None


def estimate_seconds(case: Case, args: argparse.Namespace) -> float:
    masked = case.mask != "none" or case.causal == BOTTOM_RIGHT
    causal = case.causal != "none"
    columns = [*bc.SDPA_BACKENDS, "sdpa_default"] + (["ffpa", "ffpa_impl"] if case.mode in ("fwd", "fp8") else [])
    total = 0.3
    for column in columns:
        model = {"sdpa_default": "unpatched", "ffpa_impl": "ffpa"}.get(column, column)
        if column_skip(column, case):
            continue
        ms = bc.model_ms(model, *case.shape(), causal, masked, backward=case.mode == "bwd")
        if ms is None:
            continue
        calls = 2 + args.warmup + (args.rounds - 1) + args.rounds * args.iters + (1 if case.mode == "bwd" else 0)
        total += args.rounds * SLEEP_S + calls * max(ms, 0.03) / 1e3
    return total


def host_us_seconds(args: argparse.Namespace) -> float:
    return 0.0 if args.skip_host_us else 5 * 7 * 2200 * 40e-6


# --- measuring one case --------------------------------------------------------------------------


def case_row(case: Case) -> dict[str, Any]:
    return {"case": case.id, "shape": case.describe(), **{k: v for k, v in asdict(case).items() if k != "id"},
            "flops": case.flops(), "hbm_bound_ms": case.hbm_bound_ms()}


def case_inputs(gpu: bc.GpuSession, case: Case, args: argparse.Namespace) -> tuple[list[Any], Any, int]:
    """(input sets, the SDPA-side mask or None, number of sets). The mask is what SDPA gets: the case's
    mask, or for bottom-right causal the equivalent bool [1, 1, Nq, Nkv] mask."""
    torch = gpu.torch
    set_bytes = bc.ELEMENT_BYTES * case.B * (case.Hq * case.Nq * case.D + case.Hkv * case.Nkv * (case.D + case.value_dim))
    count = 1 if case.mode == "bwd" else gpu.set_count(set_bytes)
    seed = args.seed + zlib.crc32(case.id.encode()) % 1_000_000 * 10
    dtype = "bf16" if case.mode == "fp8" else case.dtype
    sets = gpu.qkv_sets(*case.shape(), dtype, seed, count)
    if case.value_dim != case.D:  # v with its own head dim
        sets = [(q, k, gpu.random((case.B, case.Hkv, case.Nkv, case.value_dim), gpu.dtype(dtype), seed + 3 * i + 2))
                for i, (q, k, _) in enumerate(sets)]
    mask = None
    if case.mask == "add-keys":
        t = gpu.dtype(dtype)
        generator = torch.Generator(device=gpu.device).manual_seed(seed + 999)
        bias = torch.rand(1, 1, 1, case.Nkv, generator=generator, device=gpu.device).neg_().to(t)  # in (-1, 0]
        bias[..., case.Nkv - case.Nkv // 10:] = torch.finfo(t).min  # as models write "masked"
        mask = bias
    elif case.mask == "bool-keypad":
        mask = gpu.key_padding(case.B, case.Nkv)[:, None, None, :]
    return sets, mask, count


def measure_forward(gpu: bc.GpuSession, case: Case, args: argparse.Namespace, row: dict[str, Any],
                    runnable: bool) -> None:
    """The forward columns; runnable=False: SDPA's alone (ffpa cannot run the case)."""
    sets, mask, count = case_inputs(gpu, case, args)
    fa = gpu.ffpa_attn
    alignment = BOTTOM_RIGHT if case.causal == BOTTOM_RIGHT else TOP_LEFT
    # fp8 rows: "ffpa" is the FP8 path (CUDABackend(precision="fp8"), the pre-pass included), "ffpa_impl"
    # the library's bf16 path on the same inputs, for the FP8 / bf16 ratio of issue 11.
    fp8 = {"precision": "fp8"} if case.mode == "fp8" else {}
    default = fa.CUDABackend(causal_alignment=alignment, **fp8)
    only_ffpa = fa.CUDABackend(impl="ffpa", causal_alignment=alignment)
    ffpa_kwargs = {"attn_mask": mask, "dropout_p": case.dropout, "is_causal": case.causal != "none",
                   "enable_gqa": case.gqa}
    sdpa_mask, sdpa_causal = mask, case.causal == TOP_LEFT
    if case.causal == BOTTOM_RIGHT:  # SDPA's is_causal is top-left: the bottom-right one as a mask
        sdpa_mask = gpu.causal_keep(case.Nq, case.Nkv, bottom_right=True)[None, None]
        sdpa_causal = False
    sdpa_kwargs = {"attn_mask": sdpa_mask, "dropout_p": case.dropout, "is_causal": sdpa_causal, "enable_gqa": case.gqa}
    row.update(input_sets=count, sdpa_mask_shape=None if sdpa_mask is None else list(sdpa_mask.shape))

    q0, k0, v0 = sets[0]
    if runnable:
        row["route"] = fa.explain(q0, k0, v0, **ffpa_kwargs, backend=default)
        row["kernel"] = gpu.ffpa_kernel(case.D, row["route"])
    refs, sample = None, None
    if runnable and not case.dropout:
        sample = bc.choose_sample(case.B, case.Hq, case.Nq, case.Nkv)
        refs = gpu.reference(q0, k0, v0, mask, case.causal, sample)
        row["sample"] = sample.describe(case.Nq)
    elif runnable:
        row["rel_err_note"] = "dropout: the output is random, no reference"

    sdpa = gpu.original_sdpa
    calls = {
        "ffpa": lambda s: fa.ffpa_attn_func(*sets[s], **ffpa_kwargs, backend=default),
        "ffpa_impl": lambda s: fa.ffpa_attn_func(*sets[s], **ffpa_kwargs, backend=only_ffpa),
        "sdpa_default": lambda s: sdpa(*sets[s], **sdpa_kwargs),
        **{name: (lambda s: sdpa(*sets[s], **sdpa_kwargs)) for name in bc.SDPA_BACKENDS},
    }
    if not runnable:
        del calls["ffpa"], calls["ffpa_impl"]
    expanded: list[Any] = []
    if case.gqa:
        # What many models do instead of enable_gqa: K and V repeated to Hq heads (outside the timing),
        # so that SDPA's fast backends take the call (attention_bench's "K/V expanded" columns).
        group = case.Hq // case.Hkv
        expanded = [(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)) for q, k, v in sets]
        plain = {**sdpa_kwargs, "enable_gqa": False}
        for name in FAST_BACKENDS:
            calls[name + KV_EXPANDED] = lambda s: sdpa(*expanded[s], **plain)
    active, results = {}, {}
    for column, call in calls.items():
        context = gpu.backend_context(column.removesuffix(KV_EXPANDED))
        skip = column_skip(column, case)
        out, reason = (None, skip) if skip else gpu.first_call(call, context, column not in ("ffpa", "ffpa_impl"))
        if reason is not None:
            results[column] = {"ms": None, "reason": reason[:400]}
            continue
        results[column] = {}
        if refs is not None:
            results[column]["rel_err"], results[column]["nan"] = gpu.rel_err(out, refs, sample)
        del out
        active[column] = (call, context)
    del refs
    time_columns(gpu, case, args, active, count, results)
    finish_row(row, results)


def measure_backward(gpu: bc.GpuSession, case: Case, args: argparse.Namespace, row: dict[str, Any]) -> None:
    """The backward alone (dq, dk, dv from a saved forward, retain_graph): ffpa's (the op's autograd, the
    library's GPU backward kernels) and SDPA's per backend and default."""
    torch = gpu.torch
    sets, _, _ = case_inputs(gpu, case, args)
    q, k, v = (t.requires_grad_() for t in sets[0])
    grad = gpu.random((case.B, case.Hq, case.Nq, case.D), gpu.dtype(case.dtype), args.seed + 4242)
    row["input_sets"] = 1
    sdpa = gpu.original_sdpa
    results, active = {}, {}
    graphs: dict[str, Any] = {}
    library = gpu.ffpa_attn._library
    causal = library.Causal.TOP_LEFT if case.causal == TOP_LEFT else library.Causal.NONE

    # ffpa: impl auto (on an H200 the sm90 dQ kernel beside the portable dK/dV); ffpa_impl: the portable
    # kernels alone (impl sm80_split_d), the same forward and inputs.
    for key, impl in (("ffpa", library.Impl.AUTO), ("ffpa_impl", library.Impl.SM80_SPLIT_D)):

        def ffpa_forward(_: int, impl: Any = impl) -> Any:
            out, _lse = torch.ops.ffpa_attn.forward(q, k, v, None, 0.0, causal, case.D ** -0.5,
                                                    library.Accumulation.F32, impl, 0, 0, True)
            return out

        out, reason = gpu.first_call(ffpa_forward, gpu.backend_context("ffpa"), False)
        if reason is not None:
            results[key] = {"ms": None, "reason": reason[:400]}
            continue
        graphs[key] = out

        def ffpa_backward(_: int, out: Any = out) -> Any:
            return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

        _, reason = gpu.first_call(ffpa_backward, gpu.backend_context("ffpa"), False)
        if reason is not None:
            results[key] = {"ms": None, "reason": f"backward: {reason}"[:400]}
            del graphs[key]
        else:
            results[key] = {}
            active[key] = (ffpa_backward, gpu.backend_context("ffpa"))
    for column in SDPA_COLUMNS:
        context = gpu.backend_context(column)
        skip = column_skip(column, case)
        if skip:
            results[column] = {"ms": None, "reason": skip}
            continue

        def forward(_: int) -> Any:  # first_call runs it in the backend's context
            return sdpa(q, k, v, is_causal=case.causal == TOP_LEFT, enable_gqa=case.gqa)

        out, reason = gpu.first_call(forward, context, sdpa=True)
        if reason is not None:
            results[column] = {"ms": None, "reason": reason[:400]}
            continue
        graphs[column] = out

        def backward(_: int, out: Any = out) -> Any:
            return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

        _, reason = gpu.first_call(backward, gpu.backend_context(column), sdpa=True)
        if reason is not None:
            results[column] = {"ms": None, "reason": f"backward: {reason}"[:400]}
            del graphs[column]
            continue
        results[column] = {}
        active[column] = (backward, gpu.backend_context(column))
    time_columns(gpu, case, args, active, 1, results)
    finish_row(row, results)


def time_columns(gpu: bc.GpuSession, case: Case, args: argparse.Namespace, active: dict[str, Any], count: int,
                 results: dict[str, dict[str, Any]]) -> None:
    iters = {column: args.iters for column in active}
    medians, _, errors = gpu.time_rounds(active, count, args.rounds, args.warmup, iters)
    for column in active:
        if column in errors or not medians[column]:
            results[column] = {"ms": None, "reason": errors.get(column, "not timed")}
            continue
        ms = statistics.median(medians[column])
        results[column].update(ms=ms, tflops=bc.tflops(case.flops(), ms), rounds_ms=medians[column])


def finish_row(row: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    """The compass's fields from the columns' results."""
    ffpa, impl, default = results.get("ffpa", {}), results.get("ffpa_impl", {}), results.get("sdpa_default", {})
    backends = {name: r for name, r in results.items() if name in bc.SDPA_BACKENDS or name.endswith(KV_EXPANDED)}
    timed = {name: r["ms"] for name, r in backends.items() if r.get("ms")}
    best = min(timed, key=timed.get) if timed else None
    best_result = backends[best] if best else {}
    if best is None and default.get("ms"):
        # No backend alone ran it (e.g. math skipped at N = 8192): SDPA's default dispatch is the reference.
        best, best_result = "default", default
    row.update(
        ffpa_ms=ffpa.get("ms"),
        ffpa_tflops=ffpa.get("tflops"),
        sdpa_best_ms=best_result.get("ms"),
        sdpa_best_backend=best,
        sdpa_default_ms=default.get("ms"),
        rel_err=ffpa.get("rel_err"),
        ffpa_impl_ms=impl.get("ms"),
        ffpa_impl_tflops=impl.get("tflops"),
        sdpa_best_tflops=best_result.get("tflops"),
        sdpa_default_tflops=default.get("tflops"),
    )
    if row["ffpa_ms"] and row["sdpa_best_ms"]:
        row["speedup_vs_sdpa_best"] = row["sdpa_best_ms"] / row["ffpa_ms"]
    if row["ffpa_ms"] and row["sdpa_default_ms"]:
        row["speedup_vs_sdpa_default"] = row["sdpa_default_ms"] / row["ffpa_ms"]
    if row.get("mode") == "fp8" and row["ffpa_ms"] and row["ffpa_impl_ms"]:
        row["fp8_speedup_vs_bf16"] = row["ffpa_impl_ms"] / row["ffpa_ms"]  # ffpa_impl: the bf16 path, same run
    for key, result in (("ffpa", ffpa), ("ffpa_impl", impl)):
        if result.get("reason"):
            row[f"{key}_reason" if key != "ffpa" else "reason"] = result["reason"]
        if result.get("nan"):
            row[f"{key}_nan"] = result["nan"]
    if impl.get("rel_err") is not None:
        row["ffpa_impl_rel_err"] = impl["rel_err"]
    row["sdpa_default"] = default
    row["sdpa_backends"] = backends


def run_case(gpu: bc.GpuSession, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    row = case_row(case)
    not_yet = NOT_YET.get(case.mode) or gpu.head_dim_refusal(case.D)
    if case.mode == "bwd":
        measure_backward(gpu, case, args, row)
    else:
        measure_forward(gpu, case, args, row, runnable=not_yet is None)
    if not_yet is not None:
        row.update(ffpa_ms=None, ffpa_tflops=None, reason=not_yet)
    return row


def host_row(host: dict[str, Any]) -> dict[str, Any]:
    us = host.get("us", {})
    return {"case": "host-us", "ffpa_us": us.get("ffpa_attn_func"), "sdpa_us": us.get("sdpa"),
            "ffpa_impl_us": us.get("ffpa_attn_func impl=ffpa"), "detail": host}


def progress_text(row: dict[str, Any]) -> str:
    if row.get("error"):
        return f"FAILED: {row['error']}"
    parts = [f"ffpa {bc.fmt(row.get('ffpa_ms'))} ms" if row.get("ffpa_ms") else f"ffpa null ({row.get('reason')})"]
    if row.get("ffpa_impl_ms"):
        parts.append(f"impl=ffpa {bc.fmt(row['ffpa_impl_ms'])} ms")
    parts.append(f"SDPA best {bc.fmt(row.get('sdpa_best_ms'))} ms ({row.get('sdpa_best_backend')}), "
                 f"default {bc.fmt(row.get('sdpa_default_ms'))} ms")
    if row.get("rel_err") is not None:
        parts.append(f"rel err {row['rel_err']:.1e}")
    return " | ".join(parts)


# --- dry run ------------------------------------------------------------------------------------


def synthetic_row(case: Case, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    row = case_row(case)
    masked = case.mask != "none" or case.causal == BOTTOM_RIGHT
    causal = case.causal != "none"
    backward = case.mode == "bwd"

    def result(model: str, column: str) -> dict[str, Any]:
        skip = column_skip(column, case)
        ms = None if skip else bc.model_ms(model, *case.shape(), causal, masked, backward=backward)
        if ms is None:
            return {"ms": None, "reason": skip or "dry run: the model says this backend refuses the call"}
        rounds = [ms * rng.uniform(0.98, 1.03) for _ in range(args.rounds)]
        median = statistics.median(rounds)
        out = {"ms": median, "tflops": bc.tflops(case.flops(), median), "rounds_ms": rounds}
        if case.mode == "fwd" and not case.dropout:
            out["rel_err"] = rng.uniform(1.5e-3, 3e-3)
        return out

    results = {column: result(column, column) for column in bc.SDPA_BACKENDS}
    results["sdpa_default"] = result("unpatched", "sdpa_default")
    if case.mode in ("fwd", "fp8"):
        results["ffpa"] = result("patched", "ffpa")
        results["ffpa_impl"] = result("ffpa", "ffpa_impl")
        routed = "ffpa (impl auto)" if case.D > 256 else "PyTorch SDPA (its own choice)"
        row.update(route=f"{routed}: dry run", kernel="sdpa" if case.D <= 256 else "ffpa sm90_wgmma (inferred)")
    finish_row(row, results)
    if case.mode in NOT_YET:
        row.update(ffpa_ms=None, ffpa_tflops=None, reason=NOT_YET[case.mode])
    return row


def synthetic_host() -> dict[str, Any]:
    us = {"ffpa_attn_func": 18.6, "ffpa_attn_func impl=ffpa": 19.5, "sdpa": 15.0, "torch.ops.ffpa_attn.forward": 60.0,
          "torch.empty_like(q)": 1.8, "torch.cuda.current_stream().cuda_stream": 7.4, "empty call (lambda: None)": 0.05}
    return {"shape": "B=1, H=1, Nq=1, Nkv=16, D=512, bf16", "calls": 2000, "rounds": 5, "us": us,
            "us_with_sync": dict(us), "dry_run": True}


# --- markdown ---------------------------------------------------------------------------------------


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Compass: ffpa vs PyTorch SDPA — {report.get('gpu')}, {str(report.get('date'))[:10]}",
        "",
        f"Command: `{report.get('command')}`  ",
        f"torch {report.get('torch')} (CUDA {report.get('cuda')}, cuDNN {report.get('cudnn')}), commit "
        f"{report.get('commit')}{' (dirty)' if report.get('dirty') else ''}, library {report.get('library')}.",
        "",
        "ms: GPU time per call (CUDA events, calls queued behind a sleep kernel, inputs rotated beyond 2x L2), median "
        f"of {report['settings']['rounds']} interleaved rounds of {report['settings']['iters']} calls. ffpa: "
        "ffpa_attn_func, default backend (what a patched model runs; `runs` says where it went); impl=ffpa: the "
        "library's kernel alone. TFLOP/s: 4·B·Hq·Nq·Nkv·D, halved for causal with Nq == Nkv, backward 2.5x. rel err: "
        "ffpa against fp32 math on upcast inputs (sampled for large cases).",
        "",
    ]
    if report.get("dry_run"):
        lines += ["**Dry run: synthetic numbers from the model, nothing was measured.**", ""]
    if report.get("aborted"):
        lines += [f"**Aborted: {report['aborted']}**", ""]
    if not report.get("complete", True):
        lines += [f"**Incomplete: {len(report['rows'])} of {report.get('cases_planned')} cases.**", ""]
    head = ["case", "shape", "ffpa ms", "ffpa TFLOP/s", "impl=ffpa ms", "SDPA best ms", "SDPA best", "SDPA default ms",
            "vs best", "vs default", "rel err", "runs / reason"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    host = None
    for r in report["rows"]:
        if r["case"] == "host-us":
            host = r
            continue
        if r.get("error"):
            lines.append(f"| {r['case']} | {r.get('shape', '')} | FAILED: {r['error']} |" + " |" * (len(head) - 3))
            continue
        speed_best = r.get("speedup_vs_sdpa_best")
        speed_default = r.get("speedup_vs_sdpa_default")
        note = r.get("reason") or (r.get("route", "").split(":")[0]) or ""
        cells = [r["case"], r.get("shape", ""), bc.fmt(r.get("ffpa_ms")), bc.fmt(r.get("ffpa_tflops")),
                 bc.fmt(r.get("ffpa_impl_ms")), bc.fmt(r.get("sdpa_best_ms")), r.get("sdpa_best_backend") or "-",
                 bc.fmt(r.get("sdpa_default_ms")), "-" if speed_best is None else f"{speed_best:.2f}x",
                 "-" if speed_default is None else f"{speed_default:.2f}x", bc.fmt_err(r.get("rel_err")),
                 note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    if host:
        lines += ["", f"host-us: ffpa_attn_func {bc.fmt(host.get('ffpa_us'))} µs, impl=ffpa "
                      f"{bc.fmt(host.get('ffpa_impl_us'))} µs, SDPA {bc.fmt(host.get('sdpa_us'))} µs per eager call "
                      "(B=1, H=1, Nq=1, Nkv=16, D=512, bf16)."]
        detail = host.get("detail", {}).get("us", {})
        extra = {k: v for k, v in detail.items() if k not in ("ffpa_attn_func", "ffpa_attn_func impl=ffpa", "sdpa")}
        if extra:
            lines.append("Breakdown: " + ", ".join(f"{k} {v:.2f} µs" for k, v in extra.items()) + ".")
    return "\n".join(lines) + "\n"


# --- command line -------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=parse_patterns, help="comma-separated ids or shell patterns (default: all)")
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK_CASES)} cases, one round")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per case (default 2; 1 with --quick)")
    parser.add_argument("--iters", type=int, default=10, help="timed calls per column and round, >= 10 (default 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before a column's first round (default 3)")
    parser.add_argument("--seed", type=int, default=4321, help="base of the inputs' seeds (default 4321)")
    parser.add_argument("--skip-host-us", action="store_true", help="leave out the host-us row")
    parser.add_argument("--out", help=f"the compass JSON (default {DEFAULT_OUT} in the repository; with --dry-run, "
                                      "none unless given)")
    parser.add_argument("--markdown", metavar="PATH", help="also write a markdown table")
    parser.add_argument("--list", action="store_true", help="print the selected cases and the runtime estimate")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU, no torch: synthetic numbers from the model, to exercise the outputs")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 2
    if args.rounds < 1 or args.warmup < 0:
        parser.error("need --rounds >= 1 and --warmup >= 0")
    if args.iters < 10:
        parser.error("--iters must be at least 10 (the compass's median of at least 10 calls)")
    if args.out is None and not args.dry_run:
        args.out = str(bc.REPO_ROOT / DEFAULT_OUT)
    for option in ("out", "markdown"):
        if error := bc.output_path_error(f"--{option}", getattr(args, option)):
            parser.error(error)
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cases = select_cases(args.cases, args.quick)
    weights = [estimate_seconds(c, args) for c in cases]
    if args.list:
        for c, w in zip(cases, weights):
            not_yet = NOT_YET.get(c.mode)
            mode = f"  ({not_yet.split(' (')[0].split(':')[0]})" if not_yet else ""
            print(f"{c.id:<30} {c.describe():<52} {c.flops() / 1e12:8.2f} TFLOP  ~{w:5.1f} s{mode}")
        total = sum(weights) + host_us_seconds(args)
        print(f"{len(cases)} cases; estimated {total:.0f} s ({total / 60:.1f} min) on an H200, host-us included")
        return 0

    state = bc.git_state()
    report: dict[str, Any] = {"gpu": None, "date": bc.now_utc(), "commit": state["commit"], "torch": None,
                              "dirty": state["dirty"], "tool": "bench/compass.py", "command": bc.command_line(),
                              "settings": {"rounds": args.rounds, "iters": args.iters, "warmup": args.warmup,
                                           "seed": args.seed},
                              "cases_planned": len(cases), "complete": False, "rows": []}
    progress = bc.Progress("compass", weights + ([host_us_seconds(args)] if not args.skip_host_us else []))

    def write(final: bool) -> None:
        if args.out:
            bc.write_json(args.out, report)
        if final and args.markdown:
            bc.write_text(args.markdown, render_markdown(report))

    if args.dry_run:
        rng = random.Random(args.seed)
        report.update(gpu="(dry run)", torch="(dry run)", dry_run=True)
        for case in cases:
            report["rows"].append(synthetic_row(case, args, rng))
            progress.step(case.id, progress_text(report["rows"][-1]))
        if not args.skip_host_us:
            report["rows"].append(host_row(synthetic_host()))
        report["complete"] = True
        write(final=True)
        print(render_markdown(report))
        return 0

    try:
        gpu = bc.GpuSession(patched=False)
    except (ImportError, OSError, RuntimeError) as error:
        print(f"compass: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    status = 0
    try:
        report.update({k: v for k, v in gpu.environment().items() if k not in report or report[k] is None})
        progress.say(f"{report['gpu']}, torch {report['torch']}, library {report['library']}: {len(cases)} cases, "
                     f"estimated {sum(progress.weights):.0f} s")
        for case in cases:
            began = time.monotonic()
            try:
                row = run_case(gpu, case, args)
            except gpu.torch.OutOfMemoryError as error:
                gpu.free()
                row = {**case_row(case), "ffpa_ms": None, "ffpa_tflops": None, "sdpa_best_ms": None,
                       "sdpa_best_backend": None, "sdpa_default_ms": None, "rel_err": None,
                       "reason": f"out of memory: {bc.first_line(error)}", "error": "out of memory"}
            except bc.ContextLost:
                raise
            except Exception as error:  # noqa: BLE001 - one case's failure is its row's
                gpu.check_context()
                message = f"{type(error).__name__}: {bc.first_line(error)}"
                row = {**case_row(case), "ffpa_ms": None, "ffpa_tflops": None, "sdpa_best_ms": None,
                       "sdpa_best_backend": None, "sdpa_default_ms": None, "rel_err": None, "reason": message,
                       "error": message}
            row["seconds"] = time.monotonic() - began
            gpu.free()
            report["rows"].append(row)
            progress.step(case.id, progress_text(row))
            write(final=False)
        if not args.skip_host_us:
            host = gpu.host_us()
            report["rows"].append(host_row(host))
            progress.step("host-us", ", ".join(f"{k} {v:.1f} us" for k, v in host["us"].items()))
        report["complete"] = True
    except bc.ContextLost as error:
        report["aborted"] = str(error)
        print(f"compass: {error}; the rows so far are written", file=sys.stderr)
        status = 3
    finally:
        gpu.close()
    write(final=True)
    print(render_markdown(report))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
