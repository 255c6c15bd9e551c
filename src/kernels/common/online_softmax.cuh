// The online softmax in the log2 domain, one KV block at a time: the block's
// row maxima, the rescale of the running state to the new maximum, and the
// exponentials with their row sums. Reductions over a quad (the 4 threads
// that share a row in the accumulator layout) are here; reductions over
// several warps or consumers that share rows belong to the family.
#pragma once

#include <cmath>

#include "common/attention_problem.hpp"
#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/fast_math.cuh"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/softmax_state.hpp"

namespace ffpa::detail {

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// This thread's maximum of thread row r.
template <class Layout>
__device__ __forceinline__ float thread_row_max(const float (&s)[Layout::kElements], int r) {
  float m = -INFINITY;
#pragma unroll
  for (int b = 0; b < Layout::kColBlocks; ++b)
    m = fmaxf(m, fmaxf(s[Layout::index(r, b, 0)], s[Layout::index(r, b, 1)]));
  return m;
}

// Moving a row's running state to a new block: its new maximum, the base the
// block's exponentials subtract, and the factor earlier sums and O rows take.
struct RowRescale {
  float new_max;
  float base;   // new_max, or 0 while nothing is attended: exp2(-inf - 0) = 0
  float scale;  // exp2(old_max - base)
};

__device__ __forceinline__ RowRescale rescale_row(float old_max, float block_max) {
  RowRescale rescale;
  rescale.new_max = fmaxf(old_max, block_max);
  rescale.base = exponent_base(rescale.new_max);
  rescale.scale = rescale_factor(old_max, rescale.new_max);
  return rescale;
}

// s = exp2(s - base) over thread row r, each value added to sum in column order.
template <class Layout>
__device__ __forceinline__ void exponentiate_row(float (&s)[Layout::kElements], int r, float base, float& sum) {
#pragma unroll
  for (int b = 0; b < Layout::kColBlocks; ++b)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = s[Layout::index(r, b, e)];
      x = fast_exp2(x - base);
      sum += x;
    }
}

// The same for scores that still carry a factor: s = exp2(factor s - base),
// one FFMA and the exponential an element.
template <class Layout>
__device__ __forceinline__ void exponentiate_row(float (&s)[Layout::kElements], int r, float factor, float base,
                                                 float& sum) {
#pragma unroll
  for (int b = 0; b < Layout::kColBlocks; ++b)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = s[Layout::index(r, b, e)];
      x = fast_exp2(fmaf(x, factor, -base));
      sum += x;
    }
}

// The logit softcap (AttentionProblem::softcap > 0) on raw scores q.k:
// softcap * tanh(scale * s / softcap), in the log2 domain, so the capped
// scores take no further scale factor. Applied before the mask.
struct Softcap {
  float inner;  // scale / softcap
  float outer;  // softcap * log2(e)
};

// scale_log2: the scores' scale times log2(e) (and an e4m3 cache's k_descale).
__device__ __forceinline__ Softcap softcap_factors(const AttentionProblem& p, float scale_log2) {
  return {scale_log2 / (kLog2e * p.softcap), p.softcap * kLog2e};
}

// An e4m3 cache's descales of (sequence b, KV head h): K's multiplies the
// scores' scale, V's the output rows (FlashAttention-3's k_descale /
// v_descale); 1 where absent.
struct KvDescales {
  float k, v;
};

__device__ __forceinline__ KvDescales kv_descales(const AttentionProblem& p, int b, int h) {
  return {p.k_descale != nullptr ? p.k_descale[b * p.k_descale_stride[0] + h * p.k_descale_stride[1]] : 1.0f,
          p.v_descale != nullptr ? p.v_descale[b * p.v_descale_stride[0] + h * p.v_descale_stride[1]] : 1.0f};
}

template <class Layout>
__device__ __forceinline__ void apply_softcap(float (&s)[Layout::kElements], Softcap cap) {
#pragma unroll
  for (int i = 0; i < Layout::kElements; ++i) s[i] = cap.outer * fast_tanh(s[i] * cap.inner);
}

// Whether any row of the warp moves its maximum (a factor other than 1):
// once the maxima settle, most blocks leave O as it is and skip scale_row.
__device__ __forceinline__ bool warp_rescales(float factor0, float factor1) {
  return __any_sync(0xffffffffu, factor0 != 1.0f || factor1 != 1.0f);
}

// Multiplies thread row r of an accumulator (O) by factor: the rescale of
// O's running sum when the row's maximum moves.
template <class Layout>
__device__ __forceinline__ void scale_row(float (&acc)[Layout::kElements], int r, float factor) {
#pragma unroll
  for (int b = 0; b < Layout::kColBlocks; ++b) {
    acc[Layout::index(r, b, 0)] *= factor;
    acc[Layout::index(r, b, 1)] *= factor;
  }
}

}  // namespace ffpa::detail
