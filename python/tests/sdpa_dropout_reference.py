#!/usr/bin/env python3
"""CPU reference for the dropout keep-mask of PyTorch 2.11's memory-efficient
SDPA forward (CUTLASS "mem_eff_attention", AttentionKernel in
aten/src/ATen/native/transformers/cuda/mem_eff_attention/kernel_forward.h).

Pure Python + numpy; no torch needed. See sdpa_dropout.md (same folder) for the
source citations. Summary of the rule implemented here:

  * host: (seed, offset) = CUDA default generator's (seed, philox_offset)
    *before* the call; the generator then advances by
    ceil4(B*H*Nq*Nkv) (64-bit, no wrap)          -> generator_offset_increment()
  * element (b, h, i, j) of the [B, H, Nq, Nkv] attention matrix uses the
    32-bit Philox4x32-10 output word number

        W = offset + ((b*H*Nq*Nkv + h*Nq*Nkv) mod 2**32) + ((i*Nkv + j) mod 2**32)

    of the curand stream with key = seed, subsequence 0, i.e.
        ctr   = (lo32(W//4), hi32(W//4), 0, 0), key = (lo32(seed), hi32(seed))
        x     = Philox4x32_10(ctr, key)[W % 4]
  * u = float32(x) * 2**-32 + 2**-33   (float32 arithmetic, curand_uniform)
  * keep  <=>  u > float32(dropout_p)
  * kept P entries are multiplied by scalar_t(float32(1.0 / (1.0 - double(float32(p)))))

The mapping does not depend on the kernel's tile shape (kQueriesPerBlock /
kKeysPerBlock / thread count): every thread skips ahead to the exact linear
position of its first element and then draws consecutive words. The self test
below checks this by emulating the kernel's per-thread loop for several tile
configurations.

The one exception: if Nq*Nkv > 2**32 the in-head term wraps per *thread start*
and the mapping becomes tile dependent; that case raises NotImplementedError.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

MASK32 = 0xFFFFFFFF
PHILOX_W32_0 = 0x9E3779B9
PHILOX_W32_1 = 0xBB67AE85
PHILOX_M4x32_0 = 0xD2511F53
PHILOX_M4x32_1 = 0xCD9E8D57

_F32_2POW32_INV = np.float32(2.0 ** -32)   # CURAND_2POW32_INV (2.3283064e-10f == 2**-32 exactly)
_F32_2POW33_INV = np.float32(2.0 ** -33)   # CURAND_2POW32_INV / 2.0f


# ----------------------------------------------------------------------------
# Philox4x32-10, exactly as curand_philox4x32_x.h (== Random123 philox4x32_10)
# ----------------------------------------------------------------------------
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Vectorised Philox4x32-10. All inputs: ints or integer numpy arrays with
    values in [0, 2**32). Returns a tuple of 4 uint32 numpy arrays."""
    c0 = np.asarray(c0, dtype=np.uint64)
    c1 = np.asarray(c1, dtype=np.uint64)
    c2 = np.asarray(c2, dtype=np.uint64)
    c3 = np.asarray(c3, dtype=np.uint64)
    k0 = np.asarray(k0, dtype=np.uint64)
    k1 = np.asarray(k1, dtype=np.uint64)
    m0 = np.uint64(PHILOX_M4x32_0)
    m1 = np.uint64(PHILOX_M4x32_1)
    w0 = np.uint64(PHILOX_W32_0)
    w1 = np.uint64(PHILOX_W32_1)
    mask = np.uint64(MASK32)
    s32 = np.uint64(32)
    for rnd in range(10):
        if rnd:
            k0 = (k0 + w0) & mask
            k1 = (k1 + w1) & mask
        p0 = m0 * c0              # < 2**64, exact in uint64
        p1 = m1 * c2
        hi0, lo0 = p0 >> s32, p0 & mask
        hi1, lo1 = p1 >> s32, p1 & mask
        # ret = {hi1^ctr.y^key.x, lo1, hi0^ctr.w^key.y, lo0}
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return tuple(np.asarray(v, dtype=np.uint32) for v in (c0, c1, c2, c3))


def curand_uniform_from_u32(x):
    """_curand_uniform(unsigned int x) = x * CURAND_2POW32_INV + CURAND_2POW32_INV/2.0f
    in float32 (the product is exact, so FMA contraction cannot change it).
    Result in (0, 1]."""
    xf = np.asarray(x, dtype=np.uint32).astype(np.float32)   # cvt.rn.f32.u32
    return (xf * _F32_2POW32_INV) + _F32_2POW33_INV


def philox_words(seed, first_word, count):
    """`count` consecutive 32-bit words of curand's Philox stream (subsequence 0)
    starting at absolute word index `first_word` (= curand_init offset)."""
    seed = int(seed) & ((1 << 64) - 1)
    first_word = int(first_word)
    if count <= 0:
        return np.zeros(0, dtype=np.uint32)
    c_first = first_word >> 2
    c_last = (first_word + count - 1) >> 2
    ctr = np.arange(c_first, c_last + 1, dtype=np.uint64)   # 64-bit counter (ctr.x, ctr.y)
    assert c_last < (1 << 64)
    out = philox4x32_10(ctr & np.uint64(MASK32), ctr >> np.uint64(32), 0, 0,
                        seed & MASK32, seed >> 32)
    words = np.stack(out, axis=-1).reshape(-1)               # x, y, z, w per counter
    lane0 = first_word & 3
    return words[lane0:lane0 + count]


# ----------------------------------------------------------------------------
# The SDPA mem-efficient mapping
# ----------------------------------------------------------------------------
def generator_offset_increment(B, H, Nq, Nkv, dropout_p=0.5):
    """How far torch's CUDA default generator (philox_offset_per_thread) advances
    in one _efficient_attention_forward call (attention.cu:
    gen->philox_cuda_state(B * num_heads * M * N); CUDAGeneratorState::increase
    rounds up to a multiple of 4). 0 when dropout_p == 0 (use_dropout false:
    the generator is not touched)."""
    if float(dropout_p) == 0.0:
        return 0
    n = int(B) * int(H) * int(Nq) * int(Nkv)
    return ((n + 3) // 4) * 4


def batch_head_word_base(b, h, H, Nq, Nkv):
    """dropout_batch_head_rng_offset (kernel_forward.h:206-209): computed in
    32-bit unsigned arithmetic (blockIdx.z/.y are unsigned, the factors int32),
    so it wraps mod 2**32 before being widened to unsigned long long."""
    return (b * H * Nq * Nkv + h * Nq * Nkv) & MASK32


def _check_shape(Nq, Nkv):
    if int(Nq) * int(Nkv) > (1 << 32):
        raise NotImplementedError(
            "Nq*Nkv > 2**32: the kernel computes (query_start+thread_i)*num_keys"
            "+(iter_key_start+thread_start_j) in uint32, so the in-head index wraps "
            "at a thread-start granularity that depends on the tile config")


def sdpa_mem_efficient_uniforms(seed, offset, B, H, Nq, Nkv):
    """float32 uniforms u[b, h, i, j] in (0, 1] the kernel compares with p.
    (These are also exactly what torch.ops.aten._fill_mem_eff_dropout_mask_
    writes, as long as B*H*Nq*Nkv < 2**31.)"""
    _check_shape(Nq, Nkv)
    out = np.empty((B, H, Nq, Nkv), dtype=np.float32)
    mn = Nq * Nkv
    for b in range(B):
        for h in range(H):
            w0 = int(offset) + batch_head_word_base(b, h, H, Nq, Nkv)
            out[b, h] = curand_uniform_from_u32(philox_words(seed, w0, mn)).reshape(Nq, Nkv)
    return out


def sdpa_mem_efficient_keep_mask(seed, offset, B, H, Nq, Nkv, p):
    """bool keep-mask [B, H, Nq, Nkv] (True = kept) that PyTorch 2.11's
    mem-efficient SDPA forward draws for philox (seed, offset), where offset is
    the CUDA generator's offset *before* the call. Causal masking does not change
    the draw (masked entries are zero anyway)."""
    u = sdpa_mem_efficient_uniforms(seed, offset, B, H, Nq, Nkv)
    return u > np.float32(p)


def sdpa_mem_efficient_uniform_at(seed, offset, H, Nq, Nkv, b, h, i, j):
    """Uniform for arbitrary (broadcastable) index arrays b, h, i, j.
    Useful to spot-check huge shapes without materialising the full mask."""
    _check_shape(Nq, Nkv)
    b, h, i, j = np.broadcast_arrays(*(np.asarray(a, dtype=np.int64) for a in (b, h, i, j)))
    base = (b.astype(np.uint64) * np.uint64(H * Nq * Nkv) + h.astype(np.uint64) * np.uint64(Nq * Nkv)) \
        & np.uint64(MASK32)
    w = np.uint64(offset) + base + (i.astype(np.uint64) * np.uint64(Nkv) + j.astype(np.uint64))
    ctr = w >> np.uint64(2)
    lane = (w & np.uint64(3)).astype(np.int64)
    seed = int(seed) & ((1 << 64) - 1)
    outs = np.stack(philox4x32_10(ctr & np.uint64(MASK32), ctr >> np.uint64(32), 0, 0,
                                  seed & MASK32, seed >> 32), axis=-1)
    x = np.take_along_axis(outs, lane[..., None], axis=-1)[..., 0]
    return curand_uniform_from_u32(x)


def dropout_scale(p, dtype="bf16"):
    """The factor kept entries of P (already rounded to scalar_t in smem) are
    multiplied by: static_cast<scalar_t>(float(1.0 / (1.0 - (double)float(p)))).
    Returns it as a Python float (the exact scalar_t value)."""
    pf = float(np.float32(p))
    s = np.float32(1.0 / (1.0 - pf))
    if dtype in ("fp16", "half", "float16"):
        return float(np.float16(s))
    if dtype in ("bf16", "bfloat16"):
        return float(_round_to_bf16(s))
    if dtype in ("fp32", "float32"):
        return float(s)
    raise ValueError(dtype)


def _round_to_bf16(x):
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return (b << np.uint64(16)).astype(np.uint32).view(np.float32)


# ----------------------------------------------------------------------------
# Stateful emulation of curand (curand_kernel.h) + the kernel's thread loop.
# Only used by the self test, to show the closed form above is what the kernel
# computes, for any tile configuration.
# ----------------------------------------------------------------------------
class _CurandPhilox:
    """curandStatePhilox4_32_10 with curand_init / skipahead / curand4 copied
    from curand_kernel.h + curand_philox4x32_x.h (CUDA 13.0), including the
    exact carry logic of Philox_State_Incr(s, n)."""

    def __init__(self, seed, subsequence, offset):
        self.ctr = [0, 0, 0, 0]
        self.key = (seed & MASK32, (seed >> 32) & MASK32)
        self.STATE = 0
        self._skipahead_sequence(subsequence)
        self.skipahead(offset)

    def copy(self):
        o = object.__new__(_CurandPhilox)
        o.ctr, o.key, o.STATE, o.output = list(self.ctr), self.key, self.STATE, self.output
        return o

    def _gen(self):
        self.output = tuple(int(v) for v in philox4x32_10(*self.ctr, *self.key))

    def _incr_n(self, n):  # Philox_State_Incr(s, n)
        nlo, nhi = n & MASK32, (n >> 32) & MASK32
        c = self.ctr
        c[0] = (c[0] + nlo) & MASK32
        if c[0] < nlo:
            nhi = (nhi + 1) & MASK32
        c[1] = (c[1] + nhi) & MASK32
        if nhi <= c[1]:
            return
        c[2] = (c[2] + 1) & MASK32
        if c[2]:
            return
        c[3] = (c[3] + 1) & MASK32

    def _incr1(self):  # Philox_State_Incr(s)
        c = self.ctr
        for k in range(4):
            c[k] = (c[k] + 1) & MASK32
            if c[k]:
                return

    def _skipahead_sequence(self, n):  # Philox_State_Incr_hi
        nlo, nhi = n & MASK32, (n >> 32) & MASK32
        c = self.ctr
        c[2] = (c[2] + nlo) & MASK32
        if c[2] < nlo:
            nhi = (nhi + 1) & MASK32
        c[3] = (c[3] + nhi) & MASK32
        self._gen()

    def skipahead(self, n):
        self.STATE += n & 3
        n //= 4
        if self.STATE > 3:
            n += 1
            self.STATE -= 4
        self._incr_n(n)
        self._gen()

    def curand4(self):
        tmp = self.output
        self._incr1()
        self._gen()
        s, o = self.STATE, self.output
        return (tmp + o)[s:s + 4]


def _emulate_kernel_uniforms(seed, offset, B, H, Nq, Nkv, kQ, kK, nthreads):
    """Literal transcription of kernel_forward.h's dropout code path for an
    AttentionKernel<..., kQueriesPerBlock=kQ, kKeysPerBlock=kK> launched with
    `nthreads` threads (non-causal: causal only shortens the key loop)."""
    out = np.full((B, H, Nq, Nkv), np.nan, dtype=np.float32)
    for b, h in itertools.product(range(B), range(H)):
        base = batch_head_word_base(b, h, H, Nq, Nkv)
        init = _CurandPhilox(seed, 0, offset + base)
        for query_start in range(0, Nq, kQ):
            m = min(kQ, Nq - query_start)
            for iter_key_start in range(0, Nkv, kK):
                n = min(kK, Nkv - iter_key_start)
                threads_per_row = min(nthreads // m, n)
                elts = -(-(-(-n // threads_per_row)) // 4) * 4     # round_nearest(ceil_div, 4)
                for tid in range(nthreads):
                    ti, tj = tid // threads_per_row, (tid % threads_per_row) * elts
                    if not (ti < m and tj < n):
                        continue
                    st = init.copy()
                    st.skipahead(((query_start + ti) * Nkv + (iter_key_start + tj)) & MASK32)
                    for c in range(tj, min(tj + elts, n), 4):
                        quad = curand_uniform_from_u32(np.array(st.curand4(), dtype=np.uint32))
                        for q in range(4):
                            if c + q < n:  # columns >= n are padding in smem
                                out[b, h, query_start + ti, iter_key_start + c + q] = quad[q]
    return out


# ----------------------------------------------------------------------------
def _self_test(verbose=True):
    ok = True

    def check(name, cond):
        nonlocal ok
        ok &= bool(cond)
        if verbose:
            print(("PASS " if cond else "FAIL ") + name)

    # 1. Random123 known-answer tests for Philox4x32-10 (also reproduced by
    #    calling curand_Philox4x32_10 from the CUDA 13.0 header on the host).
    kat = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((MASK32,) * 4, (MASK32, MASK32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for ctr, key, exp in kat:
        got = tuple(int(v) for v in philox4x32_10(*ctr, *key))
        check("philox4x32_10 KAT ctr=%s key=%s" % ([hex(c) for c in ctr], [hex(k) for k in key]),
              got == exp)

    # 2. curand_uniform conversion edge cases.
    u = curand_uniform_from_u32(np.array([0, 1, 0xFFFFFFFF, 0x80000000, (1 << 24) + 1], dtype=np.uint32))
    check("uniform(0) == 2**-33", u[0] == np.float32(2.0 ** -33))
    check("uniform(1) == 1.5*2**-32", u[1] == np.float32(1.5 * 2.0 ** -32))
    check("uniform(2**32-1) == 1.0 (range is (0,1])", u[2] == np.float32(1.0))
    check("uniform(2**31) == 0.5 + 2**-33 rounded", u[3] == np.float32(0.5) + np.float32(2.0 ** -33))
    check("uniform(2**24+1): u32->f32 rounds to nearest even",
          u[4] == np.float32(2.0 ** 24) * np.float32(2.0 ** -32) + np.float32(2.0 ** -33))

    # 3. curand stream semantics: words from skipahead/curand4 == closed form.
    for seed, off in [(0, 0), (42, 4), (2 ** 64 - 1, 123456788), (0x1234_5678_9ABC_DEF0, (1 << 34) + 8)]:
        for extra in [0, 1, 2, 3, 5, 4097]:
            st = _CurandPhilox(seed, 0, off)
            st.skipahead(extra)
            got = st.curand4() + st.curand4()
            exp = tuple(int(v) for v in philox_words(seed, off + extra, 8))
            check("curand skipahead+curand4 == linear word stream (seed=%d off=%d +%d)" % (seed, off, extra),
                  got == exp)

    # 4. The kernel's per-thread loop (any tile config) == closed form.
    shapes = [(1, 1, 5, 7), (2, 3, 33, 130), (1, 2, 70, 257), (2, 1, 3, 1)]
    tiles = [(32, 128, 128), (64, 64, 128), (64, 128, 256)]   # (kQ, kK, threads) of the sm80 cutlassF kernels
    for (B, H, Nq, Nkv), (kQ, kK, nt) in itertools.product(shapes, tiles):
        seed, off = 1234567 + Nq, 4 * Nkv
        ref = sdpa_mem_efficient_uniforms(seed, off, B, H, Nq, Nkv)
        emu = _emulate_kernel_uniforms(seed, off, B, H, Nq, Nkv, kQ, kK, nt)
        check("kernel thread-loop emulation == closed form, shape=%s tile=%s" % ((B, H, Nq, Nkv), (kQ, kK, nt)),
              np.array_equal(ref.view(np.uint32), emu.view(np.uint32)))

    # 5. uniform_at agrees with the full-tensor version; keep-mask statistics.
    B, H, Nq, Nkv = 2, 3, 17, 29
    full = sdpa_mem_efficient_uniforms(99, 8, B, H, Nq, Nkv)
    bb, hh, ii, jj = np.meshgrid(*(np.arange(n) for n in (B, H, Nq, Nkv)), indexing="ij")
    check("uniform_at == uniforms", np.array_equal(full, sdpa_mem_efficient_uniform_at(99, 8, H, Nq, Nkv, bb, hh, ii, jj)))
    m = sdpa_mem_efficient_keep_mask(0, 0, 2, 4, 128, 256, 0.25)
    check("keep rate ~ 0.75 (got %.4f)" % m.mean(), abs(m.mean() - 0.75) < 0.01)

    # 6. Batch/head base wraps mod 2**32 (B*H*Nq*Nkv >= 2**32): with Nq=Nkv=2**14
    #    head 16 of batch 0 starts at word 16*2**28 = 2**32 -> wraps to 0, so
    #    it reuses head 0's draws.
    H, N = 17, 1 << 14
    i = np.arange(0, N, 997)[:, None]
    j = np.arange(0, N, 991)[None, :]
    u0 = sdpa_mem_efficient_uniform_at(5, 0, H, N, N, 0, 0, i, j)
    u16 = sdpa_mem_efficient_uniform_at(5, 0, H, N, N, 0, 16, i, j)
    u1 = sdpa_mem_efficient_uniform_at(5, 0, H, N, N, 0, 1, i, j)
    check("32-bit wrap of dropout_batch_head_rng_offset: head16 == head0 for N=2**14", np.array_equal(u0, u16))
    check("heads 0 and 1 differ", not np.array_equal(u0, u1))
    check("generator increment is not wrapped: %d" % generator_offset_increment(1, H, N, N),
          generator_offset_increment(1, H, N, N) == 17 * (1 << 28))
    check("generator increment rounds up to 4", generator_offset_increment(1, 1, 3, 3) == 12
          and generator_offset_increment(1, 1, 3, 3, 0.0) == 0)

    # 7. dropout scale rounding.
    check("bf16 scale for p=0.1 is 1.109375", dropout_scale(0.1, "bf16") == 1.109375)
    check("fp16 scale for p=0.1 is 1.111328125", dropout_scale(0.1, "fp16") == 1.111328125)

    print("SELF-TEST:", "ALL PASS" if ok else "FAILURES")
    return ok


if __name__ == "__main__":
    sys.exit(0 if _self_test() else 1)
