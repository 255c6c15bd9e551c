// Launching the portable backward kernels: preprocess, then dK/dV and dQ
// (independent of each other; one stream keeps them ordered after delta).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "common/ceil_div.hpp"
#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/sm80_backward/family.hpp"
#include "kernels/sm80_backward/arguments.cuh"
#include "kernels/sm80_backward/kernels.cuh"

namespace ffpa::detail::sm80_backward {
namespace {

constexpr const char* kImpl = "sm80_split_d (backward)";
constexpr int64_t kMaxBlocksPerLaunch = int64_t{1} << 30;  // below gridDim.x's 2^31 - 1

template <class Element>
Status launch_preprocess(const BackwardProblem& b, float* delta, cudaStream_t stream) {
  const int64_t blocks = preprocess_blocks(b);
  if (blocks == 0) return {};
  if (blocks > kMaxBlocksPerLaunch) {
    return {StatusCode::impl_unavailable, std::string(kImpl) + ": more than 2^33 query rows"};
  }
  preprocess_kernel<Element><<<static_cast<unsigned>(blocks), 32 * kPreprocessRows, 0, stream>>>(
      preprocess_args(b, delta));
  FFPA_RETURN_IF_DEVICE_ERROR(kImpl, cudaGetLastError());
  return {};
}

template <class Traits, class Kernel>
Status launch_grid(Kernel kernel, Args args, int64_t ctas, cudaStream_t stream) {
  if (ctas == 0) return {};
  FFPA_RETURN_IF_DEVICE_ERROR(
      kImpl, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  for (int64_t first = 0; first < ctas; first += kMaxBlocksPerLaunch) {
    args.block_offset = first;
    const auto blocks = static_cast<unsigned>(std::min(kMaxBlocksPerLaunch, ctas - first));
    kernel<<<blocks, Traits::kThreads, Traits::kSmemBytes, stream>>>(args);
    FFPA_RETURN_IF_DEVICE_ERROR(kImpl, cudaGetLastError());
  }
  return {};
}

template <class Element>
Status run_typed(const BackwardProblem& b, void* workspace, cudaStream_t stream) {
  using T = Traits<Element, kSliceCols>;
  const AttentionProblem& p = b.forward;
  float* const delta = static_cast<float*>(workspace);
  if (Status status = launch_preprocess<Element>(b, delta, stream); !status.ok()) return status;
  const Args args = kernel_args(b, delta);
  if (Status status = launch_grid<T>(dkdv_kernel<T>, args, dkdv_ctas<T>(p), stream); !status.ok()) return status;
  return launch_grid<T>(dq_kernel<T>, args, dq_ctas<T>(p), stream);
}

template <class Element>
Status runnable_typed(int device) {
  using T = Traits<Element, kSliceCols>;
  static KernelImageMemo dkdv_memo, dq_memo, preprocess_memo;
  for (auto [kernel, threads, memo] :
       {std::tuple{reinterpret_cast<const void*>(&dkdv_kernel<T>), T::kThreads, &dkdv_memo},
        std::tuple{reinterpret_cast<const void*>(&dq_kernel<T>), T::kThreads, &dq_memo},
        std::tuple{reinterpret_cast<const void*>(&preprocess_kernel<Element>), 32 * kPreprocessRows, &preprocess_memo}}) {
    if (Status status = kernel_runnable(kernel, threads, kImpl, device, memo); !status.ok()) return status;
  }
  int smem_optin = 0;
  FFPA_RETURN_IF_DEVICE_ERROR(kImpl, cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (T::kSmemBytes > smem_optin) {
    return {StatusCode::impl_unavailable, std::string(kImpl) + ": its kernels need " + std::to_string(T::kSmemBytes) +
                                              " bytes of shared memory per block; device " + std::to_string(device) +
                                              " allows " + std::to_string(smem_optin)};
  }
  return {};
}

}  // namespace

size_t workspace_bytes(const BackwardProblem& b) {
  const AttentionProblem& p = b.forward;
  return static_cast<size_t>(p.batch * p.heads_q * p.seq_q) * sizeof(float);
}

Status check(const BackwardProblem& b) {
  const AttentionProblem& p = b.forward;
  if (b.d_mask != nullptr) {
    return {StatusCode::impl_unavailable,
            std::string(kImpl) + ": an additive mask's gradient (d_mask) is computed by the CPU reference only, "
                                 "for now"};
  }
  if (p.seq_q > kMaxSequenceLength || p.seq_kv > kMaxSequenceLength) {
    return {StatusCode::impl_unavailable, std::string(kImpl) + ": Nq and Nkv up to " +
                                              std::to_string(kMaxSequenceLength) + " (32-bit positions)"};
  }
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) {
    return {StatusCode::unsupported_dtype, std::string(kImpl) + ": f16 and bf16 inputs only"};
  }
  return {};
}

Status runnable(DType dtype, int device) {
  return dtype == DType::bf16 ? runnable_typed<__nv_bfloat16>(device) : runnable_typed<__half>(device);
}

std::string kernel_name(const BackwardProblem& b) {
  return std::string("sm80_backward<") + (b.forward.dtype == DType::bf16 ? "bf16" : "f16") + ",slice" +
         std::to_string(kSliceCols) + ">x" + std::to_string(slices_of(b.forward));
}

Status run(const BackwardProblem& b, void* workspace, cudaStream_t stream) {
  const AttentionProblem& p = b.forward;
  if (p.batch * p.heads_q * p.seq_q == 0 && p.batch * p.heads_kv * p.seq_kv == 0) return {};
  return p.dtype == DType::bf16 ? run_typed<__nv_bfloat16>(b, workspace, stream)
                                : run_typed<__half>(b, workspace, stream);
}

}  // namespace ffpa::detail::sm80_backward
