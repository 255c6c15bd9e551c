#include "host/kernel_image.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "host/cuda_status.hpp"

namespace ffpa::detail {

Status kernel_runnable(const void* kernel, int threads, const char* impl, int device,
                       KernelImageMemo* memo) {
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (memo->runnable_devices.load(std::memory_order_relaxed) & bit) != 0) return {};
  cudaFuncAttributes attributes{};
  if (const cudaError_t error = cudaFuncGetAttributes(&attributes, kernel); error != cudaSuccess) {
    (void)cudaGetLastError();  // non-sticky: leave no error behind for a later launch check
    return device_status(error, impl, "cudaFuncGetAttributes");
  }
  if (attributes.maxThreadsPerBlock < threads) {
    return {StatusCode::impl_unavailable,
            std::string("impl ") + impl + " cannot run on device " + std::to_string(device) +
                ": its kernel takes " + std::to_string(threads) + " threads per block, but with " +
                std::to_string(attributes.numRegs) + " registers per thread the device runs at most " +
                std::to_string(attributes.maxThreadsPerBlock)};
  }
  if (bit != 0) memo->runnable_devices.fetch_or(bit, std::memory_order_relaxed);
  return {};
}

namespace {

uint64_t device_bit(int device) { return device >= 0 && device < 64 ? uint64_t{1} << device : 0; }

}  // namespace

cudaError_t opt_in_shared_memory(const void* kernel, int bytes, int device, SharedMemoryOptIn* memo) {
  const uint64_t bit = device_bit(device);
  if (bit != 0 && (memo->devices.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  const cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (error == cudaSuccess && bit != 0) memo->devices.fetch_or(bit, std::memory_order_relaxed);
  return error;
}

void forget_shared_memory_opt_in(int device, SharedMemoryOptIn* memo) {
  memo->devices.fetch_and(~device_bit(device), std::memory_order_relaxed);
}

}  // namespace ffpa::detail
