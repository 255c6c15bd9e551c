// The CPU reference's backward pass (reference/cpu_attention_backward) against
// central finite differences of a naive forward written straight from the
// formula in double: the gradients of sum(O * G) + sum(LSE * GL) for random G
// and GL (half the cases without the LSE term), with respect
// to every element of Q, K and V, the sinks and (for additive masks) every
// score, on odd sizes with GQA, both causal alignments, boolean and additive
// masks with fully masked rows, dropout, a custom scale, sliding windows, the
// logit softcap and attention sinks. The naive forward shares only the
// definitions of which keys a row sees and of the keep mask (attended_keys,
// score_terms, philox) with the library.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/attention_problem.hpp"
#include "common/philox.hpp"
#include "reference/cpu_attention.hpp"
#include "reference/cpu_attention_backward.hpp"
#include "reference/score_terms.hpp"
#include "support/host_tensors.hpp"
#include "support/nonfinite_expectation.hpp"

namespace ffpa {
namespace {

using detail::AttentionProblem;
using detail::MaskKind;
using testing::HostTensor;

struct Case {
  std::string name;
  int64_t batch = 1, heads_q = 2, heads_kv = 2, seq_q = 5, seq_kv = 7, dim = 8;
  int64_t value_dim = 0;  // Dv of v, o and the loss's weights; 0: dim
  Causal causal = Causal::none;
  MaskKind mask = MaskKind::none;
  float dropout_p = 0.0f;
  double scale = 0.0;  // 0: 1 / sqrt(D)
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sinks = false;
};

// The inputs of a case as the library reads them (bf16), their values as
// doubles ([B, H, N, D] contiguous), and the loss's weights G.
struct Inputs {
  HostTensor q, k, v, mask;
  AttentionProblem problem;
  std::vector<double> qd, kd, vd, g;
  std::vector<double> gl;  // the loss's weights of the lse [B, Hq, Nq]; empty: no lse term
  std::vector<float> sinks;  // [Hq] (the problem's); empty: none
  std::vector<double> sd;    // the sinks as doubles
};

std::vector<double> as_doubles(const HostTensor& t) {
  std::vector<double> out;
  const auto& s = t.tensor.shape;
  for (int64_t a = 0; a < s[0]; ++a)
    for (int64_t b = 0; b < s[1]; ++b)
      for (int64_t c = 0; c < s[2]; ++c)
        for (int64_t d = 0; d < s[3]; ++d) out.push_back(testing::element_as_double(t.tensor, {a, b, c, d}));
  return out;
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  in.q = testing::make_host_tensor(DType::bf16, {c.batch, c.heads_q, c.seq_q, c.dim});
  in.k = testing::make_host_tensor(DType::bf16, {c.batch, c.heads_kv, c.seq_kv, c.dim});
  const int64_t dv = c.value_dim > 0 ? c.value_dim : c.dim;
  in.v = testing::make_host_tensor(DType::bf16, {c.batch, c.heads_kv, c.seq_kv, dv});
  testing::fill_uniform(in.q, seed + 1, -2.0f, 2.0f);
  testing::fill_uniform(in.k, seed + 2, -2.0f, 2.0f);
  testing::fill_uniform(in.v, seed + 3, -1.0f, 1.0f);
  AttentionProblem& p = in.problem;
  testing::set_problem_shape(p, c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_kv, c.dim, DType::bf16);
  testing::set_problem_qkv(p, in.q.tensor, in.k.tensor, in.v.tensor);
  p.value_dim = dv;
  p.scale = static_cast<float>(c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.dim)));
  p.causal = c.causal;
  p.dropout_p = c.dropout_p;
  p.dropout_threshold = detail::dropout_threshold(c.dropout_p);
  p.dropout_scale = c.dropout_p > 0.0f ? static_cast<float>(1.0 / (1.0 - static_cast<double>(c.dropout_p))) : 1.0f;
  p.dropout_seed = 0x9E3779B97F4A7C15ull * (seed + 1);
  p.dropout_offset = 0xD1B54A32D192ED03ull * (seed + 2);
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  if (c.sinks) {
    std::mt19937_64 sink_rng(seed + 6);
    std::uniform_real_distribution<float> logit(-1.0f, 2.0f);
    for (int64_t h = 0; h < c.heads_q; ++h) in.sinks.push_back(logit(sink_rng));
    in.sd.assign(in.sinks.begin(), in.sinks.end());
    p.sinks = in.sinks.data();  // the vector's buffer moves with it
    p.sinks_stride = 1;
  }
  p.mask_kind = c.mask;
  if (c.mask != MaskKind::none) {
    // [B, 1, Nq, Nkv]: row 1 of every batch excluded entirely (no attended key).
    const DType dtype = c.mask == MaskKind::boolean ? DType::boolean : DType::f32;
    in.mask = testing::make_host_tensor(dtype, {c.batch, 1, c.seq_q, c.seq_kv});
    if (c.mask == MaskKind::boolean) {
      testing::fill_bool(in.mask, seed + 4, 0.7);
    } else {
      testing::fill_uniform(in.mask, seed + 4, -2.0f, 2.0f);
      testing::set_element(in.mask.tensor, {0, 0, 0, 2}, -std::numeric_limits<double>::infinity());
    }
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t j = 0; j < c.seq_kv; ++j)
        testing::set_element(in.mask.tensor, {b, 0, 1, j},
                             c.mask == MaskKind::boolean ? 0.0 : -std::numeric_limits<double>::infinity());
    p.mask = in.mask.tensor.data;
    p.mask_stride[0] = in.mask.tensor.stride[0];
    p.mask_stride[1] = 0;
    p.mask_stride[2] = in.mask.tensor.stride[2];
    p.mask_stride[3] = in.mask.tensor.stride[3];
  }
  in.qd = as_doubles(in.q);
  in.kd = as_doubles(in.k);
  in.vd = as_doubles(in.v);
  std::mt19937_64 rng(seed + 5);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  in.g.resize(static_cast<size_t>(c.batch * c.heads_q * c.seq_q * dv));
  for (double& x : in.g) x = uniform(rng);
  if (seed % 20 == 1) {
    in.gl.resize(static_cast<size_t>(c.batch * c.heads_q * c.seq_q));
    for (double& x : in.gl) x = uniform(rng);
  }
  return in;
}

// sum(O * G) + sum(LSE * GL) from the formula (rows without a key or sink
// add no lse term), for the values q, k, v and sinks (doubles, [B, H, N, D]
// and [Hq]) and an extra term added to score (b, h, i, j) = `bumped` (for the
// scores' gradient).
double naive_loss(const Inputs& in, const std::vector<double>& q, const std::vector<double>& k,
                  const std::vector<double>& v, const std::vector<double>& sinks, int64_t bumped = -1,
                  double bump = 0.0) {
  const AttentionProblem& p = in.problem;
  const int64_t dim = p.head_dim, dv = p.dv(), nkv = p.seq_kv;
  const double inf = std::numeric_limits<double>::infinity();
  double loss = 0.0;
  std::vector<double> bias(static_cast<size_t>(nkv)), s(static_cast<size_t>(nkv));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t kvh = h / p.group_size();
      const double sink = sinks.empty() ? -inf : sinks[static_cast<size_t>(h)];
      for (int64_t i = 0; i < p.seq_q; ++i) {
        const detail::KeyRange keys = detail::attended_keys(p, i, p.seq_q, p.seq_kv);
        detail::mask_bias(p, b, h, i, keys.end, bias.data());
        double max_score = sink;
        for (int64_t j = keys.first; j < keys.end; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < dim; ++d)
            dot += q[((b * p.heads_q + h) * p.seq_q + i) * dim + d] * k[((b * p.heads_kv + kvh) * nkv + j) * dim + d];
          double x = p.scale * dot;
          if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
          s[j] = x + bias[j];
          if (((b * p.heads_q + h) * p.seq_q + i) * nkv + j == bumped) s[j] += bump;
          max_score = std::max(max_score, s[j]);
        }
        if (max_score == -inf) continue;
        double sum = sink == -inf ? 0.0 : std::exp(sink - max_score);
        for (int64_t j = keys.first; j < keys.end; ++j) sum += std::exp(s[j] - max_score);
        if (!in.gl.empty()) loss += (max_score + std::log(sum)) * in.gl[(b * p.heads_q + h) * p.seq_q + i];
        for (int64_t j = keys.first; j < keys.end; ++j) {
          double weight = std::exp(s[j] - max_score) / sum;
          if (p.has_dropout()) {
            const bool keep = detail::dropout_keep(p.dropout_seed, p.dropout_offset, b * p.heads_q + h, p.seq_q,
                                                   p.seq_kv, i, j, p.dropout_threshold);
            weight = keep ? weight * p.dropout_scale : 0.0;
          }
          for (int64_t d = 0; d < dv; ++d)
            loss += weight * v[((b * p.heads_kv + kvh) * nkv + j) * dv + d] *
                    in.g[((b * p.heads_q + h) * p.seq_q + i) * dv + d];
        }
      }
    }
  }
  return loss;
}

constexpr double kStep = 1e-5;

// The central difference of naive_loss along element e of input `which` (0 q, 1 k, 2 v, 3 the sinks).
double finite_difference(const Inputs& in, int which, size_t e) {
  std::vector<double> q = in.qd, k = in.kd, v = in.vd, sinks = in.sd;
  std::vector<double>& x = which == 0 ? q : which == 1 ? k : which == 2 ? v : sinks;
  const double x0 = x[e];
  x[e] = x0 + kStep;
  const double up = naive_loss(in, q, k, v, sinks);
  x[e] = x0 - kStep;
  const double down = naive_loss(in, q, k, v, sinks);
  return (up - down) / (2 * kStep);
}

void expect_close(double analytic, double numeric, const std::string& what) {
  EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::fabs(numeric))) << what;
}

void check_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(c.name);
  const Inputs in = make_inputs(c, seed);
  const AttentionProblem& p = in.problem;
  const double poison = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> dq(in.qd.size(), poison), dk(in.kd.size(), poison), dv(in.vd.size(), poison);
  std::vector<double> ds(static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.seq_kv), poison);
  std::vector<double> d_sinks(static_cast<size_t>(p.heads_q), poison);
  detail::cpu_attention_backward_f64(p, in.g.data(), in.gl.empty() ? nullptr : in.gl.data(),
                                     {dq.data(), dk.data(), dv.data(), ds.data(), d_sinks.data()}, 3);
  for (size_t e = 0; e < dq.size(); ++e) expect_close(dq[e], finite_difference(in, 0, e), "dQ " + std::to_string(e));
  for (size_t e = 0; e < dk.size(); ++e) expect_close(dk[e], finite_difference(in, 1, e), "dK " + std::to_string(e));
  for (size_t e = 0; e < dv.size(); ++e) expect_close(dv[e], finite_difference(in, 2, e), "dV " + std::to_string(e));
  for (size_t h = 0; h < in.sd.size(); ++h) expect_close(d_sinks[h], finite_difference(in, 3, h), "dSink " + std::to_string(h));
  for (size_t h = 0; in.sd.empty() && h < d_sinks.size(); ++h) EXPECT_EQ(d_sinks[h], 0.0) << "no sinks: a zero gradient";
  for (size_t e = 0; e < ds.size(); ++e) {
    const double numeric = (naive_loss(in, in.qd, in.kd, in.vd, in.sd, static_cast<int64_t>(e), kStep) -
                            naive_loss(in, in.qd, in.kd, in.vd, in.sd, static_cast<int64_t>(e), -kStep)) /
                           (2 * kStep);
    expect_close(ds[e], numeric, "dScores " + std::to_string(e));
  }
  // The forward reference agrees with the naive formula: sum(O * G) + sum(LSE * GL).
  std::vector<double> out(in.g.size(), poison), lse(static_cast<size_t>(p.batch * p.heads_q * p.seq_q), poison);
  detail::cpu_attention_forward_f64(p, {}, out.data(), lse.data(), 2);
  double loss = 0.0;
  for (size_t e = 0; e < out.size(); ++e) loss += out[e] * in.g[e];
  for (size_t r = 0; r < in.gl.size(); ++r)
    if (std::isfinite(lse[r])) loss += lse[r] * in.gl[r];
  EXPECT_NEAR(loss, naive_loss(in, in.qd, in.kd, in.vd, in.sd), 1e-9 * (1.0 + std::fabs(loss))) << "forward";
  if (c.mask != MaskKind::none) {  // the fully masked row 1: no gradient reaches its query
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t d = 0; d < p.head_dim; ++d) EXPECT_EQ(dq[((0 * p.heads_q + h) * p.seq_q + 1) * p.head_dim + d], 0.0);
  }
}

TEST(CpuReferenceBackward, GradientsMatchFiniteDifferences) {
  std::vector<Case> cases;
  cases.push_back({"mha"});
  Case gqa{"gqa 4:2, causal top-left, two batches"};
  gqa.batch = 2, gqa.heads_q = 4, gqa.heads_kv = 2, gqa.seq_q = 6, gqa.seq_kv = 6, gqa.causal = Causal::top_left;
  cases.push_back(gqa);
  Case bottom{"causal bottom-right, Nq < Nkv, MQA"};
  bottom.heads_q = 3, bottom.heads_kv = 1, bottom.seq_q = 3, bottom.seq_kv = 7, bottom.causal = Causal::bottom_right;
  cases.push_back(bottom);
  Case empty_rows{"causal bottom-right, Nq > Nkv (rows with no key)"};
  empty_rows.seq_q = 6, empty_rows.seq_kv = 4, empty_rows.causal = Causal::bottom_right;
  cases.push_back(empty_rows);
  Case boolean{"boolean mask [B,1,Nq,Nkv], a row fully masked"};
  boolean.mask = MaskKind::boolean;
  cases.push_back(boolean);
  Case additive{"additive f32 mask with -inf, a row fully masked, D 16"};
  additive.mask = MaskKind::additive_f32, additive.dim = 16;
  cases.push_back(additive);
  Case dropout{"dropout 0.3, gqa 2:1"};
  dropout.dropout_p = 0.3f, dropout.heads_kv = 1, dropout.seq_q = 4, dropout.seq_kv = 9;
  cases.push_back(dropout);
  Case wide_v{"Dv 24 > D 8, gqa 2:1, causal bottom-right"};
  wide_v.value_dim = 24, wide_v.heads_kv = 1, wide_v.causal = Causal::bottom_right;
  cases.push_back(wide_v);
  Case narrow_v{"Dv 8 < D 16, additive mask"};
  narrow_v.dim = 16, narrow_v.value_dim = 8, narrow_v.mask = MaskKind::additive_f32;
  cases.push_back(narrow_v);
  Case scaled{"scale 0.7, causal top-left, Nq > Nkv"};
  scaled.scale = 0.7, scaled.causal = Causal::top_left, scaled.seq_q = 7, scaled.seq_kv = 5;
  cases.push_back(scaled);
  Case window{"window (2, 1), gqa 2:1, Nq < Nkv"};
  window.window_left = 2, window.window_right = 1, window.heads_kv = 1, window.seq_q = 5, window.seq_kv = 9;
  cases.push_back(window);
  Case causal_window{"causal bottom-right with a left window 3, additive mask"};
  causal_window.causal = Causal::bottom_right, causal_window.window_left = 3, causal_window.mask = MaskKind::additive_f32;
  cases.push_back(causal_window);
  Case right_window{"window (-1, 0), Nq > Nkv: rows without a key"};
  right_window.window_right = 0, right_window.seq_q = 8, right_window.seq_kv = 4;
  cases.push_back(right_window);
  Case sinks{"sinks, causal top-left, gqa 4:2, Nq > Nkv (rows whose only weight is the sink)"};
  sinks.sinks = true, sinks.causal = Causal::top_left, sinks.heads_q = 4, sinks.seq_q = 6, sinks.seq_kv = 4;
  cases.push_back(sinks);
  Case sinks_dropout{"sinks, dropout 0.25, window (1, 1)"};
  sinks_dropout.sinks = true, sinks_dropout.dropout_p = 0.25f, sinks_dropout.window_left = 1;
  sinks_dropout.window_right = 1;
  cases.push_back(sinks_dropout);
  Case softcap{"softcap 2, scale 0.9, causal bottom-right"};
  softcap.softcap = 2.0f, softcap.scale = 0.9, softcap.causal = Causal::bottom_right;
  cases.push_back(softcap);
  Case softcap_mask{"softcap 1.5, additive mask, sinks, Dv 16"};
  softcap_mask.softcap = 1.5f, softcap_mask.mask = MaskKind::additive_f32, softcap_mask.sinks = true;
  softcap_mask.value_dim = 16;
  cases.push_back(softcap_mask);
  uint64_t seed = 11;  // seeds 21, 41, ... have an lse term (seed % 20 == 1), 31, 51, ... none
  for (const Case& c : cases) check_case(c, seed += 10);
}

// NaN inputs (spec.md, "Non-finite inputs"): a row whose forward is NaN
// passes it to its dQ and to dK and dV of every key in its reach; a row whose
// O has a NaN column (a v NaN) to its dQ and those keys' dK (delta is NaN)
// but not dV; rows masking empties give nothing. Every other gradient element
// is bit-identical to the run without the NaN.
TEST(CpuReferenceBackward, NanInputsReachTheGradientsTheyTouch) {
  const double nan = std::nan("");
  for (const Causal causal : {Causal::none, Causal::top_left}) {
    for (const MaskKind mask : {MaskKind::none, MaskKind::boolean}) {
      for (int which = 0; which < 3; ++which) {
        Case c{"nan"};
        c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.seq_q = 9, c.seq_kv = 11, c.dim = 16;
        c.causal = causal, c.mask = mask;
        SCOPED_TRACE(std::string("causal ") + std::to_string(static_cast<int>(causal)) + " mask " +
                     std::to_string(static_cast<int>(mask)) + " NaN in " + "qkv"[which]);
        const Inputs clean = make_inputs(c, 77);
        Inputs in = make_inputs(c, 77);
        if (which == 0) testing::set_element(in.q.tensor, {1, 3, 4, 2}, nan);
        if (which == 1) testing::set_element(in.k.tensor, {0, 1, 5, 9}, nan);
        if (which == 2) testing::set_element(in.v.tensor, {1, 0, 3, 6}, nan);
        const AttentionProblem& p = in.problem;
        const testing::ForwardExpectation fwd = testing::expect_forward_nans(p, 0);
        const testing::BackwardExpectation want = testing::expect_backward_nans(p, fwd, 0);
        auto run = [&](const Inputs& inputs) {
          std::vector<double> d_q(in.qd.size()), d_k(in.kd.size()), d_v(in.vd.size());
          detail::cpu_attention_backward_f64(inputs.problem, inputs.g.data(), nullptr,
                                             {d_q.data(), d_k.data(), d_v.data()});
          return std::array<std::vector<double>, 3>{d_q, d_k, d_v};
        };
        const auto got = run(in), base = run(clean);
        int64_t nans = 0;
        for (const auto* expect : {&want.d_q, &want.d_k, &want.d_v})
          nans += std::count(expect->begin(), expect->end(), testing::Expect::nan);
        EXPECT_GT(nans, 0);
        EXPECT_EQ(testing::count_off(want.d_q, got[0], base[0], "d_q"), 0);
        EXPECT_EQ(testing::count_off(want.d_k, got[1], base[1], "d_k"), 0);
        EXPECT_EQ(testing::count_off(want.d_v, got[2], base[2], "d_v"), 0);
      }
    }
  }
}

TEST(CpuReferenceBackward, ThreadCountDoesNotChangeAnyBit) {
  Case c{"gqa"};
  c.batch = 2, c.heads_q = 4, c.heads_kv = 2, c.seq_q = 9, c.seq_kv = 11, c.dim = 24, c.dropout_p = 0.2f;
  c.sinks = true, c.window_left = 5;
  const Inputs in = make_inputs(c, 99);
  const AttentionProblem& p = in.problem;
  auto run = [&](int threads) {
    std::vector<double> all(in.qd.size() + 2 * in.kd.size() + in.sd.size());
    double* const d_k = all.data() + in.qd.size();
    detail::cpu_attention_backward_f64(p, in.g.data(), nullptr,
                                       {all.data(), d_k, d_k + in.kd.size(), nullptr, d_k + 2 * in.kd.size()}, threads);
    return all;
  };
  const std::vector<double> one = run(1);
  for (int threads : {2, 3, 8}) EXPECT_EQ(run(threads), one) << threads << " threads";
}

}  // namespace
}  // namespace ffpa
