// An fp64 reference of a serving call for the API fuzz driver, written from
// the semantics in include/ffpa/ffpa.hpp and docs/serving.md and independent
// of the library's code: its own decoding of every element format (f16, bf16,
// e4m3 by their bit layouts) and its own addressing, from where the driver
// put each sequence's rows and keys (packed, batched or paged), not from the
// library's reading of the lengths and block table.
//
// Row i of a sequence with Nq queries and Nkv keys sits at key position
// p = i + Nkv - Nq (its queries are the sequence's last tokens) and attends
// key j when
//   top_left causal: j <= i;  bottom_right causal: j <= p;
//   window: p - left <= j <= p + right (a bound of -1 leaves that side open).
// Its score s_j = scale * k_descale * (q_i . k_j), then c * tanh(s_j / c)
// with a softcap c > 0; the head's sink logit joins the denominator and adds
// no value; o_i = sum_j softmax_j * v_descale * v_j; lse_i the natural log of
// the denominator. A row with neither an attended key nor a sink has o = 0
// and lse = -inf.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ffpa/ffpa.hpp"

namespace ffpa_fuzz {

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline double decode_f16(uint16_t bits) {
  const double sign = (bits & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  if (exponent == 0x1F) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// bfloat16: the high half of an IEEE binary32.
inline double decode_bf16(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

// OCP FP8 E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits, no
// infinities, S.1111.111 NaN.
inline double decode_e4m3(uint8_t bits) {
  const double sign = (bits & 0x80u) ? -1.0 : 1.0;
  const int exponent = (bits >> 3) & 0xF, mantissa = bits & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa, -9);
  return sign * std::ldexp(8 + mantissa, exponent - 10);
}

inline int64_t element_bytes(ffpa::DType dtype) {
  switch (dtype) {
    case ffpa::DType::f16:
    case ffpa::DType::bf16: return 2;
    case ffpa::DType::f32:
    case ffpa::DType::i32: return 4;
    case ffpa::DType::f64: return 8;
    case ffpa::DType::boolean:
    case ffpa::DType::u8:
    case ffpa::DType::e4m3: return 1;
  }
  return 1;
}

// The element of t at index (entries past its rank are 0), by t's strides.
inline double read_element(const ffpa::Tensor& t, std::array<int64_t, 4> index) {
  int64_t offset = 0;
  for (int32_t d = 0; d < t.rank; ++d) offset += index[d] * t.stride[d];
  const unsigned char* p = static_cast<const unsigned char*>(t.data) + offset * element_bytes(t.dtype);
  uint16_t half = 0;
  float f = 0.0f;
  double d = 0.0;
  int32_t i = 0;
  switch (t.dtype) {
    case ffpa::DType::f16: std::memcpy(&half, p, 2); return decode_f16(half);
    case ffpa::DType::bf16: std::memcpy(&half, p, 2); return decode_bf16(half);
    case ffpa::DType::f32: std::memcpy(&f, p, 4); return f;
    case ffpa::DType::f64: std::memcpy(&d, p, 8); return d;
    case ffpa::DType::e4m3: return decode_e4m3(*p);
    case ffpa::DType::i32: std::memcpy(&i, p, 4); return i;
    case ffpa::DType::boolean:
    case ffpa::DType::u8: return *p;
  }
  return 0.0;
}

// Where sequence b lies, as the driver laid it out: query rows [q_first,
// q_first + seq_q) of batch entry q_entry of q (and o, lse); key j at
// keys[j] = (entry, row) of k and v, for the seq_kv = keys.size() keys it uses.
struct SequenceRows {
  int64_t q_entry = 0, q_first = 0, seq_q = 0;
  std::vector<std::array<int64_t, 2>> keys;
};

// A call's tensors and options (sinks and descales read from params), and its
// sequences (sequence b is batch entry b of the descales).
struct ServingReference {
  const ffpa::ForwardParams* params = nullptr;
  std::vector<SequenceRows> sequences;
};

struct ReferenceRow {
  std::vector<double> o;
  double lse = 0.0;
};

// Row i (of the sequence's own rows) of head h of sequence b.
inline ReferenceRow reference_row(const ServingReference& call, int64_t b, int64_t h, int64_t i) {
  const ffpa::ForwardParams& p = *call.params;
  const SequenceRows& seq = call.sequences[static_cast<size_t>(b)];
  const int64_t dim = p.q.shape[3], value_dim = p.v.shape[3];
  const int64_t kv_head = h / (p.q.shape[1] / p.k.shape[1]);
  const int64_t seq_kv = static_cast<int64_t>(seq.keys.size()), position = i + seq_kv - seq.seq_q;
  const ffpa::Options& opt = p.options;
  // The API's scale is a float: its default is 1/sqrt(D) rounded to one.
  const double scale = opt.scale.value_or(static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim))));
  const double k_descale = p.k_descale.data ? read_element(p.k_descale, {b, kv_head, 0, 0}) : 1.0;
  const double v_descale = p.v_descale.data ? read_element(p.v_descale, {b, kv_head, 0, 0}) : 1.0;
  const double sink = p.sinks.data ? read_element(p.sinks, {h, 0, 0, 0}) : -INFINITY;

  std::vector<double> score(static_cast<size_t>(seq_kv), -INFINITY);
  double max_score = sink;
  for (int64_t j = 0; j < seq_kv; ++j) {
    if (opt.causal == ffpa::Causal::top_left && j > i) continue;
    if (opt.causal == ffpa::Causal::bottom_right && j > position) continue;
    if (opt.window_left >= 0 && j < position - opt.window_left) continue;
    if (opt.window_right >= 0 && j > position + opt.window_right) continue;
    const auto [entry, row] = seq.keys[static_cast<size_t>(j)];
    double dot = 0.0;
    for (int64_t d = 0; d < dim; ++d)
      dot += read_element(p.q, {seq.q_entry, h, seq.q_first + i, d}) * read_element(p.k, {entry, kv_head, row, d});
    double s = scale * k_descale * dot;
    if (opt.softcap > 0.0f) s = opt.softcap * std::tanh(s / opt.softcap);
    score[static_cast<size_t>(j)] = s;
    max_score = std::max(max_score, s);
  }
  ReferenceRow out;
  out.o.assign(static_cast<size_t>(value_dim), 0.0);
  if (max_score == -INFINITY) {
    out.lse = -INFINITY;
    return out;
  }
  double sum = sink == -INFINITY ? 0.0 : std::exp(sink - max_score);
  for (double s : score) sum += s == -INFINITY ? 0.0 : std::exp(s - max_score);
  for (int64_t j = 0; j < seq_kv; ++j) {
    const double s = score[static_cast<size_t>(j)];
    if (s == -INFINITY) continue;
    const double weight = std::exp(s - max_score) / sum * v_descale;
    const auto [entry, row] = seq.keys[static_cast<size_t>(j)];
    for (int64_t d = 0; d < value_dim; ++d) out.o[static_cast<size_t>(d)] += weight * read_element(p.v, {entry, kv_head, row, d});
  }
  out.lse = max_score + std::log(sum);
  return out;
}

}  // namespace ffpa_fuzz
