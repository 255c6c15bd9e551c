// The dropout keep-mask of the keys a thread holds in the accumulator layout
// (columns 2t and 2t + 1 of each 8-column block, t the lane in its quad),
// drawn from the stream of common/philox.hpp (SDPA's), as the CPU reference
// draws it. A row's keys are consecutive words of the stream, but a row starts
// anywhere in a Philox block of four words, so a quad's keys straddle blocks:
// the quad draws each block once and trades words by shuffles. (The sm90
// family draws 32 keys of a row a thread: sm90_wgmma/dropout_warps.cuh and
// Consumer::draw_keep.)
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"
#include "common/philox.hpp"
#include "kernels/common/dropout_quad.hpp"  // dropout_head_word

namespace ffpa::detail {

struct DroppedPair {
  bool first, second;  // keys c and c + 1
};

// Whether keys c and c + 1 of row `row` are dropped (c = 8 * block + 2t). The
// quad's 8 keys c - 2t .. c - 2t + 7 are 8 consecutive words in 2 or 3 Philox
// blocks: lane t draws block t of them and the quad swaps words, one draw per
// lane and pair, and no two blocks live at once.
__device__ __forceinline__ DroppedPair dropped_pair(const AttentionProblem& p, uint64_t head_word, int row, int c,
                                                    int t) {
  const uint64_t base = dropout_word(head_word, static_cast<uint32_t>(row), static_cast<uint32_t>(p.seq_kv),
                                     static_cast<uint32_t>(c - 2 * t));
  const Philox4 mine = dropout_block(p.dropout_seed, (base >> 2) + t);
  const uint32_t first_word = static_cast<uint32_t>(base & 3) + 2 * t;  // of the quad's blocks
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) words[w] = __shfl_sync(0xFFFFFFFFu, mine.x[w], first_word >> 2, 4);
  const uint32_t next_block_first = __shfl_sync(0xFFFFFFFFu, mine.x[0], (first_word + 1) >> 2, 4);
  const uint32_t index = first_word & 3;
  const Philox4 held{{words[0], words[1], words[2], words[3]}};
  const uint32_t second = index == 3 ? next_block_first : philox_word(held, index + 1);
  return {philox_word(held, index) < p.dropout_threshold, second < p.dropout_threshold};
}

// What kept values are scaled by, applied with the normalization.
__device__ __forceinline__ float dropout_keep_scale(const AttentionProblem& p) {
  return p.dropout_p > 0.0f ? p.dropout_scale : 1.0f;
}

}  // namespace ffpa::detail
