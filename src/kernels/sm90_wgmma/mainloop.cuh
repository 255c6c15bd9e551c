// The consumer's tensor-core work: S_j = Q K_j^T (wgmma over the head dim,
// streaming K through the ring) and O_w += P_j V_j[:, half w], issued (wgmma
// groups in flight) and finished apart, so that kSplit = 2 sends its partial S
// while the tensor cores run P_{j-1} V_{j-1}.
#pragma once

#include "kernels/common/online_softmax.cuh"
#include "kernels/sm90_wgmma/consumer.cuh"
#include "kernels/sm90_wgmma/ring.hpp"
#include "kernels/sm90_wgmma/stage_rows.cuh"
#include "kernels/sm90_wgmma/wgmma.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::start_keep(int j) {
  const AttentionProblem& p = cta.p;
  const TileCoordinates* tile = cta.tile();
  const int t = quad_lane();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint64_t head_word =
        dropout_head_word(p, static_cast<int64_t>(tile->batch) * p.heads_q + tile->row_head(row(h)));
    keep_word[h] = dropout_word(head_word, static_cast<uint32_t>(tile->query_row(row(h))),
                                static_cast<uint32_t>(p.seq_kv), static_cast<uint32_t>(cta.block_key(j) + 32 * t));
    keep_low[h] = keep_high[h] = 0;
  }
}

// Draws [begin, end) of the kKeepDraws (row h = d / 9, block m = d % 9): constants
// once compute_s's stage loop is unrolled, so this is straight-line code.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::draw_keep(int begin, int end) {
  const uint32_t threshold = cta.p.dropout_threshold;
#pragma unroll
  for (int d = begin; d < end; ++d) {
    const int h = d / 9, m = d % 9;
    const uint32_t nibble =
        keep_nibble(dropout_block(cta.p.dropout_seed, (keep_word[h] >> 2) + static_cast<uint64_t>(m)), threshold);
    if (m < 8) {
      keep_low[h] |= nibble << (4 * m);
    } else {
      keep_high[h] = nibble;
    }
  }
}

// Each lane's quarter of the rows' 128 keep bits to each lane's pairs (bit
// 2 b + e of dropout_keep[h]: key 8 b + 2t + e), by four shuffles a row.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::finish_keep() {
  const int t = quad_lane();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t keys = keys_from_blocks(keep_low[h], keep_high[h], static_cast<uint32_t>(keep_word[h] & 3));
    uint32_t word = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int source = (t - k) & 3;
      const uint32_t got = __shfl_sync(0xFFFFFFFFu, quad_lane_byte(keys, (t + k) & 3), source, 4);
      word |= got << (8 * source);
    }
    dropout_keep[h] = word;
  }
}

// One k32 (8-bit) or k16 (16-bit) step of S: 32 bytes of each operand row.
// The int8 product accumulates in s32 in S's registers (the softmax converts).
template <class Traits>
__device__ __forceinline__ void s_wgmma(float (&s)[64], uint64_t q, uint64_t k, int accumulate) {
  if constexpr (Traits::kQkInt8) {
    wgmma_ss_s8<128>(reinterpret_cast<int32_t(&)[64]>(s), q, k, accumulate);
  } else if constexpr (Traits::kFp8) {
    wgmma_ss_e4m3<128>(s, q, k, accumulate);
  } else {
    wgmma_ss<typename Traits::Operand, 128, false>(s, q, k, accumulate);
  }
}

// S_j (fp32, 64 x 128; s32 for int8 Q K^T), streaming K_j through the ring.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::compute_s(int j, float (&s)[64]) {
  const int first = ring_k_position(j, kKStages, Traits::kVStages);
  const bool from_mask = loads_mask(j);
  if (from_mask) mask_to_starting_scores<typename Traits::SLayout>(s, cta.p.mask_kind, cta.args.inverse_scale);
  if constexpr (kOwnerDraws) start_keep(j);
  fence_operands(s);
#pragma unroll
  for (int ks = 0; ks < kKStages; ++ks) {
    const int position = first + ks;
    const int stage = position % kStages;
    mbarrier_wait(cta.full(position), cta.full_parity(position));
    wgmma_fence();
    constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
#pragma unroll
    for (int b = 0; b < (ks + 1 < kKStages ? 2 : kLast); ++b)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // k steps of 32 bytes of a 128-byte row
        const uint64_t a = smem_descriptor(cta.q_tiles() + (2 * ks + b) * kTileBytes + kk * 32, 16, 1024);
        const uint64_t k =
            smem_descriptor(cta.ring() + stage * kStageBytes + b * Traits::kKChunkBytes + kk * 32, 16,
                           Traits::kKGroupBytes);
        s_wgmma<Traits>(s, a, k, from_mask || (ks | b | kk) != 0);
      }
    wgmma_commit();
    if constexpr (kOwnerDraws) draw_keep(ks * kKeepDraws / kKStages, (ks + 1) * kKeepDraws / kKStages);
    if (ks > 0) {
      wgmma_wait<1>();
      release(position - 1);
    }
  }
  wgmma_wait<0>();
  fence_operands(s);
  release(first + kKStages - 1);
  if constexpr (Traits::kQkInt8 && !Traits::kScoresAsInt) {
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = static_cast<float>(__float_as_int(s[i]));
  }
  if constexpr (kOwnerDraws) finish_keep();
}

// A sequence's last KV block: the rows of V_j's key half past the sequence
// (another sequence's, or a cache's unused rows) zeroed before the wgmmas read
// this consumer's stage of it (stage_rows.cuh). K needs none: a key past Nkv
// has its score set to -inf (score_mask.cuh), whatever K holds.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::clear_v_rows_past_sequence(int j, int key_half, int stage) const {
  const int rows = opaque(cta.sequence()->seq_kv) - cta.block_key(j) - 64 * key_half;
  if (rows >= 64) return;
  clear_rows_from<64, kHalfCols / kBoxCols, Traits::kVChunkBytes, Traits::kVGroupBytes>(
      Cta<Traits>::smem() + Traits::kRingOffset + stage * kStageBytes, rows < 0 ? 0 : rows, thread, 2 + w);
}

// The owner has already rescaled O; the other consumer rescales by the owner's
// published factors first. Returns the ring position finish_pv frees.
template <class Traits>
__device__ __forceinline__ int Consumer<Traits>::issue_pv(int j, bool own) {
  const int buffer = j & 1;
  mbarrier_wait(cta.p_full(buffer), (j >> 1) & 1);
  if (!own) {
    const int t = quad_lane();
    float scale[2];
    const float unit_change = v_unit_change(j);  // 1 but for per-block V scales
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      scale[h] = cta.stats()[buffer * 128 + 64 + row(h)];
      if (t == 0) cta.row_sums()[w * 64 + row(h)] *= scale[h];
      scale[h] *= unit_change;
    }
    if (warp_rescales(scale[0], scale[1])) {
#pragma unroll
      for (int h = 0; h < 2; ++h) scale_row<typename Traits::OLayout>(o_acc, h, scale[h]);
    }
  }
  // This consumer's part of key half h of V_j is at position first + 2 * h;
  // with 8-bit operands its V^T tile [kHalfCols][128 keys] is at first.
  const int first = ring_v_part_position(j, cta.tile()->kv_blocks, kKStages, 0, w, Traits::kVStages);
  fence_operands(o_acc);
  if constexpr (Traits::kFp8) {
    const int stage = first % kStages;
    mbarrier_wait(cta.full(first), cta.full_parity(first));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // k32 steps: 32 keys of P's and V^T's 128-byte rows
      const uint64_t a = smem_descriptor(cta.p_tiles() + buffer * Traits::kPBytes + kk * 32, 16, 1024);
      const uint64_t v = smem_descriptor(cta.ring() + stage * kStageBytes + kk * 32, 16, 1024);
      wgmma_ss_e4m3<kHalfCols>(o_acc, a, v, 1);
    }
    wgmma_commit();
  } else {
#pragma unroll
    for (int key_half = 0; key_half < 2; ++key_half) {
      const int position = first + 2 * key_half;
      const int stage = position % kStages;
      mbarrier_wait(cta.full(position), cta.full_parity(position));
      if (cta.p.sequences.active) clear_v_rows_past_sequence(j, key_half, stage);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t a =
            smem_descriptor(cta.p_tiles() + buffer * Traits::kPBytes + key_half * kTileBytes + kk * 32, 16, 1024);
        const uint64_t v =
            smem_descriptor(cta.ring() + stage * kStageBytes + kk * 2 * Traits::kVGroupBytes, Traits::kVChunkBytes,
                            Traits::kVGroupBytes);
        wgmma_ss<Operand, kHalfCols, true>(o_acc, a, v, 1);
      }
      wgmma_commit();
      if constexpr (Traits::kCacheCodes) {
        // Key half 0's stage goes back before half 1 is waited for: a stage
        // is then held only until the stage after it is full (not two on),
        // so the converters copy three positions ahead (producer_codes.cuh).
        if (key_half == 0) {
          wgmma_wait<0>();
          fence_operands(o_acc);
          release(position);
        }
      }
    }
  }
  return first;
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::finish_pv(int first, int j, bool own) {
  wgmma_wait<0>();
  fence_operands(o_acc);
  if constexpr (!Traits::kCacheCodes) release(first);  // (an e4m3 cache's: in issue_pv)
  if constexpr (!Traits::kFp8) release(first + 2);
  if (!own && lane == 0) mbarrier_arrive(cta.p_empty(j & 1));
}

}  // namespace ffpa::detail::sm90_wgmma
