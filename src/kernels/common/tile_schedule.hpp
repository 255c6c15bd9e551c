// Which tile a CTA computes, host and device: query row blocks of one (batch,
// head) are enumerated fastest, so the CTAs the hardware runs together share
// that head's K and V in L2; causal row blocks go longest first (the last row
// block attends the most keys); and the KV blocks a row block attends end at
// its last row's causal limit. With split-KV (kernels/common/split_kv.hpp) a
// tile is also one split of the keys: blocks [kv_first, kv_first + kv_blocks)
// of its split's range that the rows attend, possibly none. The CPU tests
// check it against the reference's masking rule (tests/cpu/test_tile_schedule.cpp).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"

namespace ffpa::detail {

struct TileCoordinates {
  int q0;  // first query row
  int head, batch, kv_head;
  int kv_split;   // which split of the keys (0 without split-KV)
  int kv_first;   // the first KV block of the split (0 without split-KV)
  int kv_blocks;  // KV blocks of block_n keys from kv_first the rows attend (causal: up to the diagonal)
};

// One past the last key any row of [q0, q0 + block_m) attends.
FFPA_HOST_DEVICE int attended_kv_end(const AttentionProblem& p, int q0, int block_m) {
  const int seq_q = static_cast<int>(p.seq_q), seq_kv = static_cast<int>(p.seq_kv);
  const int last_row = (q0 + block_m < seq_q ? q0 + block_m : seq_q) - 1;
  const int end = last_row + static_cast<int>(p.causal_shift()) + 1;
  const int clipped = end < seq_kv ? end : seq_kv;
  return p.causal == Causal::none ? seq_kv : (clipped > 0 ? clipped : 0);
}

// The tile of linear index `tile` (row block fastest, then KV split, then
// head, then batch) among row_blocks x kv_splits x Hq x B; split s holds KV
// blocks [s x split_blocks, (s + 1) x split_blocks). Index is the integer type
// the caller counts tiles in (int when the grid is below 2^31 tiles).
template <typename Index>
FFPA_HOST_DEVICE TileCoordinates tile_coordinates(const AttentionProblem& p, Index tile, int row_blocks,
                                                  int block_m, int block_n, int kv_splits = 1,
                                                  int split_blocks = 0) {
  TileCoordinates c;
  int row_block = static_cast<int>(tile % row_blocks);
  tile /= row_blocks;
  c.kv_split = static_cast<int>(tile % kv_splits);
  tile /= kv_splits;
  c.head = static_cast<int>(tile % static_cast<Index>(p.heads_q));
  c.batch = static_cast<int>(tile / static_cast<Index>(p.heads_q));
  c.kv_head = c.head / static_cast<int>(p.group_size());
  if (p.causal != Causal::none) row_block = row_blocks - 1 - row_block;  // longest first
  c.q0 = row_block * block_m;
  const int attended_blocks = (attended_kv_end(p, c.q0, block_m) + block_n - 1) / block_n;
  if (kv_splits == 1) {
    c.kv_first = 0;
    c.kv_blocks = attended_blocks;
  } else {
    c.kv_first = c.kv_split * split_blocks;
    const int end = c.kv_first + split_blocks < attended_blocks ? c.kv_first + split_blocks : attended_blocks;
    c.kv_blocks = end > c.kv_first ? end - c.kv_first : 0;
  }
  return c;
}

}  // namespace ffpa::detail
