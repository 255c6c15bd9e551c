// A sequence batch's backward call on host memory for tests (packed training,
// docs/serving.md): a ServingCase's forward (the CPU reference writes o and
// lse), random d_o and d_lse, the gradients poisoned with NaN, and its
// ffpa::BackwardParams; d_o and d_lse rows of no sequence are NaN too, so a
// gradient that reads them shows. The fp64 oracle's loss (serving_inputs.hpp)
// for finite differences; the CPU reference's gradients in double for the
// kernels' checks, and the check itself: every row a sequence owns against
// the reference (relative L2), every other row still NaN.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "common/backward_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention_backward.hpp"
#include "support/error_metrics.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa::testing {

struct ServingBackward {
  ServingInputs in;
  HostTensor d_o, d_lse, d_q, d_k, d_v, d_sinks;
  BackwardParams params;

  // The rows sequence b owns: queries of q_entry from q_first, keys of k_entry from k_first.
  int64_t q_entry(int64_t b) const { return in.c.packed_q ? 0 : b; }
  int64_t k_entry(int64_t b) const { return in.c.keys == KeyForm::packed ? 0 : b; }
};

// Whether row n of entry e of a query-shaped (or key-shaped) tensor belongs to a sequence.
inline bool owned_query_row(const ServingBackward& s, int64_t e, int64_t n) {
  for (int64_t b = 0; b < s.in.c.batch(); ++b)
    if (s.q_entry(b) == e && n >= s.in.q_begin[b] && n < s.in.q_begin[b] + s.in.c.seq_q[b]) return true;
  return false;
}
inline bool owned_key_row(const ServingBackward& s, int64_t e, int64_t n) {
  for (int64_t b = 0; b < s.in.c.batch(); ++b)
    if (s.k_entry(b) == e && n >= s.in.k_begin[b] && n < s.in.k_begin[b] + s.in.c.seq_kv[b]) return true;
  return false;
}

// Sets every element of rows no sequence owns to NaN.
inline void poison_unowned_query_rows(const ServingBackward& s, const Tensor& t) {
  for (int64_t e = 0; e < t.shape[0]; ++e)
    for (int64_t n = 0; n < t.shape[2]; ++n)
      if (!owned_query_row(s, e, n))
        for (int64_t h = 0; h < t.shape[1]; ++h)
          for (int64_t d = 0; d < (t.rank == 4 ? t.shape[3] : 1); ++d)
            set_element(t, {e, h, n, d}, std::numeric_limits<double>::quiet_NaN());
}

// A tensor of t's logical shape (rank 3 or 4) and dtype, rows [B, N, H, D] in memory, NaN-filled.
inline HostTensor poisoned_like(const Tensor& t) {
  HostTensor out = t.rank == 3 ? make_host_lse(t.shape[0], t.shape[1], t.shape[2])
                               : make_host_tensor(t.dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]},
                                                  Layout::bnhd);
  fill_nan(out);
  return out;
}

// c: packed or batched keys (a paged cache has no backward), 16-bit or wider
// dtype, c.lse true. Runs the forward on the CPU reference.
inline void make_serving_backward(const ServingCase& c, bool with_d_lse, bool with_d_sinks, ServingBackward* s) {
  ASSERT_NE(c.keys, KeyForm::paged);
  ASSERT_TRUE(c.lse);
  s->in = make_serving_inputs(c);
  ServingInputs& in = s->in;
  in.params.sequences = &in.batch;  // the moved batch
  {
    const Status status = forward(in.params);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  s->d_o = poisoned_like(in.o.tensor);
  fill_uniform(s->d_o, c.seed * 13 + 1, -1.0f, 1.0f);
  poison_unowned_query_rows(*s, s->d_o.tensor);
  if (with_d_lse) {
    s->d_lse = poisoned_like(in.lse.tensor);
    fill_uniform(s->d_lse, c.seed * 13 + 2, -1.0f, 1.0f);
    poison_unowned_query_rows(*s, s->d_lse.tensor);
  }
  s->d_q = poisoned_like(in.q.tensor);
  s->d_k = poisoned_like(in.k);
  s->d_v = poisoned_like(in.v);
  BackwardParams& p = s->params;
  p = BackwardParams{};
  p.q = in.q.tensor, p.k = in.k, p.v = in.v, p.o = in.o.tensor, p.lse = in.lse.tensor;
  p.d_o = s->d_o.tensor, p.d_q = s->d_q.tensor, p.d_k = s->d_k.tensor, p.d_v = s->d_v.tensor;
  if (with_d_lse) p.d_lse = s->d_lse.tensor;
  p.options = in.params.options;
  p.sequences = &in.batch;
  if (c.sinks) {
    p.sinks = in.sinks.tensor;
    if (with_d_sinks) {
      const int64_t shape[1] = {c.heads_q};
      s->d_sinks = host_tensor_detail::allocate(DType::f32, 1, shape);
      fill_nan(s->d_sinks);
      p.d_sinks = s->d_sinks.tensor;
    }
  }
}

// The loss whose gradients the call computes: sum(O * d_o) + sum(LSE * d_lse)
// over every row of every sequence (rows without a key or sink: no lse
// term), from the fp64 oracle on the inputs' current values.
inline double serving_loss(const ServingBackward& s) {
  const ServingCase& c = s.in.c;
  double loss = 0.0;
  for (int64_t b = 0; b < c.batch(); ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q[b]; ++i) {
        const OracleRow row = serving_oracle_row(s.in, b, h, i);
        const int64_t e = s.q_entry(b), n = s.in.q_begin[b] + i;
        for (int64_t d = 0; d < c.value_dim; ++d) loss += row.out[d] * element_as_double(s.d_o.tensor, {e, h, n, d});
        if (s.params.d_lse.data && std::isfinite(row.lse)) loss += row.lse * element_as_double(s.d_lse.tensor, {e, h, n, 0});
      }
  return loss;
}

// The CPU reference's gradients in double, in the tensors' extents
// (cpu_attention_backward_f64), and the sinks'.
struct ServingGradients {
  std::vector<double> d_q, d_k, d_v, d_sinks;
  detail::RowExtent q_extent, k_extent;
};

inline std::vector<double> extent_values(const Tensor& t, detail::RowExtent x, int64_t heads, int64_t dim) {
  std::vector<double> out;
  for (int64_t e = 0; e < x.entries; ++e)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t n = 0; n < x.rows; ++n)
        for (int64_t d = 0; d < dim; ++d) out.push_back(element_as_double(t, {e, h, n, d}));
  return out;
}

inline ServingGradients serving_reference_gradients(const ServingBackward& s) {
  detail::BackwardProblem problem;
  {
    const Status status = detail::validate_backward(s.params, &problem);
    EXPECT_TRUE(status.ok()) << status.message;
  }
  const detail::AttentionProblem& p = problem.forward;
  ServingGradients g;
  g.q_extent = detail::query_extent(p), g.k_extent = detail::key_extent(p);
  const std::vector<double> d_out = extent_values(s.d_o.tensor, g.q_extent, p.heads_q, p.dv());
  std::vector<double> d_lse;
  if (s.params.d_lse.data) d_lse = extent_values(s.d_lse.tensor, g.q_extent, p.heads_q, 1);
  g.d_q.assign(static_cast<size_t>(g.q_extent.entries * p.heads_q * g.q_extent.rows * p.head_dim), 0.0);
  g.d_k.assign(static_cast<size_t>(g.k_extent.entries * p.heads_kv * g.k_extent.rows * p.head_dim), 0.0);
  g.d_v.assign(static_cast<size_t>(g.k_extent.entries * p.heads_kv * g.k_extent.rows * p.dv()), 0.0);
  g.d_sinks.assign(static_cast<size_t>(p.heads_q), 0.0);
  detail::cpu_attention_backward_f64(p, d_out.data(), d_lse.empty() ? nullptr : d_lse.data(),
                                     {g.d_q.data(), g.d_k.data(), g.d_v.data(), nullptr, g.d_sinks.data()});
  return g;
}

// What a run wrote into s's gradients: every row a sequence owns finite and
// within `tolerance` (relative L2 per gradient) of the reference, every
// other row NaN; d_sinks (when requested) within `tolerance` relative to
// its largest element.
inline void check_serving_gradients(const ServingBackward& s, const ServingGradients& want, double tolerance,
                                    const std::string& label) {
  const ServingCase& c = s.in.c;
  struct Checked {
    const char* name;
    const Tensor* got;
    const std::vector<double>* want;
    detail::RowExtent extent;
    int64_t heads, dim;
    bool queries;
  };
  for (const Checked& g : {Checked{"d_q", &s.d_q.tensor, &want.d_q, want.q_extent, c.heads_q, c.dim, true},
                           Checked{"d_k", &s.d_k.tensor, &want.d_k, want.k_extent, c.heads_kv, c.dim, false},
                           Checked{"d_v", &s.d_v.tensor, &want.d_v, want.k_extent, c.heads_kv, c.value_dim, false}}) {
    std::vector<double> got_owned, want_owned;
    int64_t not_finite = 0, unowned_written = 0;
    size_t e = 0;
    for (int64_t entry = 0; entry < g.extent.entries; ++entry)
      for (int64_t h = 0; h < g.heads; ++h)
        for (int64_t n = 0; n < g.extent.rows; ++n) {
          const bool owned = g.queries ? owned_query_row(s, entry, n) : owned_key_row(s, entry, n);
          for (int64_t d = 0; d < g.dim; ++d, ++e) {
            const double x = element_as_double(*g.got, {entry, h, n, d});
            if (!owned) {
              unowned_written += std::isnan(x) ? 0 : 1;
              continue;
            }
            not_finite += std::isfinite(x) ? 0 : 1;
            got_owned.push_back(x);
            want_owned.push_back((*g.want)[e]);
          }
        }
    EXPECT_EQ(not_finite, 0) << g.name << ": elements of a sequence's rows unwritten or not finite";
    EXPECT_EQ(unowned_written, 0) << g.name << ": rows of no sequence were written";
    double norm = 0.0;
    for (double x : want_owned) norm += x * x;
    if (norm == 0.0) continue;  // e.g. every sequence empty
    const ErrorMetrics m = error_metrics(got_owned, want_owned);
    std::cout << "[ " << label << " ] " << c.describe() << " " << g.name << " relative L2 " << m.relative_l2 << "\n";
    EXPECT_LE(m.relative_l2, tolerance) << g.name;
  }
  if (!s.params.d_sinks.data) return;
  double largest = 1e-30;
  for (double x : want.d_sinks) largest = std::max(largest, std::fabs(x));
  for (int64_t h = 0; h < c.heads_q; ++h)
    EXPECT_NEAR(element_as_double(s.d_sinks.tensor, {h, 0, 0, 0}), want.d_sinks[static_cast<size_t>(h)],
                tolerance * largest)
        << "d_sinks[" << h << "]";
}

}  // namespace ffpa::testing
