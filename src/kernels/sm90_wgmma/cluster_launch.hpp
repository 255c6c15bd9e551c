// A kernel launch in clusters of `cluster` consecutive CTAs (1: no cluster
// attribute), with its dynamic shared memory: the sm90 kernels' one
// cudaLaunchKernelEx (the forward's D > 512 tiles, the backward's blocks).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ffpa::detail::sm90_wgmma {

template <class... KernelArgs, class... Args>
cudaError_t launch_in_clusters(void (*kernel)(KernelArgs...), int64_t blocks, int threads, int shared_bytes,
                               int cluster, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = cluster > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace ffpa::detail::sm90_wgmma
