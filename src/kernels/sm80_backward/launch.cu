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
#include "kernels/sm80_backward/kernels.cuh"
#include "kernels/sm80_backward/preprocess.cuh"

namespace ffpa::detail::sm80_backward {
namespace {

constexpr const char* kImpl = "sm80_split_d (backward)";
constexpr int64_t kMaxBlocksPerLaunch = int64_t{1} << 30;  // below gridDim.x's 2^31 - 1

int slices_of(const AttentionProblem& p) {
  return static_cast<int>(ceil_div(std::max(p.head_dim, p.dv()), int64_t{kSliceCols}));
}

template <class Element>
Status launch_preprocess(const BackwardProblem& b, float* delta, cudaStream_t stream) {
  const AttentionProblem& p = b.forward;
  PreprocessArgs args{};
  args.o = p.o;
  args.d_o = b.d_o;
  args.d_lse = b.d_lse;
  for (int i = 0; i < 3; ++i) {
    args.o_stride[i] = p.o_stride[i];
    args.d_o_stride[i] = b.d_o_stride[i];
    args.d_lse_stride[i] = b.d_lse_stride[i];
  }
  args.delta = delta;
  args.heads_q = p.heads_q;
  args.seq_q = p.seq_q;
  args.rows = p.batch * p.heads_q * p.seq_q;
  args.value_dim = static_cast<int>(p.dv());
  const int64_t blocks = ceil_div(args.rows, int64_t{8});
  if (blocks == 0) return {};
  if (blocks > kMaxBlocksPerLaunch) {
    return {StatusCode::impl_unavailable, std::string(kImpl) + ": more than 2^33 query rows"};
  }
  preprocess_kernel<Element><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(args);
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
  Args args{};
  args.p = p;
  args.delta = delta;
  args.d_q = b.d_q;
  args.d_k = b.d_k;
  args.d_v = b.d_v;
  args.d_o = b.d_o;
  for (int i = 0; i < 3; ++i) {
    args.d_q_stride[i] = b.d_q_stride[i];
    args.d_k_stride[i] = b.d_k_stride[i];
    args.d_v_stride[i] = b.d_v_stride[i];
    args.d_o_stride[i] = b.d_o_stride[i];
  }
  args.slices = slices_of(p);
  args.scale_log2 = p.scale * kLog2e;
  const int64_t key_blocks = ceil_div(p.seq_kv, int64_t{T::kBlockK});
  const int64_t query_blocks = ceil_div(p.seq_q, int64_t{T::kBlockQ});
  if (Status status = launch_grid<T>(dkdv_kernel<T>, args, p.batch * p.heads_kv * key_blocks * args.slices, stream);
      !status.ok()) {
    return status;
  }
  return launch_grid<T>(dq_kernel<T>, args, p.batch * p.heads_q * query_blocks * args.slices, stream);
}

template <class Element>
Status runnable_typed(int device) {
  using T = Traits<Element, kSliceCols>;
  static KernelImageMemo dkdv_memo, dq_memo, preprocess_memo;
  for (auto [kernel, threads, memo] :
       {std::tuple{reinterpret_cast<const void*>(&dkdv_kernel<T>), T::kThreads, &dkdv_memo},
        std::tuple{reinterpret_cast<const void*>(&dq_kernel<T>), T::kThreads, &dq_memo},
        std::tuple{reinterpret_cast<const void*>(&preprocess_kernel<Element>), 256, &preprocess_memo}}) {
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
