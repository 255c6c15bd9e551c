// A consumer warpgroup of the row-split kernel (row_split/traits.cuh): tile
// rows [64 w, 64 w + 64) with their S and all of O in registers, and the
// online softmax's running maxima and (this thread's part of the) sums
// beside them. Per KV block j: S_j = Q K_j^T (SS wgmma, K_j from the ring),
// the softmax from the shared pieces (kernels/common: softcap, key limits,
// the user's mask, rescale and exponentials), P_j rounded into A fragments
// in S_j's registers (a_fragment.cuh), O rescaled, O += P_j V_j (RS wgmma).
// The epilogue: each consumer normalizes and stores its own 64 rows.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/score_mask.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/a_fragment.cuh"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/row_split/producer.cuh"
#include "kernels/sm90_wgmma/stage_rows.cuh"
#include "kernels/sm90_wgmma/staged_output.cuh"
#include "kernels/sm90_wgmma/wgmma.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
struct RowSplitConsumer {
  using Element = typename Traits::Element;
  using SLayout = typename Traits::SLayout;
  using OLayout = typename Traits::OLayout;
  static constexpr int kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim, kChunks = Traits::kChunks;
  static constexpr int kStages = Traits::kStages, kTileBytes = Traits::kTileBytes;
  static constexpr int kPSteps = kBlockN / 16;  // k16 steps of P V

  const Cta<Traits>& cta;
  const int w;  // which 64 rows of the tile
  float o_acc[kHeadDim / 2];
  // The running maximum of this thread's rows (log2 domain) and its part of
  // their sums (its columns; the quad's parts are added in the epilogue).
  float row_max[2], row_sum[2];

  __device__ __forceinline__ RowSplitConsumer(const Cta<Traits>& cta_, int w_) : cta(cta_), w(w_) {
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o_acc[i] = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) row_max[h] = -INFINITY, row_sum[h] = 0.0f;
  }

  // Thread coordinates, read where used (lane_id() is not merged across the
  // KV loop, so they hold no registers beside S and O).
  __device__ __forceinline__ static int thread() { return static_cast<int>(threadIdx.x) % 128; }
  // This thread's row h within its consumer's 64 (wgmma accumulator layout),
  // and as a tile row.
  __device__ __forceinline__ static int part_row(int h) { return thread() / 32 * 16 + lane_id() / 4 + 8 * h; }
  __device__ __forceinline__ int row(int h) const { return 64 * w + part_row(h); }
  struct SCoordinates {
    const RowSplitConsumer& consumer;
    __device__ __forceinline__ int row(int r) const { return consumer.row(r); }
  };

  __device__ __forceinline__ uint32_t q_part() const { return cta.q_tiles() + w * Traits::kQPartBytes; }
  __device__ __forceinline__ uint32_t stage_address(int position) const {
    return cta.ring() + (position % kStages) * Traits::kStageBytes;
  }
  // Frees ring position `position`: one arrival per warp once its wgmmas have read it.
  __device__ __forceinline__ void release(int position) const {
    if (lane_id() == 0) mbarrier_arrive(cta.empty(position % kStages));
  }

  __device__ __forceinline__ static int k_position(int j) { return ring_k_position(j, 1, 1); }
  __device__ __forceinline__ int v_position(int j) const { return ring_v_position(j, cta.tile()->kv_blocks, 1, 1); }

  // Issues S_j = Q K_j^T over the instance's columns (one wgmma group; the
  // caller waits for it and releases K_j's stage).
  __device__ __forceinline__ void issue_s(int j, float (&s)[kBlockN / 2]) {
    const int position = k_position(j);
    mbarrier_wait(cta.full(position), cta.full_parity(position));
    const uint32_t k_stage = stage_address(position);
    fence_operands(s);
    wgmma_fence();
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // k16 steps: 32 bytes of a 128-byte row
        const uint64_t q = smem_descriptor(q_part() + c * kTileBytes + kk * 32, 16, 1024);
        const uint64_t k = smem_descriptor(k_stage + c * Traits::kKBoxBytes + kk * 32, 16, 1024);
        wgmma_ss<Element, kBlockN, false>(s, q, k, (c | kk) != 0);
      }
    wgmma_commit();
  }

  __device__ __forceinline__ void compute_s(int j, float (&s)[kBlockN / 2]) {
    issue_s(j, s);
    wgmma_wait<0>();
    fence_operands(s);
    release(k_position(j));
  }

  // The online softmax of S_j in place: S_j becomes P_j (unnormalized, in the
  // running maximum's units); `scale` is the factor O's rows take before
  // P_j V_j is added. Without the mask and the softcap (Traits::
  // kMaskAndSoftcap false: routed so only with a positive scale) S keeps its
  // raw scores and the scale is the factor of the maxima (max commutes with
  // a positive factor) and of the exponentials' FFMA.
  __device__ __forceinline__ void softmax(int j, float (&s)[kBlockN / 2], float (&scale)[2]) {
    const AttentionProblem& p = cta.p;
    const TileCoordinates* tile = cta.tile();
    const int kv0 = cta.block_key(j);
    const int key0 = kv0 + 2 * quad_lane();
    float factor = 1.0f;
    if constexpr (!Traits::kMaskAndSoftcap) {
      factor = cta.score_scale();
    } else if (p.softcap > 0.0f) {
      apply_softcap<SLayout>(s, softcap_factors(p, cta.score_scale()));
    } else {
      const float score_scale = cta.score_scale();
#pragma unroll
      for (int i = 0; i < kBlockN / 2; ++i) s[i] *= score_scale;
    }
    const KeyLimits limits(opaque(cta.sequence())->seq_kv, *opaque(cta.key_bounds()), *tile);
    const SCoordinates coords{*this};
    if (limits.block_needs_masking(kv0, kBlockN)) mask_outside_limits<SLayout>(s, limits, coords, key0);
    if constexpr (Traits::kMaskAndSoftcap) {
      if (p.mask_kind != MaskKind::none) {
        add_mask<SLayout, Traits::kMaskBlocksInFlight, Traits::kMaskPairLoads>(s, p, *tile, coords, key0);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const RowRescale rescale = rescale_row(row_max[h], quad_max(thread_row_max<SLayout>(s, h) * factor));
      row_max[h] = rescale.new_max;
      scale[h] = rescale.scale;
      float block_sum = 0.0f;
      exponentiate_row<SLayout>(s, h, factor, rescale.base, block_sum);  // (factor 1: exp2(s - base), exactly)
      row_sum[h] = row_sum[h] * rescale.scale + block_sum;
    }
  }

  // P_j (S_j after the softmax) rounded into the A fragments of P_j V_j.
  __device__ __forceinline__ static void pack_p(const float (&s)[kBlockN / 2], uint32_t (&p)[kPSteps][4]) {
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) a_fragment_from_accumulators<Element>(s, kk, p[kk]);
  }

  // O's rows times the softmax's factors (skipped where no row of the warp moved its maximum).
  __device__ __forceinline__ void rescale_o(const float (&scale)[2]) {
    if (warp_rescales(scale[0], scale[1])) {
#pragma unroll
      for (int h = 0; h < 2; ++h) scale_row<OLayout>(o_acc, h, scale[h]);
    }
  }

  // Issues O += P_j V_j (one wgmma group; the caller waits for it and
  // releases V_j's stage).
  __device__ __forceinline__ void issue_pv(int j, uint32_t (&p)[kPSteps][4]) {
    const int position = v_position(j);
    mbarrier_wait(cta.full(position), cta.full_parity(position));
    const uint32_t v_stage = stage_address(position);
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) fence_operands(p[kk]);
    fence_operands(o_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      // N-major V: k16 step kk is 16 key rows (2 KB) on; its 64-column boxes
      // a block's keys apart.
      const uint64_t v = smem_descriptor(v_stage + kk * 16 * kSwizzleRowBytes, Traits::kKBoxBytes, 1024);
      wgmma_rs<Element, kHeadDim, true>(o_acc, p[kk], v, 1);
    }
    wgmma_commit();
  }

  // A sequence batch's tile, before P V of its last block j (the only one
  // that can reach past the sequence's keys: set_kv_blocks ends a tile's
  // blocks at the sequence's): V_j's rows past the sequence (another
  // sequence's keys, a batched cache's slots past seqused_k: anything, NaN
  // included, and P = 0 times NaN is NaN) zeroed before any consumer's wgmma
  // reads the stage (stage_rows.cuh). Consumer 0 clears them, both consumers
  // then meet at kVClearedBarrier; both run the same blocks, so both reach it
  // or neither. K needs none: a key past Nkv has its score set to -inf
  // (score_mask.cuh), whatever K holds.
  __device__ __forceinline__ void clear_last_v_block(int j) const {
    if (!cta.p.sequences.active) return;
    const int rows = opaque(cta.sequence()->seq_kv) - cta.block_key(j);
    if (rows >= kBlockN) return;
    const int position = v_position(j);
    mbarrier_wait(cta.full(position), cta.full_parity(position));
    if (w == 0) {
      clear_rows_from<kBlockN, kChunks, Traits::kKBoxBytes>(
          Cta<Traits>::smem() + Traits::kRingOffset + (position % kStages) * Traits::kStageBytes, rows < 0 ? 0 : rows,
          thread(), 2);
    }
    named_barrier_sync(Traits::kVClearedBarrier, 128 * Traits::kConsumers);
  }

  // Waits for S_{j} issued before a P V group (the last one committed).
  __device__ __forceinline__ void finish_s_under_pv(int j, float (&s)[kBlockN / 2]) {
    wgmma_wait<1>();
    fence_operands(s);
    release(k_position(j));
  }

  // Waits for every wgmma of this warpgroup, P_j V_j the last.
  __device__ __forceinline__ void finish_pv(int j) {
    wgmma_wait<0>();
    fence_operands(o_acc);
    release(v_position(j));
  }

  // This thread's rows' ends: the quad's sums added, the head's sink merged.
  __device__ __forceinline__ RowEnd finish(int h) const {
    return finish_row(cta.p, cta.tile()->row_head(row(h)), row_max[h], quad_sum(row_sum[h]), 1.0f);
  }

  // O normalized into this consumer's Q part (its last S has read it), LSE,
  // then a TMA store per 64-column box of its 64 rows (plain stores of the
  // rows inside the sequence where the next rows are another's).
  __device__ __forceinline__ void store_output(const CUtensorMap* o_map) {
    const AttentionProblem& p = cta.p;
    const TileCoordinates* tile = cta.tile();
    const TileSequence* seq = cta.sequence();
    float out_scale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const RowEnd end = finish(h);
      out_scale[h] = end.out_scale;
      const int r = tile->query_row(row(h));
      if (p.lse != nullptr && quad_lane() == 0 && r < seq->seq_q)
        store_lse(p, seq->q_batch, tile->row_head(row(h)), seq->q_begin + r, end.lse);
    }
    unsigned char* const o_part = cta.smem() + Traits::kQOffset + w * Traits::kQPartBytes;
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      const int col = 8 * i + 2 * quad_lane();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t packed = pack2<Element>(o_acc[4 * i + 2 * h] * out_scale[h], o_acc[4 * i + 2 * h + 1] * out_scale[h]);
        *reinterpret_cast<uint32_t*>(o_part + (col / Traits::kOutBoxCols) * kTileBytes +
                                     swizzle128<Traits::kElementBytes>(part_row(h), col % Traits::kOutBoxCols)) =
            output_pair(packed, out_scale[h]);
      }
    }
    fence_proxy_async();
    named_barrier_sync(2 + w, 128);  // the consumer's rows are staged
    if (rows_reach_next_sequence(cta)) {
      store_staged_rows_inside<Traits, kHeadDim>(cta, o_part, 64 * w, 0, thread());  // its 64 rows, every column
      return;
    }
    if (thread() == 0) {
      const PartOrigin at = part_origin(*tile, 64 * w);
      const int value_dim = static_cast<int>(p.dv());
      for (int c = 0; c < kChunks && c * Traits::kOutBoxCols < value_dim; ++c)
        tma_store_4d(o_map, smem_address(o_part + c * kTileBytes), c * Traits::kOutBoxCols, seq->q_begin + at.row,
                     at.head, seq->q_batch);
      tma_store_commit();
      tma_store_wait_read();
    }
  }

  // Split-KV: this consumer's rows' partials (unnormalized O in fp32 and
  // each row's softmax state), what kernels/split_kv/combine.cu merges.
  __device__ __forceinline__ void store_partial() {
    const AttentionProblem& p = cta.p;
    const TileCoordinates* tile = cta.tile();
    const TileSequence* seq = cta.sequence();
    const int value_dim = static_cast<int>(p.dv());
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(row_sum[h]);
      const int i = tile->query_row(row(h));
      if (i >= seq->seq_q) continue;
      const int64_t partial_row = partial_row_index(p, *tile, *seq, tile->row_head(row(h)), i);
      if (quad_lane() == 0) cta.args.partial_states[partial_row] = RowSoftmaxState{row_max[h], sum};
      float* const o_row = cta.args.partial_o + partial_row * value_dim;
#pragma unroll
      for (int k = 0; k < kHeadDim / 8; ++k) {
        const int col = 8 * k + 2 * quad_lane();  // even; Dv is a multiple of 8
        if (col < value_dim) *reinterpret_cast<float2*>(o_row + col) = make_float2(o_acc[4 * k + 2 * h], o_acc[4 * k + 2 * h + 1]);
      }
    }
  }
};

}  // namespace ffpa::detail::sm90_wgmma
