// Device memory for the GPU tests: a checked CUDA call, an owning device
// buffer (cudaMalloc / cudaFree), and device mirrors of host test tensors that
// keep the host tensor's strides, so the GPU sees the same layout as the CPU
// reference.
//
// Functions here report CUDA failures with gtest assertions; call them through
// ASSERT_NO_FATAL_FAILURE so that a failure stops the test.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "ffpa/ffpa.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

inline ::testing::AssertionResult cuda_ok(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << call << " failed: " << cudaGetErrorName(error) << " ("
                                       << cudaGetErrorString(error) << ")";
}

}  // namespace ffpa::testing

#define FFPA_ASSERT_CUDA(call) ASSERT_TRUE(::ffpa::testing::cuda_ok((call), #call))
#define FFPA_EXPECT_CUDA(call) EXPECT_TRUE(::ffpa::testing::cuda_ok((call), #call))

namespace ffpa::testing {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() { release(); }

  // Replaces the buffer by `bytes` bytes of uninitialized device memory.
  void allocate(size_t bytes) {
    release();
    FFPA_ASSERT_CUDA(cudaMalloc(&data_, bytes));
    bytes_ = bytes;
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() {
    if (data_ != nullptr) {
      FFPA_EXPECT_CUDA(cudaFree(data_));
    }
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host buffer, and a tensor that views it exactly as the
// host view views the host buffer (same strides, same offset).
struct DeviceTensor {
  DeviceBuffer buffer;
  Tensor tensor;
};

// Copies all of `host` (gaps between rows included) to the device; `view`
// must point into host.tensor's buffer. Synchronous.
inline void mirror_to_device(const HostTensor& host, const Tensor& view, DeviceTensor* device) {
  ASSERT_NO_FATAL_FAILURE(device->buffer.allocate(host.bytes()));
  FFPA_ASSERT_CUDA(cudaMemcpy(device->buffer.data(), host.tensor.data, host.bytes(),
                              cudaMemcpyHostToDevice));
  const auto offset = static_cast<const unsigned char*>(view.data) -
                      static_cast<const unsigned char*>(host.tensor.data);
  ASSERT_TRUE(offset >= 0 && static_cast<size_t>(offset) < host.bytes())
      << "the view does not point into the host buffer";
  device->tensor = view;
  device->tensor.data = static_cast<unsigned char*>(device->buffer.data()) + offset;
}

// Copies the whole device buffer back into `host` (same size), ordered on
// `stream`, and waits for it.
inline void copy_to_host(const DeviceTensor& device, HostTensor* host, cudaStream_t stream) {
  ASSERT_EQ(device.buffer.bytes(), host->bytes());
  FFPA_ASSERT_CUDA(cudaMemcpyAsync(host->tensor.data, device.buffer.data(), host->bytes(),
                                   cudaMemcpyDeviceToHost, stream));
  FFPA_ASSERT_CUDA(cudaStreamSynchronize(stream));
}

// What gpu_unavailable_reason reports: no device, or one older than compute
// capability 8.0.
inline std::optional<std::string> query_gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(error) +
           ")";
  }
  if (count == 0) return std::string("no CUDA device");
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cannot query the compute capability of device 0");
  }
  if (major < 8)
    return "device 0 has compute capability " + std::to_string(major) + "." +
           std::to_string(minor) + "; the GPU kernels need 8.0 or newer";
  return std::nullopt;
}

// Why the GPU tests cannot run on this machine, or nothing (queried once).
inline const std::optional<std::string>& gpu_unavailable_reason() {
  static const std::optional<std::string> reason = query_gpu_unavailable_reason();
  return reason;
}

}  // namespace ffpa::testing
