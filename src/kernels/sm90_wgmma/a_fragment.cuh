// An RS wgmma's A operand (wgmma.cuh's wgmma_rs) taken from a product's fp32
// accumulators, so that P = softmax(S) multiplies V from the registers S was
// computed in, without a trip through shared memory (FA3's MmaPV_is_RS).
//
// The accumulators of an m64nN wgmma and the A fragment of an m64k16 one
// share their layout: thread t = 32 w + l holds, for each 8-column block i,
// accumulators 4 i + {0, 1} at row 16 w + l / 4, columns 8 i + 2 (l % 4) +
// {0, 1}, and 4 i + {2, 3} eight rows below; A register j holds row 16 w +
// l / 4 + 8 (j % 2), columns 8 (j / 2) + 2 (l % 4) + {0, 1}. So k16 step kk of
// P is accumulators 8 kk .. 8 kk + 7, packed in pairs: no shuffle.
#pragma once

#include <cstdint>

#include "kernels/common/element.cuh"

namespace ffpa::detail::sm90_wgmma {

// A fragment of k16 step `k_step` (columns 16 k_step .. 16 k_step + 15) of
// the warpgroup's [64 x 2 kAccumulators] product whose accumulators this
// thread holds, rounded to Operand. k_step must be a compile-time constant
// after unrolling (the accumulators are registers).
template <class Operand, int kAccumulators>
__device__ __forceinline__ void a_fragment_from_accumulators(const float (&accumulators)[kAccumulators], int k_step,
                                                             uint32_t (&a)[4]) {
  static_assert(kAccumulators % 8 == 0, "whole k16 steps: 16 columns are 8 accumulators a thread");
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    a[j] = pack2<Operand>(accumulators[8 * k_step + 2 * j], accumulators[8 * k_step + 2 * j + 1]);
  }
}

}  // namespace ffpa::detail::sm90_wgmma
