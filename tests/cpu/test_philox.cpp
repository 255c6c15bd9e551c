// The dropout keep-mask generator: Philox4x32-10 known answers, keep rates,
// thresholds and the dependence of the stream on every key field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/philox.hpp"

namespace ffpa::detail {
namespace {

void expect_philox(Philox4 counter, uint32_t k0, uint32_t k1, Philox4 expected) {
  const Philox4 got = philox4x32_10(counter, k0, k1);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(got.x[w], expected.x[w]) << "word " << w;
}

// Known-answer vectors of Random123 (kat_vectors, philox4x32 10 rounds).
TEST(Philox, KnownAnswerZeros) {
  expect_philox({{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
}

TEST(Philox, KnownAnswerOnes) {
  const uint32_t ones = 0xffffffffu;
  expect_philox({{ones, ones, ones, ones}}, ones, ones,
                {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
}

TEST(Philox, KnownAnswerPiDigits) {
  expect_philox({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u,
                {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

// dropout_bits lays the key fields out as philox.hpp documents.
TEST(Philox, DropoutBitsCounterAndKeyLayout) {
  const uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba9876543210ull;
  const uint64_t bh = 77, i = 1234, j = 4 * 999 + 2;
  const Philox4 direct =
      philox4x32_10({{999u, 1234u, 77u, 0x76543210u}}, 0x89abcdefu, 0x01234567u ^ 0xfedcba98u);
  const Philox4 bits = dropout_bits(seed, offset, bh, i, j);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(bits.x[w], direct.x[w]);
  EXPECT_EQ(dropout_keep(seed, offset, bh, i, j, 0x80000000u), direct.x[2] >= 0x80000000u);
}

TEST(Philox, KeepRateMatchesProbability) {
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t threshold = dropout_threshold(p);
    int64_t kept = 0, total = 0;
    for (uint64_t i = 0; i < 1000; ++i) {
      for (uint64_t j = 0; j < 1000; ++j, ++total) {
        kept += dropout_keep(42, 7, 3, i, j, threshold) ? 1 : 0;
      }
    }
    const double rate = static_cast<double>(kept) / static_cast<double>(total);
    const double sigma = std::sqrt(p * (1.0 - p) / static_cast<double>(total));
    EXPECT_NEAR(rate, 1.0 - p, 5.0 * sigma) << "p = " << p;
  }
}

TEST(Philox, ThresholdEdgeCases) {
  EXPECT_EQ(dropout_threshold(0.0f), 0u);
  EXPECT_EQ(dropout_threshold(0.5f), 0x80000000u);
  EXPECT_EQ(dropout_threshold(0.25f), 0x40000000u);
  EXPECT_EQ(dropout_threshold(1e-10f), 0u);  // rounds to no drop at all
  // The largest float below 1: 2^32 - 256, exactly.
  EXPECT_EQ(dropout_threshold(std::nextafter(1.0f, 0.0f)), 0xFFFFFF00u);
  EXPECT_EQ(dropout_threshold(1.0f), 0xFFFFFFFFu);  // saturates instead of wrapping to 0
  EXPECT_EQ(dropout_threshold(2.0f), 0xFFFFFFFFu);

  // p = 0 keeps everything.
  for (uint64_t j = 0; j < 4096; ++j) EXPECT_TRUE(dropout_keep(1, 2, 3, 4, j, 0u));
  // A saturated threshold keeps only the all-ones draw: none of these.
  int kept = 0;
  for (uint64_t j = 0; j < 4096; ++j) kept += dropout_keep(1, 2, 3, 4, j, 0xFFFFFFFFu) ? 1 : 0;
  EXPECT_EQ(kept, 0);
}

// Keep-mask of 1024 consecutive keys at p = 0.5.
std::vector<bool> keep_row(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t i,
                           uint64_t first_j) {
  std::vector<bool> keep;
  for (uint64_t j = first_j; j < first_j + 1024; ++j) {
    keep.push_back(dropout_keep(seed, offset, bh, i, j, 0x80000000u));
  }
  return keep;
}

// Changing any field gives an unrelated stream: about half the decisions flip.
void expect_unrelated(const std::vector<bool>& a, const std::vector<bool>& b, const char* field) {
  int differ = 0;
  for (size_t e = 0; e < a.size(); ++e) differ += a[e] != b[e] ? 1 : 0;
  EXPECT_GT(differ, 400) << field;
  EXPECT_LT(differ, 624) << field;
}

TEST(Philox, StreamDependsOnEveryKeyField) {
  const uint64_t seed = 0x1111222233334444ull, offset = 0x5555666677778888ull;
  const uint64_t bh = 5, i = 9, j = 64;
  const std::vector<bool> base = keep_row(seed, offset, bh, i, j);
  expect_unrelated(base, keep_row(seed ^ 1, offset, bh, i, j), "seed low");
  expect_unrelated(base, keep_row(seed ^ (1ull << 40), offset, bh, i, j), "seed high");
  expect_unrelated(base, keep_row(seed, offset ^ 1, bh, i, j), "offset low");
  expect_unrelated(base, keep_row(seed, offset ^ (1ull << 40), bh, i, j), "offset high");
  expect_unrelated(base, keep_row(seed, offset, bh + 1, i, j), "bh");
  expect_unrelated(base, keep_row(seed, offset, bh, i + 1, j), "i");
  expect_unrelated(base, keep_row(seed, offset, bh, i, j + 1024), "j");
  // Within one Philox block the four lanes are distinct words.
  const Philox4 bits = dropout_bits(seed, offset, bh, i, j);
  for (int a = 0; a < 4; ++a) {
    for (int b = a + 1; b < 4; ++b) EXPECT_NE(bits.x[a], bits.x[b]);
  }
}

}  // namespace
}  // namespace ffpa::detail
