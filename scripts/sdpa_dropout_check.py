#!/usr/bin/env python3
"""GPU check (run on an H200 / any sm80+ GPU with torch 2.11) that
sdpa_dropout_reference.py reproduces the dropout keep-mask of PyTorch's
memory-efficient SDPA forward bit for bit, and the CUDA generator advance.

    python3 sdpa_dropout_gpu_check.py            # all checks (~1 min)
    python3 sdpa_dropout_gpu_check.py --quick    # skip the big 2**32-wrap case

Needs: torch (CUDA build), numpy. python/tests/sdpa_dropout_reference.py is found from the repository root (formerly: next to
this file. Exit code 0 iff every non-INFO check passed.

How the kernel's keep-mask is observed: q = k = 0 makes every score 0, so
P[i, j] = 1 for every attended key; v is one-hot (v[j, d] = 1 iff j - c0 == d)
for a window of D keys starting at c0, so out[i, d] = keep[i, c0+d] * s / l_i
with s = scalar_t(1/(1-p)) and l_i = number of attended keys: out != 0 <=> kept.
Nkv > D is covered with ceil(Nkv/D) calls, each restarting from the same RNG
state. One case uses random q, k (still out != 0 <=> kept) to show the mask
does not depend on the data.
"""

import argparse
import os
import struct
import sys
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "tests")  # the reference
sys.path.insert(0, HERE)
from sdpa_dropout_reference import (  # noqa: E402
    _self_test,
    generator_offset_increment,
    sdpa_mem_efficient_keep_mask,
    sdpa_mem_efficient_uniform_at,
    sdpa_mem_efficient_uniforms,
)

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # very old torch
    SDPBackend = sdpa_kernel = None

DEV = torch.device("cuda")
RESULTS = []  # (status, name, detail)


def record(status, name, detail=""):
    RESULTS.append((status, name, detail))
    print(f"[{status}] {name}" + (f" -- {detail}" if detail else ""), flush=True)


# ----------------------------------------------------------------------------- RNG state helpers
def get_state():
    """(seed, offset) of the current device's CUDA default generator."""
    st = torch.cuda.get_rng_state().cpu().numpy().tobytes()
    seed, off = struct.unpack("<Qq", st[:16])
    return seed, off


def set_state(seed, offset):
    assert offset % 4 == 0
    st = torch.tensor(list(struct.pack("<Qq", seed & (2**64 - 1), offset)), dtype=torch.uint8)
    torch.cuda.set_rng_state(st)
    assert get_state() == (seed & (2**64 - 1), offset)


# ----------------------------------------------------------------------------- SDPA callers
def sdpa_forced_eff(q, k, v, p, causal):
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)


def sdpa_default(q, k, v, p, causal):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)


def sdpa_aten_eff(q, k, v, p, causal):
    out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False, p, causal)
    return out[0]


def extract_keep(call, q, k, B, H, Nq, Nkv, D, dtype, p, causal, seed, offset, v_expand=False, col_windows=None):
    """Observe the kernel's keep-mask through one-hot V windows."""
    keep = np.zeros((B, H, Nq, Nkv), dtype=bool)
    seen = np.zeros((B, H, Nq, Nkv), dtype=bool)
    windows = col_windows if col_windows is not None else list(range(0, Nkv, D))
    for c0 in windows:
        w = min(D, Nkv - c0)
        idx = torch.arange(c0, c0 + w, device=DEV)
        if v_expand:
            v1 = torch.zeros(B, 1, Nkv, D, dtype=dtype, device=DEV)
            v1[:, :, idx, idx - c0] = 1
            v = v1.expand(B, H, Nkv, D)
        else:
            v = torch.zeros(B, H, Nkv, D, dtype=dtype, device=DEV)
            v[:, :, idx, idx - c0] = 1
        set_state(seed, offset)
        o = call(q, k, v, p, causal)
        torch.cuda.synchronize()
        if not torch.isfinite(o).all():
            raise RuntimeError("non-finite output")
        keep[..., c0:c0 + w] = (o[..., :w] != 0).cpu().numpy()
        seen[..., c0:c0 + w] = True
    return keep, seen


def attended(Nq, Nkv, causal):
    if not causal:
        return np.ones((Nq, Nkv), dtype=bool)
    return np.arange(Nkv)[None, :] <= np.arange(Nq)[:, None]   # top-left (SDPA is_causal)


# ----------------------------------------------------------------------------- checks
def check_mask_case(B, H, Nq, Nkv, D, dtype, p, causal, seed, offset, random_qk=False,
                    expand_kv=False, callers=("forced_eff", "aten_eff", "default")):
    name = (f"mask B={B} H={H} Nq={Nq} Nkv={Nkv} D={D} {str(dtype).split('.')[-1]} p={p} "
            f"causal={causal} seed={seed} off={offset}" + (" random_qk" if random_qk else "")
            + (" expanded_kv(headstride0)" if expand_kv else ""))
    g = torch.Generator(device=DEV).manual_seed(seed ^ 0x5A5A)
    if random_qk:
        q = torch.randn(B, H, Nq, D, dtype=dtype, device=DEV, generator=g)
        k = torch.randn(B, H, Nkv, D, dtype=dtype, device=DEV, generator=g)
    else:
        q = torch.zeros(B, H, Nq, D, dtype=dtype, device=DEV)
        k = torch.zeros(B, H, Nkv, D, dtype=dtype, device=DEV)
    if expand_kv:
        k = k[:, :1].expand(B, H, Nkv, D)
    ref = sdpa_mem_efficient_keep_mask(seed, offset, B, H, Nq, Nkv, p)
    att = np.broadcast_to(attended(Nq, Nkv, causal), ref.shape)
    fns = {"forced_eff": sdpa_forced_eff, "aten_eff": sdpa_aten_eff, "default": sdpa_default}
    for cname in callers:
        try:
            got, seen = extract_keep(fns[cname], q, k, B, H, Nq, Nkv, D, dtype, p, causal, seed, offset,
                                     v_expand=expand_kv)
            sel = att & seen
            mism = int(((got != ref) & sel).sum())
            status = "PASS" if mism == 0 else "FAIL"
            if cname == "default":
                choice = torch._fused_sdp_choice(q, k, k, None, p, causal)
                if choice != 2:  # SDPBackend.EFFICIENT_ATTENTION
                    status = "INFO"   # default SDPA did not route to mem-eff for this case
                detail = f"default backend={choice}; "
            else:
                detail = ""
            detail += f"mismatches={mism}/{int(sel.sum())} keep_rate={got[sel].mean():.4f} (1-p={1 - p:.4f})"
            record(status, f"{name} via {cname}", detail)
        except Exception as e:  # noqa: BLE001
            record("FAIL", f"{name} via {cname}", f"exception: {e!r}")
            traceback.print_exc()


def check_seed_offset_and_advance(B, H, Nq, Nkv, D, dtype, p, causal, seed, offset):
    name = f"seed/offset/advance B={B} H={H} Nq={Nq} Nkv={Nkv} D={D} p={p} causal={causal}"
    try:
        q = torch.randn(B, H, Nq, D, dtype=dtype, device=DEV)
        k = torch.randn(B, H, Nkv, D, dtype=dtype, device=DEV)
        v = torch.randn(B, H, Nkv, D, dtype=dtype, device=DEV)
        set_state(seed, offset)
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, False, p, causal)
        s_t, o_t = int(out[2].item()) & (2**64 - 1), int(out[3].item())
        after = get_state()
        inc = generator_offset_increment(B, H, Nq, Nkv, p)
        ok = (s_t == seed) and (o_t == offset) and after == (seed, offset + inc)
        record("PASS" if ok else "FAIL", name + " (aten op returns philox seed/offset; gen advances ceil4(B*H*Nq*Nkv))",
               f"returned=({s_t},{o_t}) expected=({seed},{offset}); gen after={after[1]} expected={offset + inc}")
        # same through F.scaled_dot_product_attention (forced and default routing)
        for cname, fn in (("forced_eff", sdpa_forced_eff), ("default", sdpa_default)):
            set_state(seed, offset)
            fn(q, k, v, p, causal)
            after = get_state()
            choice = torch._fused_sdp_choice(q, k, v, None, p, causal)
            st = "PASS" if after[1] == offset + inc else ("INFO" if cname == "default" and choice != 2 else "FAIL")
            record(st, f"{name} generator advance via {cname}", f"backend={choice} delta={after[1] - offset} expected={inc}")
        # next torch.rand agrees with a generator advanced by hand
        set_state(seed, offset)
        sdpa_forced_eff(q, k, v, p, causal)
        r1 = torch.rand(4099, device=DEV)
        set_state(seed, offset + inc)
        r2 = torch.rand(4099, device=DEV)
        record("PASS" if torch.equal(r1, r2) else "FAIL", f"{name} next torch.rand after SDPA == rand at offset+inc")
        # p == 0: generator untouched
        set_state(seed, offset)
        sdpa_forced_eff(q, k, v, 0.0, causal)
        record("PASS" if get_state() == (seed, offset) else "FAIL", f"{name} p=0 leaves generator untouched",
               f"after={get_state()}")
    except Exception as e:  # noqa: BLE001
        record("FAIL", name, f"exception: {e!r}")
        traceback.print_exc()


def check_manual_seed_end_to_end():
    """The user-facing claim: under torch.manual_seed(s), with nothing else
    drawn, SDPA's mask == reference(seed=s, offset=0); after a torch.rand of n
    elements the offset is whatever the generator says (read, not modelled)."""
    B, H, Nq, Nkv, D, dtype, p = 2, 3, 45, 90, 320, torch.bfloat16, 0.25
    q = torch.zeros(B, H, Nq, D, dtype=dtype, device=DEV)
    k = torch.zeros(B, H, Nkv, D, dtype=dtype, device=DEV)
    idx = torch.arange(Nkv, device=DEV)
    v = torch.zeros(B, H, Nkv, D, dtype=dtype, device=DEV)
    v[:, :, idx, idx] = 1
    for s in (0, 1234, 2**63 + 77):
        torch.manual_seed(s)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        got = (o[..., :Nkv] != 0).cpu().numpy()
        ref = sdpa_mem_efficient_keep_mask(s, 0, B, H, Nq, Nkv, p)
        record("PASS" if np.array_equal(got, ref) else "FAIL",
               f"torch.manual_seed({s}) then default SDPA (D=320) == reference(seed={s}, offset=0)",
               f"mismatches={int((got != ref).sum())}")
        # second call continues from offset ceil4(B*H*Nq*Nkv)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        got = (o[..., :Nkv] != 0).cpu().numpy()
        ref = sdpa_mem_efficient_keep_mask(s, generator_offset_increment(B, H, Nq, Nkv), B, H, Nq, Nkv, p)
        record("PASS" if np.array_equal(got, ref) else "FAIL",
               f"torch.manual_seed({s}); 2nd SDPA call uses offset ceil4(B*H*Nq*Nkv)",
               f"mismatches={int((got != ref).sum())}")


def check_fill_helper(B, H, Nq, Nkv, seed, offset, p=0.5):
    """torch.ops.aten._fill_mem_eff_dropout_mask_ (PyTorch's own test helper, one
    thread per query row, so Nq <= 1024) writes the raw uniforms: compare bits."""
    name = f"_fill_mem_eff_dropout_mask_ uniforms bitwise B={B} H={H} Nq={Nq} Nkv={Nkv} seed={seed} off={offset}"
    try:
        t = torch.empty(B, H, Nq, Nkv, dtype=torch.float32, device=DEV)
        torch.ops.aten._fill_mem_eff_dropout_mask_(t, p, seed if seed < 2**63 else seed - 2**64, offset)
        got = t.cpu().numpy().view(np.uint32)
        ref = sdpa_mem_efficient_uniforms(seed, offset, B, H, Nq, Nkv).view(np.uint32)
        mism = int((got != ref).sum())
        record("PASS" if mism == 0 else "FAIL", name, f"mismatches={mism}/{got.size}")
    except Exception as e:  # noqa: BLE001
        record("INFO", name, f"helper unavailable/failed: {e!r}")


def check_wrap_case():
    """B*H*Nq*Nkv >= 2**32: dropout_batch_head_rng_offset is uint32 in the kernel,
    so with Nq = Nkv = 2**14 head 16 starts at word 16*2**28 = 2**32 -> 0 and
    reuses head 0's draws; the generator still advances by the full 64-bit count."""
    B, H, N, D, dtype, p = 1, 17, 1 << 14, 320, torch.bfloat16, 0.5
    seed, offset = 77, 4 * 1000
    name = f"2**32 wrap B={B} H={H} Nq=Nkv={N} D={D}"
    try:
        q = torch.zeros(B, H, N, D, dtype=dtype, device=DEV)
        k = torch.zeros(B, H, N, D, dtype=dtype, device=DEV)
        rows = np.array([0, 1, 2, 31, 32, 1000, 8191, 8192, N - 2, N - 1])
        heads = (0, 1, 15, 16)
        mism, same, inc_seen = 0, True, None
        for c0 in (0, N - D):
            idx = torch.arange(c0, c0 + D, device=DEV)
            v = torch.zeros(B, H, N, D, dtype=dtype, device=DEV)
            v[:, :, idx, idx - c0] = 1
            set_state(seed, offset)
            o = sdpa_forced_eff(q, k, v, p, False)
            torch.cuda.synchronize()
            inc_seen = get_state()[1] - offset
            got = (o[0][list(heads)][:, torch.as_tensor(rows, device=DEV)] != 0).cpu().numpy()  # [4, rows, D]
            cols = np.arange(c0, c0 + D)
            for hi, h in enumerate(heads):
                u = sdpa_mem_efficient_uniform_at(seed, offset, H, N, N, 0, h, rows[:, None], cols[None, :])
                mism += int(((u > np.float32(p)) != got[hi]).sum())
            full0 = (o[0, 0] != 0)
            full16 = (o[0, 16] != 0)
            same &= bool(torch.equal(full0, full16))
            del o, v, full0, full16
        record("PASS" if mism == 0 else "FAIL", name + " sampled rows vs reference (heads 0,1,15,16)",
               f"mismatches={mism}")
        record("PASS" if same else "FAIL", name + " head 16 reuses head 0's whole mask window (uint32 wrap)")
        exp_inc = generator_offset_increment(B, H, N, N, p)
        record("PASS" if inc_seen == exp_inc else "FAIL", name + " generator advance not wrapped",
               f"delta={inc_seen} expected={exp_inc}")
        del q, k
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        record("FAIL", name, f"exception: {e!r}")
        traceback.print_exc()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the 2**32-wrap case (big tensors)")
    args = ap.parse_args()

    torch.cuda.init()
    print("torch", torch.__version__, "git", getattr(torch.version, "git_version", "?"),
          "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    print("device", torch.cuda.get_device_name(), "cc", torch.cuda.get_device_capability())
    if not torch.__version__.startswith("2.11"):
        print("WARNING: the reference was derived from PyTorch 2.11 sources; this is", torch.__version__)

    record("PASS" if _self_test(verbose=False) else "FAIL", "CPU self-test of the reference (KATs, curand emulation)")

    bf16, fp16 = torch.bfloat16, torch.float16
    cases = [
        # B, H, Nq, Nkv, D, dtype, p, causal, seed, offset
        (1, 1, 1, 1, 320, bf16, 0.5, False, 0, 0),
        (2, 3, 77, 131, 320, bf16, 0.1, False, 1234, 4 * 777),
        (2, 3, 77, 131, 320, fp16, 0.3, True, 42, 8),
        (1, 5, 200, 200, 512, bf16, 0.5, True, 2**64 - 5, 4 * 12345),
        (3, 2, 129, 65, 512, fp16, 0.2, False, 99, 0),
        (1, 2, 70, 700, 320, bf16, 0.15, False, 7, 4 * 3),
        (2, 1, 33, 1000, 1024, bf16, 0.5, True, 31337, 4 * 99991),
        (1, 3, 1, 257, 512, bf16, 0.4, False, 5, 4),
        (2, 2, 300, 37, 320, fp16, 0.75, True, 11, 4 * 5),  # Nq > Nkv, causal top-left
    ]
    for c in cases:
        check_mask_case(*c)
    check_mask_case(1, 2, 64, 256, 320, bf16, 0.5, False, 2024, 16, random_qk=True)
    # Nq == 1 with K/V head stride 0 and no LSE: the kernel's "iterate over heads" path
    check_mask_case(2, 64, 1, 300, 320, bf16, 0.5, False, 3, 4 * 7, expand_kv=True,
                    callers=("forced_eff", "aten_eff"))

    for c in [(2, 3, 77, 131, 320, bf16, 0.1, False, 1234, 4 * 777),
              (1, 1, 3, 3, 512, fp16, 0.5, True, 5, 0),       # 9 elements -> +12
              (3, 5, 33, 47, 320, bf16, 0.2, False, 9, 4 * 11)]:
        check_seed_offset_and_advance(*c)

    check_manual_seed_end_to_end()
    check_fill_helper(2, 3, 77, 131, 1234, 4 * 777)
    check_fill_helper(1, 2, 1000, 333, 2**64 - 3, 4 * 5)

    if not args.quick:
        check_wrap_case()

    n_fail = sum(1 for s, _, _ in RESULTS if s == "FAIL")
    n_pass = sum(1 for s, _, _ in RESULTS if s == "PASS")
    n_info = sum(1 for s, _, _ in RESULTS if s == "INFO")
    print("\n==== SUMMARY ====")
    for s, n, d in RESULTS:
        if s != "PASS":
            print(f"  {s}: {n} {d}")
    print(f"{n_pass} passed, {n_fail} failed" + (f", {n_info} info" if n_info else ""))
    print("OVERALL:", "PASS" if n_fail == 0 else "FAIL")
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
