// O staged in shared memory, stored row by row where a TMA store of whole
// boxes would overwrite another sequence's rows: a sequence's last row block
// in packed q (TMA clips at the tensor's end only). Used by both CTA
// layouts' epilogues (epilogue.cuh, row_split/consumer.cuh).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/cta.cuh"

namespace ffpa::detail::sm90_wgmma {

// Whether the tile's rows run past its sequence into the next one's in packed q.
template <class Traits>
__device__ __forceinline__ bool rows_reach_next_sequence(const Cta<Traits>& cta) {
  const TileCoordinates* tile = cta.tile();
  return cta.p.sequences.packed_q() && tile->q0 + (1 << tile->row_shift) > cta.sequence()->seq_q;
}

// 64 staged rows of kCols staged columns from col0 (boxes of [64 rows]
// [kOutBoxCols], 128-byte swizzle, kTileBytes apart: staged row r is tile row
// first_row + r, staged column c is O's column cta.vo_col0() + c) to global
// memory, the rows inside the tile's sequence and the columns below Dv only,
// 16 bytes a thread at a time by the 128 threads of a warpgroup (`thread`
// its index).
template <class Traits, int kCols>
__device__ __forceinline__ void store_staged_rows_inside(const Cta<Traits>& cta, const unsigned char* staged,
                                                         int first_row, int col0, int thread) {
  using Element = typename Traits::Element;
  const AttentionProblem& p = cta.p;
  const TileCoordinates* tile = cta.tile();
  const TileSequence* seq = cta.sequence();
  const int value_dim = static_cast<int>(p.dv());
  constexpr int kSegments = kCols / 8;  // 16-byte segments of a row's kCols columns
  for (int item = thread; item < 64 * kSegments; item += 128) {
    const int r = item / kSegments, col = col0 + (item % kSegments) * 8;
    const int i = tile->query_row(first_row + r);
    if (i >= seq->seq_q || cta.vo_col0() + col >= value_dim) continue;
    const uint4 value = *reinterpret_cast<const uint4*>(staged + (col / Traits::kOutBoxCols) * Traits::kTileBytes +
                                                        swizzle128<Traits::kElementBytes>(r, col % Traits::kOutBoxCols));
    Element* const out = static_cast<Element*>(p.o) + seq->q_batch * p.o_stride[0] +
                         tile->row_head(first_row + r) * p.o_stride[1] +
                         static_cast<int64_t>(seq->q_begin + i) * p.o_stride[2];
    *reinterpret_cast<uint4*>(out + cta.vo_col0() + col) = value;
  }
}

}  // namespace ffpa::detail::sm90_wgmma
