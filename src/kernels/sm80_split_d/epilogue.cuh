// The split-D epilogue: row sums over the quad and the warps of a row, O
// normalized (and scaled for dropout) into the freed ring with the 128-byte
// swizzle, LSE, then 16-byte stores of the valid rows and columns.
#pragma once

#include "kernels/common/dropout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm80_split_d/cta.cuh"
#include "kernels/sm80_split_d/ptx.cuh"
#include "kernels/sm80_split_d/softmax.cuh"

namespace ffpa::detail::sm80_split_d {

template <class Traits>
__device__ __forceinline__ void Cta<Traits>::store_output(const OAccumulator& o_acc, const float (&row_max)[kRows],
                                                          float (&row_sum)[kRows]) {
  constexpr int kBlockM = Traits::kBlockM, kElementBytes = Traits::kElementBytes;
  cp_async_wait<0>();
  __syncthreads();  // the ring and the row statistics are free
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_sum[r] = quad_sum(row_sum[r]);
  reduce_across_warps(row_sum, SumOp{});
  const float keep_scale = dropout_keep_scale(p);
  float out_scale[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) out_scale[r] = output_row_scale(row_sum[r], keep_scale);

  if (p.lse != nullptr && split == 0 && warp_n == 0 && t == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = tile.query_row(local_row(r));
      if (i < seq_q) store_lse(p, tile.batch, tile.row_head(local_row(r)), i, row_log_sum_exp(row_max[r], row_sum[r]));
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      float v[4];
      if constexpr (Traits::kAccumF16) {
        const float2 lo = unpack_half2(o_acc[mt][nt][0]), hi = unpack_half2(o_acc[mt][nt][1]);
        v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
      } else {
        v[0] = o_acc[mt][nt][0], v[1] = o_acc[mt][nt][1], v[2] = o_acc[mt][nt][2], v[3] = o_acc[mt][nt][3];
      }
      const int col = warp_n * Traits::kWarpCols + nt * 8 + 2 * t, row = local_row(2 * mt);
      unsigned char* const subtile = ring() + (col / 64) * (kBlockM * Traits::kRowBytes);
      *reinterpret_cast<uint32_t*>(subtile + swizzle128<kElementBytes>(row, col % 64)) =
          pack2<Element>(v[0] * out_scale[2 * mt], v[1] * out_scale[2 * mt]);
      *reinterpret_cast<uint32_t*>(subtile + swizzle128<kElementBytes>(row + 8, col % 64)) =
          pack2<Element>(v[2] * out_scale[2 * mt + 1], v[3] * out_scale[2 * mt + 1]);
    }
  __syncthreads();
  Element* const o_batch = static_cast<Element*>(p.o) + tile.batch * p.o_stride[0];
  for (int s = tid; s < kBlockM * Traits::kOutCols / 8; s += Traits::kThreads) {
    const int subtile = s / (kBlockM * 8), row = (s / 8) % kBlockM, segment = s % 8;
    const int col = subtile * 64 + segment * 8;
    const int i = tile.query_row(row);
    if (i < seq_q && col < out_cols) {
      const uint4 value = *reinterpret_cast<const uint4*>(ring() + subtile * (kBlockM * Traits::kRowBytes) +
                                                          swizzle128<kElementBytes>(row, segment * 8));
      *reinterpret_cast<uint4*>(o_batch + tile.row_head(row) * p.o_stride[1] + static_cast<int64_t>(i) * p.o_stride[2] +
                                dv0 + col) = value;
    }
  }
}

}  // namespace ffpa::detail::sm80_split_d
