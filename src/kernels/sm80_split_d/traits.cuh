// The compile-time shape of a split-D kernel instance and its launch arguments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/attention_problem.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/softmax_state.hpp"
#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/split_kv.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm80_split_d/split_launch.hpp"
#include "kernels/sm80_split_d/tiles.hpp"

namespace ffpa::detail::sm80_split_d {

template <typename Element_, bool kAccumF16_, int kOutCols_, int kWarpRows_, int kWarpsM_,
          int kWarpsN_, int kBlockN_, int kPVKeys_, int kStages_>
struct Traits {
  using Element = Element_;
  static constexpr bool kAccumF16 = kAccumF16_;
  static constexpr int kOutCols = kOutCols_;
  static constexpr int kWarpRows = kWarpRows_;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 tiles per warp
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kBlockM = kWarpRows * kWarpsM;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kPVKeys = kPVKeys_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;

  static constexpr int kElementBytes = ElementTraits<Element>::kBytes;
  static constexpr int kChunk = kSwizzleCols<kElementBytes>;  // head-dim columns per Q/K step: 128-byte rows
  static constexpr int kRowBytes = kSwizzleRowBytes;
  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys of S per warp
  static constexpr int kWarpCols = kOutCols / kWarpsN;  // columns of O per warp
  static constexpr int kPVSteps = kBlockN / kPVKeys;
  static constexpr int kSTiles = kWarpKeys / 8;  // n8 tiles of S per warp
  static constexpr int kOTiles = kWarpCols / 8;  // n8 tiles of O per warp
  static constexpr int kRows = 2 * kMTiles;      // rows a thread holds: g, g + 8 of each m16 tile
  using SLayout = AccumulatorLayout<kMTiles, kSTiles>;
  using OLayout = AccumulatorLayout<kMTiles, kOTiles>;  // fp32 accumulation

  static constexpr SmemLayout kSmem =
      smem_layout(TileShape{kOutCols, kWarpRows, kWarpsM, kWarpsN, kBlockN, kPVKeys, kStages});
  static constexpr int kQTileBytes = kBlockM * kRowBytes;
  static constexpr int kVSubtileBytes = kPVKeys * kRowBytes;  // [kPVKeys][64] per 64 columns
  static constexpr int kVStageBytes = kVSubtileBytes * (kOutCols / kChunk);
  static constexpr int kStageBytes = kSmem.stage_bytes;
  static constexpr int kRingOrEpilogueBytes = kSmem.ring_bytes;
  static constexpr bool kSharedP = kWarpsN > 1;
  static constexpr int kPBytes = kSmem.p_bytes;
  static constexpr int kSmemBytes = kSmem.total_bytes;

  static_assert(kElementBytes == 2, "mma.sync m16n8k16 operands: 16-bit elements");
  static_assert(kWarpRows == 16 || kWarpRows == 32, "a warp owns one or two m16 tiles");
  static_assert(kOutCols % 64 == 0, "O slices are whole 64-column subtiles");
  static_assert(kWarpCols % 64 == 0, "each warp's O columns are whole 64-column subtiles");
  static_assert(kWarpKeys % 16 == 0, "each warp's keys form whole k16 steps");
  static_assert(kBlockN % kPVKeys == 0 && kPVKeys % 16 == 0, "P V steps are whole k16 steps");
  static_assert(kBlockN % 64 == 0, "P rows are swizzled in 128-byte groups");
  static_assert(kThreads % 64 == 0, "copies assume the swizzle phase of a thread is fixed");
  static_assert(kBlockM % (kThreads / 8) == 0, "Q rows fill whole copy passes");
  static_assert((kBlockM + kBlockN) % (kThreads / 8) == 0 &&
                    (kVStageBytes / 128) % (kThreads / 8) == 0 && kPVKeys % 8 == 0,
                "every thread copies the same number of rows of a stage");
  static_assert(kPVKeys % (kThreads / 8) == 0 || (kThreads / 8) % kPVKeys == 0,
                "V rows map to copy passes with compile-time offsets");
  static_assert(!kAccumF16 || std::is_same_v<Element, __half>, "fp16 accumulation needs fp16");
};

struct Args {
  AttentionProblem p;
  int value_splits;      // CTAs per row block, each one slice of Dv
  // GQA packing (split_kv.hpp's packed_heads): a tile holds the same query
  // rows of heads_per_tile query heads of one KV head, so decode reads each
  // K/V byte once for all of them (tile_schedule.hpp: row_head, query_row).
  int heads_per_tile;
  int row_blocks;        // tiles along a head's Nq rows: head_row_blocks()
  // Split-KV (kernels/common/split_kv.hpp; kv_splits > 1): each tile is one
  // split of split_blocks KV blocks and writes its rows' unnormalized O and
  // softmax state (split_kv/combine.hpp's layout) instead of O and LSE.
  int kv_splits;
  int split_blocks;
  // A sequence batch: the CTA slots its plan split the keys for (0: unsplit);
  // the plan's split_blocks say where (kernels/serving/plan.hpp).
  int split_slots;
  float* partial_o;
  RowSoftmaxState* partial_states;
  int64_t block_offset;  // first linear CTA index of this launch
  float scale_log2;      // scale * log2(e)
};

// The arguments and CTA count of a call (shared by the launcher and the CPU
// emulation of the kernel, tests/emulation/).
template <class Traits>
inline Args forward_args(const AttentionProblem& problem, int value_splits, const SplitLaunch& split = {}) {
  Args args{};
  args.p = problem;
  args.value_splits = value_splits;
  args.kv_splits = split.kv_splits;
  args.split_blocks = static_cast<int>(split.keys_per_split / Traits::kBlockN);
  args.split_slots = split.split_slots;
  args.partial_o = split.partial_o;
  args.partial_states = split.partial_states;
  args.heads_per_tile = packed_heads(problem.group_size(), problem.seq_q, Traits::kBlockM);
  args.row_blocks = static_cast<int>(head_row_blocks(problem.seq_q, Traits::kBlockM, args.heads_per_tile));
  args.scale_log2 = problem.scale * kLog2e;
  return args;
}

// The tiling a serving call's plan cut its sequences by (the plan's own must
// be the same: planned_tiles).
template <class Traits>
FFPA_HOST_DEVICE SequenceTiling args_sequence_tiling(const Args& args) {
  return {Traits::kBlockM, Traits::kBlockN, args.heads_per_tile, args.split_slots};
}

// A serving call's grid is the bound on its tiles (its plan says how many
// there are: the CTAs past them return at once).
template <class Traits>
inline int64_t forward_ctas(const Args& args) {
  if (args.p.sequences.active) return serving::max_tiles(args.p, args_sequence_tiling<Traits>(args)) * args.value_splits;
  return args.p.batch * (args.p.heads_q / args.heads_per_tile) * args.row_blocks *
         static_cast<int64_t>(args.value_splits) * args.kv_splits;
}

}  // namespace ffpa::detail::sm80_split_d
