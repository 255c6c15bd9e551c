// The consumer's epilogue: both consumers' row sums combined, O normalized
// (and scaled for dropout) into the freed Q region with the 128-byte swizzle,
// LSE from the last published row maxima, then one TMA store per box.
#pragma once

#include "kernels/common/dropout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/consumer.cuh"
#include "kernels/sm90_wgmma/staged_output.cuh"

namespace ffpa::detail::sm90_wgmma {

// Split-KV: this tile's partial rows (its split's keys), unnormalized, in
// fp32, and each row's softmax state (the maximum of the last block's
// statistics, both consumers' sums): what kernels/split_kv/combine.cu merges.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::store_partial() {
  const AttentionProblem& p = cta.p;
  const TileCoordinates* tile = cta.tile();
  named_barrier_sync(1, 256);  // both consumers: every wgmma has retired, the row sums are final
  const int t = quad_lane();
  const TileSequence* seq = cta.sequence();
  const int value_dim = static_cast<int>(p.dv());  // O's columns
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = tile->query_row(row(h));
    if (i >= seq->seq_q) continue;
    const int64_t partial_row = partial_row_index(p, *tile, *seq, tile->row_head(row(h)), i);
    if (split_rank<Traits::kSplit>() == 0 && w == 0 && t == 0) {
      const float* const row_sums = cta.row_sums();
      cta.args.partial_states[partial_row] =
          RowSoftmaxState{running_max(tile->kv_blocks - 1, h), row_sums[row(h)] + row_sums[64 + row(h)]};
    }
    float* const o_row = cta.args.partial_o + partial_row * value_dim;
    // An e4m3 cache's v_descale, before the splits merge (as in the output).
    const float v_factor = Traits::kCacheCodes ? opaque(cta.code_factors())[1] : 1.0f;
#pragma unroll
    for (int k = 0; k < kHalfCols / 8; ++k) {
      const int col = cta.vo_col0() + w * kHalfCols + 8 * k + 2 * t;  // even; Dv is a multiple of 8
      if (col < value_dim) {
        *reinterpret_cast<float2*>(o_row + col) =
            make_float2(o_acc[4 * k + 2 * h] * v_factor, o_acc[4 * k + 2 * h + 1] * v_factor);
      }
    }
  }
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::store_output(const CUtensorMap* o_map) {
  const AttentionProblem& p = cta.p;
  const TileCoordinates* tile = cta.tile();
  named_barrier_sync(1, 256);  // both consumers: every wgmma has retired, Q is free
  const int t = quad_lane();
  const float keep_scale = dropout_keep_scale(p);
  const float* const row_sums = cta.row_sums();
  float out_scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = row_sums[row(h)] + row_sums[64 + row(h)];
    const int head = tile->row_head(row(h));
    const int r = tile->query_row(row(h));
    if constexpr (!Traits::kFp8) {
      // The row's end with its head's sink merged in (common/epilogue.cuh).
      const TileSequence* seq = cta.sequence();
      const RowEnd end = finish_row(p, head, running_max(tile->kv_blocks - 1, h), total, keep_scale);
      out_scale[h] = end.out_scale;
      if constexpr (Traits::kCacheCodes) out_scale[h] *= opaque(cta.code_factors())[1];  // v_descale
      if (p.lse != nullptr && split_rank<Traits::kSplit>() == 0 && w == 0 && t == 0 && r < seq->seq_q)
        store_lse(p, seq->q_batch, head, seq->q_begin + r, end.lse);
      continue;
    }
    out_scale[h] = output_row_scale(total, keep_scale);
    // Traits::kQkInt8: NaN where a non-finite Q or K value reaches the row
    // (the pre-pass's row_nan: int8 codes cannot carry it; e4m3 codes do).
    float row_nan = 0.0f;
    if constexpr (Traits::kQkInt8) {
      if (r < static_cast<int>(p.seq_q)) row_nan = quantized_row_term(cta.args.row_nan, h);
      out_scale[h] += row_nan;
    }
    if (p.lse != nullptr && split_rank<Traits::kSplit>() == 0 && w == 0 && t == 0 && r < static_cast<int>(p.seq_q)) {
      if constexpr (Traits::kFp8) {
        // Row sums count 448 p; K's mean shifted every score of the row alike.
        float lse = row_log_sum_exp(running_max(tile->kv_blocks - 1, h) - kLog2PScale, total) +
                    quantized_row_term(cta.args.lse_shift, h);
        if constexpr (Traits::kQkInt8) lse += row_nan;
        store_lse(p, tile->batch, head, r, lse);
      }
    }
  }
  unsigned char* const o_tiles = cta.smem() + Traits::kQOffset;
  // Traits::kFp8: O is in units of the last block's V scale (per-block V
  // scales), and smooth-V's mean comes back on every row that attends a key.
  [[maybe_unused]] float block_unit = 1.0f;
  [[maybe_unused]] bool attends[2] = {false, false};
  if constexpr (Traits::kFp8) {
    if (cta.args.v_scale_per_block && tile->kv_blocks > 0) block_unit = v_block_scale(tile->kv_blocks - 1);
#pragma unroll
    for (int h = 0; h < 2; ++h) attends[h] = out_scale[h] != 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kHalfCols / 8; ++i) {
    const int col = w * kHalfCols + 8 * i + 2 * t;
    // Traits::kFp8: V's per-channel scales (columns past D read as 1).
    float2 column_scale = make_float2(1.0f, 1.0f), column_mean = make_float2(0.0f, 0.0f);
    if constexpr (Traits::kFp8) {
      const int channel = cta.vo_col0() + col;
      const int64_t kv_row = (static_cast<int64_t>(tile->batch) * p.heads_kv + tile->kv_head) * p.head_dim + channel;
      if (channel < static_cast<int>(p.head_dim)) {
        column_scale = cta.args.v_scale_per_block ? make_float2(block_unit, block_unit)
                                                  : __ldg(reinterpret_cast<const float2*>(cta.args.v_scales + kv_row));
        if (cta.args.v_mean != nullptr) column_mean = __ldg(reinterpret_cast<const float2*>(cta.args.v_mean + kv_row));
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float first = o_acc[4 * i + 2 * h] * out_scale[h] * column_scale.x;
      float second = o_acc[4 * i + 2 * h + 1] * out_scale[h] * column_scale.y;
      if constexpr (Traits::kFp8) {
        if (attends[h]) first += column_mean.x, second += column_mean.y;
      }
      *reinterpret_cast<uint32_t*>(o_tiles + (col / kOutBoxCols) * kTileBytes +
                                   swizzle128<kElementBytes>(row(h), col % kOutBoxCols)) =
          output_pair(pack2<Element>(first, second), out_scale[h]);
    }
  }
  fence_proxy_async();
  named_barrier_sync(2 + w, 128);
  const TileSequence* seq = cta.sequence();
  const int value_dim = static_cast<int>(p.dv());  // O's columns
  if (rows_reach_next_sequence(cta)) {
    store_staged_rows_inside<Traits, kHalfCols>(cta, o_tiles, 0, w * kHalfCols, thread);  // this consumer's half
    return;
  }
  if (thread == 0) {
    for (int box = 0; box < kHalfCols / kOutBoxCols; ++box) {
      const int col = w * kHalfCols + box * kOutBoxCols;  // within this CTA's part of O
      if (cta.vo_col0() + col < value_dim)
        tma_store_4d(o_map, smem_address(o_tiles + (col / kOutBoxCols) * kTileBytes), cta.vo_col0() + col,
                     seq->q_begin + tile->q0, tile->head, seq->q_batch);
    }
    tma_store_commit();
    tma_store_wait_read();
  }
}

}  // namespace ffpa::detail::sm90_wgmma
