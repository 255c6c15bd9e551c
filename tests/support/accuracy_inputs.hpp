// Attention inputs for accuracy measurements of the quantized path (the CPU
// tests and ffpa-fp8-accuracy): randn q, k, v, or "LLM-like" ones (K with
// per-channel offsets of 10-20x its spread, a few large Q channels: what
// smooth-K exists for), rounded to the dtype, in a problem the CPU reference
// and the FP8 model both read. Header-only.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/attention_problem.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

enum class InputKind { randn, llm_like };

inline const char* input_kind_name(InputKind kind) { return kind == InputKind::randn ? "randn" : "LLM-like"; }

struct AccuracyCase {
  int64_t batch = 1, heads_q = 2, heads_kv = 2, seq_q = 256, seq_kv = 256, dim = 128;
  DType dtype = DType::bf16;
  Causal causal = Causal::none;
  InputKind kind = InputKind::randn;
  uint64_t seed = 1;
  Layout layout = Layout::bhnd;  // of q, k and v (the values do not depend on it)
};

// The LLM-like shape of the inputs.
inline constexpr double kKeyOffsetMin = 10.0, kKeyOffsetMax = 20.0;  // |per-channel K offset|, in K's spreads
inline constexpr int kLargeQueryChannels = 4;                         // Q channels scaled up ...
inline constexpr double kLargeQueryFactor = 8.0;                      // ... by this factor

struct AccuracyInputs {
  HostTensor q, k, v;
  detail::AttentionProblem problem;  // o is null: for the f64 entry points
};

// Normal values (mean + stddev * N(0, 1), per channel where given), rounded to
// the dtype, over a contiguous [B, H, N, D] tensor.
inline void fill_normal(HostTensor& t, uint64_t seed, const std::vector<double>& channel_mean,
                        const std::vector<double>& channel_stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> draw(0.0, 1.0);
  const Tensor& x = t.tensor;
  const int64_t dim = x.shape[3];
  for (int64_t b = 0; b < x.shape[0]; ++b) {
    for (int64_t h = 0; h < x.shape[1]; ++h) {
      for (int64_t n = 0; n < x.shape[2]; ++n) {
        for (int64_t d = 0; d < dim; ++d) {
          const size_t channel = static_cast<size_t>(d);
          set_element(x, {b, h, n, d}, channel_mean[channel] + channel_stddev[channel] * draw(rng));
        }
      }
    }
  }
}

inline AccuracyInputs make_accuracy_inputs(const AccuracyCase& c) {
  AccuracyInputs in;
  in.q = make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim}, c.layout);
  in.k = make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, c.layout);
  in.v = make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, c.layout);
  const std::vector<double> zero(c.dim, 0.0), one(c.dim, 1.0);
  std::vector<double> key_mean = zero, query_stddev = one;
  if (c.kind == InputKind::llm_like) {
    std::mt19937_64 rng(c.seed * 5 + 4);
    std::uniform_real_distribution<double> offset(kKeyOffsetMin, kKeyOffsetMax);
    for (double& m : key_mean) m = (rng() & 1) != 0 ? offset(rng) : -offset(rng);
    for (int64_t d = 0; d < kLargeQueryChannels && d < c.dim; ++d) query_stddev[(d * 37) % c.dim] = kLargeQueryFactor;
  }
  fill_normal(in.q, c.seed * 5 + 1, zero, query_stddev);
  fill_normal(in.k, c.seed * 5 + 2, key_mean, one);
  fill_normal(in.v, c.seed * 5 + 3, zero, one);

  detail::AttentionProblem& p = in.problem;
  set_problem_shape(p, c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_kv, c.dim, c.dtype);
  set_problem_qkv(p, in.q.tensor, in.k.tensor, in.v.tensor);
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dim)));
  p.causal = c.causal;
  return in;
}

}  // namespace ffpa::testing
