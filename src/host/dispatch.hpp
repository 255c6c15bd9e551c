// Choosing what runs a validated call: the implementation (from the call's
// options, the memory the tensors live in and the device) and its kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// Fails with impl_unavailable / wrong_memory_space when the requested
// implementation cannot serve the call; never substitutes another one.
Status plan_forward(const AttentionProblem& problem, Impl requested, KernelChoice* choice);

// Whether `impl` (automatic, sm80_split_d or sm90_wgmma) runs this build's
// kernels on CUDA device `device` (ffpa::device_support).
Status device_support(int device, Impl impl);

// Runs a planned call (asynchronously on `stream` for GPU implementations).
Status run_forward(const AttentionProblem& problem, const KernelChoice& choice,
                   cudaStream_t stream);

}  // namespace ffpa::detail
