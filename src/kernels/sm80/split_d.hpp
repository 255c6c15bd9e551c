// Host-side interface of the sm80 split-D family: the compiled instances
// (one per instantiated head dim, listed by CMake) and the routing of a head
// dim to an instance.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/sm80/split_d_tiles.hpp"

namespace ffpa::detail::sm80 {

using SplitDLauncher = Status (*)(const AttentionProblem&, int value_splits, cudaStream_t);

// Defined in split_d_launch.cuh, explicitly instantiated per head dim in the
// generated split_d_out<D>.cu translation units.
template <int kOutCols>
Status launch_split_d_instance(const AttentionProblem& problem, int value_splits,
                               cudaStream_t stream);

struct SplitDInstance {
  int out_cols;
  SplitDLauncher launch;
};

// Generated from FFPA_HEAD_DIMS (split_d_registry.cpp.in), ascending out_cols.
extern const SplitDInstance kSplitDInstances[];
extern const int kSplitDInstanceCount;

// The instance and value splits that serve head dim D on a device that gives
// a block at most smem_limit_bytes of shared memory (split_d_routing.cpp).
SplitDRoute route_split_d(int64_t head_dim, int smem_limit_bytes);

// Human-readable name of the kernel a route runs, e.g.
// "sm80_split_d<bf16,f32acc,out512,r32,M2N4,bn128,pv32,s3>x1".
std::string split_d_kernel_name(const AttentionProblem& problem, SplitDRoute route);

// Runs a routed instance.
Status run_split_d(const AttentionProblem& problem, SplitDRoute route, cudaStream_t stream);

}  // namespace ffpa::detail::sm80
