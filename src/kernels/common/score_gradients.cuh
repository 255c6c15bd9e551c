// The middle of the backward, the same for every family, per block pair
// (query rows of one head x kBlockK keys of one sequence: a dense call's batch
// entry or a sequence batch's sequence): the softmax P recomputed from the
// forward's LSE (the limits, causal alignment, window, mask and dropout of the
// forward, from the shared attention pieces; a sink is in the LSE), then
//   Pd = P z            (z = dropout_scale where kept, 0 where dropped; 1 without dropout)
//   dS = P (z dP - delta)
// written as 16-bit [kBlockQ][kBlockK] tiles (128-byte swizzled rows) for the
// products: Pd^T dO (dV), dS^T Q (dK), dS K (dQ). dS is the gradient of the
// scaled, masked scores; the products' scale is applied in the epilogue.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/backward_problem.hpp"
#include "kernels/common/dropout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/score_mask.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/common/tile_schedule.hpp"

namespace ffpa::detail {

// The tile rows of a score warp's registers (accumulator_layout.cuh).
struct ScoreCoordinates {
  int first_row;  // the warp's first row + g
  __device__ __forceinline__ int row(int r) const { return first_row + 8 * r; }
};

// The coordinates the shared masking pieces read for a block pair: q0 and
// the head of the query rows (no head packing: row_shift covers kBlockQ).
__device__ __forceinline__ TileCoordinates block_pair_tile(int q0, int head, int batch, int kv_head, int block_q) {
  TileCoordinates tile{};
  tile.q0 = q0;
  tile.head = head;
  tile.batch = batch;
  tile.kv_head = kv_head;
  tile.row_shift = log2_of_power_of_two(block_q);
  return tile;
}

// Adds this thread's dS values to the dense fp32 [mask shape] sum of an
// additive mask's gradient: element (b, h, i, j) lands on the mask element it
// read (index 0 along a broadcast dim). Rows past Nq and keys past Nkv add
// nothing; masked and unattended elements have dS = 0.
template <class Layout, class Coordinates>
__device__ __forceinline__ void add_to_mask_gradient(const float (&ds)[Layout::kElements], const AttentionProblem& p,
                                                     const TileCoordinates& tile, const Coordinates& coords, int key0,
                                                     float* sum, const int64_t* shape) {
  const int seq_q = static_cast<int>(p.seq_q), seq_kv = static_cast<int>(p.seq_kv);
  const int64_t b = shape[0] == 1 ? 0 : tile.batch, h = shape[1] == 1 ? 0 : tile.head;
#pragma unroll
  for (int r = 0; r < Layout::kRows; ++r) {
    const int i = tile.query_row(coords.row(r));
    if (i >= seq_q) continue;
    float* const row = sum + ((b * shape[1] + h) * shape[2] + (shape[2] == 1 ? 0 : i)) * shape[3];
#pragma unroll
    for (int c = 0; c < Layout::kColBlocks; ++c)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = key0 + Layout::col_offset(c) + e;
        if (j < seq_kv) atomicAdd(row + (shape[3] == 1 ? 0 : j), ds[Layout::index(r, c, e)]);
      }
  }
}

// ScoreTraits: Element and kElementBytes (the tiles'), kBlockK (keys of the
// pair), ScoreLayout (a score warp's accumulators: accumulator_layout.cuh),
// kScoreWarpsN and kScoreWarpKeys (warp w holds rows 16 (w / kScoreWarpsN)..
// and keys (w % kScoreWarpsN) kScoreWarpKeys..: the mma.sync and wgmma
// accumulator layouts are the same per warp).
// s and dp: this thread's raw Q K^T and dO V^T sums of the pair (ScoreLayout);
// k0 the pair's first key; seq the pair's sequence (its lengths, and where its
// rows lie in lse and delta: delta is [entries][Hq][rows] over q's extent,
// backward_problem.hpp). Writes Pd to pd_tile (when not null) and dS to
// ds_tile, visible to the other warps after the caller's next barrier, and
// adds dS to d_mask_sum (when not null: add_to_mask_gradient). kWithDs =
// false: Pd alone (a dV kernel), dp and delta unread, ds_tile unwritten.
template <class Traits, bool kWithDs = true>
__device__ __forceinline__ void write_score_gradients(float (&s)[Traits::ScoreLayout::kElements],
                                                      const float (&dp)[Traits::ScoreLayout::kElements],
                                                      const AttentionProblem& p, const float* delta,
                                                      const TileCoordinates& tile, const TileSequence& seq, int k0,
                                                      float scale_log2, unsigned char* pd_tile, unsigned char* ds_tile,
                                                      unsigned tid, float* d_mask_sum = nullptr,
                                                      const int64_t* mask_shape = nullptr) {
  using Layout = typename Traits::ScoreLayout;
  using Element = typename Traits::Element;
  const int lane = static_cast<int>(tid % 32), warp = static_cast<int>(tid / 32);
  const int g = lane / 4, t = lane % 4;
  const int warp_row = (warp / Traits::kScoreWarpsN) * 16, warp_key = (warp % Traits::kScoreWarpsN) * Traits::kScoreWarpKeys;
  const ScoreCoordinates coords{warp_row + g};
  const int key0 = k0 + warp_key + 2 * t;

#pragma unroll
  for (int i = 0; i < Layout::kElements; ++i) s[i] *= scale_log2;
  const KeyLimits limits(static_cast<int>(seq.seq_kv), tile_key_bounds(p, tile, seq), tile);
  if (limits.block_needs_masking(k0, Traits::kBlockK)) mask_outside_limits<Layout>(s, limits, coords, key0);
  if (p.mask_kind != MaskKind::none) add_mask<Layout>(s, p, tile, coords, key0);

  // The row's log2-domain LSE and delta; a row past the sequence's Nq, or one
  // that attends no key (LSE -inf), gets +inf: every P of it is exp2(-inf) = 0.
  const int64_t delta_rows = query_extent(p).rows;
  float lse_log2[2], row_delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = tile.query_row(coords.row(r));
    lse_log2[r] = INFINITY;
    row_delta[r] = 0.0f;
    if (i < seq.seq_q) {
      const int64_t row = static_cast<int64_t>(seq.q_begin) + i;
      const float lse = p.lse[seq.q_batch * p.lse_stride[0] + tile.head * p.lse_stride[1] + row * p.lse_stride[2]];
      if (lse != -INFINITY) lse_log2[r] = lse * kLog2e;
      if constexpr (kWithDs) row_delta[r] = delta[(static_cast<int64_t>(seq.q_batch) * p.heads_q + tile.head) * delta_rows + row];
    }
  }

  float pd[Layout::kElements];
#pragma unroll
  for (int i = 0; i < Layout::kElements; ++i) {
    const int r = (i / 2) % 2;
    const float probability = fast_exp2(s[i] - lse_log2[r]);
    pd[i] = probability;
    if constexpr (kWithDs) s[i] = probability * (dp[i] - row_delta[r]);  // dS without dropout
  }
  if (p.dropout_p > 0.0f) {
    // Bit Layout::index(r, b, e) of dropped: whether that element is dropped.
    // The Philox rounds run in a rolled loop (register pressure), the bits are
    // applied in unrolled ones (registers are indexed at compile time only).
    static_assert(Layout::kElements <= 32, "one bit per element in a 32-bit mask");
    const uint64_t head_word = dropout_head_word(p, static_cast<int64_t>(tile.batch) * p.heads_q + tile.head);
    uint32_t dropped = 0;
#pragma unroll 1
    for (int b = 0; b < Layout::kColBlocks; ++b) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const DroppedPair pair = dropped_pair(p, head_word, tile.query_row(coords.row(r)), key0 + 8 * b, t);
        dropped |= (uint32_t{pair.first} | (uint32_t{pair.second} << 1)) << (4 * b + 2 * r);
      }
    }
    const float keep_scale = p.dropout_scale;
#pragma unroll
    for (int i = 0; i < Layout::kElements; ++i) {
      const bool drop = (dropped >> i) & 1;
      const float probability = pd[i];
      pd[i] = drop ? 0.0f : probability * keep_scale;
      if constexpr (kWithDs) s[i] = probability * ((drop ? 0.0f : dp[i] * keep_scale) - row_delta[(i / 2) % 2]);
    }
  }

  if (kWithDs && d_mask_sum != nullptr) add_to_mask_gradient<Layout>(s, p, tile, coords, key0, d_mask_sum, mask_shape);

#pragma unroll
  for (int b = 0; b < Layout::kColBlocks; ++b)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t at = swizzle128<Traits::kElementBytes>(coords.row(r), warp_key + 8 * b + 2 * t);
      if (pd_tile != nullptr)
        *reinterpret_cast<uint32_t*>(pd_tile + at) =
            pack2<Element>(pd[Layout::index(r, b, 0)], pd[Layout::index(r, b, 1)]);
      if constexpr (kWithDs)
        *reinterpret_cast<uint32_t*>(ds_tile + at) = pack2<Element>(s[Layout::index(r, b, 0)], s[Layout::index(r, b, 1)]);
    }
}

}  // namespace ffpa::detail
