// Routing a head dim to a compiled split-D instance, naming and running it.
#include <algorithm>
#include <string>

#include "kernels/sm80_split_d/family.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/serving/plan.hpp"

namespace ffpa::detail::sm80_split_d {

Route route(int64_t head_dim, int smem_limit_bytes) {
  int largest_fitting = 0;
  for (int i = 0; i < kInstanceCount; ++i) {
    const int out_cols = kInstances[i].out_cols;
    if (smem_layout(tile_shape(out_cols)).total_bytes > smem_limit_bytes) continue;
    if (out_cols >= head_dim) return {out_cols, 1};
    largest_fitting = out_cols;
  }
  if (largest_fitting == 0) return {0, 0};
  return {largest_fitting, static_cast<int>((head_dim + largest_fitting - 1) / largest_fitting)};
}

std::string kernel_name(const AttentionProblem& problem, Route route) {
  const TileShape tile = tile_shape(route.out_cols);
  const char* element = problem.dtype == DType::bf16 ? "bf16" : "f16";
  const char* accumulation = problem.accumulation == Accumulation::f16 ? "f16acc" : "f32acc";
  return std::string("sm80_split_d<") + element + "," + accumulation + ",out" +
         std::to_string(tile.out_cols) + ",r" + std::to_string(tile.warp_rows) + ",M" +
         std::to_string(tile.warps_m) + "N" + std::to_string(tile.warps_n) + ",bn" +
         std::to_string(tile.block_n) + ",pv" + std::to_string(tile.pv_keys) + ",s" +
         std::to_string(tile.stages) + ">x" + std::to_string(route.value_splits);
}

namespace {

const Instance* find_instance(int out_cols) {
  for (int i = 0; i < kInstanceCount; ++i) {
    if (kInstances[i].out_cols == out_cols) return &kInstances[i];
  }
  return nullptr;
}

Status no_instance(int out_cols) {
  return {StatusCode::impl_unavailable, "impl sm80_split_d: no instance with out_cols " +
                                            std::to_string(out_cols) + " in this build"};
}

}  // namespace

Status runnable(const AttentionProblem& problem, Route route, int device) {
  const Instance* instance = find_instance(route.out_cols);
  if (instance == nullptr) return no_instance(route.out_cols);
  return instance->runnable(problem.dtype, problem.accumulation, device);
}

Status run(const AttentionProblem& problem, Route route, const SplitLaunch& split, cudaStream_t stream) {
  const Instance* instance = find_instance(route.out_cols);
  if (instance == nullptr) return no_instance(route.out_cols);
  return instance->launch(problem, route.value_splits, split, stream);
}

SequenceTiling sequence_tiling(const AttentionProblem& problem, Route route, int split_slots) {
  const TileShape tile = tile_shape(route.out_cols);
  const int block_m = tile.warp_rows * tile.warps_m;  // Traits::kBlockM
  return {block_m, tile.block_n, packed_heads(problem.group_size(), problem.seq_q, block_m), split_slots};
}

int sequence_split_slots(const AttentionProblem& problem, Route route, int sm_count) {
  const SequenceTiling tiling = sequence_tiling(problem, route);
  if (!serving::may_split(problem, tiling.block_m, tiling.heads_per_tile)) return 0;
  return std::max(1, sm_count / std::max(1, route.value_splits));
}

KvSplits plan_kv_splits(const AttentionProblem& problem, Route route, int sm_count) {
  const TileShape tile = tile_shape(route.out_cols);
  const int block_m = tile.warp_rows * tile.warps_m;
  const int heads_per_tile = packed_heads(problem.group_size(), problem.seq_q, block_m);
  const int64_t tiles = problem.batch * (problem.heads_q / heads_per_tile) *
                        head_row_blocks(problem.seq_q, block_m, heads_per_tile) * route.value_splits;
  return choose_kv_splits(tiles, problem.seq_kv, sm_count, tile.block_n);
}

}  // namespace ffpa::detail::sm80_split_d
