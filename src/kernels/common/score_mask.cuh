// Masking a tile of scores, the same for every family: keys past Nkv, causal
// (both alignments, through the problem's causal shift) and the user's mask in
// every dtype and broadcast pattern (through its four strides). Scores are in
// the log2 domain; a masked score becomes -inf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/attention_problem.hpp"
#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/tile_schedule.hpp"

namespace ffpa::detail {

// Which keys the rows of a tile may see: key c of tile row r (query row
// tile.query_row(r) = q0 + (r & row_mask)) is visible when c < Nkv and,
// bounded above (causal or a window's right side), c <= first_row_limit +
// (r & row_mask), and, bounded below (a window's left side), c >=
// first_row_start + (r & row_mask): both bounds move with the row.
struct KeyLimits {
  int seq_kv;
  int first_row_limit;  // the last key a tile's first query row may attend
  int first_row_start;  // the first key it may attend
  int row_mask;         // tile row -> query row offset (GQA packing: tile_schedule.hpp)
  bool bounded_above, bounded_below;

  // A dense call without a window (the backward's tiles).
  __device__ __forceinline__ KeyLimits(const AttentionProblem& p, const TileCoordinates& tile)
      : seq_kv(static_cast<int>(p.seq_kv)),
        first_row_limit(tile.q0 + static_cast<int>(p.causal_shift())),
        first_row_start(0),
        row_mask(tile.row_offset_mask()),
        bounded_above(p.causal != Causal::none),
        bounded_below(false) {}

  // A forward tile of a sequence: its lengths, the causal limit in the
  // problem's alignment and the window around the rows' bottom-right
  // positions i + Nkv - Nq (common/attention_problem.hpp: attended_keys).
  __device__ __forceinline__ KeyLimits(const AttentionProblem& p, const TileCoordinates& tile,
                                       const TileSequence& seq)
      : seq_kv(seq.seq_kv), row_mask(tile.row_offset_mask()) {
    const int64_t position = static_cast<int64_t>(tile.q0) + seq.seq_kv - seq.seq_q;  // the first row's
    int64_t limit = seq.seq_kv;  // no bound: past every key
    if (p.causal != Causal::none) limit = p.causal == Causal::bottom_right ? position : tile.q0;
    if (p.window_right >= 0 && position + p.window_right < limit) limit = position + p.window_right;
    const int64_t start = p.window_left >= 0 ? position - p.window_left : 0;
    bounded_above = limit < seq.seq_kv;
    // Some row of the tile starts past key 0 (the window's start moves with the row).
    bounded_below = p.window_left >= 0 && start + row_mask > 0;
    // int: position is above -kMaxSequenceLength and the limit at most Nkv;
    // a start at or below -row_mask bounds nothing (clamped there).
    first_row_limit = static_cast<int>(limit);
    first_row_start = static_cast<int>(start > seq.seq_kv ? seq.seq_kv : (start < -row_mask ? -row_mask : start));
  }

  // Whether a block of keys [kv0, kv0 + block_n) has a key some row of the
  // tile may not see (then the block is masked element by element): the
  // tile's first query row sees the fewest keys at the right end, its last
  // row the fewest at the left.
  __device__ __forceinline__ bool block_needs_masking(int kv0, int block_n) const {
    return kv0 + block_n > seq_kv || (bounded_above && kv0 + block_n - 1 > first_row_limit) ||
           (bounded_below && kv0 < first_row_start + row_mask);
  }
};

// Scores of keys outside the limits to -inf. coords maps this thread's rows
// to the tile (accumulator_layout.cuh); key0 is the key of its first column.
template <class Layout, class Coordinates>
__device__ __forceinline__ void mask_outside_limits(float (&s)[Layout::kElements], const KeyLimits& limits,
                                                    const Coordinates& coords, int key0) {
#pragma unroll
  for (int i = 0; i < Layout::kElements; ++i) {
    const int r = 2 * (i / (4 * Layout::kColBlocks)) + (i / 2) % 2;
    const int c = key0 + Layout::col_offset((i / 4) % Layout::kColBlocks) + i % 2;
    const int offset = coords.row(r) & limits.row_mask;
    if (c >= limits.seq_kv || (limits.bounded_above && c > limits.first_row_limit + offset) ||
        (limits.bounded_below && c < limits.first_row_start + offset))
      s[i] = -INFINITY;
  }
}

// The mask's element offset of the row of tile row r (its head and query row).
__device__ __forceinline__ int64_t mask_row_offset(const AttentionProblem& p, const TileCoordinates& tile, int r) {
  return tile.batch * p.mask_stride[0] + tile.row_head(r) * p.mask_stride[1] + tile.query_row(r) * p.mask_stride[2];
}

// An element of the mask as a log2-domain additive term.
template <typename T>
__device__ __forceinline__ float mask_term(T value) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return value ? 0.0f : -INFINITY;
  } else {
    return static_cast<float>(value) * kLog2e;
  }
}

// Two adjacent mask elements, read as one vector (AttentionProblem::mask_key_pairs).
template <typename T>
struct alignas(2 * sizeof(T)) MaskPair {
  T first, second;
};

// Calls f with a value of the mask's element type (the switch every reader of
// the mask needs).
template <class F>
__device__ __forceinline__ void with_mask_element(MaskKind kind, F&& f) {
  switch (kind) {
    case MaskKind::boolean: f(uint8_t{}); break;
    case MaskKind::additive_f16: f(__half{}); break;
    case MaskKind::additive_bf16: f(__nv_bfloat16{}); break;
    default: f(float{}); break;
  }
}

// Adds the user's mask to this thread's scores (tile rows coords.row(r): query
// row tile.query_row() of head tile.row_head(), keys key0 + 8 * b + e): per
// thread row one row pointer, then column blocks kBlocksInFlight at a time, all their loads issued before the first add
// (fewer than all keeps a register-starved kernel from spilling; the compiler
// barrier stops it from batching more). Where the mask's keys are contiguous
// and pair-aligned and all of the thread's keys are in range (every block but
// a ragged last one), a thread's two keys of a block are one vector load with
// an immediate offset from the row pointer: the element path spends about
// twenty instructions per element on 64-bit index arithmetic and bounds
// checks, which sit on the softmax's critical path (ncu, sm90 d512 key-add:
// 1.6x the instructions of the unmasked kernel). The tile and the coordinates
// are read where used, so that nothing derived from them stays live across
// the loads.
template <class Layout, int kBlocksInFlight = Layout::kColBlocks, bool kPairs = true, class Coordinates>
__device__ __forceinline__ void add_mask(float (&s)[Layout::kElements], const AttentionProblem& p,
                                         const TileCoordinates& tile, const Coordinates& coords, int key0) {
  static_assert(Layout::kColBlocks % kBlocksInFlight == 0);
  const int seq_q = static_cast<int>(p.seq_q), seq_kv = static_cast<int>(p.seq_kv);
  const bool pairs = kPairs && p.mask_key_pairs && key0 + Layout::col_offset(Layout::kColBlocks - 1) + 1 < seq_kv;
  with_mask_element(p.mask_kind, [&](auto element_tag) {
    using T = decltype(element_tag);
#pragma unroll
    for (int r = 0; r < Layout::kRows; ++r) {
      const int i = tile.query_row(coords.row(r));
      if (i >= seq_q) continue;
      const T* const mask_row = opaque(static_cast<const T*>(p.mask) + mask_row_offset(p, tile, coords.row(r)));
      if (pairs) {
        const MaskPair<T>* const row_pairs = reinterpret_cast<const MaskPair<T>*>(mask_row + key0);
#pragma unroll
        for (int b0 = 0; b0 < Layout::kColBlocks; b0 += kBlocksInFlight) {
          MaskPair<T> loaded[kBlocksInFlight];
#pragma unroll
          for (int b = 0; b < kBlocksInFlight; ++b) loaded[b] = row_pairs[Layout::col_offset(b0 + b) / 2];
#pragma unroll
          for (int b = 0; b < kBlocksInFlight; ++b) {
            s[Layout::index(r, b0 + b, 0)] += mask_term(loaded[b].first);
            s[Layout::index(r, b0 + b, 1)] += mask_term(loaded[b].second);
          }
          if constexpr (kBlocksInFlight < Layout::kColBlocks) asm volatile("" ::: "memory");
        }
        continue;
      }
#pragma unroll
      for (int b0 = 0; b0 < Layout::kColBlocks; b0 += kBlocksInFlight) {
#pragma unroll
        for (int b = b0; b < b0 + kBlocksInFlight; ++b)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = key0 + Layout::col_offset(b) + e;
            if (c < seq_kv) s[Layout::index(r, b, e)] += mask_term(mask_row[c * p.mask_stride[3]]);
          }
        if constexpr (kBlocksInFlight < Layout::kColBlocks) asm volatile("" ::: "memory");
      }
    }
  });
}

// --- The mask as the scores' starting value -----------------------------
// A family whose scores come from an accumulating MMA can let the tensor
// cores add the mask: the accumulators of S = Q K^T start at mask / scale
// instead of 0, so scaling S gives scale * q.k + mask as add_mask would, and
// the softmax (which the other warps wait for) does no mask work. The mask
// pairs are loaded a block early, as raw bits into the registers that will
// hold the block's S, and turned into starting values just before its MMA.
// For blocks whose keys are all in range, of a mask read by key pairs; the
// host also asks for a scale whose inverse is finite and non-zero.

// Whether block [kv0, kv0 + block_n)'s mask can be a starting value.
__device__ __forceinline__ bool mask_starts_scores(const AttentionProblem& p, int kv0, int block_n) {
  return kv0 + block_n <= p.seq_kv;
}

// Loads this thread's mask pairs of rows tile.q0 + coords.row(r) of the
// tile's head (the kernels that start S at the mask never pack heads:
// sm90_wgmma::starts_s_at_mask; the packed mapping's per-row head costs their
// register-bound consumers a spill and 6 % at D = 512), keys key0
// + 8 b + e, as raw bits into s: element index(r, b, 1) holds a 16- or 8-bit
// pair, an fp32 pair fills both elements. Rows past Nq read nothing and get
// zeros (their scores are never stored). The loads are issued here and used by
// mask_to_starting_scores, so their latency passes under whatever the
// caller runs between the two.
template <class Layout, class Coordinates>
__device__ __forceinline__ void load_mask_pairs(float (&s)[Layout::kElements], const AttentionProblem& p,
                                                const TileCoordinates& tile, const Coordinates& coords, int key0) {
  const int seq_q = static_cast<int>(p.seq_q);
  const int64_t mask_bh = tile.batch * p.mask_stride[0] + tile.head * p.mask_stride[1];
  with_mask_element(p.mask_kind, [&](auto element_tag) {
    using T = decltype(element_tag);
#pragma unroll
    for (int r = 0; r < Layout::kRows; ++r) {
      const int i = tile.q0 + coords.row(r);
      if (i >= seq_q) {
#pragma unroll
        for (int e = 0; e < 2 * Layout::kColBlocks; ++e) s[Layout::index(r, e / 2, e % 2)] = 0.0f;
        continue;
      }
      const T* const mask_row = opaque(static_cast<const T*>(p.mask) + mask_bh + i * p.mask_stride[2]);
      const MaskPair<T>* const row_pairs = reinterpret_cast<const MaskPair<T>*>(mask_row + key0);
#pragma unroll
      for (int b = 0; b < Layout::kColBlocks; ++b) {
        const MaskPair<T>* const pair = row_pairs + Layout::col_offset(b) / 2;
        // Read-only global loads (a generic load checks the address space),
        // and the unused element of a packed pair set: left as it was, it
        // would carry the last block's score through the loop.
        if constexpr (sizeof(T) == 4) {
          const float2 v = __ldg(reinterpret_cast<const float2*>(pair));
          s[Layout::index(r, b, 0)] = v.x;
          s[Layout::index(r, b, 1)] = v.y;
        } else if constexpr (sizeof(T) == 2) {
          s[Layout::index(r, b, 0)] = 0.0f;
          s[Layout::index(r, b, 1)] = __uint_as_float(__ldg(reinterpret_cast<const unsigned int*>(pair)));
        } else {
          s[Layout::index(r, b, 0)] = 0.0f;
          s[Layout::index(r, b, 1)] = __uint_as_float(__ldg(reinterpret_cast<const unsigned short*>(pair)));
        }
      }
    }
  });
}

// value / scale. One multiply: the conversion sits just before the S MMA.
// Like mask_term's value * log2(e), a value near the fp32 limit overflows to
// an infinite score (torch.finfo(torch.bfloat16).min does in both).
__device__ __forceinline__ float starting_score(float value, float inverse_scale) { return value * inverse_scale; }

// The raw pairs load_mask_pairs left in s as the scores' starting values.
template <class Layout>
__device__ __forceinline__ void mask_to_starting_scores(float (&s)[Layout::kElements], MaskKind kind,
                                                        float inverse_scale) {
  with_mask_element(kind, [&](auto element_tag) {
    using T = decltype(element_tag);
#pragma unroll
    for (int r = 0; r < Layout::kRows; ++r)
#pragma unroll
      for (int b = 0; b < Layout::kColBlocks; ++b) {
        float& first = s[Layout::index(r, b, 0)];
        float& second = s[Layout::index(r, b, 1)];
        if constexpr (std::is_same_v<T, float>) {
          first = starting_score(first, inverse_scale);
          second = starting_score(second, inverse_scale);
        } else if constexpr (std::is_same_v<T, uint8_t>) {
          const uint32_t bits = __float_as_uint(second);
          first = (bits & 0xFFu) ? 0.0f : -INFINITY;
          second = (bits & 0xFF00u) ? 0.0f : -INFINITY;
        } else {
          const uint32_t bits = __float_as_uint(second);
          MaskPair<T> pair;
          memcpy(&pair, &bits, sizeof pair);
          first = starting_score(static_cast<float>(pair.first), inverse_scale);
          second = starting_score(static_cast<float>(pair.second), inverse_scale);
        }
      }
  });
}

}  // namespace ffpa::detail
