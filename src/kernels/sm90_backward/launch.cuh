// Launching the sm90 backward kernels: tensor maps, shared-memory opt-in, one
// CTA (a cluster of two above D 512) per 64 stationary rows; dK, dV and dQ one after the other on the
// stream (after the preprocess's delta). Included only by the generated
// per-head-dim translation units.
//
// A role's kernel launches as the programmatic dependent (PDL) of the role's
// kernel before it (dV of dK, dQ of dV; a role without CTAs launches nothing):
// each reads only the inputs and delta, written before the first launched, so
// its CTAs may start on the SMs the previous kernel's last CTAs leave idle
// (D 1024, B1 H32 N8192: 8192 CTAs, 62.06 waves of 132; MLA's causal dK one
// wave of blocks up to twice the mean). Each kernel completes after the one
// before it (kernel.cuh), so the stream's order holds for what follows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"
#include "kernels/sm90_backward/arguments.hpp"
#include "kernels/sm90_backward/family.hpp"
#include "kernels/sm90_backward/kernel.cuh"
#include "kernels/sm90_wgmma/cluster_launch.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_backward {

template <class Traits>
Status launch_role(const BackwardProblem& b, const float* delta, float* d_mask_sum, bool* after_role,
                   cudaStream_t stream) {
  const Launch launch = backward_launch(b, Traits::kRole, delta, d_mask_sum);
  if (launch.ctas == 0) return {};
  CUtensorMap maps[4];
  if (Status status = sm90_wgmma::encode_tensor_maps(launch.maps, {64, 64, 64, 64}, {1, 1, 1, 1}, maps); !status.ok()) {
    return status;
  }
  static SharedMemoryOptIn opt_in;
  const Status status = sm90_wgmma::launch_opted_in("sm90_backward", &opt_in, backward_kernel<Traits>,
                                                    launch.ctas * Traits::kSplit, Traits::kThreads, Traits::kSmemBytes,
                                                    Traits::kSplit, *after_role, stream, launch.args, maps[0], maps[1],
                                                    maps[2], maps[3]);
  if (status.ok()) *after_role = true;
  return status;
}

template <int kHeadDim, class Element>
Status launch_gradients(const BackwardProblem& b, const float* delta, float* d_mask_sum, cudaStream_t stream) {
  bool after_role = false;  // a role's kernel is on the stream before the next one
  if (Status status = launch_role<Traits<Element, kHeadDim, Role::dk>>(b, delta, d_mask_sum, &after_role, stream);
      !status.ok()) {
    return status;
  }
  if (Status status = launch_role<Traits<Element, kHeadDim, Role::dv>>(b, delta, d_mask_sum, &after_role, stream);
      !status.ok()) {
    return status;
  }
  return launch_role<Traits<Element, kHeadDim, Role::dq>>(b, delta, d_mask_sum, &after_role, stream);
}

template <int kHeadDim>
Status launch_instance(const BackwardProblem& b, const float* delta, float* d_mask_sum, cudaStream_t stream) {
  if (b.forward.dtype == DType::bf16) return launch_gradients<kHeadDim, __nv_bfloat16>(b, delta, d_mask_sum, stream);
  return launch_gradients<kHeadDim, __half>(b, delta, d_mask_sum, stream);
}

template <int kHeadDim, class Element>
Status runnable_element(int device) {
  static KernelImageMemo memos[3];
  const void* kernels[3] = {reinterpret_cast<const void*>(&backward_kernel<Traits<Element, kHeadDim, Role::dq>>),
                            reinterpret_cast<const void*>(&backward_kernel<Traits<Element, kHeadDim, Role::dk>>),
                            reinterpret_cast<const void*>(&backward_kernel<Traits<Element, kHeadDim, Role::dv>>)};
  for (int i = 0; i < 3; ++i) {
    if (Status status = kernel_runnable(kernels[i], 384, "sm90_backward", device, &memos[i]); !status.ok()) return status;
  }
  return {};
}

template <int kHeadDim>
Status instance_runnable(DType dtype, int device) {
  return dtype == DType::bf16 ? runnable_element<kHeadDim, __nv_bfloat16>(device)
                              : runnable_element<kHeadDim, __half>(device);
}

}  // namespace ffpa::detail::sm90_backward
