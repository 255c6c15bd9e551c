// The end of a row's softmax, shared by every family: the factor that
// normalizes O (and undoes dropout's 1 - p), and the row's log-sum-exp.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/softmax_state.hpp"

namespace ffpa::detail {

// O's row factor from the row's softmax denominator: keep_scale / row_sum; 0
// for a row with no attended key (sum 0), NaN for a row whose softmax is NaN
// (a NaN score: spec.md, "Non-finite inputs").
__device__ __forceinline__ float output_row_scale(float row_sum, float keep_scale) {
  return row_sum == 0.0f ? 0.0f : keep_scale / row_sum;
}

// A pair of O elements as stored (packed, their dtype's bits), from their
// row's factor: 0 in a row with no attended key whatever the accumulator held
// (a masked key's NaN V times P = 0 is NaN), else the packed products.
__device__ __forceinline__ uint32_t output_pair(uint32_t packed, float row_scale) {
  return row_scale == 0.0f ? 0u : packed;
}

// Natural-log LSE of a row from its log2-domain maximum and its denominator;
// -inf for a row with no attended key, NaN for a row whose softmax is NaN.
__device__ __forceinline__ float row_log_sum_exp(float row_max_log2, float row_sum) {
  return log_sum_exp(RowSoftmaxState{row_max_log2, row_sum});
}

// The end of a row: O's factor and the row's LSE, the head's attention sink
// (AttentionProblem::sinks) merged in as a key of its own that carries no
// value: a softmax state of maximum sink (log2 domain) and sum 1, so the sink
// joins the denominator exactly as split-KV's partials merge.
struct RowEnd {
  float out_scale;
  float lse;
};

__device__ __forceinline__ RowEnd finish_row(const AttentionProblem& p, int head, float row_max_log2, float row_sum,
                                             float keep_scale) {
  RowSoftmaxState state{row_max_log2, row_sum};
  float o_factor = 1.0f;
  if (p.sinks != nullptr) {
    const MergedRowState merged =
        merge_row_states(state, RowSoftmaxState{p.sinks[head * p.sinks_stride] * kLog2e, 1.0f});
    state = merged.state;
    o_factor = merged.scale_a;
  }
  return {output_row_scale(state.sum, keep_scale) * o_factor, log_sum_exp(state)};
}

__device__ __forceinline__ void store_lse(const AttentionProblem& p, int batch, int head, int row, float lse) {
  p.lse[batch * p.lse_stride[0] + head * p.lse_stride[1] + row * p.lse_stride[2]] = lse;
}

}  // namespace ffpa::detail
