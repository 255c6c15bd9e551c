// The dropout keep-mask (common/philox.hpp, SDPA's stream): Philox4x32-10
// known answers, the stream's known answers from SDPA itself, the threshold's
// edge, the word layout, keep rates, and the quad draws the kernels share
// (kernels/common/dropout_quad.hpp) played lane by lane.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/philox.hpp"
#include "kernels/common/dropout_quad.hpp"

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

// u as SDPA's kernel computes it from a word (curand_uniform).
float uniform(uint32_t x) { return static_cast<float>(x) * 0x1p-32f + 0x1p-33f; }

uint32_t draw(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t nq, uint64_t nkv, uint64_t i, uint64_t j) {
  return dropout_draw(seed, dropout_word(dropout_head_word(offset, bh, nq, nkv), static_cast<uint32_t>(i),
                                         static_cast<uint32_t>(nkv), static_cast<uint32_t>(j)));
}

// From python/tests/sdpa_dropout_reference.py, which scripts/sdpa_dropout_check.py
// checked bit for bit against SDPA's memory-efficient kernel on an H200
// (seed 1234, offset 3108, B 2, H 3, Nq 77, Nkv 131).
TEST(DropoutStream, KnownUniformsOfSdpa) {
  struct Element {
    uint64_t b, h, i, j;
    float uniform;
  };
  for (const Element& e : {Element{0, 0, 0, 0, 0.9303030371665955f}, Element{1, 2, 76, 130, 0.42938870191574097f},
                           Element{0, 1, 5, 7, 0.3129924535751343f}, Element{1, 0, 40, 99, 0.12701670825481415f}}) {
    EXPECT_EQ(uniform(draw(1234, 3108, e.b * 3 + e.h, 77, 131, e.i, e.j)), e.uniform)
        << e.b << "," << e.h << "," << e.i << "," << e.j;
  }
}

TEST(DropoutStream, KnownKeepCountOfSdpa) {
  const uint32_t threshold = dropout_threshold(0.3f);
  int64_t kept = 0;
  for (uint64_t bh = 0; bh < 6; ++bh)
    for (uint64_t i = 0; i < 77; ++i)
      for (uint64_t j = 0; j < 131; ++j) kept += dropout_keep(1234, 3108, bh, 77, 131, i, j, threshold) ? 1 : 0;
  EXPECT_EQ(kept, 42304);  // of 60522
}

TEST(DropoutStream, ThresholdIsSdpasComparison) {
  // keep <=> uniform(x) > p <=> x >= threshold, at the threshold's edge.
  for (float p : {0.0f, 1e-9f, 0.1f, 0.25f, 0.3f, 0.5f, 0.7f, 0.9f, std::nextafter(1.0f, 0.0f)}) {
    const uint32_t threshold = dropout_threshold(p);
    EXPECT_GT(uniform(threshold), p) << p;
    if (threshold > 0) EXPECT_LE(uniform(threshold - 1), p) << p;
  }
  EXPECT_EQ(dropout_threshold(0.0f), 0u);  // keeps everything
}

TEST(DropoutStream, WordLayoutWrapsPerHeadIn32Bits) {
  // W = offset + u32(bh * Nq * Nkv) + (i * Nkv + j): with Nq * Nkv = 2^31,
  // head 2 starts where head 0 does (the kernel's 32-bit arithmetic).
  EXPECT_EQ(dropout_head_word(4, 2, 1 << 16, 1 << 15), dropout_head_word(4, 0, 1 << 16, 1 << 15));
  EXPECT_EQ(dropout_head_word(4, 1, 1 << 16, 1 << 15), 4u + (1u << 31));
  // Consecutive keys are consecutive words, across Philox blocks and rows.
  const uint64_t head = dropout_head_word(8, 3, 5, 7);
  for (uint32_t j = 0; j + 1 < 7; ++j) EXPECT_EQ(dropout_word(head, 2, 7, j + 1), dropout_word(head, 2, 7, j) + 1);
  EXPECT_EQ(dropout_word(head, 3, 7, 0), dropout_word(head, 2, 7, 6) + 1);
}

TEST(DropoutStream, KeepRateIsOneMinusP) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t threshold = dropout_threshold(p);
    int kept = 0, total = 0;
    for (uint64_t i = 0; i < 64; ++i)
      for (uint64_t j = 0; j < 1024; ++j, ++total) kept += dropout_keep(42, 7, 3, 64, 1024, i, j, threshold) ? 1 : 0;
    EXPECT_NEAR(static_cast<double>(kept) / total, 1.0 - p, 0.01) << p;
  }
}

// The sm90 dropout warps' draw (32 keys of a row, then each lane's byte),
// against the element-wise stream: every alignment of the row's first word in
// its Philox block, offsets near 2^32 and past 2^63.
TEST(DropoutStream, RowDrawAndLaneBytesEqualTheStream) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t threshold = dropout_threshold(trial % 2 ? 0.4f : 0.1f);
    const uint64_t key_seed = rng();
    const uint64_t offsets[] = {rng() % 4096, (1ull << 32) - 8 + rng() % 16, (1ull << 63) + rng() % 4096};
    const uint64_t offset = offsets[trial % 3];
    const uint32_t seq_q = 1 + rng() % 300, seq_kv = 32 + rng() % 300;
    const uint64_t head = dropout_head_word(offset, rng() % 64, seq_q, seq_kv);
    const uint32_t row = rng() % seq_q, key0 = (rng() % (seq_kv / 32)) * 32;
    const uint64_t word = dropout_word(head, row, seq_kv, key0);
    const uint32_t keys = row_keep_bits32(key_seed, threshold, word);
    for (int k = 0; k < 32; ++k)
      EXPECT_EQ((keys >> k) & 1u, dropout_draw(key_seed, word + k) >= threshold ? 1u : 0u)
          << "trial " << trial << " key " << k << " skip " << (word & 3);
    for (int t = 0; t < 4; ++t) {
      const uint32_t byte = quad_lane_byte(keys, t);
      EXPECT_EQ(byte >> 8, 0u);
      for (int b = 0; b < 4; ++b)
        for (int e = 0; e < 2; ++e)
          EXPECT_EQ((byte >> (2 * b + e)) & 1u, (keys >> (8 * b + 2 * t + e)) & 1u)
              << "trial " << trial << " lane " << t << " block " << b << " key " << e;
    }
  }
}

}  // namespace
}  // namespace ffpa::detail
