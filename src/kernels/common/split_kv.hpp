// Split-KV decode's schedule, host and device (issue 12; docs/kernels/split_kv_plan.md):
// how many KV splits a call's work units get, and how many query heads of a
// GQA group a decode tile packs. The splits write partial rows as their
// softmax state (max, sum) and unnormalized O, which softmax_state.hpp's merge
// combines (an fp32 LSE would lose ~1e-3 of O at score ranges of 1e4: the
// test shows it). Tested on the CPU
// (tests/cpu/test_split_kv.cpp).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"
#include "kernels/common/softmax_state.hpp"

namespace ffpa::detail {

struct KvSplits {
  int count = 1;               // splits of each work unit's keys
  int64_t keys_per_split = 0;  // whole KV blocks; the last split holds the rest (at least one key)
};

// A split holds at least one KV block, and a call has at most 128 splits.
constexpr int64_t kMinKeysPerSplit = 128;
constexpr int kMaxKvSplits = 128;

// The rule's time model: the waves a count's CTAs take on the slots, times
// one CTA's work, its keys plus a fixed cost per split (loading Q, filling
// the pipeline, writing and combining partial rows) worth kSplitCostKeys
// keys. Fitted on the H200 (bench/kv_split_sweep.py, docs/kernels/
// split_kv_plan.md): on the 14 shapes measured (decode, spec-decode, Nq 64,
// few-head prefill; D 256 to 1024) the pick ran within 3 % of the fastest
// count (single runs spread 3-5 %) for any cost from 256 to 640 keys; the
// wave-filling rule before it split B1 H8 Nq512 Nkv16384 into 43 (0.50 ms)
// where 2 ran 0.27 ms.
constexpr int64_t kSplitCostKeys = 384;

// How many waves `ctas` CTAs take on `slots` CTA slots.
FFPA_HOST_DEVICE int64_t waves(int64_t ctas, int64_t slots) { return (ctas + slots - 1) / slots; }

// The model's cost of `units` work units whose keys come in splits of
// keys_per_split, `count` splits each.
FFPA_HOST_DEVICE double split_cost(int64_t units, int count, int64_t keys_per_split, int64_t slots) {
  return static_cast<double>(waves(units * count, slots)) * static_cast<double>(keys_per_split + kSplitCostKeys);
}

// About `wanted` splits of seq_kv keys in whole blocks of block_n keys: the
// count can come out lower (the last split holds the rest). 1 <= wanted.
inline KvSplits kv_splits_of(int64_t seq_kv, int wanted, int block_n) {
  const int64_t per_split = (seq_kv + wanted - 1) / wanted;
  const int64_t keys = (per_split + block_n - 1) / block_n * block_n;
  return {static_cast<int>((seq_kv + keys - 1) / keys), keys};
}

// The splits of seq_kv keys for `units` independent work units (batch x KV
// head x row group) on `slots` CTA slots (SMs x CTAs per SM): among the
// counts whose splits are whole blocks of block_n keys, at least
// kMinKeysPerSplit of them (one split is always allowed) and at most
// kMaxKvSplits, the one split_cost() rates fastest, the fewest splits on a
// tie. Units that fill the slots alone are not split (measured there: no
// count beat one split by more than the noise).
inline KvSplits choose_kv_splits(int64_t units, int64_t seq_kv, int64_t slots, int block_n) {
  KvSplits best{1, seq_kv};
  if (units <= 0 || seq_kv <= 0 || slots <= 0 || units >= slots) return best;
  double best_cost = split_cost(units, 1, seq_kv, slots);
  for (int wanted = 2; wanted <= kMaxKvSplits; ++wanted) {
    const KvSplits splits = kv_splits_of(seq_kv, wanted, block_n);
    if (splits.keys_per_split < kMinKeysPerSplit) break;  // more splits only shorten them
    const double cost = split_cost(units, splits.count, splits.keys_per_split, slots);
    if (splits.count > best.count && cost < best_cost) {
      best = splits;
      best_cost = cost;
    }
  }
  return best;
}

// GQA packing: how many query heads of a KV head's group one tile of block_m
// rows holds, each with the same query rows, so that each K and V byte is
// read once for all of them (decode with Nq = 1 fills 1 of a tile's 64 rows
// otherwise: 4x the padded tensor work at GQA 4). The heads get block_m /
// heads rows each, at least Nq rounded up to a power of two (the tile's rows
// map to (head, row) by shifts: tile_schedule.hpp), and their count divides
// the group, so that a tile's heads share one KV head. 1 (no packing) for
// Nq > block_m / 2 or an odd group.
FFPA_HOST_DEVICE int packed_heads(int64_t group, int64_t seq_q, int block_m) {
  int heads = 1;
  while (group % (2 * heads) == 0 && (block_m / (2 * heads)) >= seq_q) heads *= 2;
  return heads;
}

// The combine of one output row, host and device: the splits' states (the
// keys' maximum in the log2 domain and the sum relative to it; max = -inf and
// sum = 0 for a split whose keys the row never attends) merged in one pass,
// then each split's unnormalized O row weighted by split_weight and added.
// The order of the splits does not matter up to rounding.
FFPA_HOST_DEVICE RowSoftmaxState merge_split_states(const RowSoftmaxState* states, int64_t stride, int splits) {
  RowSoftmaxState merged;
  for (int s = 0; s < splits; ++s) merged.max_log2 = fmaxf(merged.max_log2, states[s * stride].max_log2);
  for (int s = 0; s < splits; ++s) {
    const RowSoftmaxState split = states[s * stride];
    merged.sum += split.sum * rescale_factor(split.max_log2, merged.max_log2);
  }
  return merged;
}

// What a split's unnormalized O row is multiplied by in the normalized output
// row: exp2(max_s - max) / sum, NaN where a split's sum is NaN (a NaN score
// reached the row). Every split's O row is added, its weight 0 or not: a NaN
// there is a key's NaN V times P, and reaches the row as it does in one tile
// (0 x NaN is NaN).
FFPA_HOST_DEVICE float split_weight(RowSoftmaxState split, RowSoftmaxState merged) {
  return merged.sum == 0.0f ? 0.0f : rescale_factor(split.max_log2, merged.max_log2) / merged.sum;
}

// An output element from its splits' weighted sum: 0 for a row with no
// attended key (the spec's rule, with LSE = log_sum_exp(merged) = -inf),
// whatever its splits' O rows hold.
template <class T>
FFPA_HOST_DEVICE T combined_output(T weighted_sum, RowSoftmaxState merged) {
  return merged.sum == 0.0f ? T(0) : weighted_sum;
}

}  // namespace ffpa::detail
