// The schedule of a serving call's tiles, host and device: what the plan
// writes (kernels/serving/plan.cu on the device, plan_on_host for the CPU)
// and the kernels and the split-KV combine read. A sequence's tiles are
// contiguous in the launch's linear order, sequence after sequence; within
// one they follow a dense call's order (row block fastest, then KV split,
// then head group). A tile finds its sequence by binary search over the
// sequences' first tiles, so the launch (sized by the host's bound on the
// tile count) needs no host synchronization; tiles past the count return at
// once. With the KV split on (decode: one row block a sequence), the plan
// also chooses the keys per split from the batch's lengths, and places each
// sequence's partial rows. A call may run its sequences in passes of their
// own tiling (PassRows): each pass its own plan and launch.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"
#include "kernels/common/split_kv.hpp"

namespace ffpa::detail {

// How the kernels cut each sequence into tiles: the family's tile shape and
// GQA packing, and (split_slots > 0) the KV split on for a kernel that fills
// split_slots CTA slots (SMs / CTAs a tile): the plan chooses its blocks per
// split. key_blocks: a tile is a block of block_n keys of one KV head instead
// (the backward's key-stationary kernels: key block fastest, then KV head).
struct SequenceTiling {
  int block_m = 64, block_n = 128, heads_per_tile = 1;
  int split_slots = 0;
  bool key_blocks = false;
};

FFPA_HOST_DEVICE bool operator==(const SequenceTiling& a, const SequenceTiling& b) {
  return a.block_m == b.block_m && a.block_n == b.block_n && a.heads_per_tile == b.heads_per_tile &&
         a.split_slots == b.split_slots && a.key_blocks == b.key_blocks;
}

// The sequences one pass of a serving call runs: those of min_q_rows to
// max_q_rows query rows (a batch that mixes decode rows with a prefill chunk
// runs its short sequences GQA-packed and split, the rest unpacked: two
// launches of one family). A pass's plan gives tiles, partial rows and
// combine rows to its sequences only; it still checks every sequence's
// lengths and pages, so the plans of a call's passes give one verdict.
struct PassRows {
  int64_t min_q_rows = 0, max_q_rows = INT64_MAX;  // the default: every sequence
  FFPA_HOST_DEVICE bool in_pass(const Sequence& seq) const {
    return seq.seq_q >= min_q_rows && seq.seq_q <= max_q_rows;
  }
};

// The plan's verdict and totals, at the start of its buffer (its arrays
// follow: PlanArrays). A kernel runs a plan's tiles only when the plan was cut
// by its own tiling (a plan made for another kernel is a misuse: the kernel
// writes nothing).
struct SequenceScheduleHeader {
  int32_t fault = 0;     // SequenceFault of the first sequence found wrong (none: the schedule holds)
  int32_t sequence = 0;  // which sequence
  int64_t value = 0;     // SequenceCheck's value and index
  int64_t index = 0;
  int32_t tiles = 0;         // tiles of the whole batch
  int32_t split_blocks = 0;  // KV blocks per split (0: unsplit, the kernels write O and LSE)
  SequenceTiling tiling;     // the tiling the plan cut by
};

// The plan's arrays after its header, int32 [B + 1] each, prefix sums over
// the sequences: their first tiles, first pages (of the flat list of pages
// the batch reads), first partial rows (split: a sequence's partial rows, in
// (split, head, row) order) and first query rows (of the batch's rows in
// sequence order: the combine's rows).
struct PlanArrays {
  int32_t *first_tile, *first_page, *first_partial, *first_row;
};

FFPA_HOST_DEVICE PlanArrays plan_arrays(const void* plan, int64_t batch) {
  int32_t* const base =
      reinterpret_cast<int32_t*>(const_cast<SequenceScheduleHeader*>(static_cast<const SequenceScheduleHeader*>(plan)) + 1);
  return {base, base + (batch + 1), base + 2 * (batch + 1), base + 3 * (batch + 1)};
}

FFPA_HOST_DEVICE int64_t plan_bytes_for(int64_t batch) {
  return static_cast<int64_t>(sizeof(SequenceScheduleHeader)) + 4 * (batch + 1) * static_cast<int64_t>(sizeof(int32_t));
}

// The tiles a kernel of tiling `tiling` runs from a plan: its count, or 0
// (a fault, or a plan cut by another tiling).
FFPA_HOST_DEVICE int planned_tiles(const SequenceScheduleHeader& header, const SequenceTiling& tiling) {
  return header.fault == 0 && header.tiling == tiling ? header.tiles : 0;
}

// The KV splits of kv_blocks blocks in splits of split_blocks (1 unsplit, or
// with no key). Any integer type: the plan kernel counts in 32 bits.
template <typename Int>
FFPA_HOST_DEVICE Int kv_splits_of_blocks(Int kv_blocks, Int split_blocks) {
  if (!(split_blocks > 0 && kv_blocks > 0)) return 1;  // (no "<= 0" on an unsigned Int)
  return (kv_blocks + split_blocks - 1) / split_blocks;
}

// A sequence's KV splits of split_blocks blocks (1 unsplit, or with no key).
FFPA_HOST_DEVICE int64_t sequence_splits(const Sequence& seq, int block_n, int64_t split_blocks) {
  return kv_splits_of_blocks<int64_t>((seq.seq_kv + block_n - 1) / block_n, split_blocks);
}

// The tiles of one sequence (its row blocks, splits and head groups).
FFPA_HOST_DEVICE int64_t sequence_tiles(const AttentionProblem& p, const Sequence& seq, const SequenceTiling& tiling,
                                        int64_t split_blocks) {
  if (tiling.key_blocks) return (seq.seq_kv + tiling.block_n - 1) / tiling.block_n * p.heads_kv;
  const int rows = tiling.block_m / tiling.heads_per_tile;
  const int64_t row_blocks = (seq.seq_q + rows - 1) / rows;
  return row_blocks * sequence_splits(seq, tiling.block_n, split_blocks) * (p.heads_q / tiling.heads_per_tile);
}

// The last index b < count with first[b] <= value (first non-decreasing,
// first[0] <= value < first[count]): the sequence holding tile `value` (or
// query row, of first rows), skipping sequences with none.
FFPA_HOST_DEVICE int sequence_holding(const int32_t* first, int count, int value) {
  int lo = 0, hi = count;  // first[lo] <= value < first[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= value) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Candidate c of a sequence batch's KV blocks per split: 0 (unsplit), then
// 1, 2, 3, 4, 6, 8, 12, 16, ...: the powers of two and the halves between
// them, in closed form (the plan kernel evaluates them all at once; a chain
// of 64-bit divisions in one thread cost it ~90 us on an H200).
inline constexpr int kSplitCandidates = 40;  // up to 3 x 2^18 blocks a split
FFPA_HOST_DEVICE int64_t split_candidate(int c) {
  if (c < 4) return c;
  return (c & 1) ? int64_t{3} << (c / 2 - 1) : int64_t{1} << (c / 2);
}

// The split-KV rule's cost of candidate c for a sequence batch (the dense
// rule's time model, split_kv.hpp's split_cost, over the batch's own
// lengths): the waves of its `tiles` times the work of a split; c = 0 is the
// unsplit tiles. Negative where c may not be taken: its splits are not
// shorter than the longest sequence (max_blocks), or it has more than
// max_tiles tiles or more than kMaxKvSplits splits a sequence (the
// combine's). Each candidate is evaluated alone, so a device plan can
// evaluate them all at once.
FFPA_HOST_DEVICE double split_candidate_cost(int c, int64_t tiles, int64_t max_blocks, int block_n, int slots,
                                             int64_t max_tiles) {
  if (c == 0) return split_cost(tiles, 1, max_blocks * block_n, slots);
  const int64_t s = split_candidate(c);
  if (s >= max_blocks || tiles > max_tiles || (max_blocks + s - 1) / s > kMaxKvSplits) return -1.0;
  return split_cost(tiles, 1, s * block_n, slots);
}

// Whether the rule splits at all: a longest sequence of more than one block,
// and unsplit tiles that do not fill the slots alone (the dense rule).
FFPA_HOST_DEVICE bool may_split_batch(int64_t unsplit_tiles, int64_t max_blocks, int slots) {
  return max_blocks > 1 && slots > 0 && unsplit_tiles < slots;
}

// The rule's choice from the candidates' costs (cost_of(c):
// split_candidate_cost): the candidate blocks per split with the lowest
// cost, the lowest candidate on a tie; 0 (unsplit) when no split beats the
// unsplit tiles.
#ifdef __CUDACC__
#pragma nv_exec_check_disable  // cost_of is a host lambda on the host, a device one on the device
#endif
template <class CostOf>
FFPA_HOST_DEVICE int64_t cheapest_split_blocks(CostOf&& cost_of) {
  double best_cost = cost_of(0);
  int64_t best = 0;
  for (int c = 1; c < kSplitCandidates; ++c) {
    const double cost = cost_of(c);
    if (cost >= 0.0 && cost < best_cost) best_cost = cost, best = split_candidate(c);
  }
  return best;
}

// The split-KV rule for a sequence batch on the host: `tiles_of(c)`, the
// batch's tiles with split_candidate(c) blocks a split; max_blocks: its
// longest sequence's blocks; at most `max_tiles` tiles. 0: unsplit.
template <class TilesOf>
int64_t choose_split_blocks(TilesOf&& tiles_of, int64_t max_blocks, int block_n, int slots, int64_t max_tiles) {
  const int64_t unsplit_tiles = tiles_of(0);
  if (!may_split_batch(unsplit_tiles, max_blocks, slots)) return 0;
  return cheapest_split_blocks([&](int c) {
    if (c > 0 && split_candidate(c) >= max_blocks) return -1.0;  // (not counted: tiles_of walks the batch)
    return split_candidate_cost(c, c == 0 ? unsplit_tiles : tiles_of(c), max_blocks, block_n, slots, max_tiles);
  });
}

}  // namespace ffpa::detail
