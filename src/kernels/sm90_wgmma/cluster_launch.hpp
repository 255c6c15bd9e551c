// A kernel launch in clusters of `cluster` consecutive CTAs (1: no cluster
// attribute), with its dynamic shared memory opted into: the sm90 kernels'
// one launch (the forward's tiles, the backward's blocks). `programmatic`:
// launched as the programmatic dependent of the kernel before it on the
// stream (Hopper's PDL): its CTAs may start once every CTA of that kernel has
// called launch_dependent_grid (ptx.cuh), so the kernel must read nothing that
// kernel writes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ffpa/ffpa.hpp"
#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"

namespace ffpa::detail::sm90_wgmma {

template <class... KernelArgs, class... Args>
cudaError_t launch_in_clusters(void (*kernel)(KernelArgs...), int64_t blocks, int threads, int shared_bytes,
                               int cluster, bool programmatic, cudaStream_t stream, const Args&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(shared_bytes);
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = static_cast<unsigned>(cluster);
    attributes[count].val.clusterDim.y = attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  if (programmatic) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// Opts `kernel` into its shared memory on the current device (once per device:
// `opt_in`) and launches it in clusters. A device without the kernel's image
// fails the opt-in (impl_unavailable), as does a launch the device cannot give
// its resources or cluster; a failed launch is retried once after setting the
// opt-in again (a device reset since drops it).
template <class... KernelArgs, class... Args>
Status launch_opted_in(const char* impl, SharedMemoryOptIn* opt_in, void (*kernel)(KernelArgs...), int64_t blocks,
                       int threads, int shared_bytes, int cluster, bool programmatic, cudaStream_t stream,
                       const Args&... args) {
  int device = 0;
  FFPA_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  const void* symbol = reinterpret_cast<const void*>(kernel);
  FFPA_RETURN_IF_DEVICE_ERROR(impl, opt_in_shared_memory(symbol, shared_bytes, device, opt_in));
  cudaError_t error = launch_in_clusters(kernel, blocks, threads, shared_bytes, cluster, programmatic, stream, args...);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    forget_shared_memory_opt_in(device, opt_in);
    error = opt_in_shared_memory(symbol, shared_bytes, device, opt_in);
    if (error == cudaSuccess) {
      error = launch_in_clusters(kernel, blocks, threads, shared_bytes, cluster, programmatic, stream, args...);
    }
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return device_status(error, impl, "cudaLaunchKernelEx");
  }
  return {};
}

}  // namespace ffpa::detail::sm90_wgmma
