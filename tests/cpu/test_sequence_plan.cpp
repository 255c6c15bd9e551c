// The serving plan on the host (kernels/serving/plan.hpp) and the tiles the
// kernels read from it (tile_schedule.hpp: sequence_tile_coordinates): every
// tile of every sequence exactly once, within the host's bound (max_tiles),
// each with its sequence's lengths and the KV blocks its rows attend (against
// the reference's rule); the first faulty sequence named; the tiling recorded;
// a mixed batch's two passes (PassRows) taking every sequence's rows once.
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "common/attention_problem.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "ffpa/ffpa.hpp"
#include "host/validate.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/serving/plan.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa {
namespace {

using detail::AttentionProblem;
using detail::SequenceTiling;
using detail::TileCoordinates;
using detail::TileSequence;
using testing::KeyForm;
using testing::ServingCase;

std::vector<int64_t> draw(std::mt19937_64& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int64_t> v(count);
  for (int64_t& n : v) n = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  return v;
}

TEST(SequencePlan, EveryTileOnceWithinTheBoundAndTheAttendedKeys) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    ServingCase c;
    c.seed = static_cast<uint64_t>(trial + 1);
    c.heads_kv = 1 + static_cast<int64_t>(rng() % 2);
    c.heads_q = c.heads_kv << (rng() % 4);
    c.packed_q = rng() % 3 != 0;
    c.keys = static_cast<KeyForm>(rng() % 3);
    c.page_size = 1 + static_cast<int64_t>(rng() % 20);
    const int64_t count = 1 + static_cast<int64_t>(rng() % 6);
    c.seq_q = c.packed_q ? draw(rng, count, 0, 200) : std::vector<int64_t>(count, 1 + static_cast<int64_t>(rng() % 3));
    c.seq_kv = draw(rng, count, 0, 400);
    c.causal = static_cast<Causal>(rng() % 3);
    if (rng() % 3 == 0) c.window_left = static_cast<int64_t>(rng() % 100);
    if (rng() % 4 == 0) c.window_right = static_cast<int64_t>(rng() % 50);
    testing::ServingInputs in = testing::make_serving_inputs(c);
    AttentionProblem p;
    ASSERT_TRUE(detail::validate_forward(in.params, &p).ok());
    SequenceTiling tiling;
    tiling.block_m = 64;
    tiling.block_n = 128;
    tiling.heads_per_tile = detail::packed_heads(p.group_size(), p.seq_q, tiling.block_m);
    // The split on for decode-like batches, with few slots so that they split.
    const bool split = detail::serving::may_split(p, tiling.block_m, tiling.heads_per_tile) && rng() % 2;
    tiling.split_slots = split ? 2 + static_cast<int>(rng() % 30) : 0;
    SCOPED_TRACE(c.describe() + " split_slots " + std::to_string(tiling.split_slots));
    std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(p)));
    detail::serving::plan_on_host(p, tiling, plan.data());
    const auto* header = detail::serving::plan_header(plan.data());
    ASSERT_EQ(header->fault, 0);
    ASSERT_TRUE(header->tiling == tiling);
    const int tiles = detail::planned_tiles(*header, tiling);
    ASSERT_LE(tiles, detail::serving::max_tiles(p, tiling));
    std::set<std::tuple<int, int, int, int>> seen;  // sequence, head, q0, split
    for (int t = 0; t < tiles; ++t) {
      TileSequence seq;
      const TileCoordinates tile =
          detail::sequence_tile_coordinates(p, plan.data(), t, tiling, &seq);
      ASSERT_TRUE(seen.insert({tile.batch, tile.head, tile.q0, tile.kv_split}).second) << "tile " << t << " twice";
      ASSERT_EQ(seq.seq_q, c.seq_q[tile.batch]);
      ASSERT_EQ(seq.seq_kv, c.seq_kv[tile.batch]);
      ASSERT_LT(tile.q0, seq.seq_q);
      // The attended keys of the tile's rows lie inside its KV blocks (all of
      // them when unsplit), by the reference's rule.
      const int rows = tiling.block_m / tiling.heads_per_tile;
      int64_t first = seq.seq_kv, end = 0;
      for (int i = tile.q0; i < std::min(tile.q0 + rows, seq.seq_q); ++i) {
        const detail::KeyRange keys = detail::attended_keys(p, i, seq.seq_q, seq.seq_kv);
        if (keys.end > keys.first) first = std::min(first, keys.first), end = std::max(end, keys.end);
      }
      if (header->split_blocks == 0 && end > first) {
        EXPECT_LE(tile.kv_first * 128, first);
        EXPECT_GE((tile.kv_first + tile.kv_blocks) * 128, end);
      }
    }
    // Every (sequence, head group, row block, split) the lengths call for,
    // and the partial rows within the bound the workspace is sized by.
    int64_t expected = 0;
    for (int64_t b = 0; b < c.batch(); ++b)
      expected += detail::sequence_tiles(p, detail::sequence_at(p.sequences, b), tiling, header->split_blocks);
    EXPECT_EQ(tiles, expected);
    const detail::PlanArrays arrays = detail::plan_arrays(plan.data(), p.batch);
    if (header->split_blocks > 0) {
      EXPECT_LE(arrays.first_partial[p.batch], detail::serving::max_partial_rows(p, tiling));
      for (int64_t b = 0; b < c.batch(); ++b)
        EXPECT_LE(detail::sequence_splits(detail::sequence_at(p.sequences, b), 128, header->split_blocks),
                  detail::kMaxKvSplits);
    }
    EXPECT_EQ(arrays.first_row[p.batch], std::accumulate(c.seq_q.begin(), c.seq_q.end(), int64_t{0}));
  }
}

// A mixed batch's two passes (sm90_wgmma's: the sequences of at most
// 64 / heads rows GQA-packed for one row and split, the rest at the batch's
// packing): every row of every head of every sequence in exactly one tile of
// one pass (its first split), each pass's tiles, partial rows and combine
// rows within the pass's bounds, and one verdict.
TEST(SequencePlan, TwoPassesTakeEverySequenceOnce) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    ServingCase c;
    c.seed = static_cast<uint64_t>(trial + 100);
    c.heads_kv = 1 + static_cast<int64_t>(rng() % 2);
    c.heads_q = c.heads_kv << (2 + rng() % 2);  // GQA 4 or 8
    c.packed_q = rng() % 4 != 0;
    c.keys = static_cast<KeyForm>(rng() % 3);
    c.page_size = 1 + static_cast<int64_t>(rng() % 20);
    const int64_t count = 2 + static_cast<int64_t>(rng() % 9);
    for (int64_t b = 0; b < count; ++b) {  // decode, speculative and prefill rows, and empty sequences
      const int kind = static_cast<int>(rng() % 4);
      c.seq_q.push_back(kind == 0 ? 0 : kind == 1 ? 1 : kind == 2 ? 2 + static_cast<int64_t>(rng() % 15)
                                                                  : 17 + static_cast<int64_t>(rng() % 200));
    }
    if (!c.packed_q) c.seq_q.assign(static_cast<size_t>(count), c.seq_q[0]);  // batched queries: one Nq
    c.seq_kv = draw(rng, count, 0, 700);
    c.causal = static_cast<Causal>(rng() % 3);
    testing::ServingInputs in = testing::make_serving_inputs(c);
    AttentionProblem p;
    ASSERT_TRUE(detail::validate_forward(in.params, &p).ok());
    const int short_heads = detail::packed_heads(p.group_size(), 1, 64);
    const int64_t short_rows = 64 / short_heads;
    SequenceTiling tilings[2];
    tilings[0].heads_per_tile = short_heads;
    tilings[0].split_slots = 2 + static_cast<int>(rng() % 60);
    tilings[1].heads_per_tile = detail::packed_heads(p.group_size(), p.seq_q, 64);
    if (detail::serving::may_split(p, 64, tilings[1].heads_per_tile) && rng() % 2)
      tilings[1].split_slots = 2 + static_cast<int>(rng() % 60);
    const detail::PassRows passes[2] = {{0, short_rows}, {short_rows + 1, INT64_MAX}};
    SCOPED_TRACE(c.describe() + " short heads " + std::to_string(short_heads));
    std::map<std::tuple<int, int, int>, int> covered;  // (sequence, head, row): tiles of its first split
    for (int pass = 0; pass < 2; ++pass) {
      SCOPED_TRACE("pass " + std::to_string(pass));
      const SequenceTiling& tiling = tilings[pass];
      std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(p)));
      detail::serving::plan_on_host(p, tiling, plan.data(), passes[pass]);
      const auto* header = detail::serving::plan_header(plan.data());
      ASSERT_EQ(header->fault, 0);
      const int tiles = detail::planned_tiles(*header, tiling);
      ASSERT_LE(tiles, detail::serving::max_tiles(p, tiling, passes[pass]));
      for (int t = 0; t < tiles; ++t) {
        TileSequence seq;
        const TileCoordinates tile = detail::sequence_tile_coordinates(p, plan.data(), t, tiling, &seq);
        ASSERT_TRUE(passes[pass].in_pass(detail::sequence_at(p.sequences, tile.batch))) << "tile " << t;
        if (tile.kv_split != 0) continue;
        for (int r = 0; r < 64; ++r)
          if (tile.query_row(r) < seq.seq_q) ++covered[{tile.batch, tile.row_head(r), tile.query_row(r)}];
      }
      const detail::PlanArrays arrays = detail::plan_arrays(plan.data(), p.batch);
      int64_t rows = 0;
      for (int64_t b = 0; b < c.batch(); ++b) rows += passes[pass].in_pass(detail::sequence_at(p.sequences, b)) ? c.seq_q[b] : 0;
      EXPECT_EQ(arrays.first_row[p.batch], rows);
      EXPECT_LE(rows, detail::serving::max_query_rows(p, passes[pass]));
      if (header->split_blocks > 0)
        EXPECT_LE(arrays.first_partial[p.batch], detail::serving::max_partial_rows(p, tiling, passes[pass]));
      else
        EXPECT_EQ(arrays.first_partial[p.batch], 0);
    }
    int64_t expected = 0;
    for (int64_t b = 0; b < c.batch(); ++b) expected += c.seq_q[b] * c.heads_q;
    EXPECT_EQ(static_cast<int64_t>(covered.size()), expected);
    for (const auto& [row, count] : covered) ASSERT_EQ(count, 1) << "sequence " << std::get<0>(row) << " head "
                                                              << std::get<1>(row) << " row " << std::get<2>(row);
  }
}

// A fault in a sequence neither pass runs is still each pass's verdict.
TEST(SequencePlan, EveryPassChecksEverySequence) {
  ServingCase c;
  c.keys = KeyForm::paged;
  c.page_size = 4;
  c.heads_q = 8, c.heads_kv = 1;
  c.seq_q = {1, 30, 1};
  c.seq_kv = {9, 40, 7};
  testing::ServingInputs in = testing::make_serving_inputs(c);
  static_cast<int32_t*>(in.table.tensor.data)[in.table.tensor.stride[0] * 1 + 2] = 1 << 20;  // sequence 1, page 2
  AttentionProblem p;
  ASSERT_TRUE(detail::validate_forward(in.params, &p).ok());
  for (const detail::PassRows pass : {detail::PassRows{0, 8}, detail::PassRows{9, INT64_MAX}}) {
    std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(p)));
    detail::serving::plan_on_host(p, SequenceTiling{}, plan.data(), pass);
    const auto* header = detail::serving::plan_header(plan.data());
    EXPECT_EQ(header->fault, static_cast<int32_t>(detail::SequenceFault::block_table));
    EXPECT_EQ(header->sequence, 1);
    EXPECT_EQ(detail::planned_tiles(*header, SequenceTiling{}), 0);
  }
}

TEST(SequencePlan, NamesTheFirstFaultySequenceAndRunsNoTile) {
  ServingCase c;
  c.keys = KeyForm::paged;
  c.page_size = 4;
  c.seq_q = {2, 3, 1};
  c.seq_kv = {9, 10, 7};
  testing::ServingInputs in = testing::make_serving_inputs(c);
  static_cast<int32_t*>(in.table.tensor.data)[in.table.tensor.stride[0] * 2 + 1] = -3;  // sequence 2, page 1
  static_cast<int32_t*>(in.used.tensor.data)[1] = 1000;                                // sequence 1: too many keys
  AttentionProblem p;
  ASSERT_TRUE(detail::validate_forward(in.params, &p).ok());
  std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(p)));
  detail::serving::plan_on_host(p, SequenceTiling{}, plan.data());
  const auto* header = detail::serving::plan_header(plan.data());
  EXPECT_EQ(header->fault, static_cast<int32_t>(detail::SequenceFault::seqused_k));
  EXPECT_EQ(header->sequence, 1);
  EXPECT_EQ(header->value, 1000);
  EXPECT_EQ(detail::planned_tiles(*header, SequenceTiling{}), 0);
}

TEST(SequencePlan, AnotherTilingRunsNoTile) {
  ServingCase c;
  c.seq_q = {70};
  c.seq_kv = {70};
  testing::ServingInputs in = testing::make_serving_inputs(c);
  AttentionProblem p;
  ASSERT_TRUE(detail::validate_forward(in.params, &p).ok());
  std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(p)));
  SequenceTiling made;
  made.block_m = 64;
  detail::serving::plan_on_host(p, made, plan.data());
  SequenceTiling other = made;
  other.block_m = 128;
  EXPECT_GT(detail::planned_tiles(*detail::serving::plan_header(plan.data()), made), 0);
  EXPECT_EQ(detail::planned_tiles(*detail::serving::plan_header(plan.data()), other), 0);
}

TEST(SequencePlan, PublicEntryPointsOnHostTensors) {
  ServingCase c;
  c.keys = KeyForm::paged;
  c.page_size = 4;
  c.seq_q = {2, 3};
  c.seq_kv = {9, 10};
  testing::ServingInputs in = testing::make_serving_inputs(c);
  size_t bytes = 99;
  ASSERT_TRUE(sequence_plan_size(in.params, &bytes).ok());
  EXPECT_EQ(bytes, 0u);  // the CPU reference plans nothing
  EXPECT_TRUE(plan_sequences(in.params, nullptr, 0).ok());
  EXPECT_TRUE(check_sequences(in.params).ok());
  static_cast<int32_t*>(in.table.tensor.data)[0] = 77;
  const Status status = check_sequences(in.params);
  EXPECT_EQ(status.code, StatusCode::invalid_block_table) << status.message;
  EXPECT_EQ(forward(in.params).code, StatusCode::invalid_block_table);
  ForwardParams dense = in.params;
  dense.sequences = nullptr;
  EXPECT_EQ(check_sequences(dense).code, StatusCode::invalid_option);
  EXPECT_EQ(sequence_plan_size(dense, &bytes).code, StatusCode::invalid_option);
  int plan_word = 0;
  dense.sequence_plan = &plan_word;
  EXPECT_EQ(forward(dense).code, StatusCode::invalid_option);
}

}  // namespace
}  // namespace ffpa
