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
  if (writes_partials()) {
    store_partial(o_acc, row_max, row_sum);
    return;
  }
  const float keep_scale = dropout_keep_scale(p);
  float out_scale[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const RowEnd end = finish_row(p, tile.row_head(local_row(r)), row_max[r], row_sum[r], keep_scale);
    out_scale[r] = end.out_scale * v_factor;
    const int i = tile.query_row(local_row(r));
    if (p.lse != nullptr && split == 0 && warp_n == 0 && t == 0 && i < seq_q)
      store_lse(p, seq.q_batch, tile.row_head(local_row(r)), seq.q_begin + i, end.lse);
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
          output_pair(pack2<Element>(v[0] * out_scale[2 * mt], v[1] * out_scale[2 * mt]), out_scale[2 * mt]);
      *reinterpret_cast<uint32_t*>(subtile + swizzle128<kElementBytes>(row + 8, col % 64)) = output_pair(
          pack2<Element>(v[2] * out_scale[2 * mt + 1], v[3] * out_scale[2 * mt + 1]), out_scale[2 * mt + 1]);
    }
  __syncthreads();
  Element* const o_batch =
      static_cast<Element*>(p.o) + seq.q_batch * p.o_stride[0] + static_cast<int64_t>(seq.q_begin) * p.o_stride[2];
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

// Split-KV: this split's rows as the combine reads them (split_kv/combine.hpp):
// the softmax state (the log2-domain maximum and the row's sum, reduced over
// the quad and the row's warps) by one thread a row of the first value split,
// and the unnormalized O columns of this value split, fp32 pairs from the
// registers. A split whose keys a row never attends writes max -inf, sum 0
// and zeros.
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::store_partial(const OAccumulator& o_acc, const float (&row_max)[kRows],
                                                           const float (&row_sum)[kRows]) {
  const int64_t value_dim = p.dv();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int local = local_row(r), i = tile.query_row(local);
    if (i >= seq_q) continue;
    const int64_t partial_row = partial_row_index(p, tile, seq, tile.row_head(local), i);
    if (split == 0 && warp_n == 0 && t == 0) args.partial_states[partial_row] = RowSoftmaxState{row_max[r], row_sum[r]};
    float* const o_row = args.partial_o + partial_row * value_dim + dv0;
    const int mt = r / 2, h = r % 2;
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      const int col = warp_n * Traits::kWarpCols + nt * 8 + 2 * t;
      if (col >= out_cols) continue;  // out_cols is a multiple of 8: both columns or neither
      float2 pair;
      if constexpr (Traits::kAccumF16) {
        pair = unpack_half2(o_acc[mt][nt][h]);
      } else {
        pair = make_float2(o_acc[mt][nt][2 * h], o_acc[mt][nt][2 * h + 1]);
      }
      pair.x *= v_factor, pair.y *= v_factor;  // an e4m3 cache's V descale, before the splits merge
      *reinterpret_cast<float2*>(o_row + col) = pair;
    }
  }
}

}  // namespace ffpa::detail::sm80_split_d
