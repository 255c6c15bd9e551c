// Host-side interface of the sm90 backward kernels (TMA + wgmma, sm_90a): so
// far option B's dQ kernel (docs/kernels/backward_plan.md), which runs in
// place of the portable dQ kernel beside the portable preprocess and dK/dV
// kernels (sm80_backward::run's DqRunner). Its instances, one per
// instantiated head dim (CMake's FFPA_SM90_BACKWARD_HEAD_DIMS), each serve D
// and Dv up to it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/backward_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::sm90_backward {

using DqLauncher = Status (*)(const BackwardProblem&, const float* delta, float* d_mask_sum, cudaStream_t);
using DqRunnableCheck = Status (*)(DType, int device);

// Defined in dq_launch.cuh, instantiated per head dim in the generated
// sm90_backward_dq_d<D>.cu translation units (sm_90a only).
template <int kHeadDim>
Status launch_dq_instance(const BackwardProblem& problem, const float* delta, float* d_mask_sum,
                          cudaStream_t stream);
template <int kHeadDim>
Status dq_instance_runnable(DType dtype, int device);

struct DqInstance {
  int head_dim;  // a multiple of 128; serves D and Dv up to it
  DqLauncher launch;
  DqRunnableCheck runnable;
};

// Generated (registry.cpp.in), ascending head_dim; empty without sm_90a.
extern const DqInstance kDqInstances[];
extern const int kDqInstanceCount;

// The compiled instance that serves the call's dQ, or nullptr with *reason.
const DqInstance* route_dq(const BackwardProblem& problem, std::string* reason);

// e.g. "sm90_backward_dq<bf16,d512>".
std::string dq_kernel_name(const BackwardProblem& problem, const DqInstance& instance);

// dQ of a routed call (route_dq), after the preprocess wrote delta: the
// signature of sm80_backward::DqRunner.
Status run_dq(const BackwardProblem& problem, const float* delta, float* d_mask_sum, cudaStream_t stream);

}  // namespace ffpa::detail::sm90_backward
