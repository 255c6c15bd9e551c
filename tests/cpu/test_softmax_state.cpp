// The softmax-state merge of kernels/common/softmax_state.hpp on the CPU:
// partial results over disjoint key ranges, merged in any grouping, give the
// softmax of the whole range (rows with no attended key included).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/softmax_state.hpp"

namespace {

using ffpa::detail::log_sum_exp;
using ffpa::detail::merge_row_states;
using ffpa::detail::MergedRowState;
using ffpa::detail::RowSoftmaxState;

// The state and unnormalized O (one value column) of keys [begin, end).
struct Partial {
  RowSoftmaxState state;
  double o = 0.0;
};

Partial partial(const std::vector<float>& scores, const std::vector<float>& values, size_t begin, size_t end) {
  Partial p;
  for (size_t j = begin; j < end; ++j) p.state.max_log2 = std::fmax(p.state.max_log2, scores[j]);
  const float base = p.state.max_log2 == -INFINITY ? 0.0f : p.state.max_log2;
  for (size_t j = begin; j < end; ++j) {
    const float e = std::exp2(scores[j] - base);
    p.state.sum += e;
    p.o += static_cast<double>(e) * values[j];
  }
  return p;
}

Partial merge(const Partial& a, const Partial& b) {
  const MergedRowState m = merge_row_states(a.state, b.state);
  return {m.state, a.o * m.scale_a + b.o * m.scale_b};
}

TEST(SoftmaxState, MergedPartialsEqualTheWholeRange) {
  std::mt19937 rng(20261130);
  std::uniform_real_distribution<float> score(-20.0f, 20.0f), value(-1.0f, 1.0f);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t n = 1 + rng() % 300;
    std::vector<float> scores(n), values(n);
    for (size_t j = 0; j < n; ++j) {
      scores[j] = rng() % 5 == 0 ? -INFINITY : score(rng);  // masked keys
      values[j] = value(rng);
    }
    if (trial % 10 == 0) scores.assign(n, -INFINITY);  // a row with no attended key
    const Partial whole = partial(scores, values, 0, n);
    // Up to 8 splits of random sizes (some empty), merged left to right.
    const size_t splits = 1 + rng() % 8;
    std::vector<size_t> cut{0, n};
    for (size_t s = 1; s < splits; ++s) cut.push_back(rng() % (n + 1));
    std::sort(cut.begin(), cut.end());
    Partial merged;
    for (size_t s = 0; s + 1 < cut.size(); ++s) merged = merge(merged, partial(scores, values, cut[s], cut[s + 1]));
    SCOPED_TRACE("trial " + std::to_string(trial));
    EXPECT_EQ(merged.state.max_log2, whole.state.max_log2);
    if (whole.state.sum == 0.0f) {
      EXPECT_EQ(merged.state.sum, 0.0f);
      EXPECT_EQ(merged.o, 0.0);
      EXPECT_EQ(log_sum_exp(merged.state), -INFINITY);
      continue;
    }
    EXPECT_NEAR(merged.state.sum, whole.state.sum, 1e-5 * whole.state.sum);
    EXPECT_NEAR(merged.o / merged.state.sum, whole.o / whole.state.sum, 1e-5);
    EXPECT_NEAR(log_sum_exp(merged.state), log_sum_exp(whole.state), 1e-5);
  }
}

TEST(SoftmaxState, LogSumExpIsNaturalLog) {
  // Scores 1 and 2 (log2 domain): sum relative to max 2 is 2^-1 + 1.
  const RowSoftmaxState s{2.0f, 1.5f};
  EXPECT_NEAR(log_sum_exp(s), std::log(std::exp2(1.0) + std::exp2(2.0)), 1e-6);
  EXPECT_EQ(log_sum_exp(RowSoftmaxState{}), -INFINITY);
}

}  // namespace
