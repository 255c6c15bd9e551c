// Element types of the attention operands as traits: the width that tile byte
// sizes, swizzles and tensor-core operand kinds derive from, and how two fp32
// values are packed into one 32-bit register of that type. An 8-bit operand
// (e4m3) is a new specialization here, not a new kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/fp8_e4m3.hpp"

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

// Two e4m3 codes (the low byte first) as one register of two 16-bit
// elements, exactly: every e4m3 value is an f16 and a bf16 value (NaN stays
// NaN). Hardware conversion from sm_89; the bit arithmetic of
// common/fp8_e4m3.hpp before.
template <typename Element>
__device__ __forceinline__ uint32_t unpack_e4m3x2(uint32_t pair) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(static_cast<uint16_t>(pair)));
  if constexpr (!ElementTraits<Element>::kIsBf16) return halves;
  const float2 values = __half22float2(*reinterpret_cast<const __half2*>(&halves));
  return pack2<Element>(values.x, values.y);
#else
  return pack2<Element>(e4m3_bits_to_float(static_cast<uint8_t>(pair & 0xFFu)),
                        e4m3_bits_to_float(static_cast<uint8_t>((pair >> 8) & 0xFFu)));
#endif
}

}  // namespace ffpa::detail
