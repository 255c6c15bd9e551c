// The backward pass in double, a (batch, KV head) unit per task: the unit owns
// its K and V rows' gradients and its query heads' Q rows, so the tasks write
// disjoint elements and need no atomics, and each gradient is summed in one
// fixed order whatever the thread count. Per query row i, with p the softmax
// of s = cap(scale * q k^T) + mask over the keys the row attends (its causal
// limit and window) and the head's sink (p_sink = exp(sink - lse_i)), z the
// kept elements' factor (dropout_scale or 0, 1 without dropout) and g = d_out
// row i:
//   a_j = p_j z_j              (O_i = sum_j a_j v_j)
//   dp_j = g . v_j,  delta = sum_j a_j dp_j = g . O_i
//   ds_j = p_j (z_j dp_j - delta + gl_i)    (gl_i: the gradient of lse_i, as
//                                            d lse_i / d s_j = p_j)
//   d_sink += p_sink (gl_i - delta)
//   dr_j = ds_j cap'(scale q_i . k_j)       (the softcap c tanh(x / c): 1 - tanh^2)
//   d_v_j += a_j g,  d_q_i += scale sum_j dr_j k_j,  d_k_j += scale dr_j q_i
// A sequence batch runs one sequence at a time, as the dense call of one
// batch entry it is (the forward's run_sequences).
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
// per key the softmax weight p_j, the kept factor z_j, dp_j and the softcap's
// derivative.
struct Unit {
  std::vector<double> k, v, q, bias, p, z, dp, cap;
};

// The unit's (b, kv_head) rows; d_sinks: its query heads' sink gradients ([group]).
void backward_unit(const AttentionProblem& p, const double* d_out, const double* d_lse, const AttentionGradients& g,
                   int64_t b, int64_t kv_head, Unit& u, double* d_sinks) {
  const int64_t dim = p.head_dim, dv = p.dv(), nkv = p.seq_kv, group = p.group_size();
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
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
    d_sinks[h - kv_head * group] = 0.0;
    const double sink = p.sinks != nullptr ? static_cast<double>(p.sinks[h * p.sinks_stride]) : kNegInf;
    for (int64_t i = 0; i < p.seq_q; ++i) {
      const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
      const double* const go = d_out + row * dv;
      double* const d_q = g.d_q + row * dim;
      double* const d_s = g.d_scores != nullptr ? g.d_scores + row * nkv : nullptr;
      std::fill(d_q, d_q + dim, 0.0);
      if (d_s != nullptr) std::fill(d_s, d_s + nkv, 0.0);
      load_row(p, 0, b, h, i, u.q.data());
      const KeyRange keys = attended_keys(p, i, p.seq_q, p.seq_kv);
      const int64_t first = keys.first, visible = keys.end;
      mask_bias(p, b, h, i, visible, u.bias.data());
      double max_score = sink;
      bool nan_score = false;
      for (int64_t j = first; j < visible; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d) dot += u.q[d] * u.k[j * dim + d];
        double x = scale * dot;
        u.cap[j] = 1.0;
        if (p.softcap > 0.0f) {
          const double t = std::tanh(x / p.softcap);
          x = p.softcap * t;
          u.cap[j] = 1.0 - t * t;
        }
        u.p[j] = x + u.bias[j];
        nan_score |= std::isnan(u.p[j]);
        max_score = std::max(max_score, u.p[j]);  // a NaN does not count
      }
      // No key attended and no sink: O = 0, no gradient. A NaN score makes the
      // row's denominator and so every p_j of it NaN (the forward's NaN row),
      // and from there dQ_i and the dK, dV rows of every key in its reach.
      if (max_score == kNegInf && !nan_score) continue;
      double denominator = sink == kNegInf ? 0.0 : std::exp(sink - max_score);
      for (int64_t j = first; j < visible; ++j) {
        u.p[j] = std::exp(u.p[j] - max_score);
        denominator += u.p[j];
      }
      double delta = 0.0;
      const double lse_weight = d_lse != nullptr ? d_lse[row] : 0.0;
      for (int64_t j = first; j < visible; ++j) {
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
      if (sink != kNegInf) d_sinks[h - kv_head * group] += std::exp(sink - max_score) / denominator * (lse_weight - delta);
      for (int64_t j = first; j < visible; ++j) {
        const double a = u.p[j] * u.z[j];
        const double ds = u.p[j] * (u.z[j] * u.dp[j] - delta + lse_weight);
        if (d_s != nullptr) d_s[j] = ds;
        const double dr = ds * u.cap[j];
        for (int64_t d = 0; d < dv; ++d) d_v[j * dv + d] += a * go[d];
        for (int64_t d = 0; d < dim; ++d) {
          d_q[d] += scale * dr * u.k[j * dim + d];
          d_k[j * dim + d] += scale * dr * u.q[d];
        }
      }
    }
  }
}

// A dense call's gradients (cpu_attention_backward_f64 on a problem without a sequence batch).
void backward_dense_f64(const AttentionProblem& p, const double* d_out, const double* d_lse,
                        const AttentionGradients& grads, int num_threads) {
  const int64_t units = p.batch * p.heads_kv;
  if (grads.d_sinks != nullptr) std::fill(grads.d_sinks, grads.d_sinks + p.heads_q, 0.0);
  if (units <= 0) return;
  const int workers = static_cast<int>(std::min<int64_t>(resolve_threads(num_threads), units));
  std::vector<Unit> scratch(static_cast<size_t>(workers));
  for (Unit& u : scratch) {
    u.k.resize(static_cast<size_t>(p.seq_kv * p.head_dim));
    u.v.resize(static_cast<size_t>(p.seq_kv * p.dv()));
    u.q.resize(static_cast<size_t>(p.head_dim));
    for (std::vector<double>* per_key : {&u.bias, &u.p, &u.z, &u.dp, &u.cap})
      per_key->resize(static_cast<size_t>(p.seq_kv));
  }
  // Each unit's sink gradients apart ([unit][group]), summed over the batch
  // entries in order afterwards: the same bits whatever the thread count.
  std::vector<double> unit_sinks(static_cast<size_t>(units * p.group_size()));
  parallel_for(units, workers, [&](int worker, int64_t unit) {
    backward_unit(p, d_out, d_lse, grads, unit / p.heads_kv, unit % p.heads_kv, scratch[static_cast<size_t>(worker)],
                  unit_sinks.data() + unit * p.group_size());
  });
  if (grads.d_sinks == nullptr) return;
  for (int64_t unit = 0; unit < units; ++unit)
    for (int64_t g = 0; g < p.group_size(); ++g)
      grads.d_sinks[unit % p.heads_kv * p.group_size() + g] += unit_sinks[static_cast<size_t>(unit * p.group_size() + g)];
}

size_t elements(int64_t a, int64_t b, int64_t c, int64_t d) { return static_cast<size_t>(a * b * c * d); }

// Where one sequence's rows lie in the tensors' extents (backward_problem.hpp:
// query_extent, key_extent): queries [q_first, q_first + nq) of entry q_entry,
// keys [k_first, k_first + nkv) of entry k_entry. A dense call's batch entry
// b is the sequence of all its rows.
struct SequenceRows {
  int64_t q_entry, q_first, nq, k_entry, k_first, nkv;
};

SequenceRows sequence_rows(const AttentionProblem& p, int64_t b) {
  if (!p.sequences.active) return {b, 0, p.seq_q, b, 0, p.seq_kv};
  const Sequence seq = sequence_at(p.sequences, b);
  return {seq.q_batch, seq.q_begin, seq.seq_q, seq.kv_batch, seq.kv_begin, seq.seq_kv};
}

// Rows [first, first + rows) of every head of entry `entry` of an extent
// array [entries][heads][extent_rows][dim], gathered into (or scattered from)
// a contiguous [heads][rows][dim] one.
void gather_rows(const double* extent, int64_t extent_rows, int64_t heads, int64_t dim, int64_t entry, int64_t first,
                 int64_t rows, double* compact) {
  for (int64_t h = 0; h < heads; ++h) {
    const double* const a = extent + ((entry * heads + h) * extent_rows + first) * dim;
    std::copy(a, a + rows * dim, compact + h * rows * dim);
  }
}
void scatter_rows(const double* compact, int64_t extent_rows, int64_t heads, int64_t dim, int64_t entry, int64_t first,
                  int64_t rows, double* extent) {
  for (int64_t h = 0; h < heads; ++h) {
    const double* const c = compact + h * rows * dim;
    std::copy(c, c + rows * dim, extent + ((entry * heads + h) * extent_rows + first) * dim);
  }
}

// A sequence batch, one sequence at a time as the dense call of one batch
// entry it is (the forward's run_sequences): its rows gathered, its
// gradients scattered back, its sink gradients summed in sequence order.
void backward_sequences_f64(const AttentionProblem& p, const double* d_out, const double* d_lse,
                            const AttentionGradients& grads, int num_threads) {
  const SequenceLayout& layout = p.sequences;
  const RowExtent qx = query_extent(p), kx = key_extent(p);
  const int64_t dim = p.head_dim, dv = p.dv();
  std::vector<double> sinks(static_cast<size_t>(p.heads_q));
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = sequence_at(layout, b);
    const SequenceRows rows = sequence_rows(p, b);
    AttentionProblem one = p;
    one.sequences = SequenceLayout{};
    one.batch = 1;
    one.seq_q = seq.seq_q;
    one.seq_kv = seq.seq_kv;
    const int64_t bytes = element_bytes(p.dtype);
    one.q = static_cast<const unsigned char*>(p.q) + query_row_offset(p.q_stride, seq, 0, 0) * bytes;
    one.k = static_cast<const unsigned char*>(p.k) + key_row_offset(layout, p.k_stride, seq, b, 0, 0) * bytes;
    one.v = static_cast<const unsigned char*>(p.v) + key_row_offset(layout, p.v_stride, seq, b, 0, 0) * bytes;
    std::vector<double> out(elements(1, p.heads_q, rows.nq, dv)), lse, q(elements(1, p.heads_q, rows.nq, dim)),
        k(elements(1, p.heads_kv, rows.nkv, dim)), v(elements(1, p.heads_kv, rows.nkv, dv));
    gather_rows(d_out, qx.rows, p.heads_q, dv, rows.q_entry, rows.q_first, rows.nq, out.data());
    if (d_lse != nullptr) {
      lse.resize(elements(1, p.heads_q, rows.nq, 1));
      gather_rows(d_lse, qx.rows, p.heads_q, 1, rows.q_entry, rows.q_first, rows.nq, lse.data());
    }
    backward_dense_f64(one, out.data(), d_lse != nullptr ? lse.data() : nullptr,
                       {q.data(), k.data(), v.data(), nullptr, grads.d_sinks != nullptr ? sinks.data() : nullptr},
                       num_threads);
    scatter_rows(q.data(), qx.rows, p.heads_q, dim, rows.q_entry, rows.q_first, rows.nq, grads.d_q);
    scatter_rows(k.data(), kx.rows, p.heads_kv, dim, rows.k_entry, rows.k_first, rows.nkv, grads.d_k);
    scatter_rows(v.data(), kx.rows, p.heads_kv, dv, rows.k_entry, rows.k_first, rows.nkv, grads.d_v);
    if (grads.d_sinks != nullptr)
      for (int64_t h = 0; h < p.heads_q; ++h) grads.d_sinks[h] += sinks[static_cast<size_t>(h)];
  }
}

}  // namespace

void cpu_attention_backward_f64(const AttentionProblem& p, const double* d_out, const double* d_lse,
                                const AttentionGradients& grads, int num_threads) {
  if (!p.sequences.active) return backward_dense_f64(p, d_out, d_lse, grads, num_threads);
  if (grads.d_sinks != nullptr) std::fill(grads.d_sinks, grads.d_sinks + p.heads_q, 0.0);
  backward_sequences_f64(p, d_out, d_lse, grads, num_threads);
}

namespace {

// Reads a [entries][heads][rows][dim] extent of a tensor (b, h, n strides) into doubles.
std::vector<double> load_rows(const AttentionProblem& p, const void* base, const int64_t (&stride)[3], RowExtent x,
                              int64_t heads, int64_t dim) {
  std::vector<double> values(elements(x.entries, heads, x.rows, dim));
  size_t e = 0;
  for (int64_t b = 0; b < x.entries; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t n = 0; n < x.rows; ++n)
        for (int64_t d = 0; d < dim; ++d) values[e++] = element(p, base, b * stride[0] + h * stride[1] + n * stride[2] + d);
  return values;
}

// Rows [first, first + rows) of entry `entry` of an extent array
// [entries][heads][extent_rows][dim] into a strided tensor of the dtype.
void store_rows(const std::vector<double>& values, DType dtype, void* base, const int64_t (&stride)[3],
                int64_t extent_rows, int64_t heads, int64_t dim, int64_t entry, int64_t first, int64_t rows) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t n = first; n < first + rows; ++n) {
      const size_t from = static_cast<size_t>(((entry * heads + h) * extent_rows + n) * dim);
      for (int64_t d = 0; d < dim; ++d)
        store_element(dtype, base, entry * stride[0] + h * stride[1] + n * stride[2] + d, values[from + d]);
    }
}

// An additive mask's gradient: each score's gradient (d_scores, [B, Hq, Nq,
// Nkv]) added into the mask element it read (index 0 along a broadcast dim),
// in index order, then written in the mask's dtype.
void store_mask_gradient(const BackwardProblem& bp, const std::vector<double>& d_scores) {
  const AttentionProblem& p = bp.forward;
  const int64_t* shape = bp.d_mask_shape;
  std::vector<double> d_mask(elements(shape[0], shape[1], shape[2], shape[3]), 0.0);
  const int64_t full[4] = {p.batch, p.heads_q, p.seq_q, p.seq_kv};
  size_t e = 0;
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
                        b * bp.d_mask_stride[0] + h * bp.d_mask_stride[1] + i * bp.d_mask_stride[2] +
                            j * bp.d_mask_stride[3],
                        d_mask[e++]);
}

}  // namespace

void cpu_attention_backward(const BackwardProblem& bp, int num_threads) {
  const AttentionProblem& p = bp.forward;
  const int64_t dim = p.head_dim, dv = p.dv();
  const RowExtent qx = query_extent(p), kx = key_extent(p);
  const std::vector<double> d_out = load_rows(p, bp.d_o, bp.d_o_stride, qx, p.heads_q, dv);
  std::vector<double> d_lse;
  if (bp.d_lse != nullptr) {
    d_lse.reserve(elements(qx.entries, p.heads_q, qx.rows, 1));
    for (int64_t b = 0; b < qx.entries; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < qx.rows; ++i)
          d_lse.push_back(bp.d_lse[b * bp.d_lse_stride[0] + h * bp.d_lse_stride[1] + i * bp.d_lse_stride[2]]);
  }
  std::vector<double> d_q(elements(qx.entries, p.heads_q, qx.rows, dim)), d_k(elements(kx.entries, p.heads_kv, kx.rows, dim)),
      d_v(elements(kx.entries, p.heads_kv, kx.rows, dv)), d_scores, d_sinks;
  if (bp.d_mask != nullptr) d_scores.resize(elements(p.batch, p.heads_q, p.seq_q, p.seq_kv));
  if (bp.d_sinks != nullptr) d_sinks.resize(static_cast<size_t>(p.heads_q));
  cpu_attention_backward_f64(p, d_out.data(), bp.d_lse != nullptr ? d_lse.data() : nullptr,
                             AttentionGradients{d_q.data(), d_k.data(), d_v.data(),
                                                bp.d_mask != nullptr ? d_scores.data() : nullptr,
                                                bp.d_sinks != nullptr ? d_sinks.data() : nullptr},
                             num_threads);
  // Each sequence's rows (a dense call's every row); rows of no sequence are not written.
  for (int64_t b = 0; b < p.batch; ++b) {
    const SequenceRows rows = sequence_rows(p, b);
    store_rows(d_q, p.dtype, bp.d_q, bp.d_q_stride, qx.rows, p.heads_q, dim, rows.q_entry, rows.q_first, rows.nq);
    store_rows(d_k, p.dtype, bp.d_k, bp.d_k_stride, kx.rows, p.heads_kv, dim, rows.k_entry, rows.k_first, rows.nkv);
    store_rows(d_v, p.dtype, bp.d_v, bp.d_v_stride, kx.rows, p.heads_kv, dv, rows.k_entry, rows.k_first, rows.nkv);
  }
  for (int64_t h = 0; h < p.heads_q && bp.d_sinks != nullptr; ++h)
    bp.d_sinks[h * bp.d_sinks_stride] = static_cast<float>(d_sinks[static_cast<size_t>(h)]);
  if (bp.d_mask != nullptr) store_mask_gradient(bp, d_scores);
}

}  // namespace ffpa::detail
