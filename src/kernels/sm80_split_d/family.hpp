// Host-side interface of the sm80 split-D family: the compiled instances
// (one per instantiated head dim, listed by CMake) and the routing of a head
// dim to an instance.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/sm80_split_d/split_launch.hpp"
#include "kernels/sm80_split_d/tiles.hpp"

namespace ffpa::detail::sm80_split_d {

using Launcher = Status (*)(const AttentionProblem&, int value_splits, const SplitLaunch&, cudaStream_t);
using RunnableCheck = Status (*)(DType, Accumulation, int device);

// Defined in launch.cuh, explicitly instantiated per head dim in the
// generated sm80_split_d_d<D>.cu translation units.
template <int kOutCols>
Status launch_instance(const AttentionProblem& problem, int value_splits, const SplitLaunch& split,
                       cudaStream_t stream);
// Whether the instance's kernel for the dtype and accumulation runs on the
// current device, `device` (host/kernel_image.hpp): impl_unavailable when this
// build has no image the device loads, or the device cannot give it its threads.
template <int kOutCols>
Status instance_runnable(DType dtype, Accumulation accumulation, int device);

struct Instance {
  int out_cols;
  Launcher launch;
  RunnableCheck runnable;
};

// Generated from FFPA_HEAD_DIMS (registry.cpp.in), ascending out_cols.
extern const Instance kInstances[];
extern const int kInstanceCount;

// The instance and value splits that serve head dim D on a device that gives
// a block at most smem_limit_bytes of shared memory (routing.cpp).
Route route(int64_t head_dim, int smem_limit_bytes);

// Human-readable name of the kernel a route runs, e.g.
// "sm80_split_d<bf16,f32acc,out512,r32,M2N4,bn128,pv32,s3>x1".
std::string kernel_name(const AttentionProblem& problem, Route route);

// Whether the kernel of a route runs on the current device, `device`.
Status runnable(const AttentionProblem& problem, Route route, int device);

// Runs a routed instance; `split` (kv_splits > 1): split-KV's partial rows instead of O and LSE.
Status run(const AttentionProblem& problem, Route route, const SplitLaunch& split, cudaStream_t stream);

// How a serving call's sequences are cut into tiles by a routed instance
// (the serving plan's tiling: kernels/serving/plan.hpp), its keys split by
// the plan for `split_slots` CTA slots (0: unsplit; sequence_split_slots).
SequenceTiling sequence_tiling(const AttentionProblem& problem, Route route, int split_slots = 0);

// The CTA slots a serving call's plan splits its keys for on `sm_count` SMs:
// the SMs over the value splits (a tile is that many CTAs) where every
// sequence is one row block (decode, speculative decode: serving::may_split),
// else 0 (unsplit).
int sequence_split_slots(const AttentionProblem& problem, Route route, int sm_count);

// The split-KV plan of a routed call on `sm_count` SMs: the tiles a call has
// (GQA-packed rows, value splits) against the SMs, split_kv.hpp's rule.
KvSplits plan_kv_splits(const AttentionProblem& problem, Route route, int sm_count);

}  // namespace ffpa::detail::sm80_split_d
