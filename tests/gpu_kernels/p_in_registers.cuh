// One warpgroup's S = Q K^T (SS wgmma), P = S rounded to Element and kept in
// the registers S was computed in (a_fragment.cuh), O = P V (RS wgmma): the
// product FA3 calls MmaPV_is_RS. One source for the GPU test
// (test_wgmma_rs.cu) and the emulated one (tests/emulation/
// test_sm90_wgmma_emulated.cpp), which compiles it as host code through the
// emulator's shims.
//
// Shared memory at `base` (1024-byte aligned, 128-byte swizzled rows, as TMA
// writes them): Q [64][64], K [kKeys][64] (K-major: a row a key), then V as
// [kKeys][kValueCols] in 64-column boxes of [kKeys][64] (N-major B:
// kTransposeV; the last box part-filled where kValueCols is not a multiple of
// 64), or V^T [kValueCols][kKeys] (K-major B, kKeys = 64). Thread t
// of the warpgroup writes its accumulators of S and O into s_out [64][kKeys]
// and o_out [64][kValueCols] (row-major floats).
#pragma once

#include <cstdint>

#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/a_fragment.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/wgmma.cuh"

namespace ffpa::testing::p_in_registers {

constexpr int kRows = 64;    // one wgmma's M
constexpr int kDepth = 64;   // Q's and K's columns: one 128-byte row of 16-bit elements
constexpr int kQBytes = kRows * 128;

// Bytes of K, and of V's boxes.
template <int kKeys>
constexpr int kKBytes = kKeys * 128;
template <int kKeys, int kValueCols, bool kTransposeV>
constexpr int kVBytes = kTransposeV ? (kValueCols + 63) / 64 * kKeys * 128 : kValueCols * 128;

// The byte offset of element (row, col) of V in its boxes.
template <int kKeys, bool kTransposeV>
FFPA_HOST_DEVICE uint32_t v_offset(int key, int col) {
  if (kTransposeV) return static_cast<uint32_t>((col / 64) * kKeys * 128) + detail::swizzle128<2>(key, col % 64);
  return detail::swizzle128<2>(col, key);  // V^T: row = column of V
}

// Accumulator i of thread t: its row and column ([64][N] product).
FFPA_HOST_DEVICE int accumulator_row(int t, int i) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((i % 4) / 2); }
FFPA_HOST_DEVICE int accumulator_col(int t, int i) { return 8 * (i / 4) + 2 * (t % 4) + i % 2; }

template <class Element, int kKeys, int kValueCols, bool kTransposeV>
__device__ __forceinline__ void p_in_registers_product(uint32_t base, int thread, float* s_out, float* o_out) {
  using namespace ffpa::detail::sm90_wgmma;
  static_assert(kTransposeV || kKeys == 64, "V^T [kValueCols][kKeys] in one 128-byte row a column");
  const uint32_t q = base, k = base + kQBytes, v = k + kKBytes<kKeys>;
  float s[kKeys / 2];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDepth / 16; ++kk) {
    wgmma_ss<Element, kKeys, false>(s, smem_descriptor(q + kk * 32, 16, 1024), smem_descriptor(k + kk * 32, 16, 1024),
                                    kk != 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(s);
  uint32_t p[kKeys / 16][4];
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    a_fragment_from_accumulators<Element>(s, kk, p[kk]);
    fence_operands(p[kk]);
  }
  float o[kValueCols / 2];
#pragma unroll
  for (int i = 0; i < kValueCols / 2; ++i) o[i] = 12345.0f;  // accumulate = 0 must overwrite it
  fence_operands(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    // N-major V: k16 step kk is 16 key rows (2 KB) on; LBO the 64-column boxes
    // apart. K-major V^T: 32 bytes along its rows.
    const uint64_t desc_v = kTransposeV ? smem_descriptor(v + kk * 16 * 128, kKeys * 128, 1024)
                                        : smem_descriptor(v + kk * 32, 16, 1024);
    wgmma_rs<Element, kValueCols, kTransposeV>(o, p[kk], desc_v, kk != 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(o);
#pragma unroll
  for (int i = 0; i < kKeys / 2; ++i) s_out[accumulator_row(thread, i) * kKeys + accumulator_col(thread, i)] = s[i];
#pragma unroll
  for (int i = 0; i < kValueCols / 2; ++i) {
    o_out[accumulator_row(thread, i) * kValueCols + accumulator_col(thread, i)] = o[i];
  }
}

}  // namespace ffpa::testing::p_in_registers
