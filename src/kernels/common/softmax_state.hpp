// The softmax state of one row over a range of keys, host and device: its
// maximum (log2 domain) and its denominator relative to that maximum. With the
// unnormalized O row it is what a range of keys contributes, so partial
// results over disjoint key ranges (split-KV decode, context-parallel shards)
// combine exactly: merge the states, scale each partial O row by its factor,
// add, then normalize by the merged sum. Tested on the CPU against the whole
// range (tests/cpu/test_softmax_state.cpp).
#pragma once

#include <cmath>

#include "common/host_device.hpp"
#include "kernels/common/math_constants.hpp"

namespace ffpa::detail {

struct RowSoftmaxState {
  float max_log2 = -INFINITY;  // -inf: no key attended (yet)
  float sum = 0.0f;            // sum of exp2(score - base) over the range, base = max or 0
};

// What a row's exponentials subtract: its maximum, or 0 while nothing is
// attended (-inf), so that exp2(-inf - 0) = 0 rather than NaN.
FFPA_HOST_DEVICE float exponent_base(float max_log2) { return max_log2 == -INFINITY ? 0.0f : max_log2; }

// The factor that moves values relative to `from` onto `to` (both maxima, in
// the log2 domain); a state with nothing attended contributes 0.
FFPA_HOST_DEVICE float rescale_factor(float from, float to) { return exp2f(from - exponent_base(to)); }

struct MergedRowState {
  RowSoftmaxState state;
  float scale_a, scale_b;  // what each partial's unnormalized O row is multiplied by
};

FFPA_HOST_DEVICE MergedRowState merge_row_states(RowSoftmaxState a, RowSoftmaxState b) {
  MergedRowState m;
  m.state.max_log2 = fmaxf(a.max_log2, b.max_log2);
  m.scale_a = rescale_factor(a.max_log2, m.state.max_log2);
  m.scale_b = rescale_factor(b.max_log2, m.state.max_log2);
  m.state.sum = a.sum * m.scale_a + b.sum * m.scale_b;
  return m;
}

// Natural-log LSE of a row; -inf for a row with no attended key (sum 0), NaN
// for one whose sum is NaN (a NaN score reached it: spec.md, "Non-finite
// inputs"). The maxima never hold the NaN: fmaxf drops it, the sums keep it.
FFPA_HOST_DEVICE float log_sum_exp(RowSoftmaxState s) {
  return s.sum == 0.0f ? -INFINITY : s.max_log2 * kLn2 + logf(s.sum);
}

}  // namespace ffpa::detail
