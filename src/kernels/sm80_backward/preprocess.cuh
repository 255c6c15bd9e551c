// The backward's preprocess: delta_i = sum_c dO_ic O_ic - d_lse_i per query
// row, in fp32 (docs/spec.md, "Backward": the gradient of the LSE enters
// through delta). One warp per row, 16-byte loads along Dv.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/attention_problem.hpp"
#include "kernels/common/element.cuh"

namespace ffpa::detail::sm80_backward {

// Rows: every row of q's extent (backward_problem.hpp: a dense call's
// [B][Nq], a sequence batch's packed [1][total_q] or batched [B][Nq]), those
// of no sequence too (their delta is never read).
struct PreprocessArgs {
  const void* o;
  const void* d_o;
  const float* d_lse;  // null: zero
  int64_t o_stride[3], d_o_stride[3], d_lse_stride[3];  // b, h, n
  float* delta;        // [entries][Hq][seq_q]
  int64_t heads_q, seq_q, rows;  // seq_q: the extent's rows; rows = entries Hq seq_q
  int value_dim;
};

// Rows (warps) per block of the preprocess.
inline constexpr int kPreprocessRows = 8;

template <class Element>
__global__ void __launch_bounds__(32 * kPreprocessRows) preprocess_kernel(const PreprocessArgs args) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kPreprocessRows + threadIdx.x / 32;
  if (row >= args.rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t i = row % args.seq_q, bh = row / args.seq_q;
  const int64_t h = bh % args.heads_q, b = bh / args.heads_q;
  const Element* o = static_cast<const Element*>(args.o) + b * args.o_stride[0] + h * args.o_stride[1] + i * args.o_stride[2];
  const Element* d_o =
      static_cast<const Element*>(args.d_o) + b * args.d_o_stride[0] + h * args.d_o_stride[1] + i * args.d_o_stride[2];
  float sum = 0.0f;
  for (int c = 8 * lane; c < args.value_dim; c += 8 * 32) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c), gv = *reinterpret_cast<const uint4*>(d_o + c);
    Element oe[8], ge[8];  // memcpy, not a cast: the bytes of a uint4 read as elements without aliasing
    memcpy(oe, &ov, sizeof oe);
    memcpy(ge, &gv, sizeof ge);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += static_cast<float>(oe[e]) * static_cast<float>(ge[e]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    if (args.d_lse != nullptr)
      sum -= args.d_lse[b * args.d_lse_stride[0] + h * args.d_lse_stride[1] + i * args.d_lse_stride[2]];
    args.delta[row] = sum;
  }
}

}  // namespace ffpa::detail::sm80_backward
