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
#include "common/sequence_batch.hpp"
#include "kernels/common/sequence_schedule.hpp"

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

// The sequence a forward tile belongs to: its lengths and where its rows lie
// (int: positions are below kMaxSequenceLength). A dense call's batch entry
// b: Nq and Nkv, rows from 0 of batch entry b; a serving call's sequence b
// (common/sequence_batch.hpp).
struct TileSequence {
  int seq_q, seq_kv;
  int q_batch, q_begin;    // q's, o's and lse's batch entry and the sequence's first row in it
  int kv_batch, kv_begin;  // k's and v's (paged keys: unused, a key's page says where it is)
};

FFPA_HOST_DEVICE TileSequence tile_sequence(const AttentionProblem& p, int b) {
  if (!p.sequences.active) return {static_cast<int>(p.seq_q), static_cast<int>(p.seq_kv), b, 0, b, 0};
  const Sequence s = sequence_at(p.sequences, b);
  return {static_cast<int>(s.seq_q),   static_cast<int>(s.seq_kv),   static_cast<int>(s.q_batch),
          static_cast<int>(s.q_begin), static_cast<int>(s.kv_batch), static_cast<int>(s.kv_begin)};
}

// The keys [first, end) some row of rows [q0, q0 + rows) of a sequence
// attends before the mask (causal limit and window: the first row has the
// smallest first key, the last row the largest end). Empty past Nq.
FFPA_HOST_DEVICE KeyRange attended_key_range(const AttentionProblem& p, const TileSequence& seq, int q0, int rows) {
  const int last_row = (q0 + rows < seq.seq_q ? q0 + rows : seq.seq_q) - 1;
  if (last_row < q0) return {0, 0};
  const int64_t first = attended_keys(p, q0, seq.seq_q, seq.seq_kv).first;
  const int64_t end = attended_keys(p, last_row, seq.seq_q, seq.seq_kv).end;
  return {first, end > first ? end : first};
}

// The key bounds of a tile's first query row (score_mask.cuh's KeyLimits:
// they move with the row): the last key it may attend (the causal limit in
// the problem's alignment and a window's right side) and the first (a
// window's left side), each kNoKeyBound past any key where unbounded.
struct TileKeyBounds {
  int first_row_limit, first_row_start;
};
constexpr int kUnboundedKeys = 1 << 30;  // score_mask.cuh's kNoKeyBound

FFPA_HOST_DEVICE TileKeyBounds tile_key_bounds(const AttentionProblem& p, const TileCoordinates& tile,
                                               const TileSequence& seq) {
  const int64_t position = static_cast<int64_t>(tile.q0) + seq.seq_kv - seq.seq_q;  // the first row's
  int64_t limit = kUnboundedKeys;
  if (p.causal != Causal::none) limit = p.causal == Causal::bottom_right ? position : tile.q0;
  if (p.window_right >= 0 && position + p.window_right < limit) limit = position + p.window_right;
  int64_t start = -kUnboundedKeys;
  if (p.window_left >= 0 && position - p.window_left > start) start = position - p.window_left;
  return {static_cast<int>(limit), static_cast<int>(start)};
}

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

// The query rows [first, end) of a sequence among which are all those that
// attend a key of [key0, key0 + keys) (the backward's key-stationary kernels
// stream their blocks): row i's attended keys (attended_keys) end past key0
// from the first row whose causal limit and window's right bound reach key0
// on, and start at or before the last key up to the last row whose window's
// left bound reaches it. Empty past Nkv.
FFPA_HOST_DEVICE KeyRange attending_row_range(const AttentionProblem& p, const TileSequence& seq, int key0, int keys) {
  const int64_t last_key = (key0 + keys < seq.seq_kv ? key0 + keys : seq.seq_kv) - 1;
  if (last_key < key0) return {0, 0};
  const int64_t shift = static_cast<int64_t>(seq.seq_kv) - seq.seq_q;  // row i's position is i + shift
  int64_t first = 0, end = seq.seq_q;
  if (p.causal != Causal::none) {
    const int64_t row = key0 - (p.causal == Causal::bottom_right ? shift : 0);
    first = row > first ? row : first;
  }
  if (p.window_right >= 0 && key0 - p.window_right - shift > first) first = key0 - p.window_right - shift;
  if (p.window_left >= 0 && last_key + p.window_left - shift + 1 < end) end = last_key + p.window_left - shift + 1;
  if (first > seq.seq_q) first = seq.seq_q;
  return {first, end > first ? end : first};
}

// The rows of one head in a tile of block_m rows holding heads_per_tile heads.
FFPA_HOST_DEVICE int rows_per_head(int block_m, int heads_per_tile) { return block_m / heads_per_tile; }

// Tiles along one head's Nq query rows.
FFPA_HOST_DEVICE int64_t head_row_blocks(int64_t seq_q, int block_m, int heads_per_tile) {
  const int rows = rows_per_head(block_m, heads_per_tile);
  return (seq_q + rows - 1) / rows;
}

// A tile's KV blocks: those its rows attend (from a window's first block),
// within its split's [kv_split x split_blocks, + split_blocks) when split.
FFPA_HOST_DEVICE void set_kv_blocks(const AttentionProblem& p, const TileSequence& seq, int head_rows, int block_n,
                                   int kv_splits, int split_blocks, TileCoordinates& c) {
  const KeyRange keys = attended_key_range(p, seq, c.q0, head_rows);
  const int first_block = static_cast<int>(keys.first / block_n);
  const int end_block = static_cast<int>((keys.end + block_n - 1) / block_n);
  int first = first_block, end = end_block;
  if (kv_splits > 1) {
    const int split_first = c.kv_split * split_blocks;
    first = split_first > first_block ? split_first : first_block;
    end = split_first + split_blocks < end_block ? split_first + split_blocks : end_block;
  }
  c.kv_first = first;
  c.kv_blocks = end > first ? end - first : 0;
}

// Tile `tile` of one sequence's (batch's) tiles, in a dense call's order
// (row block fastest, then KV split, then head group): its rows, heads and
// KV blocks.
template <typename Index>
FFPA_HOST_DEVICE TileCoordinates tile_in_sequence(const AttentionProblem& p, const TileSequence& seq, int batch,
                                                  Index tile, int row_blocks, int block_m, int block_n, int kv_splits,
                                                  int split_blocks, int heads_per_tile, int first_row_block) {
  TileCoordinates c;
  int row_block = static_cast<int>(tile % row_blocks);
  tile /= row_blocks;
  c.kv_split = static_cast<int>(tile % kv_splits);
  tile /= kv_splits;
  c.head = static_cast<int>(tile) * heads_per_tile;
  c.batch = batch;
  c.kv_head = c.head / static_cast<int>(p.group_size());
  const int head_rows = rows_per_head(block_m, heads_per_tile);
  c.row_shift = log2_of_power_of_two(head_rows);
  if (p.causal != Causal::none) row_block = row_blocks - 1 - row_block;  // longest first
  c.q0 = (first_row_block + row_block) * head_rows;
  set_kv_blocks(p, seq, head_rows, block_n, kv_splits, split_blocks, c);
  return c;
}

// The tile of linear index `tile` (row block fastest, then KV split, then
// head group, then batch) among row_blocks x kv_splits x (Hq / heads_per_tile)
// x B of a dense call; split s holds KV blocks [s x split_blocks, (s + 1) x
// split_blocks); a tile's heads_per_tile heads (a power of two dividing the
// GQA group, block_m / heads_per_tile rows each: head_row_blocks() of them
// per head) share a KV head. Index is the integer type the caller counts
// tiles in (int when the grid is below 2^31 tiles). A launch may cover row
// blocks [first_row_block, first_row_block + row_blocks) of each head only
// (the FP8 path's hybrid rows: the first blocks on the 16-bit kernel, the
// rest on the 8-bit one).
template <typename Index>
FFPA_HOST_DEVICE TileCoordinates tile_coordinates(const AttentionProblem& p, Index tile, int row_blocks,
                                                  int block_m, int block_n, int kv_splits = 1,
                                                  int split_blocks = 0, int heads_per_tile = 1,
                                                  int first_row_block = 0) {
  const Index per_batch = static_cast<Index>(row_blocks) * kv_splits * static_cast<Index>(p.heads_q / heads_per_tile);
  const int batch = static_cast<int>(tile / per_batch);
  return tile_in_sequence<Index>(p, tile_sequence(p, batch), batch, tile % per_batch, row_blocks, block_m, block_n,
                                 kv_splits, split_blocks, heads_per_tile, first_row_block);
}

// A serving call's tile `tile` (below the plan's count) of the plan at
// `plan` (kernels/common/sequence_schedule.hpp): its sequence found in the plan's
// first tiles, then tile_in_sequence with the sequence's own row blocks and
// the plan's KV splits. *seq receives the sequence.
FFPA_HOST_DEVICE TileCoordinates sequence_tile_coordinates(const AttentionProblem& p, const void* plan, int tile,
                                                           const SequenceTiling& tiling, TileSequence* seq) {
  const auto* header = static_cast<const SequenceScheduleHeader*>(plan);
  const PlanArrays arrays = plan_arrays(plan, p.batch);
  const int b = sequence_holding(arrays.first_tile, static_cast<int>(p.batch), tile);
  *seq = tile_sequence(p, b);
  const int rows = rows_per_head(tiling.block_m, tiling.heads_per_tile);
  const int row_blocks = (seq->seq_q + rows - 1) / rows;
  const int split_blocks = header->split_blocks;
  Sequence lengths;
  lengths.seq_kv = seq->seq_kv;
  const int splits = static_cast<int>(sequence_splits(lengths, tiling.block_n, split_blocks));
  return tile_in_sequence<int>(p, *seq, b, tile - arrays.first_tile[b], row_blocks, tiling.block_m, tiling.block_n,
                               splits, split_blocks, tiling.heads_per_tile, 0);
}

// Whether a call's tiles write split-KV's partial rows instead of O and LSE:
// a dense call's when it has kv_splits > 1, a serving call's where its plan
// split the keys (both families' epilogues ask).
FFPA_HOST_DEVICE bool writes_split_partials(const AttentionProblem& p, int kv_splits) {
  if (!p.sequences.active) return kv_splits > 1;
  return static_cast<const SequenceScheduleHeader*>(p.sequences.plan)->split_blocks > 0;
}

// A split-KV partial row's index: dense calls (split_kv/combine.hpp) row
// (b x Hq + h) x Nq + i of split s at s x B x Hq x Nq + row; a serving call's
// sequence b at the plan's first partial row of b, then (s x Hq + h) x Nq_b + i.
FFPA_HOST_DEVICE int64_t partial_row_index(const AttentionProblem& p, const TileCoordinates& tile,
                                           const TileSequence& seq, int head, int i) {
  if (p.sequences.active) {
    const PlanArrays arrays = plan_arrays(p.sequences.plan, p.batch);
    return arrays.first_partial[tile.batch] + (static_cast<int64_t>(tile.kv_split) * p.heads_q + head) * seq.seq_q + i;
  }
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  return tile.kv_split * rows + (static_cast<int64_t>(tile.batch) * p.heads_q + head) * p.seq_q + i;
}

}  // namespace ffpa::detail
