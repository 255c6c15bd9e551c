// Host-side interface of the sm90 backward kernels (TMA + wgmma, sm_90a):
// dQ, dK and dV kernels (option B with dK and dV apart,
// docs/kernels/backward_plan.md; arguments.hpp), run after the portable
// preprocess (delta) in place of the portable gradient kernels
// (sm80_backward::run's GradientRunner: the routed instance's launch). Their instances, one per
// instantiated head dim (CMake's FFPA_SM90_BACKWARD_HEAD_DIMS), each serve D
// and Dv up to it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/backward_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::sm90_backward {

// dQ, dK and dV of a routed call, after the preprocess wrote delta: the
// signature of sm80_backward::GradientRunner.
using Launcher = Status (*)(const BackwardProblem&, const float* delta, float* d_mask_sum, cudaStream_t);
using RunnableCheck = Status (*)(DType, int device);

// Defined in launch.cuh, instantiated per head dim in the generated
// sm90_backward_d<D>.cu translation units (sm_90a only).
template <int kHeadDim>
Status launch_instance(const BackwardProblem& problem, const float* delta, float* d_mask_sum, cudaStream_t stream);
template <int kHeadDim>
Status instance_runnable(DType dtype, int device);

struct Instance {
  int head_dim;  // a multiple of 128; serves D and Dv up to it
  Launcher launch;
  RunnableCheck runnable;
};

// Generated (registry.cpp.in), ascending head_dim; empty without sm_90a.
extern const Instance kInstances[];
extern const int kInstanceCount;

// The compiled instance that serves the call, or nullptr with *reason.
const Instance* route(const BackwardProblem& problem, std::string* reason);


}  // namespace ffpa::detail::sm90_backward
