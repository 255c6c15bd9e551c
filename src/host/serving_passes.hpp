// A serving call's passes on a GPU family (docs/kernels/serving.md, "Mixed
// batches"): the sequences each launch runs (PassRows), the tiling its plan
// is cut by, and where that plan lies in the call's plan buffer (the
// workspace's first bytes, or the caller's ForwardParams::sequence_plan).
// Most calls have one pass of every sequence; sm90_wgmma's mixed batches two
// (KernelChoice::short_rows): the short sequences GQA-packed and split
// first, the rest second.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/common/sequence_schedule.hpp"

namespace ffpa::detail {

struct ServingPass {
  PassRows rows;
  SequenceTiling tiling;
  int64_t plan_offset = 0;  // its plan's bytes from the plan buffer's start (a multiple of 256)
};

struct ServingPasses {
  ServingPass pass[2];
  int count = 0;
  int64_t plan_bytes = 0;  // the plan buffer: every pass's plan
};

// The passes of a serving call planned as `choice` (sm90_wgmma or sm80_split_d).
ServingPasses serving_passes(const AttentionProblem& problem, const KernelChoice& choice);

// Every pass's plan into `plans` (passes.plan_bytes), in order on `stream`.
Status launch_plans(const AttentionProblem& problem, const ServingPasses& passes, void* plans, cudaStream_t stream);

// `problem` reading `pass`'s plan of the plan buffer at `plans`.
AttentionProblem pass_problem(const AttentionProblem& problem, const ServingPass& pass, const void* plans);

}  // namespace ffpa::detail
