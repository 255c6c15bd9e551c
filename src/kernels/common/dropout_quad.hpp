// The dropout keep bits of a row's keys in the layout of a quad of lanes
// (kernels/common/dropout.cuh), in host and device code: the sm90 dropout
// warps (D > 512) and S owners (D <= 512) draw them, and the CPU tests play
// them against the stream (tests/cpu/test_philox.cpp).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"
#include "common/philox.hpp"

namespace ffpa::detail {

// The stream's word of element (bh, 0, 0): a tile's rows and keys count from it.
FFPA_HOST_DEVICE uint64_t dropout_head_word(const AttentionProblem& p, int64_t bh) {
  return dropout_head_word(p.dropout_offset, static_cast<uint64_t>(bh), static_cast<uint64_t>(p.seq_q),
                           static_cast<uint64_t>(p.seq_kv));
}

// Bit w of the result: whether word w of the Philox block is kept.
FFPA_HOST_DEVICE uint32_t keep_nibble(const Philox4& block, uint32_t threshold) {
  return (block.x[0] >= threshold ? 1u : 0u) | (block.x[1] >= threshold ? 2u : 0u) |
         (block.x[2] >= threshold ? 4u : 0u) | (block.x[3] >= threshold ? 8u : 0u);
}

// The keep bits of 32 keys from the nine blocks' bits that hold them: `low`,
// blocks 0-7 from the first block's first word, `high`, block 8, and `skip`,
// the first block's words before key 0 (block 8 unused when it is 0).
FFPA_HOST_DEVICE uint32_t keys_from_blocks(uint32_t low, uint32_t high, uint32_t skip) {
  return skip == 0 ? low : (low >> skip) | (high << (32 - skip));
}

// The keep bits of 32 consecutive keys of a row whose first key is stream word
// `word`: bit k is key k. The keys are words word .. word + 31, in the 8
// Philox blocks from word / 4, or 9 when word is not a block's first: each
// block is drawn once (the fewest draws for 32 keys).
FFPA_HOST_DEVICE uint32_t row_keep_bits32(uint64_t seed, uint32_t threshold, uint64_t word) {
  const uint64_t first_block = word >> 2;
  const uint32_t skip = static_cast<uint32_t>(word & 3);  // the first block's words before key 0
  const int blocks = skip == 0 ? 8 : 9;
  uint32_t low = 0, high = 0;  // the blocks' keep bits from the first block's first word
  // Two blocks at a time: each block's rounds are one dependent chain.
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int m = 0; m < 8; m += 2) {
    uint64_t round_seed = seed;
#if defined(__CUDA_ARCH__)
    asm volatile("" : "+l"(round_seed));
#endif
    const Philox4 even = dropout_block(round_seed, first_block + static_cast<uint64_t>(m));
    const Philox4 odd = dropout_block(round_seed, first_block + static_cast<uint64_t>(m + 1));
    low |= (keep_nibble(even, threshold) | keep_nibble(odd, threshold) << 4) << (4 * m);
  }
  if (blocks == 9) high = keep_nibble(dropout_block(seed, first_block + 8), threshold);
  return keys_from_blocks(low, high, skip);
}

// Lane t's byte of 32 keys' keep bits (row_keep_bits32): bit 2 b + e is key
// 8 b + 2t + e (b < 4), the lane's keys in the accumulator layout.
FFPA_HOST_DEVICE uint32_t quad_lane_byte(uint32_t keys, int t) {
  const uint32_t pairs = (keys >> (2 * t)) & 0x03030303u;  // key pair b at bits 8 b, 8 b + 1
  const uint32_t folded = pairs | (pairs >> 6);            // pairs 0, 1 at bits 0-3; 2, 3 at bits 16-19
  return (folded & 0xFu) | ((folded >> 12) & 0xF0u);
}

}  // namespace ffpa::detail
