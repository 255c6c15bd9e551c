// The compile-time shape of the portable backward kernels (sm80 .. sm120,
// mma.sync) and their launch arguments. docs/kernels/backward_plan.md, option
// C: a KV-stationary kernel (dK, dV) and a Q-stationary one (dQ), each CTA
// owning one slice of kSliceCols columns of its gradients and recomputing S =
// Q K^T and dP = dO V^T over the whole head dim (no atomics, deterministic).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/swizzle.hpp"

namespace ffpa::detail::sm80_backward {

template <typename Element_, int kSliceCols_>
struct Traits {
  using Element = Element_;
  static constexpr int kElementBytes = ElementTraits<Element>::kBytes;
  static_assert(kElementBytes == 2, "mma.sync m16n8k16 operands: 16-bit elements");

  // A block pair: kBlockQ query rows x kBlockK keys.
  static constexpr int kBlockQ = 64;
  static constexpr int kBlockK = 64;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kChunk = kSwizzleCols<kElementBytes>;  // head-dim columns per ring step: 128-byte rows

  // Score phase (S and dP, [kBlockQ x kBlockK]): warps 4 (rows) x 2 (keys),
  // each 16 rows x 32 keys: 16 fp32 registers per tile and thread.
  static constexpr int kScoreWarpsM = 4, kScoreWarpsN = 2;
  static constexpr int kScoreWarpKeys = kBlockK / kScoreWarpsN;
  using ScoreLayout = AccumulatorLayout<1, kScoreWarpKeys / 8>;

  // Product phase (dK, dV: rows = keys; dQ: rows = queries; 64 rows either
  // way): warps 4 (rows, 16 each) x 2 (32 of each 64-column chunk).
  static constexpr int kSliceCols = kSliceCols_;
  static constexpr int kSliceChunks = kSliceCols / kChunk;
  static constexpr int kProductWarpsM = 4, kProductWarpsN = 2;
  static constexpr int kProductWarpCols = kChunk / kProductWarpsN;  // per chunk
  using SliceLayout = AccumulatorLayout<1, kSliceChunks * kProductWarpCols / 8>;

  // Shared memory: a ring of stages, each 2 x 64 rows of one 64-column chunk
  // (A rows: Q or dO; B rows: K, V or Q), then the block pair's P (dropout
  // applied) and dS tiles, [kBlockQ][kBlockK] with the 128-byte swizzle.
  static constexpr int kStages = 3;
  static constexpr int kHalfBytes = 64 * kSwizzleRowBytes;
  static constexpr int kStageBytes = 2 * kHalfBytes;
  static constexpr int kTileBytes = kBlockQ * kBlockK * kElementBytes;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kSmemBytes = kRingBytes + 2 * kTileBytes;

  static_assert(kBlockQ == kScoreWarpsM * 16 && kBlockK == kScoreWarpsN * kScoreWarpKeys, "score warps tile the pair");
  static_assert(kBlockK * kElementBytes == kSwizzleRowBytes, "P and dS rows are one 128-byte swizzle row");
  static_assert(kBlockQ == kProductWarpsM * 16 && kBlockK == kProductWarpsM * 16, "product warps own 16 rows each");
  static_assert(kSliceCols % kChunk == 0, "a slice is whole 64-column chunks");
  static_assert(kScoreWarpsM * kScoreWarpsN == kWarps && kProductWarpsM * kProductWarpsN == kWarps, "8 warps");
  static_assert(kStageBytes / 16 % kThreads == 0, "every thread copies the same number of segments of a stage");
  static_assert(SliceLayout::kElements * 2 + ScoreLayout::kElements * 2 <= 160,
                "dK and dV slices plus S and dP: the register budget of a 256-thread CTA");
};

struct Args {
  AttentionProblem p;
  const float* delta;         // [entries][Hq][rows] of q's extent: rowsum(dO o O) - d_lse, from the preprocess
  void* d_q;                  // gradients, q's / k's / v's dtype, rows of 16-byte aligned strides
  void* d_k;
  void* d_v;
  int64_t d_q_stride[3], d_k_stride[3], d_v_stride[3];  // b, h, n
  const void* d_o;
  int64_t d_o_stride[3];
  // An additive mask's gradient: dS summed into a dense fp32 [mask shape]
  // buffer (size-1 dims where the mask broadcasts) by the dQ kernel's first
  // slice; null when not requested.
  float* d_mask_sum;
  int64_t mask_shape[4];
  int slices;                 // dK/dV CTAs per key block: slices of max(D, Dv) columns
  int dq_slices;              // dQ CTAs per query block: slices of D columns
  int64_t block_offset;       // first linear CTA index of this launch
  float scale_log2;           // scale * log2(e)
  // A sequence batch's plans (kernels/serving/plan.hpp): the dQ kernel's tiles
  // (blocks of kBlockQ rows of each query head) and the dK/dV kernel's
  // (blocks of kBlockK keys of each KV head), each with the data checks' verdict.
  const void* query_plan;
  const void* key_plan;
};

}  // namespace ffpa::detail::sm80_backward
