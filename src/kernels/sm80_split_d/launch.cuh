// Launching the split-D kernel: shared-memory opt-in, grid, chunked launches.
// Included only by the generated per-head-dim translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm80_split_d/kernel.cuh"

namespace ffpa::detail::sm80_split_d {

template <class Traits>
Status launch(const AttentionProblem& problem, int value_splits, const SplitLaunch& split, cudaStream_t stream) {
  const auto kernel = forward_kernel<Traits>;
  int device = 0, smem_optin = 0;
  FFPA_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  FFPA_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (Traits::kSmemBytes > smem_optin) {
    return {StatusCode::impl_unavailable,
            "impl sm80_split_d: the kernel for head dim " + std::to_string(problem.head_dim) +
                " needs " + std::to_string(Traits::kSmemBytes) +
                " bytes of shared memory per block; this device allows " +
                std::to_string(smem_optin)};
  }
  // A device this build has no image for fails here (impl_unavailable), as
  // does a launch the device cannot give its resources, below.
  FFPA_RETURN_IF_DEVICE_ERROR("sm80_split_d", cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));

  Args args = forward_args<Traits>(problem, value_splits, split);
  const int64_t total_blocks = forward_ctas<Traits>(args);
  constexpr int64_t kMaxBlocksPerLaunch = int64_t{1} << 30;  // below gridDim.x's 2^31 - 1
  for (int64_t first = 0; first < total_blocks; first += kMaxBlocksPerLaunch) {
    args.block_offset = first;
    const auto blocks = static_cast<unsigned>(std::min(kMaxBlocksPerLaunch, total_blocks - first));
    kernel<<<blocks, Traits::kThreads, Traits::kSmemBytes, stream>>>(args);
    FFPA_RETURN_IF_DEVICE_ERROR("sm80_split_d", cudaGetLastError());
  }
  return {};
}

template <class Traits>
Status runnable(int device) {
  static KernelImageMemo memo;
  return kernel_runnable(reinterpret_cast<const void*>(&forward_kernel<Traits>), Traits::kThreads,
                         "sm80_split_d", device, &memo);
}

// Calls action(TraitsTag<Traits>{}) with the kernel traits of instance
// kOutCols for the dtype and accumulation.
template <class Traits>
struct TraitsTag {
  using type = Traits;
};
template <int kOutCols, class Action>
Status with_traits(DType dtype, Accumulation accumulation, Action&& action) {
  constexpr TileShape kTile = tile_shape(kOutCols);
  static_assert(kTile.out_cols == kOutCols);
  if (dtype == DType::bf16) {
    return action(TraitsTag<Traits<__nv_bfloat16, false, kOutCols, kTile.warp_rows, kTile.warps_m,
                                   kTile.warps_n, kTile.block_n, kTile.pv_keys, kTile.stages>>{});
  }
  if (accumulation == Accumulation::f16) {
    return action(TraitsTag<Traits<__half, true, kOutCols, kTile.warp_rows, kTile.warps_m,
                                   kTile.warps_n, kTile.block_n, kTile.pv_keys, kTile.stages>>{});
  }
  return action(TraitsTag<Traits<__half, false, kOutCols, kTile.warp_rows, kTile.warps_m,
                                 kTile.warps_n, kTile.block_n, kTile.pv_keys, kTile.stages>>{});
}

template <int kOutCols>
Status launch_instance(const AttentionProblem& problem, int value_splits, const SplitLaunch& split,
                       cudaStream_t stream) {
  return with_traits<kOutCols>(problem.dtype, problem.accumulation, [&](auto tag) {
    return launch<typename decltype(tag)::type>(problem, value_splits, split, stream);
  });
}

template <int kOutCols>
Status instance_runnable(DType dtype, Accumulation accumulation, int device) {
  return with_traits<kOutCols>(dtype, accumulation, [&](auto tag) {
    return runnable<typename decltype(tag)::type>(device);
  });
}

}  // namespace ffpa::detail::sm80_split_d
