// The dropout warps of an sm90_wgmma CTA (Traits::kDropoutWarps: in a cluster,
// D > 512; at D <= 512 the S owners draw, Consumer::draw_keep): warps 1-3 of the
// producer warpgroup, idle otherwise, draw each KV block's keep bits (the
// stream of common/philox.hpp, SDPA's) into shared memory a block ahead of
// the consumers, who read two words per block instead of drawing on their
// softmax's critical path (drawn there, dropout 0.1 ran at 0.5x the undropped
// speed at D = 512: docs/kernels/sm90_wgmma.md).
//
// Per block, 64 rows x 4 quarters of 32 keys: 256 row draws (row_keep_bits32,
// 8 or 9 Philox blocks each, the fewest) over the 96 threads, each quarter
// stored as the four quad lanes' bytes of their keep words.
//
// One buffer, three barriers. Block j's bits complete phase j / 2 of
// keep_full(j % 2), the barrier of its S owner: a consumer waits for its own
// k-th block, so it is never more than one phase ahead of its barrier (with
// one barrier, the owner of block j + 1 could wait before block j is written
// and see the previous phase of the same parity). keep_empty completes a
// phase as each block's owner has read its words, in block order; the dropout
// warps wait for block j - 1's before writing block j.
#pragma once

#include <cstdint>

#include "kernels/common/dropout_quad.hpp"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
struct DropoutWarps {
  static constexpr int kThreads = Traits::kDropoutThreads;
  static constexpr int kRowDraws = Traits::kBlockM * Traits::kBlockN / 32;
  static_assert(Traits::kBlockN == 128, "a row's keys are four 32-key quarters: one byte of each lane's word");
  const Cta<Traits>& cta;

  // thread: 0 .. kThreads - 1. Runs in the producer warpgroup's 24 registers:
  // the tile and the problem are read where used.
  __device__ __forceinline__ void run(int thread) const {
    const AttentionProblem& p = cta.p;
    unsigned char* const keep_bytes = reinterpret_cast<unsigned char*>(cta.keep_words());
#pragma unroll 1
    for (int j = 0; j < cta.tile()->kv_blocks; ++j) {
      if (j >= 1) mbarrier_wait(cta.keep_empty(), (j - 1) & 1);
#pragma unroll 1
      for (int draw = thread; draw < kRowDraws; draw += kThreads) {
        const int r = draw % Traits::kBlockM, quarter = draw / Traits::kBlockM;
        const TileCoordinates* tile = cta.tile();
        const int row = tile->query_row(r);
        uint32_t keys = 0;  // rows past Nq are never stored
        if (row < p.seq_q) {
          const uint64_t head_word =
              dropout_head_word(p, static_cast<int64_t>(tile->batch) * p.heads_q + tile->row_head(r));
          const uint64_t word = dropout_word(head_word, static_cast<uint32_t>(row), static_cast<uint32_t>(p.seq_kv),
                                             static_cast<uint32_t>(cta.block_key(j) + 32 * quarter));
          keys = row_keep_bits32(p.dropout_seed, p.dropout_threshold, word);
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) keep_bytes[(r * 4 + t) * 4 + quarter] = static_cast<unsigned char>(quad_lane_byte(keys, t));
      }
      mbarrier_arrive(cta.keep_full(j & 1));
    }
  }
};

}  // namespace ffpa::detail::sm90_wgmma
