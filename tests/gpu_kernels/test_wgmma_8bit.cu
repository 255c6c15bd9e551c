// The 8-bit wgmma wrappers (wgmma_ss_e4m3, wgmma_ss_s8) against an exact CPU
// product, one warpgroup per case: A [64][128] and B [N][128] (both K-major,
// one 128-byte swizzled row per matrix row, as TMA's SWIZZLE_128B writes
// them), four k32 steps whose descriptors advance 32 bytes along the row, as
// the 16-bit family's k16 steps do. A wrong descriptor, swizzle, operand order
// or accumulator layout shows up as a mismatch; the first step runs with
// accumulate = 0 over non-zero accumulators, so a wrong scale-d does too.
// Needs an sm_90 device (skipped elsewhere).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <type_traits>
#include <vector>

#include "common/fp8_e4m3.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/wgmma.cuh"

namespace {

using namespace ffpa::detail;
using namespace ffpa::detail::sm90_wgmma;

::testing::AssertionResult cuda_ok(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << call << " failed: " << cudaGetErrorName(error) << " ("
                                       << cudaGetErrorString(error) << ")";
}

#define WGMMA8_CHECK(call) ASSERT_TRUE(cuda_ok((call), #call))

constexpr int kRowsA = 64;   // one wgmma's M
constexpr int kDepth = 128;  // K: one 128-byte swizzled row of 8-bit codes
constexpr int kStepK = 32;   // K of one 8-bit wgmma
constexpr int kThreads = 128;
constexpr int kAlign = 1024;  // the 128-byte swizzle repeats every 8 rows

// e4m3 accuracy, as |gpu - exact| <= kE4m3Tolerance * sum_k |a_k b_k|. The
// tensor core does not sum fp8 products in fp32: measured on an H200, a k32
// step matches, for 70% of the outputs exactly and for the rest within 3
// units, the sum of its 32 exact products each truncated to a multiple of
// 2^(E - 13), E the largest exponent sum e_a + e_b of the step. Over random
// codes (the full finite range, or |x| <= 16) that came to at most 7.5e-4 *
// sum |a_k b_k| after 1 to 4 steps (mean 6e-5); 2^-9 leaves a margin while a
// wrong operand, k step, register or scale-d misses by orders of magnitude.
constexpr double kE4m3Tolerance = 1.0 / 512;

enum class Kind { kE4m3, kS8 };

template <Kind kKind>
using Accumulator = std::conditional_t<kKind == Kind::kE4m3, float, int32_t>;

// fence_operands for either accumulator type (ptx.cuh's is fp32 only).
template <int N>
__device__ __forceinline__ void fence_accumulators(float (&regs)[N]) {
  fence_operands(regs);
}
template <int N>
__device__ __forceinline__ void fence_accumulators(int32_t (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(regs[i])::"memory");
}

// Copies a [rows][128] row-major byte matrix into a 128-byte swizzled box, 16
// bytes (one swizzle segment) per store.
__device__ void load_swizzled(uint8_t* box, const uint8_t* global, int rows) {
  for (int i = threadIdx.x; i < rows * 8; i += kThreads) {
    const int row = i / 8;
    const int col = (i % 8) * 16;
    *reinterpret_cast<uint4*>(box + swizzle128<1>(row, col)) =
        *reinterpret_cast<const uint4*>(global + row * kDepth + col);
  }
}

// D [64][N] = A [64][128] B^T, B given as [N][128].
template <Kind kKind, int N>
__global__ void __launch_bounds__(kThreads) wgmma_8bit_kernel(const uint8_t* a, const uint8_t* b,
                                                              Accumulator<kKind>* d) {
  extern __shared__ uint8_t shared_raw[];
  // The runtime promises 16 bytes of alignment; the descriptors want 1024.
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(shared_raw));
  const uint32_t pad = (kAlign - raw % kAlign) % kAlign;
  uint8_t* const box_a = shared_raw + pad;
  uint8_t* const box_b = box_a + kRowsA * kDepth;
  const uint32_t address_a = raw + pad;
  const uint32_t address_b = address_a + kRowsA * kDepth;

  load_swizzled(box_a, a, kRowsA);
  load_swizzled(box_b, b, N);
  fence_proxy_async();  // generic-proxy stores before the tensor cores' reads
  __syncthreads();

  // Non-zero before the first step: accumulate = 0 must overwrite them.
  Accumulator<kKind> acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = static_cast<Accumulator<kKind>>(12345);

  fence_accumulators(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kDepth / kStepK; ++kk) {
    const uint64_t desc_a = smem_descriptor(address_a + kk * 32, 16, 1024);
    const uint64_t desc_b = smem_descriptor(address_b + kk * 32, 16, 1024);
    if constexpr (kKind == Kind::kE4m3) {
      wgmma_ss_e4m3<N>(acc, desc_a, desc_b, kk != 0);
    } else {
      wgmma_ss_s8<N>(acc, desc_a, desc_b, kk != 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_accumulators(acc);

  // Warp w holds rows 16w + g and 16w + g + 8, columns 8c + 2t + {0, 1}.
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
#pragma unroll
  for (int c = 0; c < N / 8; ++c)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = 16 * warp + g + 8 * half;
        const int col = 8 * c + 2 * t + e;
        d[row * N + col] = acc[4 * c + 2 * half + e];
      }
}

// Owning device allocation.
struct DeviceBytes {
  void* data = nullptr;
  DeviceBytes() = default;
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() {
    if (data != nullptr) cudaFree(data);
  }
};

class Wgmma8Bit : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
    cudaDeviceProp prop{};
    WGMMA8_CHECK(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9 || prop.minor != 0) {
      GTEST_SKIP() << "wgmma needs sm_90; device is sm_" << prop.major << prop.minor;
    }
  }
};

// Runs the kernel on A [64][128] and B [n][128] codes; D comes back [64][n].
template <Kind kKind, int N>
void run_on_gpu(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                std::vector<Accumulator<kKind>>& d) {
  using Acc = Accumulator<kKind>;
  ASSERT_EQ(a.size(), static_cast<size_t>(kRowsA * kDepth));
  ASSERT_EQ(b.size(), static_cast<size_t>(N * kDepth));
  d.assign(static_cast<size_t>(kRowsA) * N, Acc{});
  DeviceBytes a_dev, b_dev, d_dev;
  WGMMA8_CHECK(cudaMalloc(&a_dev.data, a.size()));
  WGMMA8_CHECK(cudaMalloc(&b_dev.data, b.size()));
  WGMMA8_CHECK(cudaMalloc(&d_dev.data, d.size() * sizeof(Acc)));
  WGMMA8_CHECK(cudaMemcpy(a_dev.data, a.data(), a.size(), cudaMemcpyHostToDevice));
  WGMMA8_CHECK(cudaMemcpy(b_dev.data, b.data(), b.size(), cudaMemcpyHostToDevice));
  WGMMA8_CHECK(cudaMemset(d_dev.data, 0xFF, d.size() * sizeof(Acc)));

  const size_t shared_bytes = kAlign + static_cast<size_t>(kRowsA + N) * kDepth;
  auto* kernel = &wgmma_8bit_kernel<kKind, N>;
  WGMMA8_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(shared_bytes)));
  kernel<<<1, kThreads, shared_bytes>>>(static_cast<const uint8_t*>(a_dev.data),
                                        static_cast<const uint8_t*>(b_dev.data),
                                        static_cast<Acc*>(d_dev.data));
  WGMMA8_CHECK(cudaGetLastError());
  WGMMA8_CHECK(cudaDeviceSynchronize());
  WGMMA8_CHECK(cudaMemcpy(d.data(), d_dev.data, d.size() * sizeof(Acc), cudaMemcpyDeviceToHost));
}

// Finite e4m3 codes, uniformly over the 254 of them (0x7F and 0xFF are NaN).
std::vector<uint8_t> random_e4m3(size_t count, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(0, 253);
  std::vector<uint8_t> codes(count);
  for (auto& code : codes) {
    const int c = pick(rng);
    code = static_cast<uint8_t>(c < 0x7F ? c : c + 1);  // 0x00..0x7E, 0x80..0xFE
  }
  return codes;
}

// Symmetric int8 codes in [-127, 127], as bytes.
std::vector<uint8_t> random_s8(size_t count, std::mt19937& rng) {
  std::uniform_int_distribution<int> pick(-127, 127);
  std::vector<uint8_t> codes(count);
  for (auto& code : codes) code = static_cast<uint8_t>(static_cast<int8_t>(pick(rng)));
  return codes;
}

template <int N>
void check_e4m3(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<float> d;
  ASSERT_NO_FATAL_FAILURE((run_on_gpu<Kind::kE4m3, N>(a, b, d)));
  double max_relative = 0.0;  // |gpu - ref| / sum |a_k b_k|
  double max_absolute = 0.0;
  int failures = 0;
  for (int i = 0; i < kRowsA; ++i)
    for (int j = 0; j < N; ++j) {
      // Exact in double: 128 products of 8 significant bits, within 2^-18 .. 2^18.
      double sum = 0.0, magnitude = 0.0;
      for (int k = 0; k < kDepth; ++k) {
        const double product = static_cast<double>(e4m3_bits_to_float(a[i * kDepth + k])) *
                               static_cast<double>(e4m3_bits_to_float(b[j * kDepth + k]));
        sum += product;
        magnitude += std::fabs(product);
      }
      const double got = d[static_cast<size_t>(i) * N + j];
      const double error = std::fabs(got - sum);
      max_absolute = std::max(max_absolute, error);
      if (magnitude > 0.0) max_relative = std::max(max_relative, error / magnitude);
      if (!(error <= kE4m3Tolerance * magnitude) && ++failures <= 10) {
        ADD_FAILURE() << "D[" << i << "][" << j << "] = " << got << ", reference " << sum
                      << " (sum |a b| = " << magnitude << ")";
      }
    }
  std::printf("e4m3 m64n%dk32 x4: max |gpu - ref| / sum |a_k b_k| = %.3e (max abs %.3e)\n", N,
              max_relative, max_absolute);
  EXPECT_EQ(failures, 0) << "elements outside " << kE4m3Tolerance << " * sum |a_k b_k|";
}

template <int N>
void check_s8(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  std::vector<int32_t> d;
  ASSERT_NO_FATAL_FAILURE((run_on_gpu<Kind::kS8, N>(a, b, d)));
  int failures = 0;
  for (int i = 0; i < kRowsA; ++i)
    for (int j = 0; j < N; ++j) {
      int64_t sum = 0;
      for (int k = 0; k < kDepth; ++k)
        sum += int64_t{static_cast<int8_t>(a[i * kDepth + k])} * int64_t{static_cast<int8_t>(b[j * kDepth + k])};
      const int32_t got = d[static_cast<size_t>(i) * N + j];
      if (int64_t{got} != sum && ++failures <= 10) {
        ADD_FAILURE() << "D[" << i << "][" << j << "] = " << got << ", reference " << sum;
      }
    }
  EXPECT_EQ(failures, 0) << "s8 products must be exact";
}

TEST_F(Wgmma8Bit, E4m3N128) {
  std::mt19937 rng(20240901);
  const auto a = random_e4m3(kRowsA * kDepth, rng);
  const auto b = random_e4m3(128 * kDepth, rng);
  check_e4m3<128>(a, b);
}

TEST_F(Wgmma8Bit, E4m3N256) {
  std::mt19937 rng(20240902);
  const auto a = random_e4m3(kRowsA * kDepth, rng);
  const auto b = random_e4m3(256 * kDepth, rng);
  check_e4m3<256>(a, b);
}

TEST_F(Wgmma8Bit, S8N128) {
  std::mt19937 rng(20240903);
  const auto a = random_s8(kRowsA * kDepth, rng);
  const auto b = random_s8(128 * kDepth, rng);
  check_s8<128>(a, b);
}

// +-127 everywhere: the largest sums of either sign (+-128 * 127^2 =
// +-2064512) and cancelling ones, from sign patterns per row and column (all
// +, all -, alternating along k, scattered) that a swapped operand, a wrong k
// step or a misplaced register would change.
TEST_F(Wgmma8Bit, S8N128Extremes) {
  const auto negative = [](int pattern, int index, int k) {
    switch (pattern) {
      case 0: return false;
      case 1: return true;
      case 2: return k % 2 == 1;
      default: return (index * 7 + k * 3) % 5 < 2;
    }
  };
  const auto code = [](bool minus) { return static_cast<uint8_t>(static_cast<int8_t>(minus ? -127 : 127)); };
  std::vector<uint8_t> a(kRowsA * kDepth), b(128 * kDepth);
  for (int i = 0; i < kRowsA; ++i)
    for (int k = 0; k < kDepth; ++k) a[i * kDepth + k] = code(negative(i % 4, i, k));
  for (int j = 0; j < 128; ++j)
    for (int k = 0; k < kDepth; ++k) b[j * kDepth + k] = code(negative((j / 4) % 4, j, k));
  check_s8<128>(a, b);
}

}  // namespace
