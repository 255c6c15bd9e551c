// The sinks' gradient (BackwardParams::d_sinks), after the preprocess: a
// head's sink joins every row's softmax denominator with weight
// p_sink = exp(sink - lse_i) and carries no value, so
//   d_sink = -sum_i p_sink_i delta_i   (delta_i = dO_i . O_i - d_lse_i)
// over every row of every sequence (a dense call's every row). One warp a
// query head; lane t sums rows t, t + 32, ... of each sequence in turn, then
// the warp's butterfly: the same bits on every run, no atomics.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/backward_problem.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/tile_schedule.hpp"

namespace ffpa::detail::sm80_backward {

inline constexpr int kSinkThreads = 32;  // a warp

struct SinkGradientArgs {
  AttentionProblem p;   // its lse and sinks; a sequence batch's layout
  const float* delta;   // [entries][Hq][rows] of q's extent (the preprocess's)
  float* d_sinks;
  int64_t d_sinks_stride;
  const void* plan;     // a sequence batch: a plan of its lengths (a faulty one: nothing written)
};

template <int kThreads>
__global__ void __launch_bounds__(kThreads) sink_gradient_kernel(const SinkGradientArgs args) {
  static_assert(kThreads == 32, "one warp a head: a shuffle reduction");
  const AttentionProblem& p = args.p;
  if (p.sequences.active && static_cast<const SequenceScheduleHeader*>(args.plan)->fault != 0) return;
  const int head = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  const float sink = p.sinks[head * p.sinks_stride];
  const int64_t delta_rows = query_extent(p).rows;
  float sum = 0.0f;
  for (int b = 0; b < static_cast<int>(p.batch); ++b) {
    const TileSequence seq = tile_sequence(p, b);
    for (int i = tid; i < seq.seq_q; i += kThreads) {
      const int64_t row = static_cast<int64_t>(seq.q_begin) + i;
      const float lse = p.lse[seq.q_batch * p.lse_stride[0] + head * p.lse_stride[1] + row * p.lse_stride[2]];
      if (lse == -INFINITY) continue;  // no key and no sink: nothing attended (a sink of -inf)
      sum -= expf(sink - lse) * args.delta[(static_cast<int64_t>(seq.q_batch) * p.heads_q + head) * delta_rows + row];
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (tid == 0) args.d_sinks[head * args.d_sinks_stride] = sum;
}

}  // namespace ffpa::detail::sm80_backward
