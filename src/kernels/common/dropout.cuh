// The dropout keep-mask of the pair of keys a thread holds in the accumulator
// layout (columns 2t and 2t + 1 of an 8-column block), drawn from the same
// Philox stream as the CPU reference (common/philox.hpp).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/philox.hpp"

namespace ffpa::detail {

struct DroppedPair {
  bool first, second;  // keys c and c + 1
};

// Row `row` (query index) of head bh = batch * Hq + head, keys c and c + 1,
// where c = 8 * block + 2t, so that c % 4 = 2 * (t % 2).
__device__ __forceinline__ DroppedPair dropped_pair(const AttentionProblem& p, int64_t bh, int row, int c,
                                                    int t) {
  const Philox4 bits = dropout_bits(p.dropout_seed, p.dropout_offset, bh, row, c);
  // Keys c and c + 1 are words c % 4 and c % 4 + 1 of the draw.
  return {((t & 1) ? bits.x[2] : bits.x[0]) < p.dropout_threshold,
          ((t & 1) ? bits.x[3] : bits.x[1]) < p.dropout_threshold};
}

// 1 / (1 - p): the scale of kept values, applied with the normalization.
__device__ __forceinline__ float dropout_keep_scale(const AttentionProblem& p) {
  return p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
}

}  // namespace ffpa::detail
