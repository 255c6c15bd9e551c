// Which tile a CTA computes, host and device: query row blocks of one (batch,
// head) are enumerated fastest, so the CTAs the hardware runs together share
// that head's K and V in L2; causal row blocks go longest first (the last row
// block attends the most keys); and the KV blocks a row block attends end at
// its last row's causal limit. With split-KV (kernels/common/split_kv.hpp) a
// tile is also one split of the keys: blocks [kv_first, kv_first + kv_blocks)
// of its split's range that the rows attend, possibly none. With GQA packing
// (decode: split_kv.hpp's packed_heads) a tile holds the same query rows of
// several query heads that share a KV head, so each K and V byte is read once
// for all of them: tile row r is query row query_row(r) of head row_head(r).
// The CPU tests check it against the reference's masking rule
// (tests/cpu/test_tile_schedule.cpp).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"

namespace ffpa::detail {

struct TileCoordinates {
  int q0;  // first query row
  int head, batch, kv_head;  // head: the first query head of the tile
  int kv_split;   // which split of the keys (0 without split-KV)
  int kv_first;   // the first KV block of the split (0 without split-KV)
  int kv_blocks;  // KV blocks of block_n keys from kv_first the rows attend (causal: up to the diagonal)
  // log2 of the rows each head has in the tile (a power of two): block_m's
  // without packing, so that query_row(r) = q0 + r and row_head(r) = head.
  int row_shift;

  // Tile row r's offset from q0 is r & row_offset_mask().
  FFPA_HOST_DEVICE int row_offset_mask() const { return (1 << row_shift) - 1; }
  // Query row and query head of tile row r (rows past Nq are padding).
  FFPA_HOST_DEVICE int query_row(int r) const { return q0 + (r & row_offset_mask()); }
  FFPA_HOST_DEVICE int row_head(int r) const { return head + (r >> row_shift); }
};

// log2 of a power of two.
FFPA_HOST_DEVICE int log2_of_power_of_two(int value) {
  int shift = 0;
  while ((1 << shift) < value) ++shift;
  return shift;
}

// One past the last key any row of [q0, q0 + block_m) attends.
FFPA_HOST_DEVICE int attended_kv_end(const AttentionProblem& p, int q0, int block_m) {
  const int seq_q = static_cast<int>(p.seq_q), seq_kv = static_cast<int>(p.seq_kv);
  const int last_row = (q0 + block_m < seq_q ? q0 + block_m : seq_q) - 1;
  const int end = last_row + static_cast<int>(p.causal_shift()) + 1;
  const int clipped = end < seq_kv ? end : seq_kv;
  return p.causal == Causal::none ? seq_kv : (clipped > 0 ? clipped : 0);
}

// The first block of block_m query rows (of one head) with a row that attends
// key0: causal, row i sees key0 once i + shift >= key0. Every block from it
// on attends some key of a key block starting at key0 (the backward's
// key-stationary kernels stream them).
FFPA_HOST_DEVICE int first_attending_row_block(const AttentionProblem& p, int key0, int block_m) {
  if (p.causal == Causal::none) return 0;
  const int first_row = key0 - static_cast<int>(p.causal_shift());
  return (first_row > 0 ? first_row : 0) / block_m;
}

// The rows of one head in a tile of block_m rows holding heads_per_tile heads.
FFPA_HOST_DEVICE int rows_per_head(int block_m, int heads_per_tile) { return block_m / heads_per_tile; }

// Tiles along one head's Nq query rows.
FFPA_HOST_DEVICE int64_t head_row_blocks(int64_t seq_q, int block_m, int heads_per_tile) {
  const int rows = rows_per_head(block_m, heads_per_tile);
  return (seq_q + rows - 1) / rows;
}

// The tile of linear index `tile` (row block fastest, then KV split, then
// head group, then batch) among row_blocks x kv_splits x (Hq / heads_per_tile)
// x B; split s holds KV blocks [s x split_blocks, (s + 1) x split_blocks); a
// tile's heads_per_tile heads (a power of two dividing the GQA group, block_m
// / heads_per_tile rows each: head_row_blocks() of them per head) share a KV head.
// Index is the integer type the caller counts tiles in (int when the grid is
// below 2^31 tiles). A launch may cover row blocks [first_row_block,
// first_row_block + row_blocks) of each head only (the FP8 path's hybrid rows:
// the first blocks on the 16-bit kernel, the rest on the 8-bit one).
template <typename Index>
FFPA_HOST_DEVICE TileCoordinates tile_coordinates(const AttentionProblem& p, Index tile, int row_blocks,
                                                  int block_m, int block_n, int kv_splits = 1,
                                                  int split_blocks = 0, int heads_per_tile = 1,
                                                  int first_row_block = 0) {
  TileCoordinates c;
  int row_block = static_cast<int>(tile % row_blocks);
  tile /= row_blocks;
  c.kv_split = static_cast<int>(tile % kv_splits);
  tile /= kv_splits;
  const Index head_groups = static_cast<Index>(p.heads_q / heads_per_tile);
  c.head = static_cast<int>(tile % head_groups) * heads_per_tile;
  c.batch = static_cast<int>(tile / head_groups);
  c.kv_head = c.head / static_cast<int>(p.group_size());
  const int head_rows = rows_per_head(block_m, heads_per_tile);
  c.row_shift = log2_of_power_of_two(head_rows);
  if (p.causal != Causal::none) row_block = row_blocks - 1 - row_block;  // longest first
  c.q0 = (first_row_block + row_block) * head_rows;
  const int attended_blocks = (attended_kv_end(p, c.q0, head_rows) + block_n - 1) / block_n;
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
