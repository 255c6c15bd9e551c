// The shared tile schedule and swizzle (kernels/common/tile_schedule.hpp,
// swizzle.hpp) on the CPU: every tile enumerated once, causal row blocks
// longest first, the attended KV range against the reference's masking rule;
// the 128-byte swizzle a bijection that spreads 8 rows over distinct banks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>

#include "common/attention_problem.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/common/tile_schedule.hpp"

namespace ffpa::detail {
inline bool operator==(const TileCoordinates& a, const TileCoordinates& b) {
  return a.q0 == b.q0 && a.head == b.head && a.batch == b.batch && a.kv_head == b.kv_head &&
         a.kv_split == b.kv_split && a.kv_first == b.kv_first && a.kv_blocks == b.kv_blocks &&
         a.row_shift == b.row_shift;
}
}  // namespace ffpa::detail

namespace {

using ffpa::Causal;
using ffpa::detail::AttentionProblem;
using ffpa::detail::attended_kv_end;
using ffpa::detail::tile_coordinates;
using ffpa::detail::TileCoordinates;

AttentionProblem problem(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_kv,
                         Causal causal) {
  AttentionProblem p;
  p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv, p.seq_q = seq_q, p.seq_kv = seq_kv;
  p.head_dim = 64;
  p.causal = causal;
  return p;
}

// One past the last key any row of [q0, q0 + block_m) may attend, by the
// reference's rule (row i sees key j < Nkv when not causal or j <= i + shift).
int reference_kv_end(const AttentionProblem& p, int q0, int block_m) {
  int end = 0;
  for (int i = q0; i < std::min<int>(q0 + block_m, static_cast<int>(p.seq_q)); ++i)
    for (int j = 0; j < p.seq_kv; ++j)
      if (p.causal == Causal::none || j <= i + p.causal_shift()) end = std::max(end, j + 1);
  return end;
}

TEST(TileSchedule, EveryTileOnceLongestFirstAndTheAttendedKeys) {
  std::mt19937 rng(20261130);
  for (int trial = 0; trial < 200; ++trial) {
    const int heads_kv = 1 + rng() % 3, group = 1 + rng() % 3;
    const Causal causal = static_cast<Causal>(rng() % 3);
    const AttentionProblem p = problem(1 + rng() % 3, heads_kv * group, heads_kv, 1 + rng() % 300,
                                       1 + rng() % 300, causal);
    const int block_m = 16 << (rng() % 3), block_n = 64 << (rng() % 3);
    const int row_blocks = static_cast<int>((p.seq_q + block_m - 1) / block_m);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": Nq " + std::to_string(p.seq_q) + ", Nkv " +
                 std::to_string(p.seq_kv) + ", causal " + std::to_string(static_cast<int>(causal)));
    std::set<std::tuple<int, int, int>> seen;
    int previous_q0 = -1;
    for (int64_t tile = 0; tile < row_blocks * p.heads_q * p.batch; ++tile) {
      const TileCoordinates c = tile_coordinates<int64_t>(p, tile, row_blocks, block_m, block_n);
      EXPECT_EQ(c, tile_coordinates<int>(p, static_cast<int>(tile), row_blocks, block_m, block_n));
      ASSERT_TRUE(seen.insert({c.batch, c.head, c.q0}).second) << "tile " << tile << " twice";
      ASSERT_EQ(c.q0 % block_m, 0);
      ASSERT_LT(c.q0, p.seq_q);
      EXPECT_EQ(c.kv_head, c.head / group);
      // Row blocks of one head are consecutive: ascending, or descending when causal.
      if (tile % row_blocks != 0) EXPECT_EQ(c.q0 - previous_q0, causal == Causal::none ? block_m : -block_m);
      previous_q0 = c.q0;
      const int end = reference_kv_end(p, c.q0, block_m);
      EXPECT_EQ(attended_kv_end(p, c.q0, block_m), end);
      EXPECT_EQ(c.kv_split, 0);
      EXPECT_EQ(c.kv_first, 0);
      EXPECT_EQ(c.kv_blocks, (end + block_n - 1) / block_n);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), row_blocks * p.heads_q * p.batch);
  }
}

// With KV splits: every (tile, split) once, the splits of a tile cover the
// attended blocks exactly once, in order, each within its range.
TEST(TileSchedule, KvSplitsCoverTheAttendedBlocksOnce) {
  std::mt19937 rng(20261201);
  for (int trial = 0; trial < 200; ++trial) {
    const int heads_kv = 1 + rng() % 3, group = 1 + rng() % 3;
    const Causal causal = static_cast<Causal>(rng() % 3);
    const AttentionProblem p = problem(1 + rng() % 3, heads_kv * group, heads_kv, 1 + rng() % 100,
                                       1 + rng() % 3000, causal);
    const int block_m = 64, block_n = 128;
    const int row_blocks = static_cast<int>((p.seq_q + block_m - 1) / block_m);
    const int total_blocks = static_cast<int>((p.seq_kv + block_n - 1) / block_n);
    const int split_blocks = 1 + static_cast<int>(rng() % total_blocks);
    const int kv_splits = (total_blocks + split_blocks - 1) / split_blocks;
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + std::to_string(kv_splits) + " splits of " +
                 std::to_string(split_blocks) + " blocks");
    std::set<std::tuple<int, int, int, int>> seen;
    std::map<std::tuple<int, int, int>, int> covered;  // (batch, head, q0) -> blocks so far, in split order
    for (int64_t tile = 0; tile < row_blocks * kv_splits * p.heads_q * p.batch; ++tile) {
      const TileCoordinates c = tile_coordinates<int64_t>(p, tile, row_blocks, block_m, block_n, kv_splits, split_blocks);
      EXPECT_EQ(c, tile_coordinates<int>(p, static_cast<int>(tile), row_blocks, block_m, block_n, kv_splits,
                                         split_blocks));
      ASSERT_TRUE(seen.insert({c.batch, c.head, c.q0, c.kv_split}).second) << "tile " << tile << " twice";
      EXPECT_EQ(c.kv_first, c.kv_split * split_blocks);
      EXPECT_GE(c.kv_blocks, 0);
      EXPECT_LE(c.kv_blocks, split_blocks);
      int& blocks = covered[{c.batch, c.head, c.q0}];
      if (c.kv_blocks > 0) {
        EXPECT_EQ(c.kv_first, blocks) << "a gap or an overlap before split " << c.kv_split;
        blocks += c.kv_blocks;
      }
    }
    for (const auto& [tile, blocks] : covered) {
      const int q0 = std::get<2>(tile);
      EXPECT_EQ(blocks, (reference_kv_end(p, q0, block_m) + block_n - 1) / block_n);
    }
  }
}

// GQA packing (split_kv.hpp's packed_heads): the tiles' rows cover every
// (batch, head, query row) once, a tile's heads share its KV head, padding
// rows are exactly those past Nq, and the attended blocks are the most any of
// its rows attends. Without packing the rows are q0 + r of the tile's head.
TEST(TileSchedule, PackedHeadsCoverEveryRowOnce) {
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 300; ++trial) {
    const int heads_kv = 1 + rng() % 3, group = 1 << (rng() % 5);
    const Causal causal = static_cast<Causal>(rng() % 3);
    const AttentionProblem p = problem(1 + rng() % 2, heads_kv * group, heads_kv, 1 + rng() % 20,
                                       1 + rng() % 700, causal);
    const int block_m = 64, block_n = 128;
    const int heads_per_tile = ffpa::detail::packed_heads(group, p.seq_q, block_m);
    const int head_rows = block_m / heads_per_tile;
    const int row_blocks = static_cast<int>(ffpa::detail::head_row_blocks(p.seq_q, block_m, heads_per_tile));
    SCOPED_TRACE("trial " + std::to_string(trial) + ": group " + std::to_string(group) + ", Nq " +
                 std::to_string(p.seq_q) + ", " + std::to_string(heads_per_tile) + " heads a tile");
    std::map<std::tuple<int, int, int>, int> rows_seen;
    const int64_t tiles = row_blocks * (p.heads_q / heads_per_tile) * p.batch;
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const TileCoordinates c =
          tile_coordinates<int64_t>(p, tile, row_blocks, block_m, block_n, 1, 0, heads_per_tile);
      EXPECT_EQ(c, tile_coordinates<int>(p, static_cast<int>(tile), row_blocks, block_m, block_n, 1, 0,
                                         heads_per_tile));
      int end = 0;
      for (int r = 0; r < block_m; ++r) {
        const int head = c.row_head(r), row = c.query_row(r);
        ASSERT_GE(head, c.head);
        ASSERT_LT(head, c.head + heads_per_tile);
        EXPECT_EQ(head / group, c.kv_head) << "row " << r;
        EXPECT_EQ(row, c.q0 + r % head_rows);
        if (row >= p.seq_q) continue;  // padding
        ++rows_seen[{c.batch, head, row}];
        end = std::max(end, reference_kv_end(p, row, 1));
      }
      EXPECT_EQ(c.kv_blocks, (end + block_n - 1) / block_n);
    }
    EXPECT_EQ(static_cast<int64_t>(rows_seen.size()), p.batch * p.heads_q * p.seq_q);
    for (const auto& [row, count] : rows_seen) EXPECT_EQ(count, 1);
  }
}

// The backward's key-stationary rows (attending_row_range): every row that
// attends a key of the block, by the reference's rule (attended_keys: causal
// in both alignments, windows on either side), lies in the range; without a
// window the range is exactly theirs (no row block streamed for nothing).
TEST(TileSchedule, TheRowsAttendingAKeyBlock) {
  using ffpa::detail::attended_keys;
  using ffpa::detail::attending_row_range;
  using ffpa::detail::TileSequence;
  std::mt19937 rng(20261202);
  for (int trial = 0; trial < 3000; ++trial) {
    AttentionProblem p = problem(1, 1, 1, 1, 1, static_cast<Causal>(rng() % 3));
    p.window_left = rng() % 3 == 0 ? -1 : static_cast<int64_t>(rng() % 40);
    p.window_right = rng() % 3 == 0 ? -1 : static_cast<int64_t>(rng() % 40);
    const TileSequence seq{static_cast<int>(rng() % 120), static_cast<int>(1 + rng() % 120), 0, 0, 0, 0};
    const int keys = 1 << (rng() % 7), key0 = keys * static_cast<int>(rng() % ((seq.seq_kv + keys - 1) / keys));
    const ffpa::detail::KeyRange range = attending_row_range(p, seq, key0, keys);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": Nq " + std::to_string(seq.seq_q) + " Nkv " +
                 std::to_string(seq.seq_kv) + " keys [" + std::to_string(key0) + ", +" + std::to_string(keys) +
                 ") window (" + std::to_string(p.window_left) + ", " + std::to_string(p.window_right) + ")");
    ASSERT_LE(0, range.first);
    ASSERT_LE(range.first, range.end);
    ASSERT_LE(range.end, seq.seq_q);
    int first = seq.seq_q, end = 0;
    for (int i = 0; i < seq.seq_q; ++i) {
      const ffpa::detail::KeyRange attended = attended_keys(p, i, seq.seq_q, seq.seq_kv);
      if (std::max<int64_t>(attended.first, key0) < std::min<int64_t>(attended.end, key0 + keys)) {
        first = std::min(first, i);
        end = std::max(end, i + 1);
      }
    }
    if (end == 0) continue;  // no row attends the block: any range, empty or not, streams nothing wrong
    EXPECT_LE(range.first, first);
    EXPECT_GE(range.end, end);
    if (p.window_left < 0 && p.window_right < 0) {
      EXPECT_EQ(range.first, first);
      EXPECT_EQ(range.end, end);
    }
  }
}

TEST(Swizzle128, BijectiveAndBankSpreading) {
  using ffpa::detail::swizzle128;
  using ffpa::detail::swizzle128_wide;
  std::set<uint32_t> offsets;
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < 64; col += 1) {
      const uint32_t offset = swizzle128<2>(row, col);
      EXPECT_EQ(offset / 128, static_cast<uint32_t>(row));
      offsets.insert(offset);
      // The same element through the 8-bit view of the same bytes.
      EXPECT_EQ(swizzle128<1>(row, 2 * col), offset);
    }
  EXPECT_EQ(offsets.size(), 64u * 64u);
  // The 8 rows of one 16-byte column segment land in 8 distinct 16-byte bank groups.
  for (int col = 0; col < 64; col += 8) {
    std::set<uint32_t> groups;
    for (int row = 0; row < 8; ++row) groups.insert((swizzle128<2>(row, col) % 128) / 16);
    EXPECT_EQ(groups.size(), 8u);
  }
  // A wide row is consecutive 128-byte groups swizzled alike.
  for (int row = 0; row < 16; ++row)
    for (int col = 0; col < 256; ++col)
      EXPECT_EQ(swizzle128_wide<2>(row, col, 256),
                row * 512 + (col / 64) * 128 + swizzle128<2>(row, col % 64) - row * 128);
}

}  // namespace
