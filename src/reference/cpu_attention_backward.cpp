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
#include <cmath>
#include <limits>
#include <vector>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "reference/parallel_for.hpp"
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

// One worker's buffers: its unit's K and V rows, a query row, a mask row, and
// per key the softmax weight p_j, the kept factor z_j and dp_j.
struct Unit {
  std::vector<double> k, v, q, bias, p, z, dp;
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
        u.p[j] = scale * dot + u.bias[j];
        max_score = std::max(max_score, u.p[j]);
      }
      if (max_score == -std::numeric_limits<double>::infinity()) continue;  // no key attended: O = 0, no gradient
      double denominator = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        u.p[j] = std::exp(u.p[j] - max_score);
        denominator += u.p[j];
      }
      double delta = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        u.p[j] /= denominator;
        if (p.has_dropout()) {
          const bool keep =
              dropout_keep(p.dropout_seed, p.dropout_offset, b * p.heads_q + h, p.seq_q, nkv, i, j, p.dropout_threshold);
          u.z[j] = keep ? static_cast<double>(p.dropout_scale) : 0.0;
        } else {
          u.z[j] = 1.0;
        }
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += go[d] * u.v[j * dim + d];
        u.dp[j] = dot;
        delta += u.p[j] * u.z[j] * dot;
      }
      for (int64_t j = 0; j < visible; ++j) {
        const double a = u.p[j] * u.z[j];
        const double ds = u.p[j] * (u.z[j] * u.dp[j] - delta);
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
  const int workers = static_cast<int>(std::min<int64_t>(resolve_threads(num_threads), units));
  std::vector<Unit> scratch(static_cast<size_t>(workers));
  for (Unit& u : scratch) {
    u.k.resize(static_cast<size_t>(p.seq_kv * p.head_dim));
    u.v.resize(u.k.size());
    u.q.resize(static_cast<size_t>(p.head_dim));
    for (std::vector<double>* per_key : {&u.bias, &u.p, &u.z, &u.dp}) per_key->resize(static_cast<size_t>(p.seq_kv));
  }
  parallel_for(units, workers, [&](int worker, int64_t unit) {
    backward_unit(p, d_out, grads, unit / p.heads_kv, unit % p.heads_kv, scratch[static_cast<size_t>(worker)]);
  });
}

}  // namespace ffpa::detail
