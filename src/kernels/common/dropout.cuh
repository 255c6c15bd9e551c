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

// The keep bits of one 8-key column block for both of a thread's rows (keys
// block_key + 2t and + 1 of rows row0 and row1; all four lanes of each quad
// call this together): bit e is key block_key + 2t + e of row0, bit 2 + e of
// row1. The quad's two rows and two 4-key groups are four Philox draws, one
// per lane (lane t draws row t % 2's group t / 2), and each lane needs its
// own group's words of both rows: one shuffle with lane t ^ 1, which drew the
// other row of the same group. Half the draws of dropped_pair, where lanes t
// and t ^ 1 both draw the same group of a row.
__device__ __forceinline__ uint32_t quad_keep_bits(const AttentionProblem& p, int64_t bh, int row0, int row1,
                                                   int block_key, int t) {
  const bool odd = t & 1;
  const Philox4 bits = dropout_bits(p.dropout_seed, p.dropout_offset, bh, odd ? row1 : row0, block_key + 4 * (t >> 1));
  uint32_t kept = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) kept |= (bits.x[w] >= p.dropout_threshold ? 1u : 0u) << w;
  const uint32_t other_row = __shfl_xor_sync(0xFFFFFFFFu, kept, 1);
  // Keys 2t and 2t + 1 of the block are words 2 (t % 2) and + 1 of group t / 2.
  const int shift = odd ? 2 : 0;
  const uint32_t mine = (kept >> shift) & 3u, theirs = (other_row >> shift) & 3u;
  return odd ? theirs | (mine << 2) : mine | (theirs << 2);
}

// 1 / (1 - p): the scale of kept values, applied with the normalization.
__device__ __forceinline__ float dropout_keep_scale(const AttentionProblem& p) {
  return p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
}

}  // namespace ffpa::detail
