// A call's temporary memory (split-KV's partial rows, FP8's quantized
// operands, the backward's delta): the caller's workspace, or stream-ordered
// memory that release() frees on the stream after the work queued there.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "ffpa/ffpa.hpp"
#include "host/cuda_status.hpp"

namespace ffpa::detail {

class Workspace {
 public:
  Workspace(void* given, size_t given_bytes, cudaStream_t stream)
      : given_(given), given_bytes_(given_bytes), stream_(stream) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // `bytes` of it for `what`, at *memory.
  Status acquire(size_t bytes, const char* what, void** memory) {
    if (bytes == 0) {  // nothing to allocate (cudaMallocAsync of 0 bytes is not defined to succeed)
      *memory = nullptr;
      return {};
    }
    if (given_ != nullptr) {
      if (given_bytes_ < bytes) {
        return {StatusCode::workspace_too_small, std::string(what) + " needs " + std::to_string(bytes) +
                                                     " bytes of workspace, got " + std::to_string(given_bytes_)};
      }
      *memory = given_;
      return {};
    }
    if (const cudaError_t error = cudaMallocAsync(&allocated_, bytes, stream_); error != cudaSuccess) {
      (void)cudaGetLastError();
      allocated_ = nullptr;
      return error == cudaErrorMemoryAllocation
                 ? Status{StatusCode::out_of_memory,
                          std::string(what) + ": no device memory for its " + std::to_string(bytes) + " bytes"}
                 : cuda_status(error, "cudaMallocAsync");
    }
    *memory = allocated_;
    return {};
  }

  // Frees what acquire allocated; `status`, or the free's failure if it was ok.
  Status release(Status status) {
    if (allocated_ != nullptr) {
      if (const cudaError_t error = cudaFreeAsync(allocated_, stream_); error != cudaSuccess && status.ok()) {
        (void)cudaGetLastError();
        status = cuda_status(error, "cudaFreeAsync");
      }
      allocated_ = nullptr;
    }
    return status;
  }

 private:
  void* given_;
  size_t given_bytes_;
  cudaStream_t stream_;
  void* allocated_ = nullptr;
};

}  // namespace ffpa::detail
