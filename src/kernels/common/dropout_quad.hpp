// The dropout draws a quad of lanes shares (kernels/common/dropout.cuh), in
// host and device code: the shuffles between the two halves are the kernel's,
// and the CPU tests play the four lanes (tests/cpu/test_philox.cpp).
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

// Two column blocks (16 keys) of a quad's two rows at once, with fewer draws:
// row r's keys are words w_r .. w_r + 15, in the 4 or 5 Philox blocks from
// w_r / 4. Slot s = 5 r + m is block m of row r; lane s % 4 draws it in round
// s / 4 (3 rounds: 12 draws for the 10 slots, against 16 for dropped_pair),
// keeping its 4 keep bits at bits 4 (s / 4) of a word; the quad then shares
// those words (4 shuffles) and each lane cuts its keys out of the rows' keep
// streams.

// Lane t's keep bits of its slots.
FFPA_HOST_DEVICE uint32_t quad_slot_keep_bits(uint64_t seed, uint32_t threshold, uint64_t row0_word,
                                              uint64_t row1_word, int t) {
  uint32_t kept = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 3; ++round) {
    const int slot = 4 * round + t;
    if (slot >= 10) continue;
    const bool second_row = slot >= 5;
    const uint64_t first_block = (second_row ? row1_word : row0_word) >> 2;
    const Philox4 block = dropout_block(seed, first_block + static_cast<uint64_t>(second_row ? slot - 5 : slot));
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int w = 0; w < 4; ++w) kept |= (block.x[w] >= threshold ? 1u : 0u) << (4 * round + w);
  }
  return kept;
}

// Lane t's keys from the quad's slot bits (lane_bits[L]: lane L's
// quad_slot_keep_bits): bit 2 b + e of nibble r is key 8 b + 2t + e of row r.
FFPA_HOST_DEVICE uint32_t quad_keys_from_slots(const uint32_t (&lane_bits)[4], uint64_t row0_word,
                                               uint64_t row1_word, int t) {
  uint32_t keys = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int r = 0; r < 2; ++r) {
    uint32_t stream = 0;  // row r's keep bits from its first block's first word, 20 of them
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int m = 0; m < 5; ++m) {
      const int slot = 5 * r + m;
      stream |= ((lane_bits[slot % 4] >> (4 * (slot / 4))) & 0xFu) << (4 * m);
    }
    const uint32_t first = static_cast<uint32_t>((r == 0 ? row0_word : row1_word) & 3) + 2 * t;
    const uint32_t bits = stream >> first;  // block 0's pair at bits 0-1, block 1's at bits 8-9
    keys |= ((bits & 3u) | ((bits >> 6) & 0xCu)) << (4 * r);
  }
  return keys;
}

}  // namespace ffpa::detail
