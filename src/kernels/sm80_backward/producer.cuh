// The backward kernels' loads: every thread copies its share of each ring
// step with cp.async (16 bytes at a time, zero-filling rows and columns past
// the tensor's end), kStages - 1 steps ahead of the step being computed. A
// step is one 64-column chunk of up to two 64-row blocks (the stage's A and B
// halves); which blocks and columns is the kernel's step program.
#pragma once

#include <cstdint>

#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm80_backward/traits.cuh"
#include "kernels/sm80_split_d/ptx.cuh"

namespace ffpa::detail::sm80_backward {

using sm80_split_d::cp_async_16;
using sm80_split_d::cp_async_commit;
using sm80_split_d::cp_async_wait;

// One 64-row block of a ring step: rows [row0, row0 + 64) of a matrix whose
// rows start `stride` elements apart at `base`, columns [col0, col0 + 64);
// rows from row_end and columns from col_end are zero-filled.
template <class Element>
struct BlockSource {
  const Element* base;
  int64_t stride;
  int row0, row_end, col0, col_end;
};

// Copies a block into a 64-row half of a stage (swizzled 128-byte rows):
// thread tid copies segment tid % 8 of rows tid / 8 + 32 k.
template <class Traits>
__device__ __forceinline__ void copy_block(uint32_t half, const BlockSource<typename Traits::Element>& src,
                                           unsigned tid) {
  constexpr int kRowsPerPass = Traits::kThreads / 8;
  const unsigned thread = opaque(tid);
  const int seg = static_cast<int>(thread % 8), first_row = static_cast<int>(thread / 8);
  const int col = src.col0 + seg * 8;
  const bool valid_col = col < src.col_end;
#pragma unroll
  for (int k = 0; k < 64 / kRowsPerPass; ++k) {
    const int row = first_row + k * kRowsPerPass;
    const bool valid = valid_col && src.row0 + row < src.row_end;
    cp_async_16(half + swizzle128<Traits::kElementBytes>(row, seg * 8),
                src.base + static_cast<int64_t>(src.row0 + row) * src.stride + col, valid);
  }
}

// The ring's stage indices. The kernel's issue(slot) copies its next step (if
// any) into stage `slot` and commits a cp.async group either way, so that
// every wait counts the same number of groups.
template <class Traits>
struct Ring {
  int slot = 0;  // the stage the current step reads

  template <class Issue>
  __device__ __forceinline__ void prime(Issue&& issue) {
#pragma unroll 1
    for (int s = 0; s < Traits::kStages - 1; ++s) issue(s);
  }

  // Waits for the current step's stage and refills the one the previous step
  // freed (every thread has passed the barrier, so nobody reads it).
  template <class Issue>
  __device__ __forceinline__ void advance(Issue&& issue) {
    cp_async_wait<Traits::kStages - 2>();
    __syncthreads();
    issue(slot == 0 ? Traits::kStages - 1 : slot - 1);
  }

  __device__ __forceinline__ void release() { slot = slot + 1 == Traits::kStages ? 0 : slot + 1; }
};

}  // namespace ffpa::detail::sm80_backward
