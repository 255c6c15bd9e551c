// Split-KV's combine of a sequence batch's pass on the host, for the
// emulated serving tests of both families: what the combine kernel
// (kernels/split_kv/combine.cu) computes, from the partial rows where the
// plan placed them (sequence b's at first_partial[b] + (split x Hq + head) x
// Nq_b + row), into O and LSE.
#pragma once

#include <cstdint>
#include <vector>

#include "common/attention_problem.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/serving/plan.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa::testing {

inline void combine_sequences_on_host(const detail::AttentionProblem& p, const detail::PassRows& pass,
                                      const std::vector<float>& partial_o,
                                      const std::vector<detail::RowSoftmaxState>& states) {
  const auto* header = detail::serving::plan_header(p.sequences.plan);
  const detail::PlanArrays arrays = detail::plan_arrays(p.sequences.plan, p.batch);
  const int64_t dv = p.dv();
  for (int64_t b = 0; b < p.batch; ++b) {
    const detail::Sequence seq = detail::sequence_at(p.sequences, b);
    if (!pass.in_pass(seq)) continue;  // another pass's
    const int64_t splits = detail::sequence_splits(seq, header->tiling.block_n, header->split_blocks);
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < seq.seq_q; ++i) {
        const int64_t first = arrays.first_partial[b] + h * seq.seq_q + i, stride = p.heads_q * seq.seq_q;
        detail::RowSoftmaxState merged = detail::merge_split_states(states.data() + first, stride, static_cast<int>(splits));
        if (p.sinks != nullptr)
          merged = detail::merge_row_states(merged, {p.sinks[h * p.sinks_stride] * detail::kLog2e, 1.0f}).state;
        std::vector<double> out(static_cast<size_t>(dv), 0.0);
        for (int64_t s = 0; s < splits; ++s) {
          const double w = detail::split_weight(states[static_cast<size_t>(first + s * stride)], merged);
          for (int64_t d = 0; d < dv; ++d) out[d] += w * partial_o[static_cast<size_t>((first + s * stride) * dv + d)];
        }
        Tensor o;
        o.data = p.o, o.dtype = p.dtype, o.rank = 4;
        for (int k = 0; k < 3; ++k) o.stride[k] = p.o_stride[k];
        o.stride[3] = 1;
        for (int64_t d = 0; d < dv; ++d) set_element(o, {seq.q_batch, h, seq.q_begin + i, d}, out[d]);
        if (p.lse != nullptr)
          p.lse[seq.q_batch * p.lse_stride[0] + h * p.lse_stride[1] + (seq.q_begin + i) * p.lse_stride[2]] =
              detail::log_sum_exp(merged);
      }
  }
}

}  // namespace ffpa::testing
