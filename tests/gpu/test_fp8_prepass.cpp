// The FP8 pre-pass (kernels/fp8_prepass/) on the GPU against the CPU model
// (reference/fp8_quantization.hpp: quantize_attention_inputs), byte for byte:
// every code, scale and mean, V transposed with its padding zeroed, for each
// knob setting, both dtypes and layouts, odd sizes, GQA, hybrid rows, and
// inputs with zeros, infinities and NaNs (int8: the rows they reach, row_nan). The workspace is poisoned first, so
// a region left unwritten shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "common/quantization_options.hpp"
#include "gpu/device_tensor.hpp"
#include "kernels/fp8_prepass/prepass.hpp"
#include "kernels/fp8_prepass/workspace.hpp"
#include "reference/fp8_quantization.hpp"
#include "support/accuracy_inputs.hpp"
#include "support/fp8_kv_cache.hpp"

namespace {

using namespace ffpa;
using namespace ffpa::detail;
using ffpa::testing::AccuracyCase;
using ffpa::testing::AccuracyInputs;
using ffpa::testing::DeviceBuffer;
using ffpa::testing::InputKind;
using ffpa::testing::Layout;

struct PrepassCase {
  std::string name;
  AccuracyCase shape;
  QuantizationOptions options;
  bool special_values = false;  // zeros, infinities and a NaN in q, k and v
};

std::vector<PrepassCase> cases() {
  auto shape = [](int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv, int64_t d) {
    AccuracyCase c;
    c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.seq_q = nq, c.seq_kv = nkv, c.dim = d;
    return c;
  };
  std::vector<PrepassCase> all;
  const AccuracyCase base = shape(1, 2, 2, 256, 256, 128);
  QuantizationOptions defaults;
  all.push_back({"defaults", base, defaults});
  for (InputKind kind : {InputKind::llm_like}) {
    AccuracyCase c = base;
    c.kind = kind;
    all.push_back({"defaults_llm_like", c, defaults});
  }
  QuantizationOptions o = defaults;
  o.qk_format = QkFormat::e4m3;
  all.push_back({"e4m3_per_thread_group", base, o});
  o.qk_granularity = QkScaleGranularity::per_block;
  all.push_back({"e4m3_per_block", base, o});
  o = defaults;
  o.qk_granularity = QkScaleGranularity::per_block;
  all.push_back({"int8_per_block", base, o});
  o = defaults;
  o.smooth_k = false;
  all.push_back({"no_smooth_k", base, o});
  o = defaults;
  o.v_granularity = VScaleGranularity::per_block;
  all.push_back({"v_per_block", base, o});
  o = defaults;
  o.smooth_v = true;
  all.push_back({"smooth_v_per_channel", base, o});
  o.v_granularity = VScaleGranularity::per_block;
  all.push_back({"smooth_v_per_block", base, o});
  o = defaults;
  o.n_early = 100;  // quantized rows start inside a tile
  all.push_back({"n_early_100", base, o});
  o.n_early = 1000;  // every row hybrid: no Q codes
  all.push_back({"n_early_past_nq", base, o});

  // Odd sizes, GQA, fp16, bnhd, the largest head dim.
  AccuracyCase c = shape(2, 4, 1, 77, 203, 40);
  c.kind = InputKind::llm_like;
  all.push_back({"gqa4_q77_kv203_d40_llm_like", c, defaults});
  c = shape(1, 2, 2, 130, 61, 520);
  c.dtype = DType::f16;
  all.push_back({"f16_q130_kv61_d520", c, defaults});
  c = shape(2, 3, 3, 65, 129, 72);
  c.layout = Layout::bnhd;
  o = defaults;
  o.smooth_v = true;
  o.qk_format = QkFormat::e4m3;
  all.push_back({"bnhd_q65_kv129_d72_e4m3_smooth_v", c, o});
  c = shape(1, 1, 1, 64, 1000, 1024);
  all.push_back({"q64_kv1000_d1024", c, defaults});
  c = shape(1, 8, 1, 3, 1, 64);
  all.push_back({"mqa_kv1_q3", c, defaults});

  // Zeros, infinities, NaN.
  c = shape(1, 2, 1, 100, 300, 64);
  all.push_back({"special_values", c, defaults, true});
  o = defaults;
  o.qk_format = QkFormat::e4m3;
  o.v_granularity = VScaleGranularity::per_block;
  all.push_back({"special_values_e4m3_v_per_block", c, o, true});
  // Non-finite K values past some rows' causal reach: row_nan marks the others.
  c.causal = Causal::bottom_right;
  all.push_back({"special_values_bottom_right", c, defaults, true});
  o = defaults;
  o.qk_granularity = QkScaleGranularity::per_block;
  o.smooth_v = true;
  c.causal = Causal::top_left;
  c.seq_q = 300;
  all.push_back({"special_values_top_left_int8_per_block_smooth_v", c, o, true});
  return all;
}

// Zeros for a whole Q group, a K group and a V block, and a few infinities and
// a NaN where they reach a mean, a scale and a code.
void add_special_values(AccuracyInputs& in) {
  using ffpa::testing::set_element;
  const AttentionProblem& p = in.problem;
  for (int64_t d = 0; d < p.head_dim; ++d) {
    set_element(in.q.tensor, {0, 0, 3, d}, 0.0);  // rows 3 and 11: one thread group
    set_element(in.q.tensor, {0, 0, 11, d}, 0.0);
    for (int64_t j = 128; j < 256; ++j) set_element(in.v.tensor, {0, 0, j, d}, 0.0);  // V block 1
    for (int64_t j = 128; j < 256; ++j) {
      if ((j % 8) / 2 == 1) set_element(in.k.tensor, {0, 0, j, d}, 0.0);  // K group 1 of block 1
    }
  }
  const double inf = std::numeric_limits<double>::infinity();
  set_element(in.q.tensor, {0, 1, 70, 5}, inf);
  set_element(in.k.tensor, {0, 0, 260, 7}, -inf);
  set_element(in.k.tensor, {0, 0, 10, 9}, std::numeric_limits<double>::quiet_NaN());
  set_element(in.v.tensor, {0, 0, 40, 3}, inf);
  set_element(in.v.tensor, {0, 0, 41, 4}, std::numeric_limits<double>::quiet_NaN());
}

// A host tensor's whole buffer on the device, and the problem's pointer moved there.
void to_device(const ffpa::testing::HostTensor& host, DeviceBuffer* device, const void** pointer) {
  ASSERT_NO_FATAL_FAILURE(device->allocate(host.bytes()));
  FFPA_ASSERT_CUDA(cudaMemcpy(device->data(), host.tensor.data, host.bytes(), cudaMemcpyHostToDevice));
  *pointer = device->data();
}

template <typename T>
std::vector<T> from_device(const unsigned char* workspace, size_t offset, size_t count) {
  std::vector<T> host(count);
  if (count > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), workspace + offset, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

// Bitwise equality (any NaN equals any NaN), reporting the first few differences.
template <typename T>
void expect_same_bits(const std::vector<T>& gpu, const std::vector<T>& model, const char* what) {
  ASSERT_EQ(gpu.size(), model.size()) << what;
  int reported = 0;
  size_t differing = 0;
  for (size_t e = 0; e < gpu.size(); ++e) {
    if (std::memcmp(&gpu[e], &model[e], sizeof(T)) == 0) continue;
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(gpu[e]) && std::isnan(model[e])) continue;  // NaN payloads differ between CPU and GPU
    }
    ++differing;
    if (reported++ < 5) {
      ADD_FAILURE() << what << "[" << e << "]: gpu " << +gpu[e] << ", model " << +model[e];
    }
  }
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << gpu.size() << " differ";
}

class Fp8Prepass : public ::testing::TestWithParam<PrepassCase> {};

TEST_P(Fp8Prepass, WritesTheModelsCodesAndScales) {
  if (ffpa::testing::gpu_unavailable_reason()) GTEST_SKIP() << *ffpa::testing::gpu_unavailable_reason();
  int major = 0;
  FFPA_ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major != 9) GTEST_SKIP() << "the FP8 pre-pass is built for sm_90a";
  const PrepassCase& c = GetParam();
  AccuracyInputs in = ffpa::testing::make_accuracy_inputs(c.shape);
  if (c.special_values) add_special_values(in);
  const QuantizedInputs model = quantize_attention_inputs(in.problem, c.options);

  AttentionProblem p = in.problem;
  DeviceBuffer q, k, v, workspace;
  ASSERT_NO_FATAL_FAILURE(to_device(in.q, &q, &p.q));
  ASSERT_NO_FATAL_FAILURE(to_device(in.k, &k, &p.k));
  ASSERT_NO_FATAL_FAILURE(to_device(in.v, &v, &p.v));
  const fp8_prepass::WorkspaceLayout layout = fp8_prepass::WorkspaceLayout::of(p, c.options);
  ASSERT_NO_FATAL_FAILURE(workspace.allocate(layout.bytes));
  FFPA_ASSERT_CUDA(cudaMemset(workspace.data(), 0xA5, layout.bytes));  // poison
  const Status status = fp8_prepass::launch_prepass(p, c.options, layout.bind(workspace.data()), nullptr);
  ASSERT_TRUE(status.ok()) << status.message;
  FFPA_ASSERT_CUDA(cudaDeviceSynchronize());

  const auto* base = static_cast<const unsigned char*>(workspace.data());
  const size_t kv_heads = static_cast<size_t>(p.batch * p.heads_kv), dim = static_cast<size_t>(p.head_dim);
  const size_t nkv = static_cast<size_t>(p.seq_kv), pitch = static_cast<size_t>(layout.v_pitch);
  ASSERT_EQ(layout.first_row, model.first_row);
  ASSERT_EQ(layout.rows, model.rows);
  const size_t q_rows = static_cast<size_t>(p.batch * p.heads_q * model.rows), code_pitch = static_cast<size_t>(layout.code_pitch);
  expect_same_bits(from_device<uint8_t>(base, layout.q_codes, q_rows * code_pitch), ffpa::testing::padded_code_rows(model.q_codes, q_rows, dim, code_pitch),
                   "q_codes");
  expect_same_bits(from_device<float>(base, layout.q_scales, model.q_scales.size()), model.q_scales, "q_scales");
  expect_same_bits(from_device<float>(base, layout.k_mean, model.k_mean.size()), model.k_mean, "k_mean");
  expect_same_bits(from_device<uint8_t>(base, layout.k_codes, kv_heads * nkv * code_pitch),
                   ffpa::testing::padded_code_rows(model.k_codes, kv_heads * nkv, dim, code_pitch), "k_codes");
  expect_same_bits(from_device<float>(base, layout.k_scales, model.k_scales.size()), model.k_scales, "k_scales");
  expect_same_bits(from_device<float>(base, layout.v_mean, model.v_mean.size()), model.v_mean, "v_mean");
  expect_same_bits(from_device<float>(base, layout.v_scales, model.v_scales.size()), model.v_scales, "v_scales");
  // int8 Q and K: the rows a non-finite value reaches (from K's flagged scales);
  // the region exists for int8 even when no row is quantized (n_early past Nq).
  ASSERT_EQ(layout.row_nan != fp8_prepass::WorkspaceLayout::kAbsent, c.options.qk_format == QkFormat::int8);
  if (!model.row_nan.empty())
    expect_same_bits(from_device<float>(base, layout.row_nan, model.row_nan.size()), model.row_nan, "row_nan");
  // smooth-K's LSE term: fp32 dot products against the model's mean in double.
  const std::vector<float> lse_shift = from_device<float>(base, layout.lse_shift, q_rows);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t r = 0; r < model.rows; ++r) {
        const float* mean = model.k_mean.data() + (b * p.heads_kv + h / p.group_size()) * p.head_dim;
        double dot = 0.0, magnitude = 0.0;
        for (int64_t d = 0; d < p.head_dim; ++d) {
          const double q_value = ffpa::testing::element_as_double(in.q.tensor, {b, h, model.first_row + r, d});
          if (!std::isfinite(q_value)) continue;  // the pre-pass sums q's finite values
          dot += q_value * mean[d];
          magnitude += std::fabs(q_value * mean[d]);
        }
        const double expected = c.options.smooth_k ? p.scale * dot : 0.0;
        const float got = lse_shift[static_cast<size_t>((b * p.heads_q + h) * model.rows + r)];
        if (std::isfinite(expected)) {
          ASSERT_NEAR(got, expected, 1e-5 * p.scale * magnitude + 1e-30) << "lse_shift b" << b << " h" << h << " r" << r;
        }
      }
  // V^T: the model's [Nkv][D] codes transposed, each row padded with zeros to the pitch.
  const std::vector<uint8_t> v_transposed = ffpa::testing::transposed_v_codes(model, pitch);
  expect_same_bits(from_device<uint8_t>(base, layout.v_codes, v_transposed.size()), v_transposed, "v_codes (V^T)");
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8Prepass, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PrepassCase>& info) { return info.param.name; });

TEST(Fp8PrepassChecks, RefusesWhatOnlyTheModelDefines) {
  AttentionProblem p;
  p.batch = p.heads_q = p.heads_kv = 1;
  p.seq_q = p.seq_kv = 16;
  p.head_dim = 64;
  alignas(16) static uint16_t storage[16 * 64];
  p.q = p.k = p.v = storage;
  p.q_stride[2] = p.k_stride[2] = p.v_stride[2] = 64;
  QuantizationOptions o;
  EXPECT_TRUE(fp8_prepass::check_prepass(p, o).ok());
  o.qk_format = QkFormat::unquantized;
  EXPECT_EQ(fp8_prepass::check_prepass(p, o).code, StatusCode::invalid_option);
  o = {};
  o.pv_format = PvFormat::unquantized;
  EXPECT_EQ(fp8_prepass::check_prepass(p, o).code, StatusCode::invalid_option);
  o = {};
  o.n_early = -1;
  EXPECT_EQ(fp8_prepass::check_prepass(p, o).code, StatusCode::invalid_option);
  o = {};
  o.smooth_v = true;
  p.dropout_p = 0.1f;
  EXPECT_EQ(fp8_prepass::check_prepass(p, o).code, StatusCode::invalid_option);
  p.dropout_p = 0.0f;
  o = {};
  p.k_stride[2] = 68;  // rows 136 bytes apart
  EXPECT_EQ(fp8_prepass::check_prepass(p, o).code, StatusCode::misaligned);
}

}  // namespace
