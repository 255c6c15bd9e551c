// The 8-bit formats of the quantized path (common/fp8_e4m3.hpp) against
// implementations written here from the format's definition: a decoder from
// sign, exponent and mantissa, and a slow encoder that picks the nearest of
// all finite codes (ties to the even code). Also against the CUDA toolkit's
// host emulation of cvt.rn.satfinite.e4m3x2.f32 on a strided sweep of every
// float pattern.
#include <gtest/gtest.h>

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/fp8_e4m3.hpp"

namespace ffpa::detail {
namespace {

// The value of an e4m3 code from the OCP definition (NaN for 0x7F / 0xFF).
double e4m3_value_by_definition(int code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xF, mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign != 0 ? -magnitude : magnitude;
}

// float -> e4m3 by search: the nearest finite code (ties: the even code),
// +-448 beyond the range, the sign of x on zero, 0x7F for NaN.
uint8_t e4m3_by_search(float x) {
  if (std::isnan(x)) return 0x7F;
  const double magnitude = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= 0x7E; ++code) {
    const double distance = std::fabs(e4m3_value_by_definition(code) - magnitude);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  if (magnitude > 448.0) best = 0x7E;
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

uint8_t e4m3_by_toolkit(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }

bool is_nan_code(uint8_t code) { return (code & 0x7F) == 0x7F; }

TEST(E4m3, DecodingMatchesTheDefinitionForAll256Codes) {
  for (int code = 0; code < 256; ++code) {
    const double expected = e4m3_value_by_definition(code);
    const float decoded = e4m3_bits_to_float(static_cast<uint8_t>(code));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(decoded)) << code;
    } else {
      EXPECT_EQ(static_cast<double>(decoded), expected) << code;
      EXPECT_EQ(std::signbit(decoded), code >= 0x80) << code;  // -0 for 0x80
    }
  }
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    const uint8_t bits = static_cast<uint8_t>(code);
    const uint8_t again = float_to_e4m3_bits(e4m3_bits_to_float(bits));
    if (is_nan_code(bits)) {
      EXPECT_EQ(again, kE4m3NaN) << code;
    } else {
      EXPECT_EQ(again, bits) << code;
    }
  }
}

TEST(E4m3, TiesBetweenNeighboursGoToTheEvenCode) {
  // Every midpoint between neighbouring finite codes (exact in fp32), and one
  // fp32 ulp either side of it, both signs.
  for (int code = 0; code < 0x7E; ++code) {
    const float low = e4m3_bits_to_float(static_cast<uint8_t>(code));
    const float high = e4m3_bits_to_float(static_cast<uint8_t>(code + 1));
    const float middle = (low + high) / 2.0f;
    ASSERT_EQ(static_cast<double>(middle), (static_cast<double>(low) + high) / 2.0) << code;
    const int even = (code & 1) == 0 ? code : code + 1;
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t sign_bit = sign < 0.0f ? 0x80 : 0x00;
      EXPECT_EQ(float_to_e4m3_bits(sign * middle), even | sign_bit) << code;
      EXPECT_EQ(float_to_e4m3_bits(sign * std::nextafter(middle, 0.0f)), code | sign_bit) << code;
      EXPECT_EQ(float_to_e4m3_bits(sign * std::nextafter(middle, 1e9f)), (code + 1) | sign_bit) << code;
    }
  }
}

TEST(E4m3, BeyondTheRangeSaturatesTo448) {
  const float big[] = {448.0f, 448.5f, 463.99f, 464.0f, 464.01f, 480.0f, 1e6f,
                       std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()};
  for (float x : big) {
    EXPECT_EQ(float_to_e4m3_bits(x), 0x7E) << x;
    EXPECT_EQ(float_to_e4m3_bits(-x), 0xFE) << x;
  }
  EXPECT_EQ(e4m3_bits_to_float(0x7E), kE4m3Max);
  EXPECT_EQ(float_to_e4m3_bits(447.0f), 0x7E);  // nearest is 448
  EXPECT_EQ(float_to_e4m3_bits(431.0f), 0x7D);  // 416 | 448: 431 is nearer 416
}

TEST(E4m3, SubnormalsAndZeros) {
  const float min_subnormal = std::ldexp(1.0f, -9);
  EXPECT_EQ(float_to_e4m3_bits(min_subnormal), 0x01);
  EXPECT_EQ(e4m3_bits_to_float(0x01), min_subnormal);
  EXPECT_EQ(float_to_e4m3_bits(min_subnormal / 2.0f), 0x00);  // tie with 0: even
  EXPECT_EQ(float_to_e4m3_bits(std::nextafter(min_subnormal / 2.0f, 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3_bits(3.0f * min_subnormal / 2.0f), 0x02);  // tie 1 | 2: even
  EXPECT_EQ(float_to_e4m3_bits(7.5f * min_subnormal), 0x08);  // tie 7 | 8 (the smallest normal)
  EXPECT_EQ(float_to_e4m3_bits(std::ldexp(1.0f, -6)), 0x08);
  EXPECT_EQ(e4m3_bits_to_float(0x07), 7.0f * min_subnormal);
  EXPECT_EQ(float_to_e4m3_bits(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3_bits(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3_bits(-1e-9f), 0x80);  // rounds to zero, keeps the sign
  EXPECT_EQ(float_to_e4m3_bits(std::numeric_limits<float>::denorm_min()), 0x00);
}

TEST(E4m3, NanGivesTheCanonicalNan) {
  const float quiet = std::numeric_limits<float>::quiet_NaN();
  const float signaling = std::numeric_limits<float>::signaling_NaN();
  for (float x : {quiet, -quiet, signaling, fp32_from_bits(0x7F800001u), fp32_from_bits(0xFFFFFFFFu)}) {
    EXPECT_EQ(float_to_e4m3_bits(x), kE4m3NaN);
  }
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0xFF)));
}

TEST(E4m3, RandomFloatsMatchTheSearch) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> log2_magnitude(-12.0f, 10.0f);
  std::uniform_int_distribution<uint32_t> pattern;
  for (int n = 0; n < 100000; ++n) {
    // Half spread over the format's range (log-uniform), half any bit pattern.
    float x = (n & 1) != 0 ? std::exp2(log2_magnitude(rng)) : fp32_from_bits(pattern(rng));
    if ((n & 2) != 0) x = -x;
    ASSERT_EQ(float_to_e4m3_bits(x), e4m3_by_search(x)) << x;
  }
}

TEST(E4m3, StridedSweepOfAllFloatsMatchesTheToolkit) {
  // Every 251st pattern (prime, so the low mantissa bits all occur), and every
  // pattern within 2^16 of each code's value, where rounding decides.
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 251) {
    const float x = fp32_from_bits(static_cast<uint32_t>(u));
    ASSERT_EQ(float_to_e4m3_bits(x), e4m3_by_toolkit(x)) << std::hex << u;
  }
  for (int code = 0; code < 256; ++code) {
    if (is_nan_code(static_cast<uint8_t>(code))) continue;
    const uint32_t center = fp32_bits(e4m3_bits_to_float(static_cast<uint8_t>(code)));
    for (uint32_t u = center - (center >= 0x10000u ? 0x10000u : center); u < center + 0x10000u; ++u) {
      const float x = fp32_from_bits(u);
      ASSERT_EQ(float_to_e4m3_bits(x), e4m3_by_toolkit(x)) << std::hex << u;
    }
  }
}

TEST(Int8Symmetric, RoundsHalfToEvenAndClampsTo127) {
  const struct {
    float x;
    int code;
  } cases[] = {{0.0f, 0},      {0.49f, 0},     {0.5f, 0},      {0.51f, 1},     {1.5f, 2},
               {2.5f, 2},      {-0.5f, 0},     {-1.5f, -2},    {-2.5f, -2},    {-3.5f, -4},
               {126.5f, 126},  {126.51f, 127}, {127.0f, 127},  {127.5f, 127},  {1e9f, 127},
               {-127.0f, -127}, {-127.6f, -127}, {-128.0f, -127}, {-1e9f, -127}};
  for (const auto& c : cases) EXPECT_EQ(float_to_int8_symmetric(c.x), c.code) << c.x;
  EXPECT_EQ(float_to_int8_symmetric(std::numeric_limits<float>::infinity()), 127);
  EXPECT_EQ(float_to_int8_symmetric(-std::numeric_limits<float>::infinity()), -127);
  EXPECT_EQ(float_to_int8_symmetric(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(Int8Symmetric, RandomFloatsMatchNearbyint) {
  // std::nearbyint in the default rounding mode rounds half to even.
  std::mt19937_64 rng(12);
  std::uniform_real_distribution<float> value(-140.0f, 140.0f);
  std::uniform_int_distribution<int> half_steps(-300, 300);
  for (int n = 0; n < 100000; ++n) {
    const float x = (n & 1) != 0 ? value(rng) : 0.5f * static_cast<float>(half_steps(rng));
    const double expected = std::fmin(127.0, std::fmax(-127.0, std::nearbyint(static_cast<double>(x))));
    ASSERT_EQ(float_to_int8_symmetric(x), static_cast<int>(expected)) << x;
  }
}

}  // namespace
}  // namespace ffpa::detail
