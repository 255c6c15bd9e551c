// The schedule of a serving call's tiles, host and device: what the plan
// writes (kernels/serving/plan.cu on the device, plan_sequences_on_host for
// the CPU) and the kernels read. A sequence's tiles are contiguous in the
// launch's linear order, sequence after sequence; within one they follow a
// dense call's order (row block fastest, then KV split, then head group).
// A tile finds its sequence by binary search over the sequences' first
// tiles, so the launch (sized by the host's bound on the tile count) needs
// no host synchronization; tiles past the count return at once.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"

namespace ffpa::detail {

// The plan's verdict and totals, at the start of its buffer; the sequences'
// first tiles follow, int32 [B + 1].
struct SequenceScheduleHeader {
  int32_t fault = 0;     // SequenceFault of the first sequence found wrong (none: the schedule holds)
  int32_t sequence = 0;  // which sequence
  int64_t value = 0;     // SequenceCheck's value and index
  int64_t index = 0;
  int32_t tiles = 0;     // tiles of the whole batch
  int32_t reserved = 0;
};

// How the kernels cut each sequence into tiles: the family's tile shape and
// packing, and the KV split (0 blocks per split: none). key_blocks: a tile is
// a block of block_n keys of one KV head instead (the backward's key-stationary
// kernels: key block fastest, then KV head).
struct SequenceTiling {
  int block_m = 64, block_n = 128, heads_per_tile = 1;
  int split_blocks = 0;
  bool key_blocks = false;
};

FFPA_HOST_DEVICE int64_t sequence_schedule_bytes(int64_t batch) {
  return static_cast<int64_t>(sizeof(SequenceScheduleHeader)) + (batch + 1) * static_cast<int64_t>(sizeof(int32_t));
}

// The tiles of one sequence (its rows, splits and head groups).
FFPA_HOST_DEVICE int64_t sequence_tiles(const AttentionProblem& p, const Sequence& seq, const SequenceTiling& tiling) {
  if (tiling.key_blocks) return (seq.seq_kv + tiling.block_n - 1) / tiling.block_n * p.heads_kv;
  const int rows = tiling.block_m / tiling.heads_per_tile;
  const int64_t row_blocks = (seq.seq_q + rows - 1) / rows;
  int64_t splits = 1;
  if (tiling.split_blocks > 0) {
    const int64_t kv_blocks = (seq.seq_kv + tiling.block_n - 1) / tiling.block_n;
    splits = kv_blocks > 0 ? (kv_blocks + tiling.split_blocks - 1) / tiling.split_blocks : 1;
  }
  return row_blocks * splits * (p.heads_q / tiling.heads_per_tile);
}

// The sequence holding linear tile `tile`: the last b with first_tile[b] <= tile.
FFPA_HOST_DEVICE int sequence_of_tile(const int32_t* first_tile, int batch, int tile) {
  int lo = 0, hi = batch;  // first_tile[lo] <= tile < first_tile[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (first_tile[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace ffpa::detail
