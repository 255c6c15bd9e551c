// Host side of p_in_registers.cuh's product: random Q, K, V exactly
// representable in the element type, the shared-memory image the product
// reads (built here, copied verbatim by the GPU test's kernel or handed to the
// emulator), and the check of S and O against an fp64 product. O is checked
// against P = the kernel's own S rounded to the element (round to nearest, as
// pack2), so that a P rounded one way on the GPU and another in fp64 cannot
// fail it; a wrong fragment, register order or descriptor misses by far.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_kernels/p_in_registers.cuh"

namespace ffpa::testing::p_in_registers {

template <class Element>
float round_to(float x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __bfloat162float(__float2bfloat16(x));
  return __half2float(__float2half(x));
}

template <class Element>
uint16_t bits_of(float x) {
  uint16_t bits;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    const __nv_bfloat16 e = __float2bfloat16(x);
    std::memcpy(&bits, &e, 2);
  } else {
    const __half e = __float2half(x);
    std::memcpy(&bits, &e, 2);
  }
  return bits;
}

struct Case {
  int keys = 64, value_cols = 128;
  std::vector<float> q, k, v;  // [64][64], [keys][64], [keys][value_cols], each value an element's
};

template <class Element>
Case make_case(uint64_t seed, int keys, int value_cols) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Case c;
  c.keys = keys, c.value_cols = value_cols;
  auto draw = [&](std::vector<float>& m, size_t n) {
    m.resize(n);
    for (float& x : m) x = round_to<Element>(normal(rng));
  };
  draw(c.q, static_cast<size_t>(kRows * kDepth));
  draw(c.k, static_cast<size_t>(keys * kDepth));
  draw(c.v, static_cast<size_t>(keys * value_cols));
  return c;
}

// The bytes p_in_registers_product reads from its base.
template <class Element, int kKeys, int kValueCols, bool kTransposeV>
std::vector<unsigned char> shared_image(const Case& c) {
  std::vector<unsigned char> image(static_cast<size_t>(kQBytes + kKBytes<kKeys> + kVBytes<kKeys, kValueCols, kTransposeV>));
  auto put = [&](uint32_t offset, float x) {
    const uint16_t bits = bits_of<Element>(x);
    std::memcpy(image.data() + offset, &bits, 2);
  };
  for (int r = 0; r < kRows; ++r)
    for (int d = 0; d < kDepth; ++d) put(detail::swizzle128<2>(r, d), c.q[static_cast<size_t>(r * kDepth + d)]);
  for (int j = 0; j < kKeys; ++j)
    for (int d = 0; d < kDepth; ++d) {
      put(kQBytes + detail::swizzle128<2>(j, d), c.k[static_cast<size_t>(j * kDepth + d)]);
    }
  for (int j = 0; j < kKeys; ++j)
    for (int d = 0; d < kValueCols; ++d) {
      put(kQBytes + kKBytes<kKeys> + v_offset<kKeys, kTransposeV>(j, d), c.v[static_cast<size_t>(j * kValueCols + d)]);
    }
  return image;
}

// S within fp32 summation of its 64 exact products; O = round(S) V likewise.
template <class Element>
::testing::AssertionResult matches(const Case& c, const std::vector<float>& s, const std::vector<float>& o) {
  for (int r = 0; r < kRows; ++r)
    for (int j = 0; j < c.keys; ++j) {
      double exact = 0, magnitude = 0;
      for (int d = 0; d < kDepth; ++d) {
        const double x = static_cast<double>(c.q[static_cast<size_t>(r * kDepth + d)]) * c.k[static_cast<size_t>(j * kDepth + d)];
        exact += x, magnitude += std::fabs(x);
      }
      const double got = s[static_cast<size_t>(r * c.keys + j)];
      if (!(std::fabs(got - exact) <= 1e-5 * magnitude + 1e-6)) {
        return ::testing::AssertionFailure() << "S[" << r << "][" << j << "] = " << got << ", expected " << exact;
      }
    }
  for (int r = 0; r < kRows; ++r)
    for (int d = 0; d < c.value_cols; ++d) {
      double exact = 0, magnitude = 0;
      for (int j = 0; j < c.keys; ++j) {
        const double p = round_to<Element>(s[static_cast<size_t>(r * c.keys + j)]);
        const double x = p * c.v[static_cast<size_t>(j * c.value_cols + d)];
        exact += x, magnitude += std::fabs(x);
      }
      const double got = o[static_cast<size_t>(r * c.value_cols + d)];
      if (!(std::fabs(got - exact) <= 1e-5 * magnitude + 1e-6)) {
        return ::testing::AssertionFailure() << "O[" << r << "][" << d << "] = " << got << ", expected " << exact;
      }
    }
  return ::testing::AssertionSuccess();
}

// What a product's failure message names.
template <int kKeys, int kValueCols, bool kTransposeV>
std::string product_name() {
  return "keys " + std::to_string(kKeys) + ", value columns " + std::to_string(kValueCols) +
         (kTransposeV ? ", V N-major" : ", V^T K-major");
}

// The products both tests run, the emulator's and the GPU's (so that the GPU
// checks every shape the emulator's model was checked on): check.template
// run<Element, kKeys, kValueCols, kTransposeV>(seed) for each. The first four
// are the shapes the large-D kernels use, the rest the small-D plan's KV
// blocks and head dims (docs/kernels/sm90_small_d_plan.md).
template <class Check>
void for_each_product(const Check& check) {
  check.template run<__nv_bfloat16, 64, 128, true>(1);
  check.template run<__half, 128, 256, true>(2);
  check.template run<__nv_bfloat16, 64, 64, false>(3);
  check.template run<__half, 64, 192, true>(4);
  check.template run<__nv_bfloat16, 80, 96, true>(5);
  check.template run<__half, 112, 64, true>(6);
  check.template run<__nv_bfloat16, 176, 128, true>(7);
  check.template run<__half, 144, 256, true>(8);
}

}  // namespace ffpa::testing::p_in_registers
