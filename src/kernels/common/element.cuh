// Element types of the attention operands as traits: the width that tile byte
// sizes, swizzles and tensor-core operand kinds derive from, and how two fp32
// values are packed into one 32-bit register of that type. An 8-bit operand
// (e4m3) is a new specialization here, not a new kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ffpa::detail {

template <typename Element>
struct ElementTraits;

template <>
struct ElementTraits<__half> {
  static constexpr int kBytes = 2;
  static constexpr bool kIsBf16 = false;
  __device__ __forceinline__ static uint32_t pack2(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

template <>
struct ElementTraits<__nv_bfloat16> {
  static constexpr int kBytes = 2;
  static constexpr bool kIsBf16 = true;
  __device__ __forceinline__ static uint32_t pack2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

// Two floats packed into one register of two 16-bit elements (lo = first).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(ElementTraits<Element>::kBytes == 2, "a pair of 16-bit elements");
  return ElementTraits<Element>::pack2(lo, hi);
}

}  // namespace ffpa::detail
