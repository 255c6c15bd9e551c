// The backward pass in double, a (batch, KV head) unit per task: the unit owns
// its K and V rows' gradients and its query heads' Q rows, so the tasks write
// disjoint elements and need no atomics, and each gradient is summed in one
// fixed order whatever the thread count. Per query row i, with p the softmax
// of s = scale * q k^T + mask, z the kept elements' factor (dropout_scale or 0,
// 1 without dropout) and g = d_out row i:
//   a_j = p_j z_j              (O_i = sum_j a_j v_j)
//   dp_j = g . v_j,  delta = sum_j a_j dp_j = g . O_i
//   ds_j = p_j (z_j dp_j - delta)
//   d_v_j += a_j g,  d_q_i += scale sum_j ds_j k_j,  d_k_j += scale ds_j q_i
#include "reference/cpu_attention_backward.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "reference/score_terms.hpp"

namespace ffpa::detail {
namespace {

double element(const AttentionProblem& p, const void* base, int64_t offset) {
  const uint16_t bits = static_cast<const uint16_t*>(base)[offset];
  return p.dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}

// Row (b, h, n) of q (kind 0), k (1) or v (2), as doubles.
void load_row(const AttentionProblem& p, int kind, int64_t b, int64_t h, int64_t n, double* row) {
  const void* base = kind == 0 ? p.q : kind == 1 ? p.k : p.v;
  const int64_t* stride = kind == 0 ? p.q_stride : kind == 1 ? p.k_stride : p.v_stride;
  const int64_t offset = b * stride[0] + h * stride[1] + n * stride[2];
  for (int64_t d = 0; d < p.head_dim; ++d) row[d] = element(p, base, offset + d);
}

struct Unit {
  std::vector<double> k, v, q, bias, score;
};

void backward_unit(const AttentionProblem& p, const double* d_out, const AttentionGradients& g, int64_t b,
                   int64_t kv_head, Unit& u) {
  const int64_t dim = p.head_dim, nkv = p.seq_kv, group = p.group_size();
  for (int64_t j = 0; j < nkv; ++j) {
    load_row(p, 1, b, kv_head, j, u.k.data() + j * dim);
    load_row(p, 2, b, kv_head, j, u.v.data() + j * dim);
  }
  double* const d_k = g.d_k + (b * p.heads_kv + kv_head) * nkv * dim;
  double* const d_v = g.d_v + (b * p.heads_kv + kv_head) * nkv * dim;
  std::fill(d_k, d_k + nkv * dim, 0.0);
  std::fill(d_v, d_v + nkv * dim, 0.0);
  const double scale = p.scale;
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    const uint64_t head_word = dropout_head_word(p.dropout_offset, static_cast<uint64_t>(b * p.heads_q + h),
                                                 static_cast<uint64_t>(p.seq_q), static_cast<uint64_t>(nkv));
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
      const double* const go = d_out + row * dim;
      double* const d_q = g.d_q + row * dim;
      double* const d_s = g.d_scores != nullptr ? g.d_scores + row * nkv : nullptr;
      std::fill(d_q, d_q + dim, 0.0);
      if (d_s != nullptr) std::fill(d_s, d_s + nkv, 0.0);
      load_row(p, 0, b, h, i, u.q.data());
      const int64_t visible = visible_keys(p, i);
      mask_bias(p, b, h, i, visible, u.bias.data());
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += u.q[d] * u.k[j * dim + d];
        u.score[j] = scale * dot + u.bias[j];
        max_score = std::max(max_score, u.score[j]);
      }
      if (max_score == -std::numeric_limits<double>::infinity()) continue;  // no key attended: O = 0, no gradient
      double denominator = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        u.score[j] = std::exp(u.score[j] - max_score);
        denominator += u.score[j];
      }
      // u.score becomes p_j; the kept factor z_j and dp_j are recomputed where used.
      for (int64_t j = 0; j < visible; ++j) u.score[j] /= denominator;
      auto kept = [&](int64_t j) {
        if (!p.has_dropout()) return 1.0;
        const uint64_t word =
            dropout_word(head_word, static_cast<uint32_t>(i), static_cast<uint32_t>(nkv), static_cast<uint32_t>(j));
        return dropout_draw(p.dropout_seed, word) >= p.dropout_threshold ? static_cast<double>(p.dropout_scale) : 0.0;
      };
      auto dot_v = [&](int64_t j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += go[d] * u.v[j * dim + d];
        return dot;
      };
      double delta = 0.0;
      for (int64_t j = 0; j < visible; ++j) delta += u.score[j] * kept(j) * dot_v(j);
      for (int64_t j = 0; j < visible; ++j) {
        const double z = kept(j), a = u.score[j] * z;
        const double ds = u.score[j] * (z * dot_v(j) - delta);
        if (d_s != nullptr) d_s[j] = ds;
        for (int64_t d = 0; d < dim; ++d) {
          d_v[j * dim + d] += a * go[d];
          d_q[d] += scale * ds * u.k[j * dim + d];
          d_k[j * dim + d] += scale * ds * u.q[d];
        }
      }
    }
  }
}

}  // namespace

void cpu_attention_backward_f64(const AttentionProblem& p, const double* d_out, const AttentionGradients& grads,
                                int num_threads) {
  const int64_t units = p.batch * p.heads_kv;
  if (units <= 0) return;
  const int threads =
      num_threads > 0 ? num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int workers = static_cast<int>(std::min<int64_t>(threads, units));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    Unit u;
    u.k.resize(static_cast<size_t>(p.seq_kv * p.head_dim));
    u.v.resize(u.k.size());
    u.q.resize(static_cast<size_t>(p.head_dim));
    u.bias.resize(static_cast<size_t>(p.seq_kv));
    u.score.resize(static_cast<size_t>(p.seq_kv));
    for (int64_t unit = next++; unit < units; unit = next++) {
      backward_unit(p, d_out, grads, unit / p.heads_kv, unit % p.heads_kv, u);
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (int t = 1; t < workers; ++t) helpers.emplace_back(work);
  } catch (const std::system_error&) {
    // The system refused another thread: the ones already running do the work.
  }
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace ffpa::detail
