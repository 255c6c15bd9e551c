// A consumer warpgroup of the sm90_wgmma kernel: its half of O (fp32 in
// registers) and the roles it plays on the KV blocks, each in its own file:
//   mainloop.cuh          S_j = Q K_j^T, and O_w += P_j V_j issued and finished apart;
//   cluster_exchange.cuh  (kSplit = 2) the partial S to and from the peer CTA;
//   softmax.cuh           the online softmax of S_j, P_j and its statistics published;
//   epilogue.cuh          normalize, LSE, O through TMA stores.
// kernel.cuh runs the alternating loop over the blocks.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/quantization_scales.hpp"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/dropout_quad.hpp"
#include "kernels/common/score_mask.cuh"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/partial_exchange.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
struct Consumer {
  using Element = typename Traits::Element;
  using Operand = typename Traits::Operand;  // of the tensor cores
  static constexpr int kStages = Traits::kStages, kKStages = Traits::kKStages;
  static constexpr int kHalfCols = Traits::kHalfCols, kBlockN = Traits::kBlockN;
  static constexpr int kTileBytes = Traits::kTileBytes, kStageBytes = Traits::kStageBytes;
  static constexpr int kBoxCols = Traits::kBoxCols, kElementBytes = Traits::kElementBytes;
  static constexpr int kOperandBytes = Traits::kOperandBytes, kOutBoxCols = Traits::kOutBoxCols;

  const Cta<Traits>& cta;
  const int w;  // which half of O, and which KV blocks (j % 2 == w)
  // Thread coordinates are re-read where used (lane_id() is not CSE'd): kept
  // in registers across the KV loop they would spill next to S and O.
  const int thread, warp, lane, g;
  float o_acc[kHalfCols / 2];
  // Traits::kDropout: the keep bits of S_j's elements (drawn by this S owner,
  // or read from the dropout warps' buffer just before P_j is packed), applied
  // as P_j is packed: bit 2 b + e of word h is column 8 b + 2 t + e of row row(h).
  uint32_t dropout_keep[2];
  // Without dropout warps (Traits::kDropoutWarps) the S owner draws S_j's
  // keep bits while its S wgmmas run. This thread draws quarter t (keys
  // 32t .. 32t + 31 of the block) of rows row(0) and row(1): the 9 Philox
  // blocks from each row's first (the ninth unused when the row starts on a
  // block), spread over the K stages of compute_s, then finish_keep trades
  // the quarters within the quad into dropout_keep.
  static constexpr bool kOwnerDraws = Traits::kDropout && !Traits::kDropoutWarps;
  static constexpr int kKeepDraws = 18;  // 2 rows x 9 Philox blocks
  uint64_t keep_word[2];                 // the stream word of each row's first key of the quarter
  uint32_t keep_low[2], keep_high[2];    // the blocks' keep bits from the first block's first word

  __device__ __forceinline__ Consumer(const Cta<Traits>& cta_, int w_)
      : cta(cta_),
        w(w_),
        thread(threadIdx.x % 128),
        warp(thread / 32),
        lane(thread % 32),
        g(lane / 4) {
#pragma unroll
    for (int i = 0; i < kHalfCols / 2; ++i) o_acc[i] = 0.0f;
    if (quad_lane() == 0) cta.row_sums()[w * 64 + row(0)] = cta.row_sums()[w * 64 + row(1)] = 0.0f;
  }

  // A thread holds rows row(0) and row(1) of S and O (wgmma accumulator layout):
  // element 4 * i + 2 * h + e is row row(h), column 8 * i + 2 * t + e, where
  // t = quad_lane() is read afresh in each phase.
  __device__ __forceinline__ int row(int h) const { return warp * 16 + g + 8 * h; }

  // The block rows of this thread's S registers (accumulator_layout.cuh).
  struct SCoordinates {
    const Consumer& consumer;
    __device__ __forceinline__ int row(int r) const { return consumer.row(r); }
  };

  // The running row maxima are not kept in registers: after block j they are
  // the ones published with P_j (stats), which stay until P_{j+2} is written,
  // and that needs this consumer's P_{j+1} first.
  __device__ __forceinline__ float running_max(int j, int h) const {
    return j < 0 ? -INFINITY : cta.stats()[opaque((j & 1) * 128 + row(h))];
  }

  // Frees ring position `position`: one arrival per warp once its wgmmas have read it.
  __device__ __forceinline__ void release(int position) const {
    if (lane == 0) mbarrier_arrive(cta.empty(position % kStages));
  }

  // Whether block j's S starts at its mask (score_mask.cuh), and whether this
  // CTA loads it: in a cluster the mask is added once, by rank 0's partial S.
  __device__ __forceinline__ bool mask_in_s(int j) const {
    return Traits::kMaskInS && mask_starts_scores(cta.p, cta.block_key(j), kBlockN);
  }
  __device__ __forceinline__ bool loads_mask(int j) const { return split_rank<Traits::kSplit>() == 0 && mask_in_s(j); }

  // Traits::kFp8: tile row r's row among the quantized ones (from the first
  // row of the FP8 launch: Args::first_row_block).
  __device__ __forceinline__ int quantized_row(int r) const {
    return cta.tile()->query_row(r) - cta.args.first_row_block * Traits::kBlockM;
  }
  // Traits::kFp8: the dequantization scales of this thread's S elements of
  // block j (its two rows share a Q group, its keys a K group).
  __device__ __forceinline__ float q_scale() const {
    const TileCoordinates* tile = cta.tile();
    const int64_t head = static_cast<int64_t>(tile->batch) * cta.p.heads_q + tile->head;
    const QkScaleGranularity g =
        cta.args.qk_scale_per_block ? QkScaleGranularity::per_block : QkScaleGranularity::per_thread_group;
    return __ldg(cta.args.q_scales + head * cta.args.q_scales_per_head + q_scale_index(quantized_row(row(0)), g));
  }
  __device__ __forceinline__ float k_scale(int j) const {
    const TileCoordinates* tile = cta.tile();
    const int64_t head = static_cast<int64_t>(tile->batch) * cta.p.heads_kv + tile->kv_head;
    const QkScaleGranularity g =
        cta.args.qk_scale_per_block ? QkScaleGranularity::per_block : QkScaleGranularity::per_thread_group;
    // Key 2t of the block: the thread's K group. A negative scale flags a
    // group with a non-finite value (int8: quantization_scales.hpp).
    return scale_magnitude(
        __ldg(cta.args.k_scales + head * cta.args.k_scales_per_head + k_scale_index(cta.block_key(j) + 2 * quad_lane(), g)));
  }
  // Traits::kFp8: a quantized row's pre-pass term (the LSE's smooth-K shift,
  // or row_nan) of this thread's row h (< Nq); 0 where the pre-pass has none.
  __device__ __forceinline__ float quantized_row_term(const float* terms, int h) const {
    const TileCoordinates* tile = cta.tile();
    const AttentionProblem& p = cta.p;
    return terms == nullptr ? 0.0f
                            : terms[(static_cast<int64_t>(tile->batch) * p.heads_q + tile->row_head(row(h))) *
                                        (p.seq_q - cta.args.first_row_block * Traits::kBlockM) +
                                    quantized_row(row(h))];
  }

  // Traits::kFp8 with V scaled per block: the scale of KV block j (global
  // numbering), and the factor O takes before block j is added (O holds
  // block j - 1's units until then; 1 for the tile's first block).
  __device__ __forceinline__ float v_block_scale(int j) const {
    const TileCoordinates* tile = cta.tile();
    const int64_t head = static_cast<int64_t>(tile->batch) * cta.p.heads_kv + tile->kv_head;
    return __ldg(cta.args.v_scales + head * cta.args.v_scales_per_head + cta.block_key(j) / kBlockN);
  }
  __device__ __forceinline__ float v_unit_change(int j) const {
    if (!Traits::kFp8 || !cta.args.v_scale_per_block || j == 0) return 1.0f;
    return v_block_scale(j - 1) / v_block_scale(j);
  }

  // mainloop.cuh
  __device__ __forceinline__ void start_keep(int j);
  __device__ __forceinline__ void draw_keep(int begin, int end);
  __device__ __forceinline__ void finish_keep();
  // S_j, starting from the mask pairs preload_mask(j, s) loaded where loads_mask(j).
  __device__ __forceinline__ void compute_s(int j, float (&s)[64]);
  __device__ __forceinline__ void clear_v_rows_past_sequence(int j, int key_half, int stage) const;
  __device__ __forceinline__ int issue_pv(int j, bool own);
  __device__ __forceinline__ void finish_pv(int first, int j, bool own);
  __device__ __forceinline__ void accumulate_pv(int j, bool own) { finish_pv(issue_pv(j, own), j, own); }
  // cluster_exchange.cuh
  __device__ __forceinline__ PartialExchange exchange() const;
  __device__ __forceinline__ void send_s(int j, const float (&s)[64]);
  __device__ __forceinline__ void receive_s(int j, float (&s)[64]);
  // softmax.cuh
  __device__ __forceinline__ void preload_mask(int j, float (&s)[64]) const;
  __device__ __forceinline__ void read_dropout_keep(int j);
  // P_j and its statistics published; `scale`: the factor this consumer's O
  // rows take before P_j V_j (rescale_own_o), once P_{j-1} V_{j-1} is in.
  __device__ __forceinline__ void softmax_publish(int j, float (&s)[64], float (&scale)[2]);
  __device__ __forceinline__ void rescale_own_o(int j, const float (&scale)[2]);
  // epilogue.cuh
  __device__ __forceinline__ void store_output(const CUtensorMap* o_map);
  __device__ __forceinline__ void store_partial();
};

}  // namespace ffpa::detail::sm90_wgmma
