// A consumer warpgroup of an sm90 backward kernel: its half of the gradient
// (fp32 in registers) and its roles on the streamed blocks:
//   compute_scores  S_j = Q K^T (and dP_j = dO V^T) of its own blocks (j % 2 == w),
//                   over the whole head dims, one operand stationary, one streamed;
//   publish_w       P_j from the forward's LSE, then W_j = dS_j (dq, dk) or
//                   P_j z (dv) as a 16-bit tile (kernels/common/score_gradients.cuh:
//                   the limits, causal alignment, mask and dropout of the forward);
//   accumulate      G_w += W_j B_j (dq) or W_j^T B_j (dk, dv), every block,
//                   both consumers, B_j this consumer's columns of the block;
//   store           scale, convert, write its rows and columns.
#pragma once

#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/score_gradients.cuh"
#include "kernels/sm90_backward/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/ring.hpp"
#include "kernels/sm90_wgmma/stage_rows.cuh"
#include "kernels/sm90_wgmma/wgmma.cuh"

namespace ffpa::detail::sm90_backward {

template <class Traits>
struct Consumer {
  using Element = typename Traits::Element;
  static constexpr int kStages = Traits::kStages, kTileBytes = Traits::kTileBytes;
  static constexpr int kStageBytes = Traits::kStageBytes, kStageTiles = Traits::kStageTiles;
  static constexpr int kScoreStages = Traits::kScoreStages, kProductStages = Traits::kProductStages;
  static constexpr int kHalfCols = Traits::kHalfCols;

  const Cta<Traits>& cta;
  const int w;  // which half of the gradient, and which streamed blocks (j % 2 == w)
  float acc[kHalfCols / 2];

  __device__ __forceinline__ Consumer(const Cta<Traits>& cta_, int w_) : cta(cta_), w(w_) {
#pragma unroll
    for (int i = 0; i < kHalfCols / 2; ++i) acc[i] = 0.0f;
  }

  __device__ __forceinline__ static int thread() { return static_cast<int>(threadIdx.x % 128); }
  // Frees ring position `position`: one arrival per warp once its wgmmas have read it.
  __device__ __forceinline__ void release(int position) const {
    if (sm90_wgmma::lane_id() == 0) sm90_wgmma::mbarrier_arrive(cta.empty(position % kStages));
  }

  // A sequence batch's streamed block j with fewer than kBlockN rows in its
  // sequence (its last): the rows past it are zeroed before this consumer,
  // the stage's only reader, runs its wgmmas on it (stage_rows.cuh).
  __device__ __forceinline__ void clear_rows_past_sequence(int j, int stage) const {
    if (!cta.p.sequences.active) return;
    const int rows = cta.streamed_rows(j);
    if (rows >= Traits::kBlockN) return;
    sm90_wgmma::clear_rows_from<Traits::kBlockN, kStageTiles, kTileBytes>(
        Cta<Traits>::smem() + Traits::kRingOffset + stage * kStageBytes, rows, thread(), 2 + w);
  }

  // One product over a head dim, S or dP (64 x 64, fp32) from zero: the
  // stationary tiles from `first_tile` against the ring's stages from
  // `position0` (kStageTiles boxes each), both K-major; the query side is A
  // (Q or dO), the key side B (K or V). Each stage is freed once the wgmmas
  // after it are issued and the ones reading it have retired.
  __device__ __forceinline__ void score_product(int j, float (&scores)[32], int first_tile, int position0) {
    constexpr int kOperandStages = Traits::kKStages;
#pragma unroll
    for (int ps = 0; ps < kOperandStages; ++ps) {
      const int position = position0 + ps;
      const int stage = position % kStages;
      sm90_wgmma::mbarrier_wait(cta.full(position), cta.full_parity(position));
      clear_rows_past_sequence(j, stage);
      sm90_wgmma::wgmma_fence();
      constexpr int kLast = Traits::kChunks - kStageTiles * (kOperandStages - 1);
#pragma unroll
      for (int b = 0; b < (ps + 1 < kOperandStages ? kStageTiles : kLast); ++b)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // k16 steps: 32 bytes of a 128-byte row
          const uint32_t fixed = cta.stationary() + (first_tile + kStageTiles * ps + b) * kTileBytes + kk * 32;
          const uint32_t streamed = cta.ring() + stage * kStageBytes + b * kTileBytes + kk * 32;
          const uint64_t a = sm90_wgmma::smem_descriptor(Traits::kQueryStationary ? fixed : streamed, 16, 1024);
          const uint64_t k = sm90_wgmma::smem_descriptor(Traits::kQueryStationary ? streamed : fixed, 16, 1024);
          sm90_wgmma::wgmma_ss<Element, 64, false>(scores, a, k, (ps | b | kk) != 0);
        }
      sm90_wgmma::wgmma_commit();
      if (ps > 0) {
        sm90_wgmma::wgmma_wait<1>();
        release(position - 1);
      }
    }
    sm90_wgmma::wgmma_wait<0>();
    release(position0 + kOperandStages - 1);
  }

  // S_j (and dP_j), streaming block j's score part through the ring. In a
  // cluster (kSplit = 2) the block's owners add each other's partials one at
  // a time through a 16 KB slot (exchange phases 2 j and 2 j + 1; dv: j):
  // S_j goes out as soon as it is complete and comes back while dP_j is
  // computed; dP_j goes out next and comes back after the other consumer's
  // W_{j-1} is added (add_last_partial). The slot's other 16 KB are ring
  // stages (32 KB held S and dP at once before).
  //
  // Both consumers use the one slot and its barriers, whose waits name a
  // phase by its parity: a wait is exact only while the barrier is at most
  // one phase from it. So the phases go in order: block j + 1's first send
  // waits until block j's last has gone out (x_sent), its first read until
  // block j's last has been read (x_read); each consumer's own phases follow
  // its program order. (Without x_sent a consumer could send while the
  // peer had yet to read two phases back, its x_empty wait passing on the
  // older phase.)
  __device__ __forceinline__ void compute_scores(int j, float (&s)[32], float (&dp)[32]) {
    const int first = sm90_wgmma::ring_k_position(j, kScoreStages, kProductStages);
    sm90_wgmma::fence_operands(s);
    score_product(j, s, 0, first);
    sm90_wgmma::fence_operands(s);
    send_partial(j, Partial::s, s);
    if constexpr (Traits::kWithDp) {
      sm90_wgmma::fence_operands(dp);
      score_product(j, dp, Traits::kChunks, first + Traits::kKStages);
      sm90_wgmma::fence_operands(dp);
      add_peer_partial(j, Partial::s, s);
      send_partial(j, Partial::dp, dp);
    }
  }
  // The peer's partial of block j not yet added: dP_j (S_j for dv).
  __device__ __forceinline__ void add_last_partial(int j, float (&s)[32], float (&dp)[32]) const {
    if constexpr (Traits::kWithDp) {
      add_peer_partial(j, Partial::dp, dp);
    } else {
      add_peer_partial(j, Partial::s, s);
    }
  }

  // kSplit = 2: the exchange of block j's partial S or dP (its phase, whether
  // it is the block's first or last, all follow from which): this CTA's
  // partial to the peer's owner of the block, and the peer's added. The reader
  // of a phase announces the next one's bytes (cta.cuh's setup the first), so
  // that x_full takes one arrival a phase whichever consumer reads next.
  enum class Partial { s, dp };
  static constexpr int kExchangePhases = Traits::kWithDp ? 2 : 1;  // S and dP, or S (dv)
  __device__ __forceinline__ static int exchange_phase(int j, Partial which) {
    return kExchangePhases * j + (which == Partial::dp ? 1 : 0);
  }
  __device__ __forceinline__ static bool first_of_block(Partial which) { return which == Partial::s; }
  __device__ __forceinline__ static bool last_of_block(Partial which) {
    return which == Partial::dp || !Traits::kWithDp;
  }
  __device__ __forceinline__ void send_partial(int j, Partial which, const float (&v)[32]) const {
    if constexpr (Traits::kSplit == 2) {
      const sm90_wgmma::PartialExchange x = cta.exchange(thread());
      if (first_of_block(which) && j >= 1) sm90_wgmma::mbarrier_wait(cta.x_sent(), (j - 1) & 1);
      x.wait_slot_free(exchange_phase(j, which));
      x.send(v, 0);
      if (last_of_block(which)) sm90_wgmma::mbarrier_arrive(cta.x_sent());
    }
  }
  __device__ __forceinline__ void add_peer_partial(int j, Partial which, float (&v)[32]) const {
    if constexpr (Traits::kSplit == 2) {
      const sm90_wgmma::PartialExchange x = cta.exchange(thread());
      if (first_of_block(which) && j >= 1) sm90_wgmma::mbarrier_wait(cta.x_read(), (j - 1) & 1);
      x.wait_landed(exchange_phase(j, which));
      x.add(v, 0);
      x.release();
      if (thread() == 0) x.expect(Traits::kExchangeBytes);
      if (last_of_block(which)) sm90_wgmma::mbarrier_arrive(cta.x_read());
    }
  }

  // W_j into buffer j % kWBuffers once what it held has been read: W_{j-2}
  // (two buffers) by the other consumer, or W_{j-1} (one) by its owner, the
  // other consumer; this consumer read either before, in program order. A
  // phase of w_empty per use of a buffer, completed by that reader
  // (accumulate), so the phase waited for is the one before this consumer's.
  __device__ __forceinline__ void publish_w(int j, float (&s)[32], const float (&dp)[32]) {
    constexpr int kWBuffers = Traits::kWBuffers;
    const int buffer = j % kWBuffers;
    if (j >= kWBuffers) sm90_wgmma::mbarrier_wait(cta.w_empty(buffer), (j / kWBuffers - 1) & 1);
    const TileCoordinates tile = cta.block_tile(j);
    const TileSequence& seq = cta.plan()->seq;  // read where used (shared memory)
    const unsigned tid = static_cast<unsigned>(thread());
    if constexpr (Traits::kWithDp) {
      // In a cluster both CTAs form the same dS: rank 0 alone sums it into the mask's gradient.
      write_score_gradients<Traits>(s, dp, cta.p, cta.args.delta, tile, seq, cta.block_key0(j), cta.args.scale_log2,
                                    nullptr, cta.w_tile(buffer), tid, cta.rank() == 0 ? cta.args.d_mask_sum : nullptr,
                                    cta.args.mask_shape);
    } else {
      write_score_gradients<Traits, false>(s, s, cta.p, nullptr, tile, seq, cta.block_key0(j), cta.args.scale_log2,
                                           cta.w_tile(buffer), nullptr, tid);
    }
    sm90_wgmma::fence_proxy_async();
    sm90_wgmma::mbarrier_arrive(cta.w_full(buffer));
  }

  // G_w += W_j B_j: A = W_j ([64 query rows][64 keys]) read K-major (dq: dS
  // rows x keys) or transposed (dk, dv: keys x rows), B = this consumer's
  // product-part stages ([64 rows][kStageTiles x 64 columns] each, N-major),
  // each adding to its columns' slice of acc.
  __device__ __forceinline__ void accumulate(int j, bool own) {
    constexpr int kPartCols = kStageTiles * 64, kPartRegs = kPartCols / 2;
    const int buffer = j % Traits::kWBuffers;
    sm90_wgmma::mbarrier_wait(cta.w_full(buffer), (j / Traits::kWBuffers) & 1);
    const int first =
        sm90_wgmma::ring_v_part_position(j, cta.plan()->blocks, kScoreStages, 0, w, kProductStages);
    sm90_wgmma::fence_operands(acc);
    const uint32_t w_tile = smem_address(cta.w_tile(buffer));
#pragma unroll
    for (int part = 0; part < Traits::kProductParts; ++part) {
      const int position = first + 2 * part;
      const int stage = position % kStages;
      sm90_wgmma::mbarrier_wait(cta.full(position), cta.full_parity(position));
      clear_rows_past_sequence(j, stage);
      sm90_wgmma::wgmma_fence();
      float(&slice)[kPartRegs] = *reinterpret_cast<float(*)[kPartRegs]>(&acc[part * kPartRegs]);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // k16 steps: 16 keys (dq) or 16 query rows (dk, dv)
        const uint64_t a = Traits::kQueryStationary
                               ? sm90_wgmma::smem_descriptor(w_tile + kk * 32, 16, 1024)
                               : sm90_wgmma::smem_descriptor(w_tile + kk * 16 * 128, kTileBytes, 1024);
        const uint64_t b =
            sm90_wgmma::smem_descriptor(cta.ring() + stage * kStageBytes + kk * 16 * 128, kTileBytes, 1024);
        sm90_wgmma::wgmma_ss<Element, kPartCols, true, !Traits::kQueryStationary>(slice, a, b, 1);
      }
      sm90_wgmma::wgmma_commit();
      // The part before has been read once this one's wgmmas are issued and it
      // retired: its stage goes back (bwd D 1024 1.03x, H200 A/B).
      if (part > 0) {
        sm90_wgmma::wgmma_wait<1>();
        release(position - 2);
      }
    }
    sm90_wgmma::wgmma_wait<0>();
    sm90_wgmma::fence_operands(acc);
    release(first + 2 * (Traits::kProductParts - 1));
    // The reader the buffer's next writer does not follow in program order
    // frees it: the other consumer (two buffers), the owner (one: the next
    // writer is the other consumer, which read W_j before its W_{j+1}).
    const bool frees = own == (Traits::kWBuffers == 1);
    if (frees && sm90_wgmma::lane_id() == 0) sm90_wgmma::mbarrier_arrive(cta.w_empty(buffer));
  }

  // The gradient's rows (query rows for dq, keys for dk and dv) and this
  // consumer's columns, times the softmax scale for dQ and dK (dS is the
  // gradient of the scaled scores); rows and columns past the sequence's (a
  // dense call's) are not written: plain stores, as a sequence batch's last
  // block of a sequence must not reach the next sequence's rows (TMA stores
  // would clip at the tensor's end only).
  __device__ __forceinline__ void store() const {
    const AttentionProblem& p = cta.p;
    const BlockPlan* plan = cta.plan();
    const int warp = thread() / 32, lane = thread() % 32, g = lane / 4, t = lane % 4;
    const TileSequence& seq = plan->seq;
    const int row0 = Traits::kQueryStationary ? plan->tile.q0 : plan->key0;
    const int rows = Traits::kQueryStationary ? seq.seq_q : seq.seq_kv;  // of the sequence: never the next one's
    const int cols = static_cast<int>(Traits::kRole == Role::dv ? p.dv() : p.head_dim);
    const int head = Traits::kQueryStationary ? plan->tile.head : plan->tile.kv_head;
    const float scale = Traits::kRole == Role::dv ? 1.0f : p.scale;
    const int batch = Traits::kQueryStationary ? seq.q_batch : seq.kv_batch;
    const int64_t first_row = Traits::kQueryStationary ? seq.q_begin : seq.kv_begin;
    auto* const base = static_cast<Element*>(cta.args.gradient) + batch * cta.args.gradient_stride[0] +
                       static_cast<int64_t>(head) * cta.args.gradient_stride[1] +
                       first_row * cta.args.gradient_stride[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + warp * 16 + g + 8 * h;
      if (row >= rows) continue;
      Element* const out = base + row * cta.args.gradient_stride[2];
#pragma unroll
      for (int i = 0; i < kHalfCols / 8; ++i) {
        const int col = cta.col0() + w * kHalfCols + 8 * i + 2 * t;
        if (col < cols)
          *reinterpret_cast<uint32_t*>(out + col) = pack2<Element>(acc[4 * i + 2 * h] * scale, acc[4 * i + 2 * h + 1] * scale);
      }
    }
  }
};

}  // namespace ffpa::detail::sm90_backward
