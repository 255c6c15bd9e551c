// The host fp16 / bf16 <-> fp32 conversions (common/float16_bits.hpp, the CUDA
// toolkit's host code) against the hand-written ones they replaced, kept here
// as the reference: every 16-bit pattern to float, and float to 16 bits on a
// strided sweep of all float patterns, every rounding boundary and the edges.
//
// Bit-exact everywhere except NaNs, where the toolkit returns one canonical
// NaN and the old code kept sign and payload:
//   fp16 -> float: toolkit 0x7FFFFFFF, old sign | 0x7F800000 | mantissa << 13;
//   float -> fp16: toolkit 0x7FFF,     old sign | 0x7E00;
//   float -> bf16: toolkit 0x7FFF,     old (bits >> 16) | 0x0040.
// (bf16 -> float keeps NaN bits in both.) Nothing in ffpa reads NaN sign or
// payload: a NaN stays a NaN, which the tests below require. The canonical
// NaNs are also what the GPU's cvt instructions give (H200, all inputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/float16_bits.hpp"

namespace ffpa::detail {
namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The replaced implementation (src/common/float16_host.hpp), unchanged.
namespace old_impl {

inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1Fu) return bits_float(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_float(sign);
  // Subnormal: normalize.
  int e = -1;
  do {
    ++e;
    mantissa <<= 1;
  } while ((mantissa & 0x400u) == 0);
  return bits_float(sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mantissa & 0x3FFu) << 13));
}

inline uint16_t float_to_half(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (remainder > halfway || (remainder == halfway && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  const uint32_t rounding = 0xFFFu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((abs - 0x38000000u + rounding) >> 13));
}

}  // namespace old_impl

bool is_half_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }
bool is_bf16_nan(uint16_t h) { return (h & 0x7FFFu) > 0x7F80u; }

// Float inputs for float -> 16 bits: every 4099th pattern (4099 < 2^23, so
// each exponent of both signs is hit many times), the float edges, and for
// each pair of adjacent finite 16-bit values of either sign the midpoint and
// its two float neighbours (every round-to-nearest-even decision).
std::vector<float> float_samples(float (*to_float)(uint16_t), uint16_t largest_finite,
                                 float overflow_threshold) {
  std::vector<float> samples;
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) {
    samples.push_back(bits_float(static_cast<uint32_t>(u)));
  }
  const uint32_t edges[] = {
      0x00000000u, 0x00000001u, 0x007FFFFFu, 0x00800000u,  // 0, float subnormals, smallest normal
      0x33000000u, 0x33000001u, 0x33800000u,              // 2^-25 (ties to 0), just above, 2^-24
      0x387FE000u, 0x387FF000u, 0x387FFFFFu, 0x38800000u,  // fp16 subnormal / normal boundary
      0x3F800000u, 0x3F801000u, 0x3F803000u, 0x3F808000u, 0x3F818000u,  // 1 and halfway cases
      0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u,  // 65504, 65520 (overflow threshold)
      0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu,              // bf16 overflow threshold, float max
      0x7F800000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FFFFFFFu,  // inf, sNaN, qNaN
  };
  for (uint32_t e : edges) {
    samples.push_back(bits_float(e));
    samples.push_back(bits_float(e | 0x80000000u));
  }
  for (uint32_t h = 0; h < largest_finite; ++h) {
    const float lo = to_float(static_cast<uint16_t>(h));
    const float hi = to_float(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;  // exact: one more bit than the 16-bit format has
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, hi)}) {
      samples.push_back(f);
      samples.push_back(-f);
    }
  }
  for (float f : {overflow_threshold, std::nextafter(overflow_threshold, 0.0f),
                  std::nextafter(overflow_threshold, std::numeric_limits<float>::infinity())}) {
    samples.push_back(f);
    samples.push_back(-f);
  }
  return samples;
}

TEST(Float16Conversions, EveryHalfPatternToFloat) {
  int nans = 0;
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const float want = old_impl::half_to_float(static_cast<uint16_t>(h));
    const float got = half_bits_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ++nans;
      ASSERT_EQ(float_bits(got), 0x7FFFFFFFu) << std::hex << "0x" << h;  // canonical NaN
    } else {
      ASSERT_EQ(float_bits(got), float_bits(want)) << std::hex << "0x" << h;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(Float16Conversions, EveryBf16PatternToFloat) {
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    const float want = old_impl::bf16_to_float(static_cast<uint16_t>(h));
    const float got = bf16_bits_to_float(static_cast<uint16_t>(h));
    ASSERT_EQ(float_bits(got), float_bits(want)) << std::hex << "0x" << h;  // NaNs included
  }
}

TEST(Float16Conversions, FloatToHalf) {
  const std::vector<float> samples = float_samples(&old_impl::half_to_float, 0x7BFFu, 65520.0f);
  int nans = 0;
  for (float f : samples) {
    const uint16_t want = old_impl::float_to_half(f);
    const uint16_t got = float_to_half_bits(f);
    if (std::isnan(f)) {
      ++nans;
      ASSERT_TRUE(is_half_nan(want)) << std::hex << "0x" << float_bits(f);
      ASSERT_EQ(got, 0x7FFFu) << std::hex << "0x" << float_bits(f);  // canonical NaN
    } else {
      ASSERT_EQ(got, want) << std::hex << "0x" << float_bits(f) << " (" << f << ")";
    }
  }
  EXPECT_GT(nans, 1000);
}

TEST(Float16Conversions, FloatToBf16) {
  const std::vector<float> samples = float_samples(&old_impl::bf16_to_float, 0x7F7Fu, 0x1.FFp127f);
  int nans = 0;
  for (float f : samples) {
    const uint16_t want = old_impl::float_to_bf16(f);
    const uint16_t got = float_to_bf16_bits(f);
    if (std::isnan(f)) {
      ++nans;
      ASSERT_TRUE(is_bf16_nan(want)) << std::hex << "0x" << float_bits(f);
      ASSERT_EQ(got, 0x7FFFu) << std::hex << "0x" << float_bits(f);  // canonical NaN
    } else {
      ASSERT_EQ(got, want) << std::hex << "0x" << float_bits(f) << " (" << f << ")";
    }
  }
  EXPECT_GT(nans, 1000);
}

// The boundaries the sweeps rely on, with values spelled out.
TEST(Float16Conversions, KnownValues) {
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7BFFu);
  EXPECT_EQ(float_to_half_bits(std::nextafter(65520.0f, 0.0f)), 0x7BFFu);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7C00u);  // ties to even: the even neighbour is inf
  EXPECT_EQ(float_to_half_bits(-65520.0f), 0xFC00u);
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000u);  // ties to even (0)
  EXPECT_EQ(float_to_half_bits(0x1.8p-24f), 0x0002u);  // ties to even (2)
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000u);
  EXPECT_EQ(half_bits_to_float(0x0001u), 0x1p-24f);
  EXPECT_EQ(float_to_bf16_bits(0x1.FFp127f), 0x7F80u);  // halfway above max (0x1.FEp127): inf
  EXPECT_EQ(float_to_bf16_bits(std::nextafter(0x1.FFp127f, 0.0f)), 0x7F7Fu);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1p-8f), 0x3F80u);  // ties to even (down)
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x3p-8f), 0x3F82u);  // ties to even (up)
  EXPECT_EQ(bf16_bits_to_float(0xFF80u), -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace ffpa::detail
