// The forward check the emulated kernel tests share: host_forward.hpp's
// inputs and reference for a ForwardCase, the kernel run by the caller's
// callback on the validated problem, then o and lse compared. And the split-KV
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
#include "gpu/host_forward.hpp"
#include "kernels/common/softmax_state.hpp"
#include "kernels/common/split_kv.hpp"
#include "reference/cpu_attention.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"
#include "support/nonfinite_expectation.hpp"

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
      set_element(o, {b, h, i, c}, detail::combined_output(sum, merged));
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
  HostForward f;
  ASSERT_NO_FATAL_FAILURE(make_host_forward(c, value_dim, splitmix64(std::hash<std::string>{}(name)), &f));
  run(f.problem);
  const double tolerance = c.accumulation == Accumulation::f16 ? 5e-3 : c.dtype == DType::bf16 ? 5e-3 : 1e-3;
  expect_forward_matches(f, c, tolerance, "emulated fwd", name);
}

// The NaN check of a kernel (spec.md, "Non-finite inputs"): case `c` run
// clean, then with put_nans() in its inputs; every o and lse element of the
// second run NaN where a NaN must reach it, bit-identical to the first where
// none may (expect_forward_nans, with a kernel's key window).
inline void check_forward_nans(const std::string& name, const ForwardCase& c, int64_t value_dim,
                               const std::function<void(const detail::AttentionProblem&)>& run) {
  SCOPED_TRACE(name + " (NaN inputs)");
  const uint64_t seed = splitmix64(std::hash<std::string>{}(name));
  HostForward clean, poisoned;
  ASSERT_NO_FATAL_FAILURE(make_host_forward(c, value_dim, seed, &clean));
  ASSERT_NO_FATAL_FAILURE(make_host_forward(c, value_dim, seed, &poisoned));
  put_nans(poisoned.q.view, poisoned.k.view, poisoned.v.view, &poisoned.mask.view);
  const ForwardExpectation want = expect_forward_nans(poisoned.problem, kKernelKeyWindow);
  EXPECT_GT(want.nan_elements, 0);
  run(clean.problem);
  run(poisoned.problem);
  auto values = [&](const HostForward& f, std::vector<double>* o, std::vector<double>* lse) {
    for_each_index(f.o.view, [&](const std::array<int64_t, 4>& i) { o->push_back(element_as_double(f.o.view, i)); });
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seq_q; ++i) lse->push_back(element_as_double(f.lse.view, {b, h, i, 0}));
  };
  std::vector<double> got_o, got_lse, clean_o, clean_lse;
  values(poisoned, &got_o, &got_lse);
  values(clean, &clean_o, &clean_lse);
  EXPECT_EQ(count_off(want.o, got_o, clean_o, "o"), 0);
  if (c.with_lse) EXPECT_EQ(count_off(want.lse, got_lse, clean_lse, "lse"), 0);
}

}  // namespace ffpa::testing
