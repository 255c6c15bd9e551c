// One backward test case, shared by the GPU test (tests/gpu/test_gpu_backward.cpp)
// and the CPU emulation of the kernels (tests/emulation/): host tensors with
// the forward's o and lse from the CPU reference, gradients poisoned with NaN
// (rows and the gaps between padded rows), the fp64 reference gradients, and
// the checks of what a run wrote: every element finite, no gap touched, the
// relative L2 error of each gradient (and an additive mask's) within bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/forward_case.hpp"
#include "gpu/host_forward.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention_backward.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"
#include "support/nonfinite_expectation.hpp"

namespace ffpa::testing {

struct BackwardCase {
  std::string name;
  ForwardCase shape;
  int64_t value_dim = 0;     // Dv; 0: D
  bool with_d_lse = false;   // a loss that reads the lse too
  bool with_d_mask = false;  // an additive mask's gradient too
  // An all-zero reference gradient fails the case (it would check nothing);
  // random cases may draw one (every row masked): their gradients must then be ~0.
  bool require_nonzero = true;
};

inline void PrintTo(const BackwardCase& c, std::ostream* out) { *out << c.name; }

enum BackwardSeedUse : uint64_t { seed_d_o = 101, seed_d_lse };

// The host tensors of a case and the call on them.
struct BackwardTensors : ForwardTensors {
  HostView d_o, d_lse, d_q, d_k, d_v, d_mask;
  BackwardParams params;
};

// The tensors: q, k, v, d_o, d_lse random (with_nans: put_nans() into q, k,
// v and the mask); o and lse from the CPU reference's forward; the
// gradients NaN.
inline void make_backward_tensors(const BackwardCase& bc, uint64_t seed, BackwardTensors* t, bool with_nans = false) {
  const ForwardCase& c = bc.shape;
  const int64_t dv = bc.value_dim > 0 ? bc.value_dim : c.head_dim;
  static_cast<ForwardTensors&>(*t) = make_forward_tensors(c, bc.value_dim, seed);
  if (with_nans) put_nans(t->q.view, t->k.view, t->v.view, &t->mask.view);
  t->d_o = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c, derive_seed(seed, seed_d_o), -1.0f, 1.0f);
  if (bc.with_d_lse) {
    t->d_lse = make_lse(c);
    fill_uniform(t->d_lse.buffer, derive_seed(seed, seed_d_lse), -1.0f, 1.0f);
  }
  BackwardParams& p = t->params;
  p.options = case_options(c, seed);
  {
    ForwardParams forward;
    forward.q = t->q.view, forward.k = t->k.view, forward.v = t->v.view, forward.o = t->o.view;
    forward.mask = t->mask.view, forward.lse = t->lse.view;
    forward.options = p.options;
    forward.options.impl = Impl::cpu_reference;
    const Status status = ffpa::forward(forward);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  t->d_q = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c.layout, c.row_pad);
  t->d_k = make_padded(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c.layout, c.row_pad);
  t->d_v = make_padded(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c.layout, c.row_pad);
  for (HostView* g : {&t->d_q, &t->d_k, &t->d_v}) fill_nan(g->buffer);
  if (bc.with_d_mask) {
    const Tensor& m = t->mask.view;
    t->d_mask.buffer = make_host_tensor(m.dtype, {m.shape[0], m.shape[1], m.shape[2], m.shape[3]});
    t->d_mask.view = t->d_mask.buffer.tensor;
    fill_nan(t->d_mask.buffer);
  }
  p.q = t->q.view, p.k = t->k.view, p.v = t->v.view, p.o = t->o.view, p.lse = t->lse.view, p.mask = t->mask.view;
  p.d_o = t->d_o.view, p.d_lse = t->d_lse.view, p.d_mask = t->d_mask.view;
  p.d_q = t->d_q.view, p.d_k = t->d_k.view, p.d_v = t->d_v.view;
}

inline std::vector<double> logical_values(const Tensor& t) {
  std::vector<double> out;
  for_each_index(t, [&](const std::array<int64_t, 4>& i) { out.push_back(element_as_double(t, i)); });
  return out;
}

// Builds the case, computes the reference, calls run(tensors, problem) to
// write the gradients into tensors' host buffers (run validates nothing
// itself: problem is the validated host call), then checks them. Relative L2
// bounds per gradient: tolerance_bf16 / tolerance_f16 (d_mask: 2x, its sums
// are longer).
template <class Run>
void check_backward(const BackwardCase& bc, uint64_t seed, const char* label, double tolerance_bf16,
                    double tolerance_f16, Run&& run) {
  SCOPED_TRACE(bc.name + " (seed " + std::to_string(seed) + ")");
  const ForwardCase& c = bc.shape;
  const int64_t dv = bc.value_dim > 0 ? bc.value_dim : c.head_dim;
  BackwardTensors t;
  ASSERT_NO_FATAL_FAILURE(make_backward_tensors(bc, seed, &t));
  detail::BackwardProblem problem;
  {
    const Status status = detail::validate_backward(t.params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  const std::vector<double> g = logical_values(t.d_o.view);
  std::vector<double> gl;
  if (bc.with_d_lse)
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seq_q; ++i) gl.push_back(element_as_double(t.d_lse.view, {b, h, i, 0}));
  std::vector<double> want_q(static_cast<size_t>(c.batch * c.heads_q * c.seq_q * c.head_dim));
  std::vector<double> want_k(static_cast<size_t>(c.batch * c.heads_kv * c.seq_kv * c.head_dim));
  std::vector<double> want_v(static_cast<size_t>(c.batch * c.heads_kv * c.seq_kv * dv));
  std::vector<double> d_scores(bc.with_d_mask ? static_cast<size_t>(c.batch * c.heads_q * c.seq_q * c.seq_kv) : 0);
  detail::cpu_attention_backward_f64(problem.forward, g.data(), gl.empty() ? nullptr : gl.data(),
                                     {want_q.data(), want_k.data(), want_v.data(),
                                      bc.with_d_mask ? d_scores.data() : nullptr});

  ASSERT_NO_FATAL_FAILURE(run(t, problem));

  const double tolerance = c.dtype == DType::bf16 ? tolerance_bf16 : tolerance_f16;
  struct Checked {
    const char* name;
    const HostView* got;
    const std::vector<double>* want;
  };
  for (const Checked& grad : {Checked{"d_q", &t.d_q, &want_q}, Checked{"d_k", &t.d_k, &want_k},
                              Checked{"d_v", &t.d_v, &want_v}}) {
    const std::vector<double> got = logical_values(grad.got->view);
    int64_t not_finite = 0;
    for (double x : got) not_finite += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(not_finite, 0) << grad.name << ": elements left unwritten or not finite";
    int64_t gaps_written = 0;
    for_each_gap_element(*grad.got, [&](const std::array<int64_t, 4>& i) {
      gaps_written += std::isnan(element_as_double(grad.got->buffer.tensor, i)) ? 0 : 1;
    });
    EXPECT_EQ(gaps_written, 0) << grad.name << ": the gaps between padded rows were written";
    double want_norm = 0.0;
    for (double x : *grad.want) want_norm += x * x;
    if (want_norm == 0.0) {
      EXPECT_FALSE(bc.require_nonzero) << grad.name << ": an all-zero reference checks nothing";
      // Rows that attend one key have dS = 0 exactly; the kernels' delta from the rounded O leaves
      // |dS| of the order of the dtype's rounding (the inputs are O(1)).
      double largest = 0.0;
      for (double x : got) largest = std::max(largest, std::fabs(x));
      EXPECT_LE(largest, 2 * tolerance) << grad.name << ": the reference is all zero";
      continue;
    }
    const ErrorMetrics m = error_metrics(got, *grad.want);
    std::cout << "[ " << label << " ] " << bc.name << " " << grad.name << " relative L2 " << m.relative_l2 << "\n";
    EXPECT_LE(m.relative_l2, tolerance) << grad.name;
  }
  if (!bc.with_d_mask) return;
  // Each score's dS summed into the mask element it read.
  const Tensor& m = t.mask.view;
  std::vector<double> want_mask(static_cast<size_t>(m.shape[0] * m.shape[1] * m.shape[2] * m.shape[3]), 0.0);
  size_t e = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i)
        for (int64_t j = 0; j < c.seq_kv; ++j, ++e) {
          const int64_t index[4] = {m.shape[0] == 1 ? 0 : b, m.shape[1] == 1 ? 0 : h, m.shape[2] == 1 ? 0 : i,
                                    m.shape[3] == 1 ? 0 : j};
          want_mask[static_cast<size_t>(((index[0] * m.shape[1] + index[1]) * m.shape[2] + index[2]) * m.shape[3] +
                                        index[3])] += d_scores[e];
        }
  const ErrorMetrics mm = error_metrics(logical_values(t.d_mask.view), want_mask);
  std::cout << "[ " << label << " ] " << bc.name << " d_mask relative L2 " << mm.relative_l2 << "\n";
  EXPECT_LE(mm.relative_l2, 2 * tolerance) << "d_mask";
}

// The NaN check of a backward (spec.md, "Non-finite inputs"): the case run
// clean, then with put_nans() in q, k, v and the mask (o and lse the CPU
// reference's forward of them); every gradient element of the second run NaN
// where a NaN must reach it, bit-identical to the first where none may
// (expect_backward_nans, with a kernel's key window).
template <class Run>
void check_backward_nans(const BackwardCase& bc, uint64_t seed, Run&& run) {
  SCOPED_TRACE(bc.name + " (NaN inputs, seed " + std::to_string(seed) + ")");
  BackwardTensors clean, poisoned;
  ASSERT_NO_FATAL_FAILURE(make_backward_tensors(bc, seed, &clean));
  ASSERT_NO_FATAL_FAILURE(make_backward_tensors(bc, seed, &poisoned, true));
  detail::BackwardProblem clean_problem, problem;
  ASSERT_TRUE(detail::validate_backward(clean.params, &clean_problem).ok());
  ASSERT_TRUE(detail::validate_backward(poisoned.params, &problem).ok());
  const ForwardExpectation fwd = expect_forward_nans(problem.forward, 0);  // o and lse: the reference's
  const BackwardExpectation want = expect_backward_nans(problem.forward, fwd, kKernelKeyWindow);
  ASSERT_NO_FATAL_FAILURE(run(clean, clean_problem));
  ASSERT_NO_FATAL_FAILURE(run(poisoned, problem));
  int64_t nans = 0;
  for (const auto* expect : {&want.d_q, &want.d_k, &want.d_v})
    nans += std::count(expect->begin(), expect->end(), Expect::nan);
  EXPECT_GT(nans, 0);
  EXPECT_EQ(count_off(want.d_q, logical_values(poisoned.d_q.view), logical_values(clean.d_q.view), "d_q"), 0);
  EXPECT_EQ(count_off(want.d_k, logical_values(poisoned.d_k.view), logical_values(clean.d_k.view), "d_k"), 0);
  EXPECT_EQ(count_off(want.d_v, logical_values(poisoned.d_v.view), logical_values(clean.d_v.view), "d_v"), 0);
}

}  // namespace ffpa::testing
