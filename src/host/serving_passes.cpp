#include "host/serving_passes.hpp"

#include "kernels/serving/plan.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm90_wgmma/family.hpp"

namespace ffpa::detail {

ServingPasses serving_passes(const AttentionProblem& problem, const KernelChoice& choice) {
  ServingPasses passes;
  const int64_t plan_stride = (serving::plan_bytes(problem) + 255) / 256 * 256;
  auto add = [&](PassRows rows, SequenceTiling tiling) {
    passes.pass[passes.count] = {rows, tiling, passes.count * plan_stride};
    passes.plan_bytes = passes.count * plan_stride + serving::plan_bytes(problem);
    ++passes.count;
  };
  if (choice.impl != Impl::sm90_wgmma) {
    const sm80_split_d::Route route{static_cast<int>(choice.padded_head_dim), choice.value_splits};
    add(PassRows{}, sm80_split_d::sequence_tiling(problem, route, choice.kv_splits == 0 ? choice.split_blocks : 0));
    return passes;
  }
  const sm90_wgmma::TileShape shape = sm90_wgmma::tile_shape(problem, static_cast<int>(choice.padded_head_dim));
  sm90_wgmma::TileLaunch tiles;
  PassRows rest;
  if (choice.short_rows > 0) {
    tiles.heads_per_tile = choice.short_heads_per_tile;
    tiles.split_slots = choice.short_split_slots;
    add(PassRows{0, choice.short_rows}, sm90_wgmma::sequence_tiling(shape, tiles));
    rest.min_q_rows = choice.short_rows + 1;
  }
  tiles.heads_per_tile = choice.heads_per_tile;
  tiles.split_slots = choice.kv_splits == 0 ? choice.split_blocks : 0;  // kv_splits 0: the plan splits
  add(rest, sm90_wgmma::sequence_tiling(shape, tiles));
  return passes;
}

Status launch_plans(const AttentionProblem& problem, const ServingPasses& passes, void* plans, cudaStream_t stream) {
  for (int i = 0; i < passes.count; ++i) {
    const ServingPass& pass = passes.pass[i];
    if (Status status = serving::launch_plan(problem, pass.tiling, static_cast<unsigned char*>(plans) + pass.plan_offset,
                                             stream, pass.rows);
        !status.ok()) {
      return status;
    }
  }
  return {};
}

AttentionProblem pass_problem(const AttentionProblem& problem, const ServingPass& pass, const void* plans) {
  AttentionProblem planned = problem;
  planned.sequences.plan = static_cast<const unsigned char*>(plans) + pass.plan_offset;
  return planned;
}

}  // namespace ffpa::detail
