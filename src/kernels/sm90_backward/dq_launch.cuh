// Launching the dQ kernel: tensor maps, shared-memory opt-in, one CTA per 64
// query rows of a head. Included only by the generated per-head-dim
// translation units.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"
#include "kernels/sm90_backward/dq_arguments.hpp"
#include "kernels/sm90_backward/dq_kernel.cuh"
#include "kernels/sm90_backward/family.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_backward {

template <class Traits>
Status launch_dq(const BackwardProblem& b, const float* delta, float* d_mask_sum, cudaStream_t stream) {
  const DqLaunch launch = dq_launch(b, delta, d_mask_sum);
  if (launch.ctas == 0) return {};
  CUtensorMap maps[4];
  if (Status status = sm90_wgmma::encode_tensor_maps(launch.maps, {64, 64, 64, 64}, {1, 1, 1, 1}, maps); !status.ok()) {
    return status;
  }
  const auto kernel = dq_kernel<Traits>;
  static SharedMemoryOptIn opt_in;
  int device = 0;
  FFPA_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  FFPA_RETURN_IF_DEVICE_ERROR("sm90_backward", opt_in_shared_memory(reinterpret_cast<const void*>(kernel),
                                                                    Traits::kSmemBytes, device, &opt_in));
  kernel<<<static_cast<unsigned>(launch.ctas), Traits::kThreads, Traits::kSmemBytes, stream>>>(
      launch.args, maps[0], maps[1], maps[2], maps[3]);
  FFPA_RETURN_IF_DEVICE_ERROR("sm90_backward", cudaGetLastError());
  return {};
}

template <int kHeadDim>
Status launch_dq_instance(const BackwardProblem& b, const float* delta, float* d_mask_sum, cudaStream_t stream) {
  if (b.forward.dtype == DType::bf16) return launch_dq<DqTraits<__nv_bfloat16, kHeadDim>>(b, delta, d_mask_sum, stream);
  return launch_dq<DqTraits<__half, kHeadDim>>(b, delta, d_mask_sum, stream);
}

template <int kHeadDim>
Status dq_instance_runnable(DType dtype, int device) {
  static KernelImageMemo bf16_memo, f16_memo;
  const void* kernel = dtype == DType::bf16 ? reinterpret_cast<const void*>(&dq_kernel<DqTraits<__nv_bfloat16, kHeadDim>>)
                                            : reinterpret_cast<const void*>(&dq_kernel<DqTraits<__half, kHeadDim>>);
  return kernel_runnable(kernel, 384, "sm90_backward", device, dtype == DType::bf16 ? &bf16_memo : &f16_memo);
}

}  // namespace ffpa::detail::sm90_backward
