// The split-D main loop's tensor-core work on one KV tile: S = Q K^T over the
// head dim (one ring step per 64-column chunk of Q and K) and O += P V (one
// ring step per kPVKeys keys of V), mma.sync m16n8k16 on ldmatrix fragments.
#pragma once

#include "kernels/common/shared_memory.cuh"
#include "kernels/sm80_split_d/cta.cuh"
#include "kernels/sm80_split_d/ptx.cuh"

namespace ffpa::detail::sm80_split_d {

// ldmatrix addresses: a per-thread row offset and swizzled segment (the
// 128-byte swizzle of swizzle.hpp with the row's XOR folded in), XORed with the
// (even) segment of the k16 step, plus compile-time offsets (rows that differ
// by a multiple of 8 share a swizzle). Recomputed where used.
struct LdmatrixOffsets {
  uint32_t q_row, k_row, v_row, p_row;
  int q_segment, k_segment, v_segment;
};

template <class Traits>
__device__ __forceinline__ LdmatrixOffsets ldmatrix_offsets(unsigned tid) {
  const unsigned thread = opaque(tid);
  const int l = thread % 32, w = thread / 32;
  const int segment_half = l / 16, segment_pair = (l / 8) % 2, row8 = l % 8;
  LdmatrixOffsets o;
  o.q_row = ((w / Traits::kWarpsN) * Traits::kWarpRows + l % 16) * 128;
  o.k_row = ((w % Traits::kWarpsN) * Traits::kWarpKeys + row8 + segment_half * 8) * 128;
  o.v_row = (row8 + segment_pair * 8) * 128;
  o.p_row = ((w / Traits::kWarpsN) * Traits::kWarpRows + l % 16) * (Traits::kBlockN * 2);
  o.q_segment = segment_half ^ row8;
  o.k_segment = segment_pair ^ row8;
  o.v_segment = segment_half ^ row8;
  return o;
}

template <class Traits>
__device__ __forceinline__ void Cta<Traits>::compute_s(SAccumulator& s_acc) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt)
      s_acc[mt][nt][0] = s_acc[mt][nt][1] = s_acc[mt][nt][2] = s_acc[mt][nt][3] = 0.0f;
  for (int c = 0; c < n_qk; ++c) {
    advance_ring(/*qk_step=*/true);
    const LdmatrixOffsets offsets = ldmatrix_offsets<Traits>(tid);
    const uint32_t q_tile = smem_address(ring() + slot * Traits::kStageBytes) + offsets.q_row;
    const uint32_t k_tile = q_tile - offsets.q_row + Traits::kQTileBytes + offsets.k_row;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldmatrix_x4(a[mt], q_tile + mt * 16 * 128 + ((offsets.q_segment ^ (2 * kk)) << 4));
#pragma unroll
      for (int nn = 0; nn < Traits::kWarpKeys / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4(b, k_tile + nn * 16 * 128 + ((offsets.k_segment ^ (2 * kk)) << 4));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_f32<Element>(s_acc[mt][2 * nn], a[mt], b[0], b[1]);
          mma_f32<Element>(s_acc[mt][2 * nn + 1], a[mt], b[2], b[3]);
        }
      }
    }
    release_slot();
  }
}

// P V step `step` of the tile: kPVKeys keys of V against P's fragments (from
// registers, or loaded here from shared memory when the warps of a row split
// the keys).
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::accumulate_pv(PFragments& p_frag, OAccumulator& o_acc, int step) {
  constexpr int kPVKeys = Traits::kPVKeys, kBlockN = Traits::kBlockN;
  advance_ring(/*qk_step=*/false);
  const LdmatrixOffsets offsets = ldmatrix_offsets<Traits>(tid);
  constexpr int kStepFrags = kPVKeys / 16;
  const int frag0 = Traits::kSharedP ? 0 : step * kStepFrags;
  if constexpr (Traits::kSharedP) {
    const uint32_t p_rows = smem_address(p_tile()) + offsets.p_row;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kStepFrags; ++kk) {
        const int segment = step * (kPVKeys / 8) + 2 * kk;  // even: its low bits XOR cleanly
        ldmatrix_x4(p_frag[mt][kk], p_rows + mt * 16 * kBlockN * 2 + (segment & ~7) * 16 +
                                          ((offsets.q_segment ^ (segment & 7)) << 4));
      }
  }
  const uint32_t v_slice = smem_address(ring() + slot * Traits::kStageBytes) + offsets.v_row;
#pragma unroll
  for (int nn = 0; nn < Traits::kWarpCols / 16; ++nn) {
    // Columns past D are zero-filled: multiplied, never branched around, so
    // the loop stays one basic block the compiler can software-pipeline.
    const int col = warp_n * Traits::kWarpCols + nn * 16;
    const uint32_t v_sub =
        v_slice + (col / 64) * Traits::kVSubtileBytes + ((offsets.v_segment ^ (2 * (nn % 4))) << 4);
#pragma unroll
    for (int kk = 0; kk < kStepFrags; ++kk) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_sub + kk * 16 * 128);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (Traits::kAccumF16) {
          mma_f16(o_acc[mt][2 * nn], p_frag[mt][frag0 + kk], b[0], b[1]);
          mma_f16(o_acc[mt][2 * nn + 1], p_frag[mt][frag0 + kk], b[2], b[3]);
        } else {
          mma_f32<Element>(o_acc[mt][2 * nn], p_frag[mt][frag0 + kk], b[0], b[1]);
          mma_f32<Element>(o_acc[mt][2 * nn + 1], p_frag[mt][frag0 + kk], b[2], b[3]);
        }
      }
    }
  }
  release_slot();
}

}  // namespace ffpa::detail::sm80_split_d
