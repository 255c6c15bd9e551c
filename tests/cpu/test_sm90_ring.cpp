// The sm90_wgmma kernel's ring order (kernels/sm90_wgmma/ring.hpp) against a
// model of its producer and consumers, for V blocks of 4 positions (the bf16
// family) and of 2 (an 8-bit family's V^T: docs/kernels/sm90_fp8_plan.md):
// the positions the consumers compute are the ones the producer fills, each
// exactly once, each consumer takes them in ascending order, and consecutive
// positions of one consumer are at most k_stages + 2 apart, which is what lets
// the kernel's full barriers (16 of them, more than k_stages + 2 + 4 ring
// stages) never be waited on two phases ahead. The sm90 backward kernels use the
// same order with a block's score part as the K block (up to 16 stages: K and
// V halves of D 1024 in 8 KB stages) and its product part as the V block (2, 4
// or 8 positions): their traits assert 32 full barriers >= score + product +
// ring stages, above the bound checked here.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/sm90_wgmma/ring.hpp"

namespace {

using ffpa::detail::sm90_wgmma::ring_k_position;
using ffpa::detail::sm90_wgmma::ring_v_part_position;

// (kind 'K' or 'V', block, part): part is the K stage, or 2 * (the consumer's part) + consumer.
using Item = std::tuple<char, int, int>;

// The producer's order: K_0, then K_j, V_{j-1} for j >= 1, then V_{n-1}.
std::map<Item, int> producer_positions(int n_blocks, int k_stages, int v_stages) {
  std::map<Item, int> positions;
  int next = 0;
  auto load_k = [&](int j) {
    for (int s = 0; s < k_stages; ++s) positions[{'K', j, s}] = next++;
  };
  auto load_v = [&](int j) {
    for (int part = 0; part < v_stages; ++part) positions[{'V', j, part}] = next++;
  };
  if (n_blocks > 0) {
    load_k(0);
    for (int j = 1; j < n_blocks; ++j) {
      load_k(j);
      load_v(j - 1);
    }
    load_v(n_blocks - 1);
  }
  return positions;
}

// The positions consumer w waits for, in the order of the kernel's loop: S of
// its block j, then its part of V_{j-1} (the other's block), then of V_j.
std::vector<int> consumer_positions(int n_blocks, int k_stages, int v_stages, int w) {
  std::vector<int> order;
  auto v_parts = [&](int j) {
    for (int part = 0; part < v_stages / 2; ++part)
      order.push_back(ring_v_part_position(j, n_blocks, k_stages, part, w, v_stages));
  };
  for (int j = w;; j += 2) {
    const bool own = j < n_blocks;
    if (own)
      for (int s = 0; s < k_stages; ++s) order.push_back(ring_k_position(j, k_stages, v_stages) + s);
    if (j >= 1 && j - 1 < n_blocks) v_parts(j - 1);
    if (!own) break;
    v_parts(j);
  }
  return order;
}

void check_ring(int v_stages, int k_stages, int n_blocks) {
  SCOPED_TRACE("v_stages " + std::to_string(v_stages) + ", k_stages " + std::to_string(k_stages) + ", n_blocks " +
               std::to_string(n_blocks));
  const std::map<Item, int> produced = producer_positions(n_blocks, k_stages, v_stages);
  for (int j = 0; j < n_blocks; ++j) {
    for (int s = 0; s < k_stages; ++s) EXPECT_EQ(ring_k_position(j, k_stages, v_stages) + s, produced.at({'K', j, s}));
    for (int part = 0; part < v_stages; ++part)
      EXPECT_EQ(ring_v_part_position(j, n_blocks, k_stages, part / 2, part % 2, v_stages), produced.at({'V', j, part}));
  }
  std::vector<int> taken(produced.size(), 0);
  for (int w = 0; w < 2; ++w) {
    int previous = -1;
    for (int position : consumer_positions(n_blocks, k_stages, v_stages, w)) {
      ASSERT_GE(position, 0);
      ASSERT_LT(position, static_cast<int>(taken.size()));
      ++taken[position];
      EXPECT_GT(position, previous) << "consumer " << w << " out of order";
      EXPECT_LE(position - previous, k_stages + 2) << "consumer " << w << " jumps too far";
      previous = position;
    }
  }
  for (size_t p = 0; p < taken.size(); ++p) EXPECT_EQ(taken[p], 1) << "position " << p;
}

TEST(Sm90Ring, ConsumersTakeEveryProducedPositionOnceInOrderAndClose) {
  for (int v_stages : {8, 4, 2}) {
    for (int k_stages = 1; k_stages <= 16; ++k_stages) {
      for (int n_blocks = 0; n_blocks <= 40; ++n_blocks) check_ring(v_stages, k_stages, n_blocks);
    }
  }
}

}  // namespace
