// The RS wgmma wrapper (wgmma_rs: A in registers) and a_fragment.cuh's A
// fragment from S's accumulators on the GPU: p_in_registers.cuh's product
// (S = Q K^T, P = S rounded in S's registers, O = P V), the source the
// emulated test (tests/emulation/test_sm90_wgmma_emulated.cpp) runs on the
// CPU, against an fp64 product. Needs an sm_90 device (skipped elsewhere).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_kernels/p_in_registers_case.hpp"

namespace {

using namespace ffpa::testing::p_in_registers;

constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 8 rows

::testing::AssertionResult cuda_ok(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << call << " failed: " << cudaGetErrorName(error) << " ("
                                       << cudaGetErrorString(error) << ")";
}
#define RS_CHECK(call) ASSERT_TRUE(cuda_ok((call), #call))

template <class Element, int kKeys, int kValueCols, bool kTransposeV>
__global__ void __launch_bounds__(128) rs_kernel(const uint4* image, int units, float* s, float* o) {
  extern __shared__ uint8_t shared_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (kAlign - raw % kAlign) % kAlign;  // the runtime promises 16 bytes of alignment
  uint4* const box = reinterpret_cast<uint4*>(shared_raw + pad);
  for (int i = threadIdx.x; i < units; i += 128) box[i] = image[i];
  ffpa::detail::sm90_wgmma::fence_proxy_async();  // generic-proxy stores before the tensor cores' reads
  __syncthreads();
  p_in_registers_product<Element, kKeys, kValueCols, kTransposeV>(raw + pad, static_cast<int>(threadIdx.x), s, o);
}

bool sm90_device() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9;
}

// One product of for_each_product, checked against the fp64 one.
struct ExpectProduct {
  template <class Element, int kKeys, int kValueCols, bool kTransposeV>
  void run(uint64_t seed) const {
    SCOPED_TRACE((product_name<kKeys, kValueCols, kTransposeV>()));
    const Case c = make_case<Element>(seed, kKeys, kValueCols);
    const std::vector<unsigned char> image = shared_image<Element, kKeys, kValueCols, kTransposeV>(c);
    ASSERT_EQ(image.size() % 16, 0u);
    void *image_d = nullptr, *s_d = nullptr, *o_d = nullptr;
    const size_t s_bytes = sizeof(float) * kRows * kKeys, o_bytes = sizeof(float) * kRows * kValueCols;
    RS_CHECK(cudaMalloc(&image_d, image.size()));
    RS_CHECK(cudaMalloc(&s_d, s_bytes));
    RS_CHECK(cudaMalloc(&o_d, o_bytes));
    RS_CHECK(cudaMemcpy(image_d, image.data(), image.size(), cudaMemcpyHostToDevice));
    const int shared_bytes = static_cast<int>(image.size()) + kAlign;
    auto kernel = rs_kernel<Element, kKeys, kValueCols, kTransposeV>;
    RS_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes));
    kernel<<<1, 128, shared_bytes>>>(static_cast<const uint4*>(image_d), static_cast<int>(image.size() / 16),
                                     static_cast<float*>(s_d), static_cast<float*>(o_d));
    RS_CHECK(cudaGetLastError());
    RS_CHECK(cudaDeviceSynchronize());
    std::vector<float> s(static_cast<size_t>(kRows * kKeys)), o(static_cast<size_t>(kRows * kValueCols));
    RS_CHECK(cudaMemcpy(s.data(), s_d, s_bytes, cudaMemcpyDeviceToHost));
    RS_CHECK(cudaMemcpy(o.data(), o_d, o_bytes, cudaMemcpyDeviceToHost));
    RS_CHECK(cudaFree(image_d));
    RS_CHECK(cudaFree(s_d));
    RS_CHECK(cudaFree(o_d));
    EXPECT_TRUE(matches<Element>(c, s, o));
  }
};

TEST(WgmmaRs, MultipliesPFromTheRegistersOfS) {
  if (!sm90_device()) GTEST_SKIP() << "no sm_90 device";
  for_each_product(ExpectProduct{});
}

}  // namespace
