// Split-KV decode's CPU-checkable pieces (issue 12): the split-count rule
// (kernels/common/split_kv.hpp), the packed decode rows, and the combine of
// the splits' partial rows (softmax_state.hpp's merge) against the whole row
// in double, on adversarial rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/math_constants.hpp"
#include "kernels/common/softmax_state.hpp"
#include "kernels/common/split_kv.hpp"

namespace {

using namespace ffpa::detail;

constexpr int kH200Slots = 132;  // one decode CTA per SM

TEST(SplitKv, DecodeOfOneSequenceFillsAWaveWithTheFewestSplits) {
  // B1 H32 (MHA) Nkv 8192: 4 splits of 2048 keys are 128 CTAs, one wave; 8
  // splits take two waves of half the keys each, plus their fixed costs.
  const KvSplits s = choose_kv_splits(32, 8192, kH200Slots, 128);
  EXPECT_EQ(s.count, 4);
  EXPECT_EQ(s.keys_per_split, 2048);
}

TEST(SplitKv, UnitsThatFillTheSlotsAreNotSplit) {
  EXPECT_EQ(choose_kv_splits(132, 100000, kH200Slots, 128).count, 1);
  EXPECT_EQ(choose_kv_splits(1000, 8192, kH200Slots, 128).count, 1);
}

TEST(SplitKv, ShortSequencesKeepTheMinimumPerSplit) {
  EXPECT_EQ(choose_kv_splits(8, 128, kH200Slots, 128).count, 1);  // one block: nothing to split
  const KvSplits s = choose_kv_splits(8, 1000, kH200Slots, 128);
  EXPECT_GE(s.keys_per_split, kMinKeysPerSplit);
  EXPECT_EQ(s.count, 8);  // 128 keys each (the last 104): 64 CTAs, the best the floor allows
}

// The splits whole blocks of at least kMinKeysPerSplit keys can make of
// seq_kv keys (by brute force over the split lengths: for each count its
// shortest splits), one split included.
std::vector<KvSplits> achievable_splits(int64_t seq_kv, int block_n) {
  std::vector<KvSplits> all{{1, seq_kv}};
  int last_count = 0;
  for (int64_t keys = block_n; keys < seq_kv; keys += block_n) {  // counts fall as the splits grow
    const int64_t count = (seq_kv + keys - 1) / keys;
    if (keys < kMinKeysPerSplit || count > kMaxKvSplits || count == last_count) continue;
    all.push_back({static_cast<int>(count), keys});
    last_count = static_cast<int>(count);
  }
  return all;
}

// The decode and prefill shapes the model was fitted on
// (docs/kernels/split_kv_plan.md): the measured fastest count, as units on
// the H200's 132 slots (66 for D = 1024's CTA pairs).
TEST(SplitKv, PicksTheMeasuredFastestCounts) {
  struct Case { int64_t units, seq_kv, slots; int fastest; };
  const Case cases[] = {
      {32, 512, 132, 4},    // B1 H32 Nkv 512
      {32, 2048, 132, 4},   // B1 H32 Nkv 2048
      {4, 131072, 132, 32}, // B1 Hq32 Hkv4 Nkv 128k, 8 heads a tile
      {32, 8192, 132, 4},   // B4 Hq32 Hkv8 Nq4 (spec-decode), Nq64 GQA, D256 decode
      {32, 8192, 66, 2},    // D1024 B1 H32 Nkv 8192
      {32, 4096, 132, 4},   // B1 H2 Nq1024 Nkv 4096
      {64, 16384, 132, 2},  // B1 H8 Nq512 Nkv 16384 (the old rule's 43 splits: 1.83x slower)
  };
  for (const Case& c : cases) {
    EXPECT_EQ(choose_kv_splits(c.units, c.seq_kv, c.slots, 128).count, c.fastest)
        << c.units << " units, Nkv " << c.seq_kv;
  }
}

// Over a grid of shapes: whole blocks, the floor and the cap, every key in
// exactly one split, and no achievable count the model rates faster (nor as
// fast with fewer splits).
TEST(SplitKv, RuleInvariantsOverAGridOfShapes) {
  for (int64_t units : {1, 2, 3, 8, 31, 32, 64, 100, 131}) {
    for (int64_t seq_kv : {1, 127, 128, 129, 256, 511, 2048, 8191, 32768, 131072, 1000003}) {
      for (int block_n : {64, 128}) {
        SCOPED_TRACE("units " + std::to_string(units) + ", Nkv " + std::to_string(seq_kv) + ", block " +
                     std::to_string(block_n));
        const KvSplits s = choose_kv_splits(units, seq_kv, kH200Slots, block_n);
        ASSERT_GE(s.count, 1);
        ASSERT_LE(s.count, kMaxKvSplits);
        if (s.count == 1) {
          EXPECT_EQ(s.keys_per_split, seq_kv);
          continue;
        }
        EXPECT_EQ(s.keys_per_split % block_n, 0);
        EXPECT_GE(s.keys_per_split, kMinKeysPerSplit);
        EXPECT_GE(s.count * s.keys_per_split, seq_kv) << "keys past the last split";
        EXPECT_LT((s.count - 1) * s.keys_per_split, seq_kv) << "an empty last split";
        const double chosen = split_cost(units, s.count, s.keys_per_split, kH200Slots);
        EXPECT_LT(chosen, split_cost(units, 1, seq_kv, kH200Slots));
        for (const KvSplits& other : achievable_splits(seq_kv, block_n)) {
          const double cost = split_cost(units, other.count, other.keys_per_split, kH200Slots);
          if (other.count < s.count) EXPECT_GT(cost, chosen) << other.count << " splits";
          if (other.count > s.count) EXPECT_GE(cost, chosen) << other.count << " splits";
        }
      }
    }
  }
}

TEST(SplitKv, PackedHeadsShareAKvHeadAndFitTheirRows) {
  // Decode and spec-decode of the compass (docs/perf/compass.json).
  EXPECT_EQ(packed_heads(4, 1, 64), 4);
  EXPECT_EQ(packed_heads(4, 4, 64), 4);   // 16 rows a head
  EXPECT_EQ(packed_heads(8, 7, 64), 8);   // 8 rows a head
  EXPECT_EQ(packed_heads(8, 16, 64), 4);  // 16 rows a head: 4 heads fill 64
  EXPECT_EQ(packed_heads(128, 1, 64), 64);
  EXPECT_EQ(packed_heads(6, 1, 64), 2);   // the largest power of two dividing 6
  EXPECT_EQ(packed_heads(3, 1, 64), 1);
  EXPECT_EQ(packed_heads(1, 1, 64), 1);   // MHA
  EXPECT_EQ(packed_heads(4, 33, 64), 1);  // prefill: a head fills the tile
  EXPECT_EQ(packed_heads(4, 4096, 64), 1);
  for (int64_t group = 1; group <= 96; ++group) {
    for (int64_t seq_q = 1; seq_q <= 80; ++seq_q) {
      const int heads = packed_heads(group, seq_q, 64);
      SCOPED_TRACE("group " + std::to_string(group) + ", Nq " + std::to_string(seq_q));
      ASSERT_EQ(heads & (heads - 1), 0) << "a power of two: rows map to heads by a shift";
      EXPECT_EQ(group % heads, 0) << "a tile's heads share one KV head";
      EXPECT_TRUE(heads == 1 || 64 / heads >= seq_q) << "each head's Nq rows fit its part of the tile";
      EXPECT_FALSE(group % (2 * heads) == 0 && 64 / (2 * heads) >= seq_q) << "the most heads that fit";
    }
  }
}

// A row's attention over keys [begin, end) in double: the normalized O (one
// value column per entry of `values`) and the natural-log LSE (scores in the
// log2 domain, as the kernels hold them; -inf scores are masked keys).
struct WholeRow {
  std::vector<double> o;
  double lse = -INFINITY;
};

WholeRow attend(const std::vector<float>& scores, const std::vector<std::vector<float>>& values) {
  WholeRow r;
  r.o.assign(values.size(), 0.0);
  double max = -INFINITY;
  for (float x : scores) max = std::max(max, static_cast<double>(x));
  if (max == -INFINITY) return r;  // no attended key: O = 0, LSE = -inf
  double sum = 0.0;
  for (size_t j = 0; j < scores.size(); ++j) {
    const double e = std::exp2(scores[j] - max);
    sum += e;
    for (size_t c = 0; c < values.size(); ++c) r.o[c] += e * values[c][j];
  }
  for (double& x : r.o) x /= sum;
  r.lse = (max + std::log2(sum)) * std::log(2.0);
  return r;
}

// What a split writes, in fp32 as a kernel computes it: its softmax state (the
// keys' maximum and the sum relative to it) and its unnormalized O row.
struct PartialRow {
  RowSoftmaxState state;
  std::vector<float> o;
};

PartialRow split_row(const std::vector<float>& scores, const std::vector<std::vector<float>>& values, size_t begin,
                     size_t end) {
  PartialRow p;
  p.o.assign(values.size(), 0.0f);
  for (size_t j = begin; j < end; ++j) p.state.max_log2 = std::fmax(p.state.max_log2, scores[j]);
  const float base = exponent_base(p.state.max_log2);
  for (size_t j = begin; j < end; ++j) {
    const float e = std::exp2(scores[j] - base);
    p.state.sum += e;
    for (size_t c = 0; c < values.size(); ++c) p.o[c] += e * values[c][j];
  }
  return p;
}

// The combine as the kernel runs it (split_kv.hpp): the splits' states merged,
// each unnormalized O row weighted and added.
// The partials carry the state, not an LSE: an fp32 LSE of a row whose scores
// are ~1e4 has an absolute error of ~1e-3, which the factors exp(LSE_s - LSE)
// turn into relative errors of up to ~1e-3 in O (1.4e-4 measured by this
// test with LSE partials, its first form).
WholeRow combine(const std::vector<PartialRow>& partials) {
  std::vector<RowSoftmaxState> states;
  for (const PartialRow& p : partials) states.push_back(p.state);
  const RowSoftmaxState merged = merge_split_states(states.data(), 1, static_cast<int>(states.size()));
  std::vector<float> o(partials.front().o.size(), 0.0f);
  for (const PartialRow& p : partials) {
    const float weight = split_weight(p.state, merged);
    for (size_t c = 0; c < o.size(); ++c) o[c] += p.o[c] * weight;
  }
  WholeRow r;
  r.lse = log_sum_exp(merged);
  for (const float x : o) r.o.push_back(combined_output(x, merged));
  return r;
}

TEST(SplitKv, CombinedPartialRowsEqualTheWholeRow) {
  std::mt19937 rng(20261201);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f), unit(0.0f, 1.0f);
  for (int trial = 0; trial < 600; ++trial) {
    const size_t n = 1 + rng() % 700, columns = 3;
    // Score ranges from 10 to 1e4: one split holds the row's maximum while
    // another's is 1e4 below it (its factor underflows to 0, never NaN).
    const float range = trial % 3 == 0 ? 1e4f : trial % 3 == 1 ? 100.0f : 10.0f;
    std::vector<float> scores(n);
    std::vector<std::vector<float>> values(columns, std::vector<float>(n));
    for (size_t j = 0; j < n; ++j) {
      scores[j] = rng() % 4 == 0 ? -INFINITY : range * (2.0f * unit(rng) - 1.0f);
      for (auto& column : values) column[j] = value(rng);
    }
    const size_t splits = 1 + rng() % 16;
    const size_t length = (n + splits - 1) / splits;
    if (trial % 7 == 0) {  // a fully masked split in the middle
      for (size_t j = length; j < std::min(n, 2 * length); ++j) scores[j] = -INFINITY;
    }
    if (trial % 25 == 0) scores.assign(n, -INFINITY);  // a row with no attended key
    std::vector<PartialRow> partials;
    for (size_t begin = 0; begin < n; begin += length) {
      partials.push_back(split_row(scores, values, begin, std::min(n, begin + length)));
    }
    const WholeRow whole = attend(scores, values), merged = combine(partials);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", " + std::to_string(partials.size()) + " splits");
    if (whole.lse == -INFINITY) {
      EXPECT_EQ(merged.lse, -INFINITY);
      for (double x : merged.o) EXPECT_EQ(x, 0.0);
      continue;
    }
    EXPECT_NEAR(merged.lse, whole.lse, 1e-6 * std::max(1.0, std::fabs(whole.lse)));
    for (size_t c = 0; c < columns; ++c) EXPECT_NEAR(merged.o[c], whole.o[c], 2e-5);
  }
}

// NaN in partial rows (spec.md, "Non-finite inputs"): a split whose sum is
// NaN (a NaN score) makes the whole row and its LSE NaN; a split's NaN O
// element reaches the row's column whatever the split's weight (a NaN V of a
// key times P = 0, as in one tile), also from a split the row does not
// attend; a row with no attended key stays O = 0, LSE = -inf whatever its
// splits' O rows hold.
TEST(SplitKv, NanPartialRowsReachTheRowAsOneTileWould) {
  const float nan = std::nanf("");
  const PartialRow attended{{3.0f, 2.5f}, {0.5f, -1.0f, 2.0f}};
  const PartialRow far_below{{-200.0f, 1.0f}, {0.25f, nan, 1.0f}};  // weight exp2(-203) = 0: still NaN
  const PartialRow unattended{{-INFINITY, 0.0f}, {0.0f, 0.0f, nan}};
  const PartialRow nan_sum{{1.0f, nan}, {nan, 0.0f, 1.0f}};

  WholeRow r = combine({attended, far_below, unattended});
  EXPECT_FALSE(std::isnan(r.lse));
  EXPECT_FALSE(std::isnan(r.o[0]));
  EXPECT_TRUE(std::isnan(r.o[1]));
  EXPECT_TRUE(std::isnan(r.o[2]));

  r = combine({attended, nan_sum});
  EXPECT_TRUE(std::isnan(r.lse));
  for (double x : r.o) EXPECT_TRUE(std::isnan(x));

  r = combine({unattended, unattended});
  EXPECT_EQ(r.lse, -INFINITY);
  for (double x : r.o) EXPECT_EQ(x, 0.0);
}

}  // namespace
