// Per-element pieces that every GPU family applies to its S and O tiles:
// packing two floats into a 16-bit pair and reading a mask element as a
// log2-domain additive term.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace ffpa::detail {

// Two floats packed into one register of two 16-bit elements (lo = first).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// An element of the mask as a log2-domain additive term.
template <typename T>
__device__ __forceinline__ float mask_term(const T* base, int64_t offset) {
  constexpr float kLog2e = 1.4426950408889634f;
  const T value = base[offset];
  if constexpr (std::is_same_v<T, uint8_t>) {
    return value ? 0.0f : -INFINITY;
  } else {
    return static_cast<float>(value) * kLog2e;
  }
}

}  // namespace ffpa::detail
