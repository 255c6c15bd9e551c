// What a launch of the 16-bit sm90_wgmma kernel is given, from the problem and
// the tile plan: the kernel's Args, the boxes of its four tensor maps (q, k,
// v, o) and the tile count. One home for the launcher (launch.cuh) and the CPU
// emulation (tests/emulation), which encode the maps each their own way.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "common/attention_problem.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "kernels/sm90_wgmma/row_split/traits.cuh"
#include "kernels/sm90_wgmma/tensor_map.hpp"
#include "kernels/sm90_wgmma/traits.cuh"

namespace ffpa::detail::sm90_wgmma {

// D up to kHeadDim. Up to 512 one CTA per tile, above a cluster of two, each
// CTA with half of D. A CTA computes S over its D / 64 (or D / 128) chunks and
// splits its columns of O between its two consumers in whole 64-column boxes
// (at least 128 columns: the smallest instantiated wgmma N).
template <int kHeadDim>
struct InstanceTraits {
  static constexpr int kSplit = cluster_size(kHeadDim);
  static_assert(kHeadDim % (64 * kSplit) == 0);
  static constexpr int kCtaDim = kHeadDim / kSplit;
  static constexpr int kQKChunks = kCtaDim / 64;
  static constexpr int kHalfCols = std::max(128, (kCtaDim + 127) / 128 * 64);
  template <class Element, bool kDropout = false, bool kMaskInS = false, KvLoad kKvLoad = KvLoad::boxes>
  using type = Traits<Element, kQKChunks, kHalfCols, kSplit, kDropout, kMaskInS, Operands::input, kKvLoad>;
};

// with_instance_traits for a column-split instance.
template <int kHeadDim, class Element, class F>
auto with_column_split_traits(const AttentionProblem& problem, F&& f) {
  using Kernels = InstanceTraits<kHeadDim>;
  if constexpr (takes_cache_codes(kHeadDim)) {
    if (problem.kv_e4m3) {
      return f(static_cast<typename Kernels::template type<Element, false, false, KvLoad::cache_codes>*>(nullptr));
    }
  }
  if constexpr (takes_page_groups(kHeadDim)) {
    if (loads_page_groups(problem, kHeadDim)) {
      return f(static_cast<typename Kernels::template type<Element, false, false, KvLoad::page_groups>*>(nullptr));
    }
  }
  if (problem.has_dropout()) return f(static_cast<typename Kernels::template type<Element, true>*>(nullptr));
  if (starts_s_at_mask(problem, kHeadDim)) {
    return f(static_cast<typename Kernels::template type<Element, false, true>*>(nullptr));
  }
  return f(static_cast<typename Kernels::template type<Element, false>*>(nullptr));
}

// Calls f(static_cast<T*>(nullptr)) with T the 16-bit kernel's Traits that serve
// the problem at instance kHeadDim: the row-split kernel where
// runs_row_split says so, or the
// e4m3-cache variant for such a cache
// (where the instance has one: takes_cache_codes; routing sends no other
// there), the page-group variant where loads_page_groups says so, the dropout
// variant, the mask-in-S variant where starts_s_at_mask says so, else the
// plain one.
template <int kHeadDim, class Element, class F>
auto with_instance_traits(const AttentionProblem& problem, F&& f) {
  if constexpr (has_row_split(kHeadDim)) {
    if (row_split_serves(problem)) {
      if (scores_plain(problem)) {
        if constexpr (kHeadDim <= 64) {
          if (row_split_consumers(problem, kHeadDim) == 3) {
            constexpr int kKeys = row_split_keys(kHeadDim, 3);
            return f(static_cast<RowSplitTraits<Element, kHeadDim, 3, kKeys, RowSchedule::ping_pong, false>*>(nullptr));
          }
        }
        constexpr int kKeys = row_split_keys(kHeadDim, 2);
        return f(static_cast<RowSplitTraits<Element, kHeadDim, 2, kKeys, RowSchedule::ping_pong, false>*>(nullptr));
      }
      return f(static_cast<RowSplitTraits<Element, kHeadDim, 2, row_split_keys(kHeadDim, 2)>*>(nullptr));
    }
  }
  return with_column_split_traits<kHeadDim, Element>(problem, f);
}

struct ForwardLaunch {
  Args args{};
  int box_rows[4] = {};   // q, k, v, o
  int box_heads[4] = {};
  int64_t tile_count = 0;  // CTAs: tile_count x Traits::kSplit
};

template <class Traits>
ForwardLaunch forward_launch(const AttentionProblem& problem, const TileLaunch& tiles) {
  // Q and O in boxes of 64 rows (a column-split tile, a row-split
  // consumer's part): of one head, or of each of 64 / head_rows heads (TMA
  // fills the box row by row, head after head, the order of
  // TileCoordinates::row_head), K of a KV block, V of a block (row split)
  // or half one (one ring stage per key half and consumer).
  const int head_rows = rows_per_head(Traits::kBlockM, tiles.heads_per_tile);
  const int part_rows = std::min(head_rows, 64);
  ForwardLaunch launch;
  // A paged cache: K and V gathered, or in page-sized boxes
  // (paged_box_rows). Where the producer copies K and V itself (the gather,
  // an e4m3 cache's converters) their maps go unused: boxes of 8 rows, any
  // valid box.
  const bool gather = gathers_pages(problem);
  const bool copied = gather || Traits::kCacheCodes;
  const bool paged_tma = problem.sequences.paged() && !copied;
  const int page_rows = paged_tma ? paged_box_rows(problem.sequences.page_size, 64) : 0;
  const int k_rows = copied ? 8 : paged_tma ? page_rows : Traits::kBlockN;
  const int v_rows = copied ? 8 : paged_tma ? page_rows : Traits::kVBoxRows;
  const int box_rows[4] = {part_rows, k_rows, v_rows, part_rows};
  const int box_heads[4] = {64 / part_rows, 1, 1, 64 / part_rows};
  for (int i = 0; i < 4; ++i) launch.box_rows[i] = box_rows[i], launch.box_heads[i] = box_heads[i];
  Args& args = launch.args;
  args.p = problem;
  args.heads_per_tile = tiles.heads_per_tile;
  args.row_blocks = tiles.row_block_count > 0
                        ? tiles.row_block_count
                        : static_cast<int>(head_row_blocks(problem.seq_q, Traits::kBlockM, tiles.heads_per_tile));
  args.first_row_block = tiles.first_row_block;
  args.scale_log2 = problem.scale * kLog2e;
  args.inverse_scale = 1.0f / problem.scale;
  args.kv_splits = tiles.splits;
  args.split_blocks = tiles.split_blocks;
  args.partial_o = tiles.partial_o;
  args.partial_states = tiles.partial_states;
  args.split_slots = tiles.split_slots;
  args.page_box_rows = page_rows;
  args.gather_pages = gather;
  if constexpr (Traits::kPageGroups) args.page_steps = page_group_steps(problem).value_or(PageMapSteps{});
  // A tile per KV split; a serving call: the bound on its tiles (its plan
  // says how many there are; CTAs past them return at once).
  launch.tile_count =
      problem.sequences.active
          ? serving::max_tiles(problem, sequence_tiling({Traits::kBlockM, Traits::kBlockN}, tiles), tiles.pass)
          : problem.batch * (problem.heads_q / tiles.heads_per_tile) * args.row_blocks * tiles.splits;  // < 2^30
  return launch;
}

// The four maps of a launch (q, k, v, o) as the encoder takes them (the
// driver's in launch.cuh, the emulator's in tests/emulation).
template <class Traits>
std::array<TensorMapSpec, 4> forward_map_specs(const AttentionProblem& problem, const ForwardLaunch& launch) {
  const std::array<TensorMapShape, 4> shapes = attention_tensor_shapes(problem);
  std::array<TensorMapSpec, 4> specs;
  for (int i = 0; i < 4; ++i) specs[i] = tensor_map_spec(shapes[i], launch.box_rows[i], launch.box_heads[i]);
  if constexpr (Traits::kPageGroups) {
    specs[1] = page_group_spec(shapes[1], launch.args.page_steps, 2, launch.args.page_box_rows);
    specs[2] = page_group_spec(shapes[2], launch.args.page_steps, Traits::kHalfCols / Traits::kBoxCols,
                               launch.args.page_box_rows);
  }
  return specs;
}

}  // namespace ffpa::detail::sm90_wgmma
