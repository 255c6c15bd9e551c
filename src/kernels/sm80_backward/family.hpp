// Host-side interface of the portable backward kernels (sm80 .. sm120):
// preprocess (delta), dK/dV and dQ (kernels.cuh), for any head dims D and Dv
// (multiples of 8 up to 1024), fp16/bf16, every forward feature, an additive
// mask's gradient (summed over its broadcast dims with fp32 atomics: its bits
// may vary from run to run where the mask broadcasts; dQ, dK, dV do not).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/backward_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::sm80_backward {

// The columns of the gradients one CTA owns (slices = ceil(max(D, Dv) / it)
// for dK and dV, ceil(D / it) for dQ): each slice recomputes S and dP over the
// whole head dims, so the widest slice whose accumulators stay in registers
// (dK + dV: 128 a thread at 256).
inline constexpr int kSliceCols = 256;

// Workspace: delta, fp32 [B][Hq][Nq], and an additive mask's fp32 gradient sum.
size_t workspace_bytes(const BackwardProblem& problem);

// Why these kernels cannot serve the call (impl_unavailable with the reason),
// or ok: sequence lengths past the kernels', inputs other than f16 / bf16.
Status check(const BackwardProblem& problem);

// Whether the kernels for `dtype` run on `device` (the current device).
Status runnable(DType dtype, int device);

// e.g. "sm80_backward<bf16,slice128>x4".
std::string kernel_name(const BackwardProblem& problem);

// Computes dQ, dK and dV in place of the portable gradient kernels, after
// the preprocess (delta): another family's kernels (a routed sm90_backward::Instance's launch).
// d_mask_sum: where an additive mask's gradient is summed when the call asks
// for it (the dQ kernel adds dS there); the conversion into d_mask follows.
using GradientRunner = Status (*)(const BackwardProblem& problem, const float* delta, float* d_mask_sum,
                                  cudaStream_t stream);

// The gradients, on `stream`; `workspace` holds workspace_bytes(problem).
// gradients: the kernels to run instead of this family's dK/dV and dQ (null: these).
Status run(const BackwardProblem& problem, void* workspace, cudaStream_t stream, GradientRunner gradients = nullptr);

}  // namespace ffpa::detail::sm80_backward
