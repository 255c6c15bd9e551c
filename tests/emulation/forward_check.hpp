// The forward check the emulated kernel tests share: fresh inputs for a
// ForwardCase, the fp64 reference, the kernel run by the caller's callback on
// the validated problem, then o (every element written and finite, the gaps
// of padded rows untouched) and lse against the reference. And the split-KV
// combine's arithmetic on the host (split_kv.hpp's merge and weights, what
// kernels/split_kv/combine.cu runs) for kernels that wrote partial rows.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "kernels/common/softmax_state.hpp"
#include "kernels/common/split_kv.hpp"
#include "reference/cpu_attention.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

// o and lse from `splits` partial rows (row r of split s at s x rows + r; o
// rows Dv wide), as the combine kernel computes them.
inline void combine_on_host(const detail::AttentionProblem& problem, const std::vector<float>& partial_o,
                            const std::vector<detail::RowSoftmaxState>& states, int splits) {
  const int64_t rows = problem.batch * problem.heads_q * problem.seq_q, dv = problem.dv();
  const float keep_scale = problem.dropout_p > 0.0f ? problem.dropout_scale : 1.0f;
  for (int64_t row = 0; row < rows; ++row) {
    const detail::RowSoftmaxState merged = detail::merge_split_states(states.data() + row, rows, splits);
    const int64_t i = row % problem.seq_q, bh = row / problem.seq_q;
    const int64_t b = bh / problem.heads_q, h = bh % problem.heads_q;
    for (int64_t c = 0; c < dv; ++c) {
      double sum = 0.0;
      for (int sp = 0; sp < splits; ++sp)
        sum += detail::split_weight(states[static_cast<size_t>(sp * rows + row)], merged) * keep_scale *
               partial_o[static_cast<size_t>((sp * rows + row) * dv + c)];
      const Tensor o{problem.o, problem.dtype, 4, {0, 0, 0, 0}, {problem.o_stride[0], problem.o_stride[1], problem.o_stride[2], 1}};
      set_element(o, {b, h, i, c}, sum);
    }
    if (problem.lse != nullptr)
      problem.lse[b * problem.lse_stride[0] + h * problem.lse_stride[1] + i * problem.lse_stride[2]] =
          detail::log_sum_exp(merged);
  }
}


// Checks the kernel `run` launches (on the emulator) for case `c` with value
// head dim `value_dim` (0: D) against the fp64 reference.
inline void check_forward(const std::string& name, const ForwardCase& c, int64_t value_dim,
                          const std::function<void(const detail::AttentionProblem&)>& run) {
  SCOPED_TRACE(name);
  const uint64_t seed = splitmix64(std::hash<std::string>{}(name));
  const int64_t dv = value_dim > 0 ? value_dim : c.head_dim;
  HostView q = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c, derive_seed(seed, seed_q), -2.0f, 2.0f);
  HostView k = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c, derive_seed(seed, seed_k), -1.0f, 1.0f);
  HostView v = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c, derive_seed(seed, seed_v), -1.0f, 1.0f);
  HostView o = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c.layout, c.row_pad);
  HostView lse = make_lse(c);
  HostView mask = make_mask(c, derive_seed(seed, seed_mask));
  fill_nan(o.buffer);
  fill_nan(lse.buffer);
  ForwardParams params;
  params.q = q.view, params.k = k.view, params.v = v.view, params.o = o.view, params.mask = mask.view;
  params.lse = lse.view;
  params.options.scale = c.scale;
  params.options.causal = c.causal;
  params.options.dropout_p = c.dropout_p;
  params.options.dropout_seed = derive_seed(seed, seed_dropout);
  params.options.dropout_offset = derive_seed(seed, seed_dropout_offset);
  params.options.accumulation = c.accumulation;
  detail::AttentionProblem problem;
  {
    const Status status = detail::validate_forward(params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.seq_q);
  std::vector<double> want_o(rows * static_cast<size_t>(dv)), want_lse(rows);
  detail::cpu_attention_forward_f64(problem, {}, want_o.data(), want_lse.data());

  run(problem);

  std::vector<double> got_o, got_lse;
  for_each_index(o.view, [&](const std::array<int64_t, 4>& i) { got_o.push_back(element_as_double(o.view, i)); });
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) got_lse.push_back(element_as_double(lse.view, {b, h, i, 0}));
  int64_t not_finite = 0;
  for (double x : got_o) not_finite += std::isfinite(x) ? 0 : 1;
  EXPECT_EQ(not_finite, 0) << "o: elements left unwritten or not finite";
  int64_t gaps_written = 0;
  for_each_gap_element(o, [&](const std::array<int64_t, 4>& i) {
    gaps_written += std::isnan(element_as_double(o.buffer.tensor, i)) ? 0 : 1;
  });
  EXPECT_EQ(gaps_written, 0) << "o: the gaps between padded rows were written";
  const ErrorMetrics m = error_metrics(got_o, want_o);
  std::cout << "[ emulated fwd ] " << name << " o relative L2 " << m.relative_l2 << "\n";
  const double tolerance = c.accumulation == Accumulation::f16 ? 5e-3 : c.dtype == DType::bf16 ? 5e-3 : 1e-3;
  EXPECT_LE(m.relative_l2, tolerance);
  for (size_t r = 0; r < rows; ++r) {
    if (std::isinf(want_lse[r])) {
      EXPECT_EQ(got_lse[r], want_lse[r]) << "lse row " << r;
    } else {
      EXPECT_NEAR(got_lse[r], want_lse[r], 2e-3 * std::max(1.0, std::fabs(want_lse[r]))) << "lse row " << r;
    }
  }
}


}  // namespace ffpa::testing
