// The 8-bit number formats of the quantized attention path, host and device:
// the CPU model (reference/fp8_quantization.hpp) and the GPU pre-pass must
// produce the same codes from the same fp32 values.
//
// e4m3 is OCP FP8 E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities; 0x7F / 0xFF are NaN; largest finite 448 (0x7E), smallest normal
// 2^-6, smallest subnormal 2^-9. float -> e4m3 is what Hopper's
// cvt.rn.satfinite.e4m3x2.f32 does (and the CUDA toolkit's host emulation of
// it, __nv_cvt_float_to_fp8 with __NV_SATFINITE): round to nearest, ties to
// the even code; anything beyond 448 in magnitude, infinities included,
// saturates to +-448; every NaN gives the canonical 0x7F; the sign of a zero
// result is kept (-1e-9 gives 0x80). e4m3 -> float is exact.
//
// int8 is the symmetric integer code of the int8 QK option: round half to
// even, clamped to [-127, 127] (never -128, so that the code range is
// symmetric and -x quantizes to -code); NaN gives 0. On the GPU that is
// cvt.rni.sat.s8.f32 (NaN -> 0, range [-128, 127]) followed by an integer
// max with -127.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.hpp"

namespace ffpa::detail {

inline constexpr float kE4m3Max = 448.0f;  // largest finite e4m3 (0x7E)
inline constexpr float kInt8Max = 127.0f;  // largest int8 code of the symmetric range
inline constexpr uint8_t kE4m3NaN = 0x7F;  // the NaN float -> e4m3 produces

FFPA_HOST_DEVICE uint32_t fp32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

FFPA_HOST_DEVICE float fp32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// float -> e4m3 bits, round to nearest even, saturating (see above).
FFPA_HOST_DEVICE uint8_t float_to_e4m3_bits(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The hardware conversion; the low byte of the pair holds the second operand.
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(pair & 0xFFu);
#else
  const uint32_t u = fp32_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return kE4m3NaN;
  // Beyond 448 (448 + 16, half an ulp, ties to 448's even mantissa): saturate.
  if (magnitude > 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);
  // At most 2^-10 (half the smallest subnormal; the tie goes to the even 0).
  if (magnitude <= 0x3A800000u) return static_cast<uint8_t>(sign);
  const uint32_t exponent = magnitude >> 23;  // fp32 biased exponent, 117..135 here
  uint32_t code, remainder, half;
  if (exponent < 121u) {
    // Below 2^-6: a subnormal code, the value in units of 2^-9 (0..8; 8 is the
    // smallest normal, which the carry encodes correctly).
    const uint32_t significand = (magnitude & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 141u - exponent;  // 2^(e-127) * sig * 2^-23 / 2^-9, 21..24
    code = significand >> shift;
    remainder = significand & ((1u << shift) - 1u);
    half = 1u << (shift - 1u);
  } else {
    // Normal: exponent field e - 120 (1..15) and the top 3 mantissa bits; a
    // carry out of the mantissa moves to the next exponent, as it should.
    code = ((exponent - 120u) << 3) | ((magnitude >> 20) & 0x7u);
    remainder = magnitude & 0xFFFFFu;
    half = 0x80000u;
  }
  if (remainder > half || (remainder == half && (code & 1u) != 0u)) ++code;
  return static_cast<uint8_t>(sign | code);
#endif
}

// Two floats to two e4m3 codes, `lo` in the low byte (the order of a pair of
// 8-bit elements in memory): float_to_e4m3_bits of each, one instruction on
// the GPU.
FFPA_HOST_DEVICE uint16_t float2_to_e4m3x2_bits(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(hi), "f"(lo));
  return pair;
#else
  return static_cast<uint16_t>(float_to_e4m3_bits(lo) | (float_to_e4m3_bits(hi) << 8));
#endif
}

// e4m3 bits -> float, exact (NaN codes give a NaN).
FFPA_HOST_DEVICE float e4m3_bits_to_float(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t exponent = (bits >> 3) & 0xFu;
  const uint32_t mantissa = bits & 0x7u;
  if (exponent == 0xFu && mantissa == 0x7u) return fp32_from_bits(sign | 0x7FC00000u);
  if (exponent == 0u) {
    // m * 2^-9: exact in fp32 (and -0 for 0x80).
    const float magnitude = static_cast<float>(mantissa) * 0.001953125f;
    return fp32_from_bits(sign | fp32_bits(magnitude));
  }
  return fp32_from_bits(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// float -> symmetric int8 code: round half to even, clamp to [-127, 127],
// NaN -> 0. The arithmetic is exact (|x| <= 127 after the clamp), so the
// result does not depend on the floating-point rounding mode.
FFPA_HOST_DEVICE int8_t float_to_int8_symmetric(float x) {
  if (!(x == x)) return 0;
  if (x >= kInt8Max) return 127;
  if (x <= -kInt8Max) return -127;
  int whole = static_cast<int>(x);  // toward zero
  const float fraction = x - static_cast<float>(whole);
  const float distance = fraction < 0.0f ? -fraction : fraction;
  if (distance > 0.5f || (distance == 0.5f && (whole & 1) != 0)) whole += x > 0.0f ? 1 : -1;
  return static_cast<int8_t>(whole);
}

}  // namespace ffpa::detail
