// The CPU model of the FP8 path (fp8_quantization.hpp). The quantization
// repeats the GPU pre-pass's fp32 arithmetic step by step, so that codes and
// scales match bit for bit: the K / V means summed in a fixed order, the
// subtraction, each group's amax, amax / format_max, 1 / scale, x times it and
// the format's rounding (no step is a multiply-add, so no contraction can change
// a bit on either side). The attention is computed in double from the
// dequantized values, with P quantized per KV block against the running row
// maximum as the main loop does; the kernel then differs from it only by its
// fp32 accumulation and exponentials.
#include "reference/fp8_quantization.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "reference/cpu_attention.hpp"
#include "reference/score_terms.hpp"

namespace ffpa::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

size_t count(int64_t n) { return static_cast<size_t>(n); }

// Rows [first, first + rows) of head (b, h) of q, k or v as float (exact for
// fp16 and bf16), [rows][dim] contiguous.
std::vector<float> load_rows(const void* base, const int64_t (&stride)[3], DType dtype, int64_t b, int64_t h,
                             int64_t first, int64_t rows, int64_t dim) {
  std::vector<float> x(count(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + b * stride[0] + h * stride[1] + (first + r) * stride[2];
    float* dst = x.data() + r * dim;
    for (int64_t d = 0; d < dim; ++d) {
      dst[d] = dtype == DType::f16 ? half_bits_to_float(src[d]) : bf16_bits_to_float(src[d]);
    }
  }
  return x;
}

// The per-channel mean of x [n][dim] in the pre-pass's order (the codes
// depend on its bits): each block of kQuantKeyBlock rows summed in fp32 in
// row order (a non-finite value adds 0: mean_term), the block sums added in
// fp32 in block order, the total divided by float(n). Without rows, 0.
std::vector<float> channel_mean(const std::vector<float>& x, int64_t n, int64_t dim) {
  std::vector<float> mean(count(dim), 0.0f);
  if (n == 0) return mean;
  for (int64_t c = 0; c < dim; ++c) {
    float total = 0.0f;
    for (int64_t first = 0; first < n; first += kQuantKeyBlock) {
      float block = 0.0f;
      for (int64_t j = first; j < std::min(n, first + kQuantKeyBlock); ++j) block += mean_term(x[count(j * dim + c)]);
      total += block;
    }
    mean[count(c)] = total / static_cast<float>(n);
  }
  return mean;
}

// x[j][c] - mean[c] in fp32, in place.
void subtract_mean(std::vector<float>& x, const float* mean, int64_t n, int64_t dim) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 0; c < dim; ++c) x[count(j * dim + c)] -= mean[c];
  }
}

// Smoothing of K or V: the channel means of x [n][dim] written to `means`,
// then subtracted from x.
void smooth(std::vector<float>& x, float* means, int64_t n, int64_t dim) {
  const std::vector<float> mean = channel_mean(x, n, dim);
  std::copy(mean.begin(), mean.end(), means);
  subtract_mean(x, mean.data(), n, dim);
}

// Codes and scales of x [n][dim], whose element (r, c) belongs to scale group
// group_of(r, c) of `groups`: each group's amax over its finite values
// (amax_term; a group without any has amax 0), its scale, then every
// element's code (non-finite values: the format's NaN code). With
// flag_groups, a group holding a non-finite value stores its scale negated
// (int8 K: flag_nonfinite).
template <class GroupOf>
void quantize_groups(const std::vector<float>& x, int64_t n, int64_t dim, int64_t groups, const GroupOf& group_of,
                     bool int8_codes, bool flag_groups, float* scales, uint8_t* codes) {
  std::vector<float> amax(count(groups), 0.0f);
  std::vector<bool> nonfinite(count(groups), false);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < dim; ++c) {
      const int64_t g = group_of(r, c);
      const float value = x[count(r * dim + c)];
      amax[count(g)] = std::fmax(amax[count(g)], amax_term(value));
      if (!finite_value(value)) nonfinite[count(g)] = true;
    }
  }
  const float format_max = int8_codes ? kInt8Max : kE4m3Max;
  std::vector<float> inverse(count(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = quantization_scale(amax[count(g)], format_max);
    inverse[count(g)] = quantization_inverse(scale);
    scales[g] = flag_groups ? flag_nonfinite(scale, nonfinite[count(g)]) : scale;
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < dim; ++c) {
      const float value = x[count(r * dim + c)], group_inverse = inverse[count(group_of(r, c))];
      codes[r * dim + c] = int8_codes ? quantize_int8(value, group_inverse) : quantize_e4m3(value, group_inverse);
    }
  }
}

// Whether a row of codes holds an int8 non-finite marker.
bool holds_nonfinite_marker(const uint8_t* codes, int64_t dim) {
  return std::find(codes, codes + dim, kInt8NonFinite) != codes + dim;
}

// int8 Q/K: QuantizedInputs::row_nan from the codes' markers. The first key
// of each kv head with a non-finite K value reaches every row whose causal
// reach includes it; a non-finite Q value its own row, if any key is in reach.
void mark_nan_rows(const AttentionProblem& p, QuantizedInputs& z) {
  const int64_t dim = p.head_dim, nkv = p.seq_kv;
  z.row_nan.assign(count(p.batch * p.heads_q * z.rows), 0.0f);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t kv_head = b * p.heads_kv + h / p.group_size();
      int64_t first_key = nkv;
      for (int64_t j = 0; j < nkv && first_key == nkv; ++j) {
        if (holds_nonfinite_marker(z.k_codes.data() + (kv_head * nkv + j) * dim, dim)) first_key = j;
      }
      const int64_t head = b * p.heads_q + h;
      for (int64_t r = 0; r < z.rows; ++r) {
        // As the pre-pass: a window's left bound is not looked at.
        const KeyRange keys = attended_keys(p, z.first_row + r, p.seq_q, p.seq_kv);
        const bool q_nonfinite = holds_nonfinite_marker(z.q_codes.data() + (head * z.rows + r) * dim, dim);
        if ((q_nonfinite && keys.end > keys.first) || keys.end > first_key) {
          z.row_nan[count(head * z.rows + r)] = std::numeric_limits<float>::quiet_NaN();
        }
      }
    }
  }
}

void check_matches(const AttentionProblem& p, const QuantizedInputs& z) {
  if (z.batch != p.batch || z.heads_q != p.heads_q || z.heads_kv != p.heads_kv || z.seq_q != p.seq_q ||
      z.seq_kv != p.seq_kv || z.head_dim != p.head_dim) {
    throw std::invalid_argument("quantized inputs of another problem's shape");
  }
}

// The reference's rows [0, first_row) into out and lse.
void hybrid_rows(const AttentionProblem& p, int64_t first_row, double* out, double* lse, int num_threads) {
  const int64_t dim = p.head_dim, heads = p.batch * p.heads_q;
  std::vector<int64_t> rows(count(first_row));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  std::vector<double> rows_out(count(heads * first_row * dim)), rows_lse(count(heads * first_row));
  cpu_attention_forward_f64(p, RowSubset{rows.data(), first_row}, rows_out.data(), rows_lse.data(), num_threads);
  for (int64_t bh = 0; bh < heads; ++bh) {
    std::copy_n(rows_out.data() + bh * first_row * dim, first_row * dim, out + bh * p.seq_q * dim);
    if (lse != nullptr) std::copy_n(rows_lse.data() + bh * first_row, first_row, lse + bh * p.seq_q);
  }
}

// One (batch, kv head)'s K and V as the main loop sees them, in double: K's
// code values (or exact K - mean) with one scale per key, V dequantized (or
// exact V - mean).
struct KeyValueBlock {
  std::vector<double> key;        // [Nkv][D]
  std::vector<double> key_scale;  // [Nkv]
  std::vector<double> value;      // [Nkv][D]
};

KeyValueBlock decode_key_values(const AttentionProblem& p, const QuantizedInputs& z, int64_t b, int64_t kv_head) {
  const QuantizationOptions& o = z.options;
  const int64_t nkv = p.seq_kv, dim = p.head_dim, head = b * p.heads_kv + kv_head;
  KeyValueBlock kv;
  kv.key.resize(count(nkv * dim));
  kv.key_scale.assign(count(nkv), 1.0);
  kv.value.resize(count(nkv * dim));
  const float* k_mean = z.k_mean.data() + head * dim;
  const float* v_mean = z.v_mean.data() + head * dim;
  if (o.qk_format == QkFormat::unquantized) {
    const std::vector<float> k = load_rows(p.k, p.k_stride, p.dtype, b, kv_head, 0, nkv, dim);
    for (int64_t e = 0; e < nkv * dim; ++e) {
      kv.key[count(e)] = static_cast<double>(k[count(e)]) - static_cast<double>(k_mean[e % dim]);  // exact
    }
  } else {
    const uint8_t* codes = z.k_codes.data() + head * nkv * dim;
    const float* scales = z.k_scales.data() + head * z.k_scales_per_head();
    for (int64_t e = 0; e < nkv * dim; ++e) kv.key[count(e)] = qk_code_value(codes[e], o.qk_format);
    for (int64_t j = 0; j < nkv; ++j) kv.key_scale[count(j)] = scale_magnitude(scales[k_scale_index(j, o.qk_granularity)]);
  }
  if (o.pv_format == PvFormat::unquantized) {
    const std::vector<float> v = load_rows(p.v, p.v_stride, p.dtype, b, kv_head, 0, nkv, dim);
    for (int64_t e = 0; e < nkv * dim; ++e) {
      kv.value[count(e)] = static_cast<double>(v[count(e)]) - static_cast<double>(v_mean[e % dim]);
    }
  } else {
    const uint8_t* codes = z.v_codes.data() + head * nkv * dim;
    const float* scales = z.v_scales.data() + head * z.v_scales_per_head();
    for (int64_t j = 0; j < nkv; ++j) {
      for (int64_t c = 0; c < dim; ++c) {
        kv.value[count(j * dim + c)] = static_cast<double>(e4m3_bits_to_float(codes[j * dim + c])) *
                                       static_cast<double>(scales[v_scale_index(j, c, o.v_granularity)]);
      }
    }
  }
  return kv;
}

// Buffers of one query row, reused across rows.
struct RowScratch {
  std::vector<double> query;  // [D]: code values (or exact q)
  std::vector<double> score;  // [Nkv]: scaled, masked scores, then P V weights
  std::vector<double> bias;   // [Nkv]
  std::vector<double> out;    // [D]: P V
};

// Query row i (quantized row r) of head (b, h): out_row [D], returns the lse.
double attend_row(const AttentionProblem& p, const QuantizedInputs& z, const KeyValueBlock& kv, int64_t b,
                  int64_t h, int64_t r, RowScratch& s, double* out_row) {
  const QuantizationOptions& o = z.options;
  const int64_t dim = p.head_dim, i = z.first_row + r, kv_head = h / p.group_size();
  const float* k_mean = z.k_mean.data() + (b * p.heads_kv + kv_head) * dim;
  const float* v_mean = z.v_mean.data() + (b * p.heads_kv + kv_head) * dim;
  const std::vector<float> q = load_rows(p.q, p.q_stride, p.dtype, b, h, i, 1, dim);
  double q_scale = 1.0;
  if (o.qk_format == QkFormat::unquantized) {
    for (int64_t d = 0; d < dim; ++d) s.query[count(d)] = q[count(d)];
  } else {
    const int64_t head = b * p.heads_q + h;
    const uint8_t* codes = z.q_codes.data() + (head * z.rows + r) * dim;
    for (int64_t d = 0; d < dim; ++d) s.query[count(d)] = qk_code_value(codes[d], o.qk_format);
    q_scale = z.q_scales[count(head * z.q_scales_per_head() + q_scale_index(r, o.qk_granularity))];
  }

  // Scores: the code dot product (exact in double: int8 products are
  // integers, e4m3 products multiples of 2^-18 below 2^17.6, so a sum over
  // D <= 1024 needs at most 46 bits), times the dequantization and softmax
  // scales, plus the mask.
  const int64_t visible = visible_keys(p, i);
  mask_bias(p, b, h, i, visible, s.bias.data());
  double row_max = kNegInf;
  bool nan_score = false;  // e4m3 NaN codes carry a non-finite Q or K value here
  for (int64_t j = 0; j < visible; ++j) {
    const double* key = kv.key.data() + j * dim;
    double dot = 0.0;
    for (int64_t d = 0; d < dim; ++d) dot += s.query[count(d)] * key[d];
    s.score[count(j)] = dot * (q_scale * kv.key_scale[count(j)]) * static_cast<double>(p.scale) + s.bias[count(j)];
    nan_score |= std::isnan(s.score[count(j)]);
    row_max = std::max(row_max, s.score[count(j)]);  // a NaN does not count
  }
  // int8 codes cannot carry a NaN: the pre-pass's row_nan says where one reaches.
  const bool marked = !z.row_nan.empty() && std::isnan(z.row_nan[count((b * p.heads_q + h) * z.rows + r)]);
  if (row_max == kNegInf && !nan_score && !marked) {  // no attended key: O = 0 whatever V holds
    std::fill(out_row, out_row + dim, 0.0);
    return kNegInf;
  }
  // The row sum over the unquantized exponentials (the kernel sums its fp32
  // exponentials before converting P), relative to the final maximum.
  double row_sum = 0.0;
  for (int64_t j = 0; j < visible; ++j) row_sum += std::exp(s.score[count(j)] - row_max);
  if (nan_score || marked || std::isnan(row_sum)) {  // the row's softmax is NaN: its O and LSE too
    std::fill(out_row, out_row + dim, std::numeric_limits<double>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }

  // P V weights, KV block by KV block in the main loop's order: block n's P is
  // exp(s - m_n) against the running maximum m_n (over blocks 0..n),
  // quantized as e4m3(448 p) from its fp32 value; O's rescales by
  // exp(m_{n-1} - m_n) compose to exp(m_n - m) by the last block.
  double running_max = kNegInf;
  for (int64_t first = 0; first < visible; first += kQuantKeyBlock) {
    const int64_t last = std::min(visible, first + kQuantKeyBlock);
    for (int64_t j = first; j < last; ++j) running_max = std::max(running_max, s.score[count(j)]);
    // O's rescales and the epilogue's 1 / rowsum, for this block's P.
    const double block_factor = running_max == kNegInf ? 0.0 : std::exp(running_max - row_max) / row_sum;
    for (int64_t j = first; j < last; ++j) {
      double& w = s.score[count(j)];
      if (w == kNegInf) {
        w = 0.0;
        continue;
      }
      double weight = std::exp(w - running_max);
      if (o.pv_format == PvFormat::e4m3) {
        weight = e4m3_bits_to_float(float_to_e4m3_bits(static_cast<float>(kPScale * weight))) / kPScale;
      }
      weight *= block_factor;
      if (p.has_dropout()) {
        const bool keep = dropout_keep(p.dropout_seed, p.dropout_offset, static_cast<uint64_t>(b * p.heads_q + h),
                                       static_cast<uint64_t>(p.seq_q), static_cast<uint64_t>(p.seq_kv),
                                       static_cast<uint64_t>(i), static_cast<uint64_t>(j), p.dropout_threshold);
        weight = keep ? weight * static_cast<double>(p.dropout_scale) : 0.0;
      }
      w = weight;
    }
  }

  // Every key in reach adds its V row, weight 0 or not (a NaN code in V
  // times a masked or dropped weight is NaN, as in the kernel's P V).
  std::fill(s.out.begin(), s.out.end(), 0.0);
  for (int64_t j = 0; j < visible; ++j) {
    const double w = s.score[count(j)];
    const double* value = kv.value.data() + j * dim;
    for (int64_t c = 0; c < dim; ++c) s.out[count(c)] += w * value[c];
  }
  for (int64_t c = 0; c < dim; ++c) {
    out_row[c] = o.smooth_v ? s.out[count(c)] + static_cast<double>(v_mean[c]) : s.out[count(c)];
  }

  // LSE of the unsmoothed scores: smoothing K shifted every score of the row
  // by -scale * (q . k_mean), with q as given (the pre-pass's correction term).
  double shift = 0.0;
  if (o.smooth_k) {
    for (int64_t d = 0; d < dim; ++d) shift += static_cast<double>(q[count(d)]) * static_cast<double>(k_mean[d]);
    shift *= static_cast<double>(p.scale);
  }
  return row_max + std::log(row_sum) + shift;
}

}  // namespace

double qk_code_value(uint8_t code, QkFormat format) {
  return format == QkFormat::int8 ? static_cast<double>(static_cast<int8_t>(code))
                                  : static_cast<double>(e4m3_bits_to_float(code));
}

QuantizedInputs quantize_key_values(const AttentionProblem& p, const QuantizationOptions& o) {
  if (o.n_early < 0) throw std::invalid_argument("n_early is negative");
  if (o.smooth_v && p.has_dropout()) {
    throw std::invalid_argument("smooth_v with dropout: the kept weights do not sum to 1, so the V mean added back "
                                "would change the result");
  }
  QuantizedInputs z;
  z.options = o;
  z.batch = p.batch;
  z.heads_q = p.heads_q;
  z.heads_kv = p.heads_kv;
  z.seq_q = p.seq_q;
  z.seq_kv = p.seq_kv;
  z.head_dim = p.head_dim;
  z.first_row = std::min(o.n_early, p.seq_q);
  z.rows = p.seq_q - z.first_row;

  const int64_t dim = p.head_dim, nkv = p.seq_kv;
  const int64_t kv_heads = p.batch * p.heads_kv;
  const bool qk_codes = o.qk_format != QkFormat::unquantized, pv_codes = o.pv_format != PvFormat::unquantized;
  const bool int8_codes = o.qk_format == QkFormat::int8;
  z.k_mean.assign(count(kv_heads * dim), 0.0f);
  z.v_mean.assign(count(kv_heads * dim), 0.0f);
  if (qk_codes) {
    z.k_codes.resize(count(kv_heads * nkv * dim));
    z.k_scales.resize(count(kv_heads * z.k_scales_per_head()));
  }
  if (pv_codes) {
    z.v_codes.resize(count(kv_heads * nkv * dim));
    z.v_scales.resize(count(kv_heads * z.v_scales_per_head()));
  }
  const QkScaleGranularity qk_granularity = o.qk_granularity;
  const VScaleGranularity v_granularity = o.v_granularity;

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
      const int64_t head = b * p.heads_kv + kv_head;
      std::vector<float> k = load_rows(p.k, p.k_stride, p.dtype, b, kv_head, 0, nkv, dim);
      if (o.smooth_k) smooth(k, z.k_mean.data() + head * dim, nkv, dim);
      if (qk_codes) {
        quantize_groups(k, nkv, dim, z.k_scales_per_head(),
                        [&](int64_t j, int64_t) { return k_scale_index(j, qk_granularity); }, int8_codes, int8_codes,
                        z.k_scales.data() + head * z.k_scales_per_head(), z.k_codes.data() + head * nkv * dim);
      }
      std::vector<float> v = load_rows(p.v, p.v_stride, p.dtype, b, kv_head, 0, nkv, dim);
      if (o.smooth_v) smooth(v, z.v_mean.data() + head * dim, nkv, dim);
      if (pv_codes) {
        quantize_groups(v, nkv, dim, z.v_scales_per_head(),
                        [&](int64_t j, int64_t c) { return v_scale_index(j, c, v_granularity); }, false, false,
                        z.v_scales.data() + head * z.v_scales_per_head(), z.v_codes.data() + head * nkv * dim);
      }
    }
  }
  return z;
}

QuantizedInputs quantize_attention_inputs(const AttentionProblem& p, const QuantizationOptions& o) {
  QuantizedInputs z = quantize_key_values(p, o);
  if (o.qk_format == QkFormat::unquantized) return z;
  const int64_t dim = p.head_dim, q_heads = p.batch * p.heads_q;
  const QkScaleGranularity qk_granularity = o.qk_granularity;
  z.q_codes.resize(count(q_heads * z.rows * dim));
  z.q_scales.resize(count(q_heads * z.q_scales_per_head()));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.heads_q; ++h) {
      const int64_t head = b * p.heads_q + h;
      const std::vector<float> q = load_rows(p.q, p.q_stride, p.dtype, b, h, z.first_row, z.rows, dim);
      quantize_groups(q, z.rows, dim, z.q_scales_per_head(),
                      [&](int64_t r, int64_t) { return q_scale_index(r, qk_granularity); },
                      o.qk_format == QkFormat::int8, false, z.q_scales.data() + head * z.q_scales_per_head(),
                      z.q_codes.data() + head * z.rows * dim);
    }
  }
  if (o.qk_format == QkFormat::int8) mark_nan_rows(p, z);
  return z;
}

void cpu_attention_quantized_f64(const AttentionProblem& p, const QuantizedInputs& z, double* out, double* lse,
                                 int num_threads) {
  check_matches(p, z);
  if (p.batch <= 0 || p.heads_q <= 0 || p.seq_q <= 0) return;
  if (z.first_row > 0) hybrid_rows(p, z.first_row, out, lse, num_threads);
  if (z.rows == 0) return;
  const int64_t dim = p.head_dim;
  RowScratch s;
  s.query.resize(count(dim));
  s.score.resize(count(p.seq_kv));
  s.bias.resize(count(p.seq_kv));
  s.out.resize(count(dim));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
      const KeyValueBlock kv = decode_key_values(p, z, b, kv_head);
      for (int64_t h = kv_head * p.group_size(); h < (kv_head + 1) * p.group_size(); ++h) {
        for (int64_t r = 0; r < z.rows; ++r) {
          const int64_t row = (b * p.heads_q + h) * p.seq_q + z.first_row + r;
          const double row_lse = attend_row(p, z, kv, b, h, r, s, out + row * dim);
          if (lse != nullptr) lse[row] = row_lse;
        }
      }
    }
  }
}

}  // namespace ffpa::detail
