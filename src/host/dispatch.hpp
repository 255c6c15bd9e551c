// Choosing what runs a validated call: the implementation (from the call's
// options, the memory the tensors live in and the device) and its kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/attention_problem.hpp"
#include "common/backward_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// Fails with impl_unavailable / wrong_memory_space when the requested
// implementation cannot serve the call; never substitutes another one. The
// choice's kernel name is left empty (forward() does not need it; building it
// costs host time on every call): kernel_name() spells it. kv_cache: the
// call's validated ForwardParams::fp8_kv_cache (its tensors must live where
// the call's do).
Status plan_forward(const AttentionProblem& problem, Impl requested, KernelChoice* choice,
                    const Fp8KvCache* kv_cache = nullptr);

// The name of a planned choice's kernel, e.g. "sm90_wgmma<bf16,d512,m64,n128,s4>".
std::string kernel_name(const AttentionProblem& problem, const KernelChoice& choice);

// Whether `impl` (automatic, sm80_split_d or sm90_wgmma) runs this build's
// kernels on CUDA device `device` (ffpa::device_support).
Status device_support(int device, Impl impl);

// A planned sm90_wgmma or sm80_split_d choice with its keys split into about `wanted` KV
// splits (1: unsplit, keeping the plan's GQA packing) instead of the planned
// count: for benchmarks that measure the split rule against other counts
// (ffpa-bench --kv-splits). invalid_option for another impl or wanted outside
// 1 .. kMaxKvSplits.
Status with_kv_splits(const AttentionProblem& problem, int wanted, KernelChoice* choice);

// The workspace bytes a planned call uses (split-KV's partial rows, the FP8
// pre-pass's regions: Q's alone with an FP8 KV cache), 0 for most.
int64_t workspace_bytes(const AttentionProblem& problem, const KernelChoice& choice,
                        const Fp8KvCache* kv_cache = nullptr);

// Runs a planned call (asynchronously on `stream` for GPU implementations),
// its temporary memory from `workspace` when given, else stream-ordered.
Status run_forward(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                   size_t workspace_size, cudaStream_t stream, const Fp8KvCache* kv_cache = nullptr);

// The backward's implementation: the CPU reference for host tensors; for
// device tensors the portable preprocess, then the sm90 kernels where they
// serve the call (impl auto up to the measured head dims, sm90_wgmma) or the
// portable ones (auto, sm80_split_d). Fails like plan_forward (never substitutes).
struct BackwardChoice {
  Impl impl = Impl::automatic;
  // The routed sm90_backward instance's launch, run in place of the portable
  // dK/dV and dQ kernels (sm80_backward::GradientRunner); null: the portable ones.
  Status (*sm90_gradients)(const BackwardProblem&, const float* delta, float* d_mask_sum, cudaStream_t) = nullptr;
};
Status plan_backward(const BackwardProblem& problem, Impl requested, BackwardChoice* choice);

// The implementation plan_backward picks for `problem` (validated, taken as a
// call on device tensors) on CUDA device `device` under `requested`
// (automatic, sm80_split_d or sm90_wgmma): *impl is sm80_split_d or
// sm90_wgmma, written on success only (ffpa::backward_route). Makes `device`
// current for the query and restores the calling thread's current device.
Status backward_route(const BackwardProblem& problem, int device, Impl requested, Impl* impl);

// The workspace bytes of a planned backward (the GPU kernels' delta).
size_t backward_workspace_bytes(const BackwardProblem& problem, const BackwardChoice& choice);

Status run_backward(const BackwardProblem& problem, const BackwardChoice& choice, void* workspace,
                    size_t workspace_size, cudaStream_t stream);

}  // namespace ffpa::detail
