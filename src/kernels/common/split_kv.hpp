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

// Below this many keys a split's fixed costs (loading Q, writing and combining
// a partial row) outweigh its share of the K and V bytes (plan; to be checked
// against measured times of several counts).
constexpr int64_t kMinKeysPerSplit = 256;
constexpr int kMaxKvSplits = 128;

// How full the CTA slots are over the waves `ctas` CTAs take: ctas / (waves x slots).
FFPA_HOST_DEVICE double wave_efficiency(int64_t ctas, int64_t slots) {
  const int64_t waves = (ctas + slots - 1) / slots;
  return static_cast<double>(ctas) / static_cast<double>(waves * slots);
}

// The splits of seq_kv keys for `units` independent work units (batch x KV
// head x row group) on `slots` CTA slots (SMs x CTAs per SM): among the split
// counts whose splits are whole blocks of block_n keys, at least
// kMinKeysPerSplit of them (one split is always allowed) and at most
// kMaxKvSplits, the one whose CTAs fill their waves best; the fewest splits on
// a tie. Units that fill the slots alone are not split.
inline KvSplits choose_kv_splits(int64_t units, int64_t seq_kv, int64_t slots, int block_n) {
  KvSplits best{1, seq_kv};
  if (units <= 0 || seq_kv <= 0 || slots <= 0 || units >= slots) return best;
  double best_efficiency = wave_efficiency(units, slots);
  for (int wanted = 2; wanted <= kMaxKvSplits; ++wanted) {
    const int64_t per_split = (seq_kv + wanted - 1) / wanted;
    const int64_t keys = (per_split + block_n - 1) / block_n * block_n;
    if (keys < kMinKeysPerSplit) break;  // more splits only shorten them
    const int count = static_cast<int>((seq_kv + keys - 1) / keys);
    const double efficiency = wave_efficiency(units * count, slots);
    if (count > best.count && efficiency > best_efficiency) {
      best = {count, keys};
      best_efficiency = efficiency;
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
// row: exp2(max_s - max) / sum; 0 for a row with no attended key (O = 0, the
// spec's rule, with LSE = log_sum_exp(merged) = -inf).
FFPA_HOST_DEVICE float split_weight(RowSoftmaxState split, RowSoftmaxState merged) {
  return merged.sum > 0.0f ? rescale_factor(split.max_log2, merged.max_log2) / merged.sum : 0.0f;
}

}  // namespace ffpa::detail
