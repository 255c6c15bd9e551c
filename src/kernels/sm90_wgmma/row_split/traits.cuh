// The compile-time shape of a row-split sm90_wgmma kernel (D <= 256: FA3's
// structure, docs/kernels/sm90_small_d_plan.md) and its shared-memory layout.
//
// The CTA tile is kConsumers x 64 query rows; consumer warpgroup w owns rows
// [64 w, 64 w + 64) with all of S (64 x kBlockN) and all of O (64 x the
// instance's columns) in its registers, so no consumer waits for another's
// statistics or P: P stays in S's registers and multiplies V as an RS wgmma's
// A operand (a_fragment.cuh). Every ring stage holds a whole K or V block
// ([kBlockN keys][instance columns], 64-column boxes) and is read by every
// consumer.
//
// The fields Cta<Traits> and Args (cta.cuh, traits.cuh) read are named as in
// the column-split Traits; those a row-split kernel has no use for (P buffers,
// published statistics, exchange, keep bits, code factors) have no bytes.
#pragma once

#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/traits.cuh"

namespace ffpa::detail::sm90_wgmma {

// How a consumer orders its tensor-core work (row_split/kernel.cuh):
// - serial: S_j, its softmax, P_j V_j, one after another;
// - overlap: S_{j+1} and P_j V_j issued together, the softmax of S_{j+1}
//   running while P_j V_j is on the tensor cores (FA3's IntraWGOverlap);
// - ping_pong: overlap, and the consumers take turns issuing their products
//   (two named barriers), so one's softmax runs under the other's products.
// The instances run ping_pong: D 128 on an H100, N 8192, 555 / 580 / 624
// TFLOP/s (docs/kernels/sm90_small_d_plan.md's log); the others stay for the
// next A/B (and are emulated).
enum class RowSchedule : int { serial, overlap, ping_pong };

// kMaskAndSoftcap: whether the kernel carries the user's mask and the
// softcap. Without them (family.hpp's scores_plain: neither, and a positive
// scale) the score scale rides in the exponentials' FFMA instead of a
// multiply a score, and the registers the mask's loads would hold stay free.
template <typename Element_, int kHeadDim_, int kConsumers_ = 2, int kBlockN_ = 128,
          RowSchedule kSchedule_ = RowSchedule::ping_pong, bool kMaskAndSoftcap_ = true>
struct RowSplitTraits {
  using Element = Element_;
  using Operand = Element_;
  static constexpr bool kRowSplit = true;
  static constexpr int kHeadDim = kHeadDim_;  // the instance's columns of Q, K, V and O (TMA zero-fills past D, Dv)
  static constexpr int kConsumers = kConsumers_;
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr RowSchedule kSchedule = kSchedule_;
  static constexpr bool kMaskAndSoftcap = kMaskAndSoftcap_;
  // Named barriers: 2 + w for consumer w's epilogue (row_split/consumer.cuh),
  // kTurnBarrier + w for its turn to issue products (ping_pong),
  // kVClearedBarrier for a sequence's last V block cleared past its keys.
  static constexpr int kTurnBarrier = 2 + kConsumers;
  static constexpr int kVClearedBarrier = kTurnBarrier + kConsumers;
  static_assert(kConsumers == 2 || kConsumers == 3, "two consumers, or three at D <= 64 (family.hpp)");
  static_assert(kVClearedBarrier < 16, "a CTA has 16 named barriers");

  // Not in this layout (the column split's variants).
  static constexpr int kSplit = 1;
  static constexpr bool kFp8 = false, kQkInt8 = false, kDropout = false, kDropoutWarps = false, kMaskInS = false;
  static constexpr KvLoad kKvLoad = KvLoad::boxes;
  static constexpr bool kCacheCodes = false, kPageGroups = false, kGathersPages = false;
  static constexpr int kDropoutThreads = 0;

  static constexpr int kElementBytes = ElementTraits<Element>::kBytes;
  static constexpr int kBoxCols = kSwizzleCols<kElementBytes>;  // columns of a 128-byte swizzle row
  static constexpr int kOutBoxCols = kBoxCols;
  static constexpr int kChunks = kHeadDim / kBoxCols;  // 64-column boxes of a Q, K, V or O row
  static constexpr int kQKChunks = kChunks;            // (Cta::qk_col0)
  static constexpr int kOutCols = kHeadDim;            // (Cta::vo_col0)

  // S of a consumer warp: one 16-row slab, kBlockN / 8 column blocks; O: kHeadDim / 8.
  using SLayout = AccumulatorLayout<1, kBlockN / 8>;
  using OLayout = AccumulatorLayout<1, kHeadDim / 8>;
  // The mask's column blocks in flight (score_mask.cuh's add_mask): the
  // largest divisor of S's blocks up to 8.
  static constexpr int kMaskBlocksInFlight = kBlockN % 64 == 0 ? 8 : kBlockN % 32 == 0 ? 4 : kBlockN % 16 == 0 ? 2 : 1;
  static constexpr bool kMaskPairLoads = true;

  // Registers after setmaxnreg: FA3's splits, 24 + 2 x 240 for two consumers
  // (the launch's 168 a thread of 384), 32 + 3 x 160 for three (128 of 512):
  // all of the register file either way.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static_assert(128 * kProducerRegisters + 128 * kConsumers * kConsumerRegisters <= kThreads * kLaunchRegisters,
                "setmaxnreg redistributes the launch's registers: more would never be granted");

  static constexpr int kTileBytes = 64 * kSwizzleRowBytes;  // [64 rows][128 bytes]: a box of Q or O rows
  static constexpr int kQPartBytes = kChunks * kTileBytes;  // one consumer's Q rows, later its O staging
  static constexpr int kKBoxBytes = kBlockN * kSwizzleRowBytes;  // [kBlockN keys][kBoxCols]
  static constexpr int kStageBytes = kChunks * kKBoxBytes;       // a K or V block
  static constexpr int kKChunkBytes = kKBoxBytes;
  static constexpr int kVChunkBytes = kKBoxBytes;
  static constexpr int kKGroupBytes = kSwizzleAtomBytes;
  static constexpr int kVGroupBytes = kSwizzleAtomBytes;
  static constexpr int kVBoxRows = kBlockN;  // V's TMA box: a whole block

  // Positions of the ring (ring.hpp with one stage a block): K_0, K_1, V_0,
  // K_2, V_1, ...; as many stages as the 227 KB hold beside Q, up to 8.
  static constexpr int kKStages = 1, kVStages = 1;
  static constexpr int kQOffset = 0;
  static constexpr int kRingOffset = kQOffset + kConsumers * kQPartBytes;
  static constexpr int kFixedBytes = 1024;  // tile, sequence, barriers
  static constexpr int kRoomStages = (232448 - kRingOffset - kFixedBytes) / kStageBytes;
  static constexpr int kStages = kRoomStages < 8 ? kRoomStages : 8;
  static constexpr int kPOffset = kRingOffset;  // (no P buffers: P stays in registers)
  static constexpr int kTileOffset = kRingOffset + kStages * kStageBytes;
  static constexpr int kSequenceOffset = kTileOffset + 32;
  static constexpr int kStatsOffset = kSequenceOffset + 32;  // (no published statistics)
  static constexpr int kRowSumOffset = kStatsOffset;
  static constexpr int kKeepOffset = kStatsOffset;
  static constexpr int kCodeFactorsOffset = kStatsOffset;
  static constexpr int kBarrierOffset = kStatsOffset;
  // q_full, full[kFullBarriers], empty[kStages] (and Cta's p_full / p_empty
  // slots, initialized, never waited on). Every consumer takes the ring's
  // positions in the order K_j, V_j, K_{j+1}, V_{j+1} (V_j is the position
  // after K_{j+1}), at most one position out of the producer's order; when
  // it waits for position p it has taken every position before p - 2, and
  // the producer refills a stage only after every consumer has released it,
  // so p - kFullBarriers has landed: any kFullBarriers >= kStages + 2 would
  // do; 16 keeps p % 16 cheap.
  static constexpr int kFullBarriers = 16;
  static_assert(kFullBarriers >= kStages + 2, "see the comment above");
  static constexpr int kEmptyArrivals = 4 * kConsumers;  // a stage is free once every consumer warp has read it
  static constexpr int kKeepBarrier = 1 + kFullBarriers + kStages + 4;
  static constexpr int kBarriers = kKeepBarrier;
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;

  static_assert(kElementBytes == 2, "q, k, v and o are bf16 or fp16");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "O of 64 x kHeadDim in a consumer's registers");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "S's N: a wgmma shape, whole k16 steps of P");
  static_assert(kStages >= 2, "K and V blocks in flight");
  static_assert(kSmemBytes <= 232448, "fits the 227 KB a Hopper block may opt into");
};

}  // namespace ffpa::detail::sm90_wgmma
