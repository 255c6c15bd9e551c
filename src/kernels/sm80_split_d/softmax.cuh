// The split-D online softmax of one KV tile, from the shared attention pieces
// (kernels/common): scale to the log2 domain, mask, row maxima over the quad
// and (warps_n > 1) over the warps that split the row's keys, rescale,
// exponentials, dropout; then P as the A operand of P V.
#pragma once

#include <type_traits>

#include "kernels/common/dropout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/score_mask.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm80_split_d/cta.cuh"

namespace ffpa::detail::sm80_split_d {

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Combines per-row values (already reduced over the 4 threads of a quad) over
// the warps_n warps that share the rows, through row_stat in shared memory;
// a no-op when warps_n == 1. values[r] is tile row local_row(r).
template <class Traits>
template <class Op>
__device__ __forceinline__ void Cta<Traits>::reduce_across_warps(float (&values)[kRows], Op op) {
  if constexpr (Traits::kSharedP) {
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) row_stat()[warp_n * Traits::kBlockM + local_row(r)] = values[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      values[r] = row_stat()[local_row(r)];
#pragma unroll
      for (int wn = 1; wn < Traits::kWarpsN; ++wn)
        values[r] = op(values[r], row_stat()[wn * Traits::kBlockM + local_row(r)]);
    }
  }
}

// s_acc[mt][nt][e] is thread row 2 * mt + e / 2 and key
// kv0 + warp_n * kWarpKeys + 8 * nt + 2t + (e & 1). After the call s_acc holds
// the tile's P (undivided, dropped elements 0), row_sum this thread's partial
// sums, alpha the factor O's rows take.
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::softmax(int kv0, SAccumulator& s_acc, float (&row_max)[kRows],
                                                     float (&row_sum)[kRows], float (&alpha)[kRows]) {
  using Layout = typename Traits::SLayout;
  float(&s)[Layout::kElements] = flat(s_acc);
  const int key0 = kv0 + warp_n * Traits::kWarpKeys + 2 * t;
  if (p.softcap > 0.0f) {
    apply_softcap<Layout>(s, softcap_factors(p, scale_log2));  // capped scores are in the log2 domain
  } else {
#pragma unroll
    for (int i = 0; i < Layout::kElements; ++i) s[i] *= scale_log2;
  }
  const KeyLimits limits(p, tile, seq);
  const SCoordinates coords{*this};
  if (limits.block_needs_masking(kv0, Traits::kBlockN)) mask_outside_limits<Layout>(s, limits, coords, key0);
  if (p.mask_kind != MaskKind::none) add_mask<Layout>(s, p, tile, coords, key0);

  float tile_max[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) tile_max[r] = quad_max(thread_row_max<Layout>(s, r));
  reduce_across_warps(tile_max, MaxOp{});
  float base[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const RowRescale rescale = rescale_row(row_max[r], tile_max[r]);
    base[r] = rescale.base;
    alpha[r] = rescale.scale;
    row_max[r] = rescale.new_max;
    row_sum[r] *= alpha[r];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) exponentiate_row<Layout>(s, r, base[r], row_sum[r]);

  if (p.dropout_p > 0.0f) {
    // Bit 4 * nt + e of dropped[mt] says whether s_acc[mt][nt][e] is dropped.
    // The Philox rounds run in a rolled loop to keep register pressure flat.
    using DropBits = std::conditional_t<(kSTiles * 4 > 32), uint64_t, uint32_t>;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      DropBits dropped = 0;
#pragma unroll 1
      for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // Each row's own head (a tile may pack several: tile_schedule.hpp).
          const int row = local_row(2 * mt + h);
          const uint64_t head_word =
              dropout_head_word(p, static_cast<int64_t>(tile.batch) * p.heads_q + tile.row_head(row));
          const DroppedPair pair = dropped_pair(p, head_word, tile.query_row(row), key0 + nt * 8, t);
          dropped |= (DropBits{pair.first} | (DropBits{pair.second} << 1)) << (4 * nt + 2 * h);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if ((dropped >> (4 * nt + e)) & 1) s_acc[mt][nt][e] = 0.0f;
    }
  }
}

template <class Traits>
__device__ __forceinline__ void Cta<Traits>::rescale_o(OAccumulator& o_acc, const float (&alpha)[kRows]) {
  if constexpr (Traits::kAccumF16) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
        __half2* o = reinterpret_cast<__half2*>(o_acc[mt][nt]);
        o[0] = __hmul2(o[0], __float2half2_rn(alpha[2 * mt]));
        o[1] = __hmul2(o[1], __float2half2_rn(alpha[2 * mt + 1]));
      }
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r) scale_row<typename Traits::OLayout>(flat(o_acc), r, alpha[r]);
  }
}

// P in registers as A fragments (warps_n == 1), or to shared memory for the
// warps that share its rows (visible to them after the barrier of the first
// P V step).
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::write_p(const SAccumulator& s_acc, PFragments& p_frag) {
  if constexpr (Traits::kSharedP) {
    constexpr int kElementBytes = Traits::kElementBytes;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) {
        const int col = warp_n * Traits::kWarpKeys + nt * 8 + 2 * t, row = local_row(2 * mt);
        *reinterpret_cast<uint32_t*>(p_tile() + swizzle128_wide<kElementBytes>(row, col, Traits::kBlockN)) =
            pack2<Element>(s_acc[mt][nt][0], s_acc[mt][nt][1]);
        *reinterpret_cast<uint32_t*>(p_tile() + swizzle128_wide<kElementBytes>(row + 8, col, Traits::kBlockN)) =
            pack2<Element>(s_acc[mt][nt][2], s_acc[mt][nt][3]);
      }
  } else {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int kk = 0; kk < kPFrags; ++kk) {
        p_frag[mt][kk][0] = pack2<Element>(s_acc[mt][2 * kk][0], s_acc[mt][2 * kk][1]);
        p_frag[mt][kk][1] = pack2<Element>(s_acc[mt][2 * kk][2], s_acc[mt][2 * kk][3]);
        p_frag[mt][kk][2] = pack2<Element>(s_acc[mt][2 * kk + 1][0], s_acc[mt][2 * kk + 1][1]);
        p_frag[mt][kk][3] = pack2<Element>(s_acc[mt][2 * kk + 1][2], s_acc[mt][2 * kk + 1][3]);
      }
  }
}

}  // namespace ffpa::detail::sm80_split_d
