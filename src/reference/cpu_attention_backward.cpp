// The backward pass in double, a (batch, KV head) unit per task: the unit owns
// its K and V rows' gradients and its query heads' Q rows, so the tasks write
// disjoint elements and need no atomics, and each gradient is summed in one
// fixed order whatever the thread count. Per query row i, with p the softmax
// of s = scale * q k^T + mask, z the kept elements' factor (dropout_scale or 0,
// 1 without dropout) and g = d_out row i:
//   a_j = p_j z_j              (O_i = sum_j a_j v_j)
//   dp_j = g . v_j,  delta = sum_j a_j dp_j = g . O_i
//   ds_j = p_j (z_j dp_j - delta + gl_i)    (gl_i: the gradient of lse_i, as
//                                            d lse_i / d s_j = p_j)
//   d_v_j += a_j g,  d_q_i += scale sum_j ds_j k_j,  d_k_j += scale ds_j q_i
#include "reference/cpu_attention_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "reference/element_io.hpp"
#include "reference/parallel_for.hpp"
#include "reference/score_terms.hpp"

namespace ffpa::detail {
namespace {

double element(const AttentionProblem& p, const void* base, int64_t offset) {
  return load_element(p.dtype, base, offset);
}

// Row (b, h, n) of q (kind 0), k (1) or v (2), as doubles.
void load_row(const AttentionProblem& p, int kind, int64_t b, int64_t h, int64_t n, double* row) {
  const void* base = kind == 0 ? p.q : kind == 1 ? p.k : p.v;
  const int64_t* stride = kind == 0 ? p.q_stride : kind == 1 ? p.k_stride : p.v_stride;
  const int64_t offset = b * stride[0] + h * stride[1] + n * stride[2];
  const int64_t dim = kind == 2 ? p.dv() : p.head_dim;
  for (int64_t d = 0; d < dim; ++d) row[d] = element(p, base, offset + d);
}

// One worker's buffers: its unit's K and V rows, a query row, a mask row, and
// per key the softmax weight p_j, the kept factor z_j and dp_j.
struct Unit {
  std::vector<double> k, v, q, bias, p, z, dp;
};

void backward_unit(const AttentionProblem& p, const double* d_out, const double* d_lse, const AttentionGradients& g,
                   int64_t b, int64_t kv_head, Unit& u) {
  const int64_t dim = p.head_dim, dv = p.dv(), nkv = p.seq_kv, group = p.group_size();
  for (int64_t j = 0; j < nkv; ++j) {
    load_row(p, 1, b, kv_head, j, u.k.data() + j * dim);
    load_row(p, 2, b, kv_head, j, u.v.data() + j * dv);
  }
  double* const d_k = g.d_k + (b * p.heads_kv + kv_head) * nkv * dim;
  double* const d_v = g.d_v + (b * p.heads_kv + kv_head) * nkv * dv;
  std::fill(d_k, d_k + nkv * dim, 0.0);
  std::fill(d_v, d_v + nkv * dv, 0.0);
  const double scale = p.scale;
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
      const double* const go = d_out + row * dv;
      double* const d_q = g.d_q + row * dim;
      double* const d_s = g.d_scores != nullptr ? g.d_scores + row * nkv : nullptr;
      std::fill(d_q, d_q + dim, 0.0);
      if (d_s != nullptr) std::fill(d_s, d_s + nkv, 0.0);
      load_row(p, 0, b, h, i, u.q.data());
      const int64_t visible = visible_keys(p, i);
      mask_bias(p, b, h, i, visible, u.bias.data());
      double max_score = -std::numeric_limits<double>::infinity();
      bool nan_score = false;
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += u.q[d] * u.k[j * dim + d];
        u.p[j] = scale * dot + u.bias[j];
        nan_score |= std::isnan(u.p[j]);
        max_score = std::max(max_score, u.p[j]);  // a NaN does not count
      }
      // No key attended: O = 0, no gradient. A NaN score makes the row's
      // denominator and so every p_j of it NaN (the forward's NaN row), and
      // from there dQ_i and the dK, dV rows of every key in its reach.
      if (max_score == -std::numeric_limits<double>::infinity() && !nan_score) continue;
      double denominator = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        u.p[j] = std::exp(u.p[j] - max_score);
        denominator += u.p[j];
      }
      double delta = 0.0;
      const double lse_weight = d_lse != nullptr ? d_lse[row] : 0.0;
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
        for (int64_t d = 0; d < dv; ++d) dot += go[d] * u.v[j * dv + d];
        u.dp[j] = dot;
        delta += u.p[j] * u.z[j] * dot;
      }
      for (int64_t j = 0; j < visible; ++j) {
        const double a = u.p[j] * u.z[j];
        const double ds = u.p[j] * (u.z[j] * u.dp[j] - delta + lse_weight);
        if (d_s != nullptr) d_s[j] = ds;
        for (int64_t d = 0; d < dv; ++d) d_v[j * dv + d] += a * go[d];
        for (int64_t d = 0; d < dim; ++d) {
          d_q[d] += scale * ds * u.k[j * dim + d];
          d_k[j * dim + d] += scale * ds * u.q[d];
        }
      }
    }
  }
}

}  // namespace

void cpu_attention_backward_f64(const AttentionProblem& p, const double* d_out, const double* d_lse,
                                const AttentionGradients& grads, int num_threads) {
  const int64_t units = p.batch * p.heads_kv;
  if (units <= 0) return;
  const int workers = static_cast<int>(std::min<int64_t>(resolve_threads(num_threads), units));
  std::vector<Unit> scratch(static_cast<size_t>(workers));
  for (Unit& u : scratch) {
    u.k.resize(static_cast<size_t>(p.seq_kv * p.head_dim));
    u.v.resize(static_cast<size_t>(p.seq_kv * p.dv()));
    u.q.resize(static_cast<size_t>(p.head_dim));
    for (std::vector<double>* per_key : {&u.bias, &u.p, &u.z, &u.dp}) per_key->resize(static_cast<size_t>(p.seq_kv));
  }
  parallel_for(units, workers, [&](int worker, int64_t unit) {
    backward_unit(p, d_out, d_lse, grads, unit / p.heads_kv, unit % p.heads_kv, scratch[static_cast<size_t>(worker)]);
  });
}

namespace {

size_t elements(int64_t a, int64_t b, int64_t c, int64_t d) { return static_cast<size_t>(a * b * c * d); }

// A contiguous [B][H][N][D] double array into a strided tensor of the dtype.
void store_rows(const std::vector<double>& values, DType dtype, void* base, const int64_t (&stride)[3], int64_t batch,
                int64_t heads, int64_t rows, int64_t dim) {
  size_t e = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t n = 0; n < rows; ++n)
        for (int64_t d = 0; d < dim; ++d) store_element(dtype, base, b * stride[0] + h * stride[1] + n * stride[2] + d, values[e++]);
}

}  // namespace

void cpu_attention_backward(const BackwardProblem& bp, int num_threads) {
  const AttentionProblem& p = bp.forward;
  const int64_t dim = p.head_dim, dv = p.dv();
  std::vector<double> d_out(elements(p.batch, p.heads_q, p.seq_q, dv));
  size_t e = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t d = 0; d < dv; ++d)
          d_out[e++] = element(p, bp.d_o, b * bp.d_o_stride[0] + h * bp.d_o_stride[1] + i * bp.d_o_stride[2] + d);
  std::vector<double> d_q(elements(p.batch, p.heads_q, p.seq_q, dim)), d_k(elements(p.batch, p.heads_kv, p.seq_kv, dim)),
      d_v(elements(p.batch, p.heads_kv, p.seq_kv, dv)), d_scores;
  if (bp.d_mask != nullptr) d_scores.resize(elements(p.batch, p.heads_q, p.seq_q, p.seq_kv));
  std::vector<double> d_lse;
  if (bp.d_lse != nullptr) {
    d_lse.reserve(elements(p.batch, p.heads_q, p.seq_q, 1));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seq_q; ++i)
          d_lse.push_back(bp.d_lse[b * bp.d_lse_stride[0] + h * bp.d_lse_stride[1] + i * bp.d_lse_stride[2]]);
  }
  cpu_attention_backward_f64(p, d_out.data(), bp.d_lse != nullptr ? d_lse.data() : nullptr,
                             AttentionGradients{d_q.data(), d_k.data(), d_v.data(),
                                                bp.d_mask != nullptr ? d_scores.data() : nullptr},
                             num_threads);
  store_rows(d_q, p.dtype, bp.d_q, bp.d_q_stride, p.batch, p.heads_q, p.seq_q, dim);
  store_rows(d_k, p.dtype, bp.d_k, bp.d_k_stride, p.batch, p.heads_kv, p.seq_kv, dim);
  store_rows(d_v, p.dtype, bp.d_v, bp.d_v_stride, p.batch, p.heads_kv, p.seq_kv, dv);
  if (bp.d_mask == nullptr) return;
  // Each score's gradient added into the mask element it read (index 0 along
  // a broadcast dim), in index order.
  const int64_t* shape = bp.d_mask_shape;
  std::vector<double> d_mask(elements(shape[0], shape[1], shape[2], shape[3]), 0.0);
  const int64_t full[4] = {p.batch, p.heads_q, p.seq_q, p.seq_kv};
  e = 0;
  for (int64_t b = 0; b < full[0]; ++b)
    for (int64_t h = 0; h < full[1]; ++h)
      for (int64_t i = 0; i < full[2]; ++i)
        for (int64_t j = 0; j < full[3]; ++j) {
          const int64_t index[4] = {shape[0] == 1 ? 0 : b, shape[1] == 1 ? 0 : h, shape[2] == 1 ? 0 : i,
                                    shape[3] == 1 ? 0 : j};
          d_mask[static_cast<size_t>(((index[0] * shape[1] + index[1]) * shape[2] + index[2]) * shape[3] + index[3])] +=
              d_scores[e++];
        }
  const DType mask_dtype = p.mask_kind == MaskKind::additive_f16    ? DType::f16
                           : p.mask_kind == MaskKind::additive_bf16 ? DType::bf16
                           : p.mask_kind == MaskKind::additive_f64  ? DType::f64
                                                                     : DType::f32;
  e = 0;
  for (int64_t b = 0; b < shape[0]; ++b)
    for (int64_t h = 0; h < shape[1]; ++h)
      for (int64_t i = 0; i < shape[2]; ++i)
        for (int64_t j = 0; j < shape[3]; ++j)
          store_element(mask_dtype, bp.d_mask,
                b * bp.d_mask_stride[0] + h * bp.d_mask_stride[1] + i * bp.d_mask_stride[2] + j * bp.d_mask_stride[3],
                d_mask[e++]);
}

}  // namespace ffpa::detail
