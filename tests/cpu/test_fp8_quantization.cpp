// The FP8 model (reference/fp8_quantization.hpp): the quantized inputs the
// GPU pre-pass must reproduce (groups, scales, codes, the smoothing means) and
// the attention computed from them, against the fp64 reference (accuracy
// bounds from docs/kernels/fp8_model.md; exact agreement where nothing is
// quantized or for hybrid rows) and against a naive evaluation of the model's
// formula written here. Outputs are poisoned with NaN before every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/attention_problem.hpp"
#include "common/fp8_e4m3.hpp"
#include "common/philox.hpp"
#include "common/quantization_scales.hpp"
#include "reference/cpu_attention.hpp"
#include "reference/fp8_quantization.hpp"
#include "support/accuracy_inputs.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"
#include "support/nonfinite_expectation.hpp"

namespace ffpa::detail {
namespace {

using testing::AccuracyCase;
using testing::AccuracyInputs;
using testing::ErrorMetrics;
using testing::InputKind;

// A case of this shape, the other fields at their defaults.
AccuracyCase shaped_case(int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_kv, int64_t dim) {
  AccuracyCase c;
  c.heads_q = heads_q, c.heads_kv = heads_kv, c.seq_q = seq_q, c.seq_kv = seq_kv, c.dim = dim;
  return c;
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Output {
  std::vector<double> out, lse;
};

size_t out_elements(const AttentionProblem& p) { return static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.head_dim); }
size_t lse_elements(const AttentionProblem& p) { return static_cast<size_t>(p.batch * p.heads_q * p.seq_q); }

Output reference(const AttentionProblem& p) {
  Output r{std::vector<double>(out_elements(p), kNaN), std::vector<double>(lse_elements(p), kNaN)};
  cpu_attention_forward_f64(p, {}, r.out.data(), r.lse.data());
  return r;
}

// The model's output; every element must have been written (finite, or an
// lse of -inf for a row without keys).
Output model(const AttentionProblem& p, const QuantizedInputs& z) {
  Output r{std::vector<double>(out_elements(p), kNaN), std::vector<double>(lse_elements(p), kNaN)};
  cpu_attention_quantized_f64(p, z, r.out.data(), r.lse.data());
  for (double x : r.out) EXPECT_TRUE(std::isfinite(x));
  for (double x : r.lse) EXPECT_TRUE(std::isfinite(x) || x == kNegInf);
  return r;
}

Output model(const AttentionProblem& p, const QuantizationOptions& o) { return model(p, quantize_attention_inputs(p, o)); }

double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t e = 0; e < a.size(); ++e) {
    if (a[e] == b[e]) continue;  // also -inf == -inf
    m = std::max(m, std::fabs(a[e] - b[e]));
  }
  return m;
}

QuantizationOptions unquantized() {
  QuantizationOptions o;
  o.qk_format = QkFormat::unquantized;
  o.pv_format = PvFormat::unquantized;
  return o;
}

// An additive fp32 mask [B, Hq, Nq, Nkv] on the problem: values in [-2, 2],
// about one key in eight excluded (-inf).
struct MaskStorage {
  testing::HostTensor mask;
};

void add_mask(AttentionProblem& p, MaskStorage& storage, uint64_t seed) {
  storage.mask = testing::make_host_tensor(DType::f32, {p.batch, p.heads_q, p.seq_q, p.seq_kv});
  float* m = static_cast<float*>(storage.mask.tensor.data);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (int64_t e = 0; e < storage.mask.numel(); ++e) {
    m[e] = rng() % 8 == 0 ? -std::numeric_limits<float>::infinity() : value(rng);
  }
  p.mask_kind = MaskKind::additive_f32;
  p.mask = m;
  for (int d = 0; d < 4; ++d) p.mask_stride[d] = storage.mask.tensor.stride[d];
}

void add_dropout(AttentionProblem& p, float probability, uint64_t seed) {
  p.dropout_p = probability;
  p.dropout_threshold = dropout_threshold(probability);
  p.dropout_scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(probability)));
  p.dropout_seed = 0x9E3779B97F4A7C15ull * seed;
  p.dropout_offset = 0xD1B54A32D192ED03ull * (seed + 1);
}

// --- which elements share a scale -------------------------------------------

TEST(QuantizationScales, ThreadGroupsAreTheRowsAndKeysOneAccumulatorThreadHolds) {
  // The m64nN wgmma accumulator: warp w, lane l holds rows 16w + l/4 (+8) and
  // columns 8c + 2(l%4) + {0, 1}. Every thread's rows share one Q group and its
  // columns one K group, and different threads' rows different Q groups.
  const auto g = QkScaleGranularity::per_thread_group;
  std::vector<int> q_group_rows(kQueryGroupsPerBlock, 0), k_group_keys(kKeyGroupsPerBlock, 0);
  for (int w = 0; w < 4; ++w) {
    for (int lane = 0; lane < 32; ++lane) {
      const int64_t row = 16 * w + lane / 4;
      ASSERT_EQ(q_scale_index(row, g), q_scale_index(row + 8, g));
      if (lane % 4 == 0) q_group_rows[q_scale_index(row, g)] += 2;
      for (int64_t block = 0; block < 3; ++block) {
        const int64_t first_key = block * kQuantKeyBlock + 2 * (lane % 4);
        for (int64_t c = 0; c < kQuantKeyBlock / 8; ++c) {
          for (int64_t e = 0; e < 2; ++e) {
            ASSERT_EQ(k_scale_index(first_key + 8 * c + e, g), k_scale_index(first_key, g));
          }
        }
        ASSERT_EQ(k_scale_index(first_key, g), block * kKeyGroupsPerBlock + lane % 4);
      }
    }
  }
  for (int rows : q_group_rows) EXPECT_EQ(rows, 2);  // 32 groups of 2 rows
  for (int64_t key = 0; key < kQuantKeyBlock; ++key) ++k_group_keys[k_scale_index(key, g)];
  for (int keys : k_group_keys) EXPECT_EQ(keys, 32);
  EXPECT_EQ(q_scale_index(64, g), kQueryGroupsPerBlock);  // the next block's first group
  EXPECT_EQ(q_scale_count(65, g), 2 * kQueryGroupsPerBlock);
  EXPECT_EQ(k_scale_count(129, g), 2 * kKeyGroupsPerBlock);
  EXPECT_EQ(q_scale_count(65, QkScaleGranularity::per_block), 2);
  EXPECT_EQ(k_scale_index(255, QkScaleGranularity::per_block), 1);
  EXPECT_EQ(v_scale_count(300, 40, VScaleGranularity::per_channel), 40);
  EXPECT_EQ(v_scale_count(300, 40, VScaleGranularity::per_block), 3);
}

TEST(QuantizationScales, ZeroAndTinyGroupsGetScaleOne) {
  EXPECT_EQ(quantization_scale(0.0f, kE4m3Max), 1.0f);
  EXPECT_EQ(quantization_scale(1e-37f, kE4m3Max), 1.0f);  // amax / 448 is subnormal
  EXPECT_EQ(quantization_scale(std::numeric_limits<float>::quiet_NaN(), kInt8Max), 1.0f);
  EXPECT_EQ(quantization_scale(448.0f, kE4m3Max), 1.0f);
  EXPECT_EQ(quantization_scale(3.0f, kInt8Max), 3.0f / 127.0f);
  EXPECT_EQ(quantize_e4m3(0.0f, 1.0f), 0x00);
  EXPECT_EQ(quantize_int8(1e-37f, 1.0f), 0);
}

// --- the quantized inputs ---------------------------------------------------

// Element (b, h, n, d) of a bf16 q, k or v as float.
float input_element(const void* base, const int64_t (&stride)[3], int64_t b, int64_t h, int64_t n, int64_t d) {
  return bf16_bits_to_float(static_cast<const uint16_t*>(base)[b * stride[0] + h * stride[1] + n * stride[2] + d]);
}

// The scale the rule gives a group whose largest magnitude is amax (one of
// the group's fp32 magnitudes, found here independently of the model).
float expected_scale(double amax, double format_max) {
  return amax > 0.0 ? static_cast<float>(amax) / static_cast<float>(format_max) : 1.0f;
}

// Q: each group's scale is its amax / format max, its largest element gets
// the largest code, every code is x / scale (fp32) within half a code step.
void check_q_groups(const AttentionProblem& p, const QuantizedInputs& z) {
  const QuantizationOptions& o = z.options;
  const double format_max = o.qk_format == QkFormat::int8 ? kInt8Max : kE4m3Max;
  const int64_t dim = p.head_dim, groups = z.q_scales_per_head();
  for (int64_t head = 0; head < p.batch * p.heads_q; ++head) {
    const int64_t b = head / p.heads_q, h = head % p.heads_q;
    const float* scales = z.q_scales.data() + head * groups;
    std::vector<double> amax(static_cast<size_t>(groups), 0.0);
    double largest_code = 0.0;
    for (int64_t r = 0; r < z.rows; ++r) {
      for (int64_t d = 0; d < dim; ++d) {
        const float x = input_element(p.q, p.q_stride, b, h, z.first_row + r, d);
        double& a = amax[static_cast<size_t>(q_scale_index(r, o.qk_granularity))];
        a = std::max(a, static_cast<double>(std::fabs(x)));
        const float y = x / scales[q_scale_index(r, o.qk_granularity)];
        const double code = qk_code_value(z.q_codes[static_cast<size_t>((head * z.rows + r) * dim + d)], o.qk_format);
        largest_code = std::max(largest_code, std::fabs(code));
        // Half a code step: 1/2 for int8, at most |y| / 16 for e4m3 (3 mantissa bits).
        const double step = o.qk_format == QkFormat::int8 ? 1.0 : std::max(std::ldexp(1.0, -9), std::fabs(y) / 8.0);
        EXPECT_LE(std::fabs(code - y), step / 2.0) << r << " " << d;
      }
    }
    for (int64_t g = 0; g < groups; ++g) EXPECT_EQ(scales[g], expected_scale(amax[static_cast<size_t>(g)], format_max));
    if (z.rows > 0) {
      EXPECT_EQ(largest_code, format_max);
    }
  }
}

// K and V: each group's scale is the amax of K - k_mean (V - v_mean), in fp32,
// over the group, / format max.
void check_kv_groups(const AttentionProblem& p, const QuantizedInputs& z) {
  const QuantizationOptions& o = z.options;
  const double format_max = o.qk_format == QkFormat::int8 ? kInt8Max : kE4m3Max;
  const int64_t dim = p.head_dim;
  for (int64_t head = 0; head < p.batch * p.heads_kv; ++head) {
    const int64_t b = head / p.heads_kv, h = head % p.heads_kv;
    std::vector<double> k_amax(static_cast<size_t>(z.k_scales_per_head()), 0.0);
    std::vector<double> v_amax(static_cast<size_t>(z.v_scales_per_head()), 0.0);
    for (int64_t j = 0; j < p.seq_kv; ++j) {
      for (int64_t d = 0; d < dim; ++d) {
        const float k = input_element(p.k, p.k_stride, b, h, j, d) - z.k_mean[static_cast<size_t>(head * dim + d)];
        const float v = input_element(p.v, p.v_stride, b, h, j, d) - z.v_mean[static_cast<size_t>(head * dim + d)];
        double& ka = k_amax[static_cast<size_t>(k_scale_index(j, o.qk_granularity))];
        double& va = v_amax[static_cast<size_t>(v_scale_index(j, d, o.v_granularity))];
        ka = std::max(ka, static_cast<double>(std::fabs(k)));
        va = std::max(va, static_cast<double>(std::fabs(v)));
      }
    }
    for (int64_t g = 0; g < z.k_scales_per_head(); ++g) {
      EXPECT_EQ(z.k_scales[static_cast<size_t>(head * z.k_scales_per_head() + g)],
                expected_scale(k_amax[static_cast<size_t>(g)], format_max));
    }
    for (int64_t g = 0; g < z.v_scales_per_head(); ++g) {
      EXPECT_EQ(z.v_scales[static_cast<size_t>(head * z.v_scales_per_head() + g)],
                expected_scale(v_amax[static_cast<size_t>(g)], kE4m3Max));
    }
  }
}

TEST(Fp8Model, ScalesMapEachGroupsLargestElementToTheLargestCode) {
  AccuracyCase c = shaped_case(4, 2, 150, 200, 40);
  c.kind = InputKind::llm_like;
  const AccuracyInputs in = testing::make_accuracy_inputs(c);
  for (QkFormat format : {QkFormat::int8, QkFormat::e4m3}) {
    for (QkScaleGranularity g : {QkScaleGranularity::per_block, QkScaleGranularity::per_thread_group}) {
      for (VScaleGranularity v : {VScaleGranularity::per_channel, VScaleGranularity::per_block}) {
        QuantizationOptions o;
        o.qk_format = format;
        o.qk_granularity = g;
        o.v_granularity = v;
        o.smooth_v = format == QkFormat::e4m3;
        o.n_early = g == QkScaleGranularity::per_block ? 0 : 21;
        SCOPED_TRACE(static_cast<int>(format) * 4 + static_cast<int>(g) * 2 + static_cast<int>(v));
        const QuantizedInputs z = quantize_attention_inputs(in.problem, o);
        EXPECT_EQ(z.first_row, o.n_early);
        EXPECT_EQ(z.rows, c.seq_q - o.n_early);
        check_q_groups(in.problem, z);
        check_kv_groups(in.problem, z);
      }
    }
  }
}

TEST(Fp8Model, TheMeansAreThePrePassOrderedSum) {
  // One channel where the order shows: key 0 is 2^24 and keys 1..255 are 1.
  // Block 0 sums to 2^24 (each +1 rounds back to even), block 1 to 128, the
  // total to 2^24 + 128: mean 65536.5 (a plain sequential sum gives 65536, the
  // exact mean 65536.996). The other channels: K's mean in double, to fp32.
  AccuracyCase c = shaped_case(1, 1, 8, 256, 16);
  const AccuracyInputs in = testing::make_accuracy_inputs(c);
  for (int64_t j = 0; j < c.seq_kv; ++j) {
    testing::set_element(in.k.tensor, {0, 0, j, 3}, j == 0 ? 16777216.0 : 1.0);
    testing::set_element(in.v.tensor, {0, 0, j, 5}, j == 0 ? 16777216.0 : 1.0);
  }
  QuantizationOptions o;
  o.smooth_v = true;
  const QuantizedInputs z = quantize_attention_inputs(in.problem, o);
  EXPECT_EQ(z.k_mean[3], 65536.5f);
  EXPECT_EQ(z.v_mean[5], 65536.5f);
  for (int64_t d = 0; d < c.dim; ++d) {
    if (d == 3) continue;
    double sum = 0.0;
    for (int64_t j = 0; j < c.seq_kv; ++j) sum += testing::element_as_double(in.k.tensor, {0, 0, j, d});
    EXPECT_NEAR(z.k_mean[d], sum / c.seq_kv, 1e-6) << d;
  }
  o.smooth_k = false;
  o.smooth_v = false;
  const QuantizedInputs plain = quantize_attention_inputs(in.problem, o);
  for (float m : plain.k_mean) EXPECT_EQ(m, 0.0f);
  for (float m : plain.v_mean) EXPECT_EQ(m, 0.0f);
}

TEST(Fp8Model, AllZeroBlocksGetScaleOneAndFiniteOutput) {
  AccuracyCase c = shaped_case(1, 1, 100, 200, 24);
  AccuracyInputs in = testing::make_accuracy_inputs(c);
  // Q rows of the first block, K keys of the second block, V channel 2: zeros.
  for (int64_t d = 0; d < c.dim; ++d) {
    for (int64_t i = 0; i < 64; ++i) testing::set_element(in.q.tensor, {0, 0, i, d}, 0.0);
    for (int64_t j = 128; j < 200; ++j) testing::set_element(in.k.tensor, {0, 0, j, d}, 0.0);
  }
  for (int64_t j = 0; j < c.seq_kv; ++j) testing::set_element(in.v.tensor, {0, 0, j, 2}, 0.0);
  for (QkScaleGranularity g : {QkScaleGranularity::per_block, QkScaleGranularity::per_thread_group}) {
    QuantizationOptions o;
    o.qk_granularity = g;
    o.smooth_k = false;  // smoothing would make the zero keys nonzero
    const QuantizedInputs z = quantize_attention_inputs(in.problem, o);
    for (int64_t s = 0; s < q_scale_count(64, g); ++s) EXPECT_EQ(z.q_scales[s], 1.0f);
    for (int64_t s = k_scale_count(128, g); s < z.k_scales_per_head(); ++s) EXPECT_EQ(z.k_scales[s], 1.0f);
    EXPECT_EQ(z.v_scales[2], 1.0f);
    for (int64_t e = 0; e < 64 * c.dim; ++e) EXPECT_EQ(z.q_codes[e], 0);
    const Output got = model(in.problem, z);
    const Output want = reference(in.problem);
    EXPECT_LT(testing::error_metrics(got.out, want.out).relative_l2, 5e-2);
  }
}

// --- attention --------------------------------------------------------------

TEST(Fp8Model, DefaultsOnRandnAreWithinTheMeasuredBounds) {
  // Measured (fp8_model.md): relative L2 3.5-3.7e-2, cosine 0.9993-0.9994;
  // e4m3 P and V alone give 3.4e-2 on randn.
  for (int64_t dim : {128, 512}) {
    AccuracyCase c = shaped_case(4, 2, 200, 190, dim);
    c.seed = 3;
    const AccuracyInputs in = testing::make_accuracy_inputs(c);
    const ErrorMetrics m = testing::error_metrics(model(in.problem, QuantizationOptions{}).out, reference(in.problem).out);
    EXPECT_LT(m.relative_l2, 4e-2) << dim;
    EXPECT_GT(m.cosine, 0.999) << dim;
  }
}

TEST(Fp8Model, SmoothKKeepsLlmLikeKeysAccurateAndWithoutItTheErrorGrows) {
  AccuracyCase c;
  c.kind = InputKind::llm_like;
  c.seq_q = 128;
  c.seed = 4;
  const AccuracyInputs in = testing::make_accuracy_inputs(c);
  const Output want = reference(in.problem);
  for (QkFormat format : {QkFormat::int8, QkFormat::e4m3}) {
    QuantizationOptions o;
    o.qk_format = format;
    const ErrorMetrics smooth = testing::error_metrics(model(in.problem, o).out, want.out);
    o.smooth_k = false;
    const ErrorMetrics raw = testing::error_metrics(model(in.problem, o).out, want.out);
    // Measured: int8 4.4e-2 / 9.3e-2, e4m3 8.5e-2 / 0.65 (fp8_model.md).
    EXPECT_LT(smooth.relative_l2, format == QkFormat::int8 ? 6e-2 : 1.2e-1);
    EXPECT_GT(raw.relative_l2, (format == QkFormat::int8 ? 1.5 : 4.0) * smooth.relative_l2);
    EXPECT_LT(raw.cosine, smooth.cosine);
  }
}

TEST(Fp8Model, LseIncludesTheSmoothingShift) {
  // LLM-like K: the shift scale * (q . k_mean) is of order 10, so an lse
  // without it would be far off; with it the lse is off only by the
  // quantization of the scores (measured: up to 0.08, 0.01 on average).
  AccuracyCase c;
  c.kind = InputKind::llm_like;
  c.seq_q = 100;
  c.seq_kv = 140;
  c.causal = Causal::bottom_right;
  const AccuracyInputs in = testing::make_accuracy_inputs(c);
  const Output want = reference(in.problem);
  const QuantizedInputs z = quantize_attention_inputs(in.problem, QuantizationOptions{});
  const Output got = model(in.problem, z);
  double largest_shift = 0.0, error_sum = 0.0;
  for (int64_t h = 0; h < c.heads_q; ++h) {
    for (int64_t i = 0; i < c.seq_q; ++i) {
      double shift = 0.0;
      for (int64_t d = 0; d < c.dim; ++d) {
        shift += testing::element_as_double(in.q.tensor, {0, h, i, d}) * z.k_mean[h * c.dim + d];
      }
      largest_shift = std::max(largest_shift, std::fabs(shift * static_cast<double>(in.problem.scale)));
      error_sum += std::fabs(got.lse[h * c.seq_q + i] - want.lse[h * c.seq_q + i]);
    }
  }
  EXPECT_GT(largest_shift, 5.0);
  EXPECT_LT(max_abs_difference(got.lse, want.lse), 0.15);
  EXPECT_LT(error_sum / static_cast<double>(c.heads_q * c.seq_q), 0.03);
}

TEST(Fp8Model, WithoutQuantizationItIsTheReferenceSmoothedOrNot) {
  // Smoothing K (and V) with exact values changes nothing but rounding: the
  // softmax does not see a per-row constant, the lse gets it back, the V mean
  // comes back through weights that sum to 1. Masks, both causal alignments
  // and dropout follow the reference's.
  for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
    for (int variant = 0; variant < 3; ++variant) {
      AccuracyCase c = shaped_case(4, 1, 70, variant == 1 ? 50 : 150, 40);  // 50: bottom_right rows without keys
      c.causal = causal;
      c.kind = InputKind::llm_like;
      c.seed = 10 + variant;
      AccuracyInputs in = testing::make_accuracy_inputs(c);
      MaskStorage mask;
      if (variant == 2) add_mask(in.problem, mask, 77);
      if (variant == 1) add_dropout(in.problem, 0.25f, 5);
      const Output want = reference(in.problem);
      for (bool smooth : {false, true}) {
        QuantizationOptions o = unquantized();
        o.smooth_k = smooth;
        o.smooth_v = smooth && !in.problem.has_dropout();
        const Output got = model(in.problem, o);
        SCOPED_TRACE(::testing::Message() << "causal " << static_cast<int>(causal) << " variant " << variant
                                        << " smooth " << smooth);
        EXPECT_LT(max_abs_difference(got.out, want.out), 1e-12);
        EXPECT_LT(max_abs_difference(got.lse, want.lse), 1e-12);
        for (size_t r = 0; r < want.lse.size(); ++r) EXPECT_EQ(got.lse[r] == kNegInf, want.lse[r] == kNegInf);
      }
    }
  }
}

TEST(Fp8Model, HybridRowsAreTheReferenceRowsBitForBit) {
  AccuracyCase c = shaped_case(4, 2, 150, 150, 40);
  c.causal = Causal::top_left;
  const AccuracyInputs in = testing::make_accuracy_inputs(c);
  const Output want = reference(in.problem);
  QuantizationOptions o;
  o.n_early = 70;  // not a block multiple: the quantized rows' blocks start at 70
  const QuantizedInputs z = quantize_attention_inputs(in.problem, o);
  const Output got = model(in.problem, z);
  const int64_t dim = c.dim;
  for (int64_t head = 0; head < c.batch * c.heads_q; ++head) {
    for (int64_t i = 0; i < c.seq_q; ++i) {
      const int64_t row = head * c.seq_q + i;
      if (i < o.n_early) {
        for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(got.out[row * dim + d], want.out[row * dim + d]) << i;
        ASSERT_EQ(got.lse[row], want.lse[row]) << i;
      }
    }
  }
  EXPECT_LT(testing::error_metrics(got.out, want.out).relative_l2, 4e-2);

  // The quantized rows' codes are those of a call made of rows [70, 150) alone.
  AttentionProblem tail = in.problem;
  tail.seq_q -= o.n_early;
  tail.q = static_cast<const uint16_t*>(in.problem.q) + o.n_early * in.problem.q_stride[2];
  QuantizationOptions tail_options = o;
  tail_options.n_early = 0;
  const QuantizedInputs alone = quantize_attention_inputs(tail, tail_options);
  EXPECT_EQ(z.q_codes, alone.q_codes);
  EXPECT_EQ(z.q_scales, alone.q_scales);
  EXPECT_EQ(z.k_codes, alone.k_codes);

  // n_early past the last row: every row is the reference's.
  o.n_early = 1000;
  const Output all_early = model(in.problem, o);
  EXPECT_EQ(all_early.out, want.out);
  EXPECT_EQ(all_early.lse, want.lse);
}

TEST(Fp8Model, OddSizesEveryKnobAndRowsWithoutKeys) {
  // D = 40 and 520 (not tile multiples), Nq = 77, Nkv = 203 or 61 (bottom_right:
  // 16 rows without keys), GQA, every setting.
  int64_t rows_without_keys = 0;
  for (int64_t dim : {40, 520}) {
    for (int64_t nkv : {203, 61}) {
      for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
        AccuracyCase c = shaped_case(2, 1, 77, nkv, dim);
        c.causal = causal;
        c.seed = static_cast<uint64_t>(dim + nkv);
        const AccuracyInputs in = testing::make_accuracy_inputs(c);
        const Output want = reference(in.problem);
        for (int setting = 0; setting < 4; ++setting) {
          QuantizationOptions o;
          o.qk_format = setting % 2 == 0 ? QkFormat::int8 : QkFormat::e4m3;
          o.qk_granularity = setting < 2 ? QkScaleGranularity::per_thread_group : QkScaleGranularity::per_block;
          o.v_granularity = setting < 2 ? VScaleGranularity::per_channel : VScaleGranularity::per_block;
          o.smooth_v = setting == 3;
          const Output got = model(in.problem, o);
          SCOPED_TRACE(::testing::Message() << "D " << dim << " Nkv " << nkv << " causal " << static_cast<int>(causal)
                                          << " setting " << setting);
          const ErrorMetrics m = testing::error_metrics(got.out, want.out);
          EXPECT_LT(m.relative_l2, o.qk_format == QkFormat::int8 ? 5e-2 : 7e-2);
          EXPECT_GT(m.cosine, 0.997);
          for (size_t r = 0; r < want.lse.size(); ++r) {
            ASSERT_EQ(got.lse[r] == kNegInf, want.lse[r] == kNegInf);
            if (want.lse[r] != kNegInf) continue;
            if (setting == 0) ++rows_without_keys;
            for (int64_t d = 0; d < dim; ++d) ASSERT_EQ(got.out[r * dim + d], 0.0);
          }
        }
      }
    }
  }
  EXPECT_EQ(rows_without_keys, 2 * 2 * (77 - 61));  // D x heads x rows
}

TEST(Fp8Model, MasksAndDropoutWithQuantization) {
  AccuracyCase c = shaped_case(2, 2, 90, 260, 64);
  c.causal = Causal::bottom_right;
  AccuracyInputs in = testing::make_accuracy_inputs(c);
  MaskStorage mask;
  add_mask(in.problem, mask, 31);
  add_dropout(in.problem, 0.1f, 9);
  const ErrorMetrics m = testing::error_metrics(model(in.problem, QuantizationOptions{}).out, reference(in.problem).out);
  EXPECT_LT(m.relative_l2, 5e-2);
  EXPECT_GT(m.cosine, 0.998);
}

TEST(Fp8Model, MatchesANaiveEvaluationOfItsFormula) {
  // O_i = sum_j w_j v^_j (+ v_mean), w_j = e4m3(448 exp(s_j - m_n)) / 448 *
  // exp(m_n - m) / l for key j of KV block n (128 keys), m_n the maximum over
  // blocks 0..n, m the row's maximum, l = sum_j exp(s_j - m); s_j = scale * (q
  // codes . k codes) * q scale * k scale; v^ = code * scale. Three KV blocks,
  // the second holding the largest scores (q and k of block 1 share a large
  // channel 0), so m_n changes along the row.
  AccuracyCase c = shaped_case(1, 1, 20, 300, 16);
  AccuracyInputs in = testing::make_accuracy_inputs(c);
  for (int64_t i = 0; i < c.seq_q; ++i) testing::set_element(in.q.tensor, {0, 0, i, 0}, 3.0);
  for (int64_t j = 128; j < 256; ++j) {
    testing::set_element(in.k.tensor, {0, 0, j, 0}, testing::element_as_double(in.k.tensor, {0, 0, j, 0}) + 3.0);
  }
  const AttentionProblem& p = in.problem;
  QuantizationOptions o;
  o.qk_format = QkFormat::e4m3;
  o.v_granularity = VScaleGranularity::per_block;
  o.smooth_v = true;
  const QuantizedInputs z = quantize_attention_inputs(p, o);
  const Output got = model(p, z);
  const int64_t dim = c.dim;
  double largest_difference = 0.0;
  int rows_whose_max_moved = 0;
  for (int64_t i = 0; i < c.seq_q; ++i) {
    std::vector<double> s(static_cast<size_t>(c.seq_kv));
    const double q_scale = z.q_scales[q_scale_index(i, o.qk_granularity)];
    for (int64_t j = 0; j < c.seq_kv; ++j) {
      double dot = 0.0;
      for (int64_t d = 0; d < dim; ++d) {
        dot += qk_code_value(z.q_codes[i * dim + d], o.qk_format) * qk_code_value(z.k_codes[j * dim + d], o.qk_format);
      }
      s[j] = dot * (q_scale * z.k_scales[k_scale_index(j, o.qk_granularity)]) * static_cast<double>(p.scale);
    }
    const double m = *std::max_element(s.begin(), s.end());
    double l = 0.0;
    for (double x : s) l += std::exp(x - m);
    const double m0 = *std::max_element(s.begin(), s.begin() + 128);
    if (m0 < m) ++rows_whose_max_moved;
    for (int64_t d = 0; d < dim; ++d) {
      double o_d = 0.0;
      for (int64_t j = 0; j < c.seq_kv; ++j) {
        const double m_n = *std::max_element(s.begin(), s.begin() + std::min<int64_t>(c.seq_kv, (j / 128 + 1) * 128));
        const double p448 = e4m3_bits_to_float(float_to_e4m3_bits(static_cast<float>(448.0 * std::exp(s[j] - m_n))));
        const double v = e4m3_bits_to_float(z.v_codes[j * dim + d]) * static_cast<double>(z.v_scales[j / 128]);
        o_d += p448 / 448.0 * std::exp(m_n - m) / l * v;
      }
      o_d += z.v_mean[d];
      largest_difference = std::max(largest_difference, std::fabs(o_d - got.out[i * dim + d]));
    }
    double shift = 0.0;
    for (int64_t d = 0; d < dim; ++d) shift += testing::element_as_double(in.q.tensor, {0, 0, i, d}) * z.k_mean[d];
    EXPECT_NEAR(got.lse[i], m + std::log(l) + shift * static_cast<double>(p.scale), 1e-12);
  }
  EXPECT_LT(largest_difference, 1e-12);
  EXPECT_GT(rows_whose_max_moved, c.seq_q / 2);
}

// Non-finite inputs (quantization_scales.hpp, "Non-finite inputs"; spec.md):
// a NaN or infinity is left out of the means and its group's amax (the other
// codes are those of the same inputs with a 0 there), coded as a NaN (e4m3)
// or -128 (int8, its K group's scale negated, row_nan marking the rows it
// reaches), and the model's output is NaN on exactly the rows and columns the
// spec's rules say (expect_forward_nans), finite elsewhere.
TEST(Fp8Model, NonFiniteInputsReachExactlyTheRowsTheyTouch) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const QkFormat format : {QkFormat::int8, QkFormat::e4m3}) {
    for (const QkScaleGranularity granularity : {QkScaleGranularity::per_thread_group, QkScaleGranularity::per_block}) {
      for (const Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
        AccuracyCase c = shaped_case(4, 2, 130, 300, 64);
        c.causal = causal;
        SCOPED_TRACE(std::string(format == QkFormat::int8 ? "int8 " : "e4m3 ") +
                     (granularity == QkScaleGranularity::per_block ? "per block " : "per thread group ") +
                     "causal " + std::to_string(static_cast<int>(causal)));
        AccuracyInputs clean = testing::make_accuracy_inputs(c), in = testing::make_accuracy_inputs(c);
        // The clean run holds 0 where the poisoned one holds NaN or inf: the
        // same codes elsewhere, the same means and scales.
        const std::array<std::array<int64_t, 4>, 2> q_at = {{{0, 3, 70, 5}, {0, 0, 1, 2}}};
        const std::array<int64_t, 4> k_at = {0, 1, 200, 9}, k_inf_at = {0, 0, 260, 7}, v_at = {0, 0, 40, 3};
        for (AccuracyInputs* inputs : {&clean, &in}) {
          const bool poison = inputs == &in;
          testing::set_element(inputs->q.tensor, q_at[0], poison ? nan : 0.0);
          testing::set_element(inputs->q.tensor, q_at[1], poison ? -inf : 0.0);
          testing::set_element(inputs->k.tensor, k_at, poison ? nan : 0.0);
          testing::set_element(inputs->k.tensor, k_inf_at, poison ? inf : 0.0);
          testing::set_element(inputs->v.tensor, v_at, poison ? nan : 0.0);
        }
        QuantizationOptions o;
        o.qk_format = format;
        o.qk_granularity = granularity;
        const QuantizedInputs z = quantize_attention_inputs(in.problem, o), zc = quantize_attention_inputs(clean.problem, o);
        EXPECT_EQ(z.k_mean, zc.k_mean);
        EXPECT_EQ(z.v_scales, zc.v_scales);
        EXPECT_EQ(z.q_scales, zc.q_scales);
        const uint8_t marker = format == QkFormat::int8 ? kInt8NonFinite : kE4m3NaN;
        const int64_t dim = c.dim, rows = z.rows, nkv = c.seq_kv;
        auto q_code = [&](const QuantizedInputs& x, const std::array<int64_t, 4>& at) {
          return x.q_codes[static_cast<size_t>(((at[0] * c.heads_q + at[1]) * rows + at[2]) * dim + at[3])];
        };
        auto k_code = [&](const QuantizedInputs& x, const std::array<int64_t, 4>& at) {
          return x.k_codes[static_cast<size_t>(((at[0] * c.heads_kv + at[1]) * nkv + at[2]) * dim + at[3])];
        };
        EXPECT_EQ(q_code(z, q_at[0]), marker);
        EXPECT_EQ(q_code(z, q_at[1]), marker);
        EXPECT_EQ(k_code(z, k_at), marker);
        EXPECT_EQ(k_code(z, k_inf_at), marker);
        EXPECT_EQ(z.v_codes[static_cast<size_t>(40 * dim + 3)], kE4m3NaN);
        size_t codes_changed = 0;
        for (size_t e = 0; e < z.k_codes.size(); ++e) codes_changed += z.k_codes[e] != zc.k_codes[e] ? 1 : 0;
        EXPECT_EQ(codes_changed, 2u) << "only the non-finite values' codes";
        for (size_t g = 0; g < z.k_scales.size(); ++g) {
          const int64_t head = static_cast<int64_t>(g) / z.k_scales_per_head(), group = static_cast<int64_t>(g) % z.k_scales_per_head();
          const bool flagged = format == QkFormat::int8 &&
                               ((head == 1 && group == k_scale_index(200, granularity)) ||
                                (head == 0 && group == k_scale_index(260, granularity)));
          EXPECT_EQ(z.k_scales[g], flagged ? -zc.k_scales[g] : zc.k_scales[g]) << "k scale " << g;
        }
        // The spec's rules read NaNs; FP8 quantizes an infinity as one.
        testing::ForwardExpectation want_with_inf;
        {
          AccuracyInputs as_nan = testing::make_accuracy_inputs(c);
          testing::set_element(as_nan.q.tensor, q_at[0], nan);
          testing::set_element(as_nan.q.tensor, q_at[1], nan);
          testing::set_element(as_nan.k.tensor, k_at, nan);
          testing::set_element(as_nan.k.tensor, k_inf_at, nan);
          testing::set_element(as_nan.v.tensor, v_at, nan);
          want_with_inf = testing::expect_forward_nans(as_nan.problem, 0);
        }
        if (format == QkFormat::int8) {
          for (int64_t bh = 0; bh < c.batch * c.heads_q; ++bh)
            for (int64_t r = 0; r < rows; ++r)
              EXPECT_EQ(std::isnan(z.row_nan[static_cast<size_t>(bh * rows + r)]),
                        want_with_inf.lse[static_cast<size_t>(bh * c.seq_q + r)] == testing::Expect::nan)
                  << "row_nan of head " << bh << " row " << r;
        } else {
          EXPECT_TRUE(z.row_nan.empty());
        }
        std::vector<double> out(out_elements(in.problem), kNaN), lse(lse_elements(in.problem), kNaN);
        cpu_attention_quantized_f64(in.problem, z, out.data(), lse.data());
        for (size_t e = 0; e < out.size(); ++e)
          EXPECT_EQ(std::isnan(out[e]), want_with_inf.o[e] == testing::Expect::nan) << "o element " << e;
        for (size_t e = 0; e < lse.size(); ++e)
          EXPECT_EQ(std::isnan(lse[e]), want_with_inf.lse[e] == testing::Expect::nan) << "lse row " << e;
        EXPECT_GT(want_with_inf.nan_rows, 0);
      }
    }
  }
}

TEST(Fp8Model, RefusesWhatItDoesNotDefine) {
  AccuracyCase c;
  c.seq_q = c.seq_kv = 16;
  c.dim = 8;
  AccuracyInputs in = testing::make_accuracy_inputs(c);
  QuantizationOptions o;
  o.n_early = -1;
  EXPECT_THROW(quantize_attention_inputs(in.problem, o), std::invalid_argument);
  o.n_early = 0;
  o.smooth_v = true;
  add_dropout(in.problem, 0.5f, 1);
  EXPECT_THROW(quantize_attention_inputs(in.problem, o), std::invalid_argument);
  in.problem.dropout_p = 0.0f;
  const QuantizedInputs z = quantize_attention_inputs(in.problem, o);
  AttentionProblem other = in.problem;
  other.seq_kv = 15;
  std::vector<double> out(out_elements(other)), lse(lse_elements(other));
  EXPECT_THROW(cpu_attention_quantized_f64(other, z, out.data(), lse.data()), std::invalid_argument);
}

}  // namespace
}  // namespace ffpa::detail
