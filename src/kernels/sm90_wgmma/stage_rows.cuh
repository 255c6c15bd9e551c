// Rows of a landed ring stage that lie past a sequence's end. A sequence
// batch's last KV block (or row block) is loaded whole by TMA: its rows past
// the sequence are the tensor's next rows (another sequence's keys, a paged
// cache's unused rows, a batched cache's slots past seqused_k), which may hold
// anything, NaN included, and must add nothing to the products (P = 0 times a
// NaN is NaN). A dense call's rows past Nq or Nkv are TMA's zero fill already.
// Used by the forward's consumers (V boxes) and the backward's (either side).
#pragma once

#include <cstdint>

#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

// Zeroes rows [rows, kBoxRows) of kBoxes boxes of 128-byte rows from
// `stage`, by the 128 threads of one warpgroup (`thread` its index in it),
// then orders the writes before the async proxy's reads (wgmma) and syncs the
// warpgroup on named barrier `barrier`. Row r of box b is at b x kBoxBytes +
// (r / 8) x kGroupBytes + (r % 8) x 128: boxes of contiguous rows
// (kGroupBytes 1024), or 8-row groups of every box together (a paged cache in
// key groups, Traits::kPageGroups). Thread t writes 16-byte segment t % 8 of
// rows t / 8, t / 8 + 16, ...: the 128-byte swizzle permutes segments within
// a row, never rows, so a row is its 128 bytes whatever the swizzle. Every
// thread of the warpgroup must call it (the barrier).
template <int kBoxRows, int kBoxes, int kBoxBytes, int kGroupBytes = kSwizzleAtomBytes>
__device__ __forceinline__ void clear_rows_from(unsigned char* stage, int rows, int thread, int barrier) {
  static_assert(kBoxRows % 16 == 0, "a pass of 128 threads covers 16 rows of 8 segments");
  unsigned char* const base =
      stage + (thread / 64) * kGroupBytes + ((thread / 8) % 8) * kSwizzleRowBytes + (thread % 8) * 16;
#pragma unroll
  for (int pass = 0; pass < kBoxRows / 16; ++pass)
    if (thread / 8 + 16 * pass >= rows)
#pragma unroll
      for (int box = 0; box < kBoxes; ++box)
        *reinterpret_cast<uint4*>(base + box * kBoxBytes + pass * 2 * kGroupBytes) = uint4{0, 0, 0, 0};
  fence_proxy_async();
  named_barrier_sync(barrier, 128);
}

}  // namespace ffpa::detail::sm90_wgmma
