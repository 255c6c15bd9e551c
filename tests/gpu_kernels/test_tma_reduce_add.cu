// TMA's reduce-add of fp32 boxes (ptx.cuh's tma_reduce_add_4d) on the GPU:
// reduce_add.cuh's adds, the source the emulated test (tests/emulation/
// test_sm90_tma_emulated.cpp) runs on the CPU, checked exactly
// (reduce_add_case.hpp). Needs an sm_90 device (skipped elsewhere).
#include <cuda.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpu_kernels/reduce_add_case.hpp"

namespace {

using namespace ffpa::testing::reduce_add;

constexpr int kAlign = 1024;  // a swizzled box's alignment

::testing::AssertionResult cuda_ok(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << call << " failed: " << cudaGetErrorName(error) << " ("
                                       << cudaGetErrorString(error) << ")";
}
#define REDUCE_CHECK(call) ASSERT_TRUE(cuda_ok((call), #call))

__global__ void __launch_bounds__(128) reduce_add_kernel(const uint4* image, int units,
                                                         const __grid_constant__ CUtensorMap map) {
  extern __shared__ uint8_t shared_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (kAlign - raw % kAlign) % kAlign;  // the runtime promises 16 bytes of alignment
  uint4* const boxes = reinterpret_cast<uint4*>(shared_raw + pad);
  for (int i = threadIdx.x; i < units; i += 128) boxes[i] = image[i];
  ffpa::detail::sm90_wgmma::fence_proxy_async();  // generic-proxy stores before TMA's reads
  __syncthreads();
  add_boxes(raw + pad, &map, static_cast<int>(threadIdx.x));
}

bool sm90_device() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9;
}

TEST(TmaReduceAdd, AddsFp32BoxesSkippingWhatFallsOutside) {
  if (!sm90_device()) GTEST_SKIP() << "no sm_90 device";
  const std::vector<unsigned char> image = shared_image();
  const std::vector<float> initial = initial_tensor();
  void *image_d = nullptr, *tensor_d = nullptr;
  const size_t tensor_bytes = initial.size() * sizeof(float);
  REDUCE_CHECK(cudaMalloc(&image_d, image.size()));
  REDUCE_CHECK(cudaMalloc(&tensor_d, tensor_bytes));
  REDUCE_CHECK(cudaMemcpy(image_d, image.data(), image.size(), cudaMemcpyHostToDevice));
  REDUCE_CHECK(cudaMemcpy(tensor_d, initial.data(), tensor_bytes, cudaMemcpyHostToDevice));
  CUtensorMap map;
  const ffpa::Status encoded =
      ffpa::detail::sm90_wgmma::encode_tensor_map(tensor_spec(static_cast<const float*>(tensor_d)), &map);
  ASSERT_TRUE(encoded.ok()) << encoded.message;
  const int shared_bytes = static_cast<int>(image.size()) + kAlign;
  REDUCE_CHECK(cudaFuncSetAttribute(reduce_add_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
  reduce_add_kernel<<<1, 128, shared_bytes>>>(static_cast<const uint4*>(image_d), static_cast<int>(image.size() / 16),
                                              map);
  REDUCE_CHECK(cudaGetLastError());
  REDUCE_CHECK(cudaDeviceSynchronize());
  std::vector<float> tensor(initial.size());
  REDUCE_CHECK(cudaMemcpy(tensor.data(), tensor_d, tensor_bytes, cudaMemcpyDeviceToHost));
  REDUCE_CHECK(cudaFree(image_d));
  REDUCE_CHECK(cudaFree(tensor_d));
  const std::vector<float> expected = expected_tensor();
  for (size_t i = 0; i < tensor.size(); ++i) {
    ASSERT_EQ(tensor[i], expected[i]) << "row " << i / kTensorCols << ", column " << i % kTensorCols;
  }
}

}  // namespace
