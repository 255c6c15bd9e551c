// The compile-time shape of an sm90 backward kernel (arguments.hpp's roles)
// and its shared-memory layout.
#pragma once

#include <cstdint>

#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_backward/arguments.hpp"
#include "kernels/sm90_wgmma/partial_exchange.cuh"

namespace ffpa::detail::sm90_backward {

// kHeadDim: the instance's padded head dim, for D and Dv both (a call's D and
// Dv up to it; TMA zero-fills the columns past each, which add nothing).
// Above 512 a stationary block takes a cluster of two CTAs (kSplit = 2), each
// with half of every operand's columns and of the gradient's: 64 rows x 1024
// gradient columns are 256 KB of fp32, no CTA's registers. Each CTA computes S
// and dP over its half of the head dims, the block's owners add each other's
// partials (sm90_wgmma/partial_exchange.cuh, as the forward's D > 512 tiles
// do), and both form the same W from the same sums.
template <typename Element_, int kHeadDim_, Role kRole_>
struct Traits {
  using Element = Element_;
  static constexpr Role kRole = kRole_;
  static constexpr int kElementBytes = ElementTraits<Element>::kBytes;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kTileRows;  // stationary rows: one wgmma M
  static constexpr int kBlockN = kTileRows;  // rows of a streamed block: S's keys (dq) or query rows
  static constexpr int kThreads = 384;       // a producer warpgroup, two consumers
  static constexpr int kSplit = kHeadDim > 512 ? 2 : 1;  // CTAs of a cluster sharing a stationary block
  static constexpr int kCtaDim = kHeadDim / kSplit;      // columns of every operand and gradient a CTA holds
  static constexpr int kChunks = kCtaDim / 64;  // 128-byte swizzle boxes of a CTA's part of a row
  static constexpr int kTileBytes = 64 * kSwizzleRowBytes;  // [64 rows][64 columns]: every box
  // The rows stay on the stationary side (dq) or the keys (dk, dv).
  static constexpr bool kQueryStationary = kRole == Role::dq;
  // dP = dO V^T (and dS) for dq and dk; dv needs P alone.
  static constexpr bool kWithDp = kRole != Role::dv;
  // Consumer w owns gradient columns [w * kHalfCols, (w + 1) * kHalfCols): 64
  // x kHalfCols fp32 in registers (128 a thread at D = 512, as the forward's O).
  static constexpr int kHalfCols = kCtaDim / 2;
  static constexpr int kHalfTiles = kHalfCols / 64;
  // The ring: stages of two boxes (16 KB), or of a gradient half's three (24
  // KB: the 384 and 768 instances), or of one box (8 KB: 1024, below).
  // Streamed block j takes, in order,
  // the operand of S (K_j, or Q_j; kKStages) and of dP (V_j, or dO_j;
  // kVStages), together its "score part" read by its owner, and a block
  // later the B operand of the product (K_j, Q_j or dO_j), kProductParts
  // stages per consumer with its kHalfCols columns (the "product part":
  // (part 0, consumer 0), (part 0, consumer 1), (part 1, consumer 0), ...).
  // dq and dk load K_j or Q_j twice: the ring cannot hold it from S to the
  // product beside the stationary tiles. 16 KB stages rather than 32: at D
  // 512 the same shared memory holds five instead of two and the producer
  // runs ahead: under ncu dK 18.2 -> 15.9 ms, dQ 17.8 -> 15.2 (their
  // consumers had waited on the ring for 40-48 % of the stall samples), dV
  // 11.1 -> 11.9; bwd-d512 281 -> 301 TFLOP/s (H200, compass).
  // At 1024 the 48 KB that dq and dk left to the ring held three 16 KB
  // stages, of which a consumer holds two while its wgmmas read them: the
  // ring waits were 31 % of dq's stall samples (ncu). One-box stages there
  // (N = 64 products): bwd D 1024 1.08x (H200 A/B; a product part of two
  // adjacent one-box stages, N = 128, 1.06x; one-box stages at 384 and 512
  // lose 10-12 %, in dv at 1024 (sixteen) nothing against its eight 16 KB).
  static constexpr bool kOneBoxStages = kSplit == 2 && kWithDp && kHalfTiles % 2 == 0;
  static constexpr int kStageTiles = kOneBoxStages ? 1 : kHalfTiles % 2 == 0 ? 2 : kHalfTiles;
  static constexpr int kStageBytes = kStageTiles * kTileBytes;
  static constexpr int kKStages = (kChunks + kStageTiles - 1) / kStageTiles;
  static constexpr int kVStages = kWithDp ? kKStages : 0;
  static constexpr int kScoreStages = kKStages + kVStages;  // the ring's "k_stages" (sm90_wgmma/ring.hpp)
  static constexpr int kProductParts = kHalfTiles / kStageTiles;
  static constexpr int kProductStages = 2 * kProductParts;  // the ring's "v_stages"
  // Stationary tiles: Q and dO (dq), K and V (dk), K (dv).
  static constexpr int kStationaryTiles = (kWithDp ? 2 : 1) * kChunks;

  // S and dP of a consumer warp: one 16-row slab, kBlockN / 8 column blocks.
  using ScoreLayout = AccumulatorLayout<1, kBlockN / 8>;
  // kernels/common/score_gradients.cuh's view: a warpgroup's warps each hold
  // 16 rows and every key of the block pair.
  static constexpr int kBlockK = kTileRows;
  static constexpr int kScoreWarpsN = 1;
  static constexpr int kScoreWarpKeys = kTileRows;

  // Registers after setmaxnreg (see sm90_wgmma/traits.cuh: 24 + 2 x 240 is
  // the launch's 168 a thread).
  static constexpr int kLaunchRegisters = 168;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kLaunchRegisters,
                "setmaxnreg redistributes the launch's registers");

  // W_j's buffers ([64][64] each): two, so that the owner of block j may
  // write W_j while the other consumer still reads W_{j-1}; one where its
  // 8 KB is one more ring stage (the one-box stages of dq and dk at 1024:
  // nine instead of eight). With one, the owner of j waits until the owner
  // of j - 1 has read W_{j-1}, which that one began a whole compute_scores
  // earlier (consumer.cuh: publish_w).
  static constexpr int kWBuffers = kOneBoxStages ? 1 : 2;

  // Shared memory: the stationary tiles, the W buffers, (kSplit = 2) the
  // peer's partial S or dP (one at a time), the ring, the plan, barriers.
  static constexpr int kStationaryOffset = 0;
  static constexpr int kWOffset = kStationaryOffset + kStationaryTiles * kTileBytes;
  static constexpr int kExchangeOffset = kWOffset + kWBuffers * kTileBytes;
  // One partial (S or dP: 32 floats a thread) a phase (consumer.cuh's compute_scores).
  static constexpr int kExchangeBytes = kSplit == 2 ? 32 * 4 * 128 : 0;
  static constexpr int kRingOffset = kExchangeOffset + kExchangeBytes;
  static constexpr int kSmemLimit = 232448;
  static constexpr int kFixedTail = 1024;  // the block plan and the barriers
  static constexpr int kFreeStages = (kSmemLimit - kRingOffset - kFixedTail) / kStageBytes;
  // A power of two (cheap p % kFullBarriers): 32, or 64 where the free stages
  // need more (the one-box stages at 1024: 16 + 8 + 9 > 32).
  static constexpr int kFullBarriers = kScoreStages + kProductStages + kFreeStages <= 32 ? 32 : 64;
  // As many as fit, within what the full barriers allow (below).
  static constexpr int kStages = kFreeStages < kFullBarriers - kScoreStages - kProductStages
                                     ? kFreeStages
                                     : kFullBarriers - kScoreStages - kProductStages;
  static constexpr int kPlanOffset = kRingOffset + kStages * kStageBytes;
  static constexpr int kBarrierOffset = kPlanOffset + 128;  // cta.cuh's BlockPlan
  // q_full (the stationary tiles), full[kFullBarriers], empty[kStages],
  // w_full[2], w_empty[2] (the first kWBuffers used), kSplit = 2: x_full,
  // x_empty, x_sent, x_read. As in the forward (sm90_wgmma/kernel.cuh, "Why
  // more full barriers than stages"): a consumer waits for position p only
  // after its previous position q was issued, and p - q <= kScoreStages +
  // kProductStages (from its part of block j - 1's product to block j's), so
  // p - kFull has landed when kFull >= kScoreStages + kProductStages + kStages.
  static_assert(kFullBarriers >= kScoreStages + kProductStages + kStages, "see the full-barrier count above");
  static constexpr int kBarriers = 1 + kFullBarriers + kStages + 4 + (kSplit == 2 ? 4 : 0);
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;

  static_assert(kElementBytes == 2, "q, k, v, dO and the gradients are bf16 or fp16");
  static_assert(kHeadDim % (128 * kSplit) == 0 && kHeadDim >= 128 && kHeadDim <= 1024,
                "gradient halves are whole boxes with N = 64..256");
  static_assert(kExchangeBytes <= sm90_wgmma::PartialExchange::kSlotBytes, "within the exchange's layout");
  static_assert(kHalfTiles % kStageTiles == 0 && kStageTiles <= 3,
                "a consumer's product part is whole stages (N = 64, 128 or 192 wgmmas)");
  // A consumer holds its first product stage while it waits for its second,
  // as may the other consumer: with two stages the producer could not load either.
  static_assert(kStages >= (kProductParts > 1 ? 3 : 2), "the ring holds both consumers' first parts and one more");
  static_assert(kBarrierOffset + kBarriers * 8 <= kPlanOffset + kFixedTail, "barriers within the fixed tail");
  static_assert(kSmemBytes <= kSmemLimit, "fits the 227 KB a Hopper block may opt into");
};

}  // namespace ffpa::detail::sm90_backward
