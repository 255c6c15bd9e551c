// The compile-time shape of the sm90 backward's dQ kernel (option B's
// Q-stationary kernel, docs/kernels/backward_plan.md) and its shared-memory
// layout.
#pragma once

#include <cstdint>

#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_backward/dq_arguments.hpp"

namespace ffpa::detail::sm90_backward {

// kHeadDim: the instance's padded head dim, for D and Dv both (a call's D and
// Dv up to it; TMA zero-fills the columns past each, which add nothing).
template <typename Element_, int kHeadDim_>
struct DqTraits {
  using Element = Element_;
  static constexpr int kElementBytes = ElementTraits<Element>::kBytes;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kDqTileRows;  // query rows of a CTA: one wgmma M
  static constexpr int kBlockN = 64;   // keys of a KV block: the N of S and dP
  static constexpr int kThreads = 384;  // a producer warpgroup, two consumers
  static constexpr int kChunks = kHeadDim / 64;  // 128-byte swizzle boxes of a row of Q, dO, K or V
  static constexpr int kTileBytes = 64 * kSwizzleRowBytes;  // [64 rows][64 columns]: every box
  // Consumer w owns dQ columns [w * kHalfCols, (w + 1) * kHalfCols): 64 x
  // kHalfCols fp32 in registers (128 a thread at D = 512, as the forward's O).
  static constexpr int kHalfCols = kHeadDim / 2;
  static constexpr int kHalfTiles = kHalfCols / 64;
  // The ring: stages of up to four boxes. Block j takes, in order, K_j for S
  // (kKStages), V_j for dP (kVStages) (together its "score part", read by its
  // owner) and then, a block later, K_j again as dQ's B operand: one stage per
  // consumer with its kHalfCols columns (the "product part"). K_j is loaded
  // twice: the ring cannot hold it from S until dQ beside Q and dO.
  static constexpr int kStageTiles = 4;
  static constexpr int kStageBytes = kStageTiles * kTileBytes;
  static constexpr int kKStages = (kChunks + kStageTiles - 1) / kStageTiles;
  static constexpr int kVStages = kKStages;
  static constexpr int kScoreStages = kKStages + kVStages;  // the ring's "k_stages" (ring.hpp)
  static constexpr int kProductStages = 2;                  // the ring's "v_stages": one per consumer

  // S and dP of a consumer warp: one 16-row slab, kBlockN / 8 column blocks.
  using ScoreLayout = AccumulatorLayout<1, kBlockN / 8>;
  // kernels/common/score_gradients.cuh's view: a warpgroup's warps each hold
  // 16 rows and every key of the block.
  static constexpr int kBlockK = kBlockN;
  static constexpr int kScoreWarpsN = 1;
  static constexpr int kScoreWarpKeys = kBlockN;
  // This consumer's dQ columns: one slab, kHalfCols / 8 column blocks.
  using DqLayout = AccumulatorLayout<1, kHalfCols / 8>;

  // Registers after setmaxnreg (see sm90_wgmma/traits.cuh: 24 + 2 x 240 is
  // the launch's 168 a thread).
  static constexpr int kLaunchRegisters = 168;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kLaunchRegisters,
                "setmaxnreg redistributes the launch's registers");

  // Shared memory: Q and dO (stationary), two dS buffers, the ring, barriers.
  static constexpr int kQOffset = 0;
  static constexpr int kDoOffset = kQOffset + kChunks * kTileBytes;
  static constexpr int kDsOffset = kDoOffset + kChunks * kTileBytes;  // 2 buffers of [64 rows][64 keys]
  static constexpr int kRingOffset = kDsOffset + 2 * kTileBytes;
  static constexpr int kSmemLimit = 232448;
  static constexpr int kFixedTail = 1024;  // tile coordinates and barriers
  static constexpr int kStages = (kSmemLimit - kRingOffset - kFixedTail) / kStageBytes > 4
                                     ? 4
                                     : (kSmemLimit - kRingOffset - kFixedTail) / kStageBytes;
  static constexpr int kTileOffset = kRingOffset + kStages * kStageBytes;
  static constexpr int kBarrierOffset = kTileOffset + 64;
  // q_full, full[kFullBarriers], empty[kStages], ds_full[2], ds_empty[2].
  // As in the forward (sm90_wgmma/kernel.cuh, "Why more full barriers than
  // stages"): a consumer waits for position p only after its previous
  // position q was issued, p - q <= kScoreStages + kProductStages, so p -
  // kFull has landed when kFull >= kScoreStages + kProductStages + kStages.
  static constexpr int kFullBarriers = 16;
  static_assert(kFullBarriers >= kScoreStages + kProductStages + kStages, "see the full-barrier count above");
  static constexpr int kBarriers = 1 + kFullBarriers + kStages + 4;
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;

  static_assert(kElementBytes == 2, "q, k, v, dO and dQ are bf16 or fp16");
  static_assert(kHeadDim % 128 == 0 && kHeadDim >= 128 && kHeadDim <= 512,
                "dQ halves are whole boxes with N = 64..256");
  static_assert(kHalfTiles <= kStageTiles, "a consumer's product part is one stage");
  static_assert(kStages >= 2, "the ring needs two stages at least");
  static_assert(kBarrierOffset + kBarriers * 8 <= kTileOffset + kFixedTail, "barriers within the fixed tail");
  static_assert(kSmemBytes <= kSmemLimit, "fits the 227 KB a Hopper block may opt into");
};


}  // namespace ffpa::detail::sm90_backward
