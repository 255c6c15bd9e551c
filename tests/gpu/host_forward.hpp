// A forward call's host side for a ForwardCase, shared by the tests that run
// a kernel on it (the GPU's value-dim test, the CPU emulation's kernel tests):
// fresh inputs (NaN in the gaps of padded rows), o and lse poisoned with NaN,
// the params over them, the validated problem and its fp64 reference; then
// the comparison of what the kernel wrote with that reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

// A forward call's tensors for case c: q, k, v from `seed` (NaN in the gaps
// of padded rows), o [.., Dv] and lse zero, the mask as the case asks.
struct ForwardTensors {
  HostView q, k, v, o, lse, mask;
};

// value_dim: V's and O's head dim (0: D).
inline ForwardTensors make_forward_tensors(const ForwardCase& c, int64_t value_dim, uint64_t seed) {
  const int64_t dv = value_dim > 0 ? value_dim : c.head_dim;
  ForwardTensors t;
  t.q = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c, derive_seed(seed, seed_q), -2.0f, 2.0f);
  t.k = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c, derive_seed(seed, seed_k), -1.0f, 1.0f);
  t.v = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c, derive_seed(seed, seed_v), -1.0f, 1.0f);
  t.o = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c.layout, c.row_pad);
  t.lse = make_lse(c);
  t.mask = make_mask(c, derive_seed(seed, seed_mask));
  return t;
}

// The case's options (dropout's seed and offset derived from `seed`).
inline Options case_options(const ForwardCase& c, uint64_t seed) {
  Options options;
  options.scale = c.scale;
  options.causal = c.causal;
  options.dropout_p = c.dropout_p;
  options.dropout_seed = derive_seed(seed, seed_dropout);
  options.dropout_offset = derive_seed(seed, seed_dropout_offset);
  options.accumulation = c.accumulation;
  return options;
}

struct HostForward : ForwardTensors {
  ForwardParams params;
  detail::AttentionProblem problem;
  std::vector<double> want_o, want_lse;
};

// Case c with value head dim dv (V and O; 0: D), inputs from `seed`, o and lse poisoned.
inline void make_host_forward(const ForwardCase& c, int64_t value_dim, uint64_t seed, HostForward* f) {
  static_cast<ForwardTensors&>(*f) = make_forward_tensors(c, value_dim, seed);
  const int64_t dv = value_dim > 0 ? value_dim : c.head_dim;
  fill_nan(f->o.buffer);
  fill_nan(f->lse.buffer);
  ForwardParams& params = f->params;
  params.q = f->q.view, params.k = f->k.view, params.v = f->v.view, params.o = f->o.view;
  params.mask = f->mask.view, params.lse = f->lse.view;
  params.options = case_options(c, seed);
  const Status status = detail::validate_forward(params, &f->problem);
  ASSERT_TRUE(status.ok()) << status.message;
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.seq_q);
  f->want_o.assign(rows * static_cast<size_t>(dv), 0.0);
  f->want_lse.assign(rows, 0.0);
  detail::cpu_attention_forward_f64(f->problem, {}, f->want_o.data(), f->want_lse.data());
}

// What the kernel wrote into f's o and lse: every element of o finite (the
// gaps of padded rows untouched), its
// relative L2 error within `tolerance` (printed as "[ tag ] name ..."), lse
// within 2e-3 (relative, at least absolute) and -inf exactly where the
// reference has it.
inline void expect_forward_matches(const HostForward& f, const ForwardCase& c, double tolerance, const std::string& tag,
                                   const std::string& name) {
  std::vector<double> got_o;
  for_each_index(f.o.view, [&](const std::array<int64_t, 4>& i) { got_o.push_back(element_as_double(f.o.view, i)); });
  int64_t not_finite = 0;
  for (double x : got_o) not_finite += std::isfinite(x) ? 0 : 1;
  EXPECT_EQ(not_finite, 0) << "o: elements left unwritten or not finite";
  int64_t gaps_written = 0;
  for_each_gap_element(f.o, [&](const std::array<int64_t, 4>& i) {
    gaps_written += std::isnan(element_as_double(f.o.buffer.tensor, i)) ? 0 : 1;
  });
  EXPECT_EQ(gaps_written, 0) << "o: the gaps between padded rows were written";
  const ErrorMetrics m = error_metrics(got_o, f.want_o);
  std::cout << "[ " << tag << " ] " << name << " o relative L2 " << m.relative_l2 << "\n";
  EXPECT_LE(m.relative_l2, tolerance);
  size_t r = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i, ++r) {
        const double got = element_as_double(f.lse.view, {b, h, i, 0});
        const double want = f.want_lse[r];
        if (std::isinf(want)) {
          EXPECT_EQ(got, want) << "lse row " << r;
        } else {
          EXPECT_NEAR(got, want, 2e-3 * std::max(1.0, std::fabs(want))) << "lse row " << r;
        }
      }
}

}  // namespace ffpa::testing
