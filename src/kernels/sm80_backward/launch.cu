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

// An additive mask's gradient from its fp32 sum, in the mask's dtype.
Status launch_mask_gradient(const BackwardProblem& b, const float* sum, cudaStream_t stream) {
  const MaskGradientArgs args = mask_gradient_args(b, sum);
  const int64_t blocks = ceil_div(args.elements, int64_t{256});
  if (blocks == 0) return {};
  if (blocks > kMaxBlocksPerLaunch) return {StatusCode::impl_unavailable, std::string(kImpl) + ": a mask of more than 2^38 elements"};
  const auto grid = static_cast<unsigned>(blocks);
  switch (b.forward.mask_kind) {
    case MaskKind::additive_f16: mask_gradient_kernel<__half><<<grid, 256, 0, stream>>>(args); break;
    case MaskKind::additive_bf16: mask_gradient_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(args); break;
    default: mask_gradient_kernel<float><<<grid, 256, 0, stream>>>(args); break;
  }
  FFPA_RETURN_IF_DEVICE_ERROR(kImpl, cudaGetLastError());
  return {};
}

// The sinks' gradient, a CTA per query head, after the preprocess's delta.
Status launch_sink_gradient(const BackwardProblem& b, const float* delta, cudaStream_t stream) {
  if (b.forward.heads_q == 0) return {};
  sink_gradient_kernel<kSinkThreads><<<static_cast<unsigned>(b.forward.heads_q), kSinkThreads, 0, stream>>>(
      sink_gradient_args(b, delta));
  FFPA_RETURN_IF_DEVICE_ERROR(kImpl, cudaGetLastError());
  return {};
}

template <class Element>
Status run_typed(const BackwardProblem& unplanned, void* workspace, cudaStream_t stream, GradientRunner gradients) {
  using T = Traits<Element, kSliceCols>;
  const WorkspaceLayout layout = workspace_layout(unplanned);
  auto* const base = static_cast<unsigned char*>(workspace);
  const BackwardProblem b = planned_problem(unplanned, base);
  const AttentionProblem& p = b.forward;
  float* const delta = reinterpret_cast<float*>(base + layout.delta);
  float* const d_mask_sum = b.d_mask != nullptr ? reinterpret_cast<float*>(base + layout.d_mask_sum) : nullptr;
  if (d_mask_sum != nullptr) {
    FFPA_RETURN_IF_DEVICE_ERROR(
        kImpl, cudaMemsetAsync(d_mask_sum, 0, static_cast<size_t>(layout.d_mask_elements) * sizeof(float), stream));
  }
  // A sequence batch: its lengths checked and its tiles planned on the device
  // (a faulty plan has no tiles: the kernels write nothing).
  if (p.sequences.active) {
    if (Status status = serving::launch_plan(p, query_tiling(), base + layout.query_plan, stream); !status.ok())
      return status;
    if (Status status = serving::launch_plan(p, key_tiling(), base + layout.key_plan, stream); !status.ok())
      return status;
  }
  if (Status status = launch_preprocess<Element>(b, delta, stream); !status.ok()) return status;
  if (b.d_sinks != nullptr) {
    if (Status status = launch_sink_gradient(b, delta, stream); !status.ok()) return status;
  }
  const Args args = kernel_args(b, delta, d_mask_sum);
  if (gradients != nullptr) {
    if (Status status = gradients(b, delta, d_mask_sum, stream); !status.ok()) return status;
  } else {
    if (Status status = launch_grid<T>(dkdv_kernel<T>, args, dkdv_ctas<T>(p), stream); !status.ok()) return status;
    if (Status status = launch_grid<T>(dq_kernel<T>, args, dq_ctas<T>(p), stream); !status.ok()) return status;
  }
  return d_mask_sum != nullptr ? launch_mask_gradient(b, d_mask_sum, stream) : Status{};
}

template <class Element>
Status runnable_typed(int device) {
  using T = Traits<Element, kSliceCols>;
  static KernelImageMemo dkdv_memo, dq_memo, preprocess_memo, sink_memo;
  for (auto [kernel, threads, memo] :
       {std::tuple{reinterpret_cast<const void*>(&dkdv_kernel<T>), T::kThreads, &dkdv_memo},
        std::tuple{reinterpret_cast<const void*>(&dq_kernel<T>), T::kThreads, &dq_memo},
        std::tuple{reinterpret_cast<const void*>(&preprocess_kernel<Element>), 32 * kPreprocessRows, &preprocess_memo},
        std::tuple{reinterpret_cast<const void*>(&sink_gradient_kernel<kSinkThreads>), kSinkThreads, &sink_memo}}) {
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

size_t workspace_bytes(const BackwardProblem& b) { return workspace_layout(b).bytes; }

Status check(const BackwardProblem& b) {
  const AttentionProblem& p = b.forward;
  const RowExtent q_rows = query_extent(p), k_rows = key_extent(p);
  if (p.seq_q > kMaxSequenceLength || p.seq_kv > kMaxSequenceLength || q_rows.rows > kMaxSequenceLength ||
      k_rows.rows > kMaxSequenceLength) {
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

Status run(const BackwardProblem& b, void* workspace, cudaStream_t stream, GradientRunner gradients) {
  const AttentionProblem& p = b.forward;
  const RowExtent q_rows = query_extent(p), k_rows = key_extent(p);
  // No row and no key: nothing to compute, unless the sinks' gradient (then 0) is to be written.
  if (q_rows.entries * p.heads_q * q_rows.rows == 0 && k_rows.entries * p.heads_kv * k_rows.rows == 0 &&
      b.d_sinks == nullptr)
    return {};
  return p.dtype == DType::bf16 ? run_typed<__nv_bfloat16>(b, workspace, stream, gradients)
                                : run_typed<__half>(b, workspace, stream, gradients);
}

}  // namespace ffpa::detail::sm80_backward
