// The FP8 KV cache (ffpa::Fp8KvCache; docs/spec.md "FP8 KV cache") on the
// CPU: its layout query, fp8_quantize_kv on host tensors against the CPU
// model's bytes (codes, padding, V^T, scales, means) for each knob, every
// status of fp8_quantize_kv and of a forward call with a cache (each with a
// message naming the argument and nothing written), the workspace of a
// forward with a cache (Q's regions only), and the C ABI (the same statuses
// and bytes as the C++ API, the forward's trailing cache pointer).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "common/quantized_kv_layout.hpp"
#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "host/fp8_forward.hpp"
#include "host/validate.hpp"
#include "kernels/fp8_prepass/workspace.hpp"
#include "reference/fp8_quantization.hpp"
#include "support/c_tensors.hpp"
#include "support/fp8_kv_cache.hpp"
#include "support/host_tensors.hpp"

namespace {

using ffpa::DType;
using ffpa::Fp8KvCache;
using ffpa::Fp8Options;
using ffpa::Fp8QuantizeKvParams;
using ffpa::ForwardParams;
using ffpa::Status;
using ffpa::StatusCode;
using ffpa::Tensor;
using ffpa::detail::AttentionProblem;
using ffpa::detail::QuantizationOptions;
using ffpa::detail::QuantizedInputs;
using ffpa::testing::HostKvCache;
using ffpa::testing::HostTensor;
using ffpa::testing::Layout;
using ffpa::testing::make_host_kv_cache;
using ffpa::testing::make_host_tensor;

uint64_t fresh_seed() { return std::random_device{}(); }

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

void* offset_pointer(const Tensor& t, int64_t bytes) { return static_cast<char*>(t.data) + bytes; }

// --- the layout --------------------------------------------------------------------

TEST(Fp8KvCacheLayout, ShapesFollowTheKnobs) {
  Fp8Options fp8;  // int8 per thread group, smooth-K, V per channel
  Fp8KvCache c;
  ASSERT_TRUE(ffpa::fp8_kv_cache_layout(2, 3, 203, 40, fp8, &c).ok());
  auto expect_dense = [](const Tensor& t, DType dtype, std::initializer_list<int64_t> shape) {
    ASSERT_EQ(t.rank, static_cast<int32_t>(shape.size()));
    EXPECT_EQ(t.dtype, dtype);
    EXPECT_EQ(t.data, nullptr);
    int32_t d = 0;
    for (int64_t extent : shape) EXPECT_EQ(t.shape[d++], extent) << d;
    int64_t stride = 1;
    for (d = t.rank - 1; d >= 0; --d) {
      EXPECT_EQ(t.stride[d], stride) << d;
      stride *= t.shape[d];
    }
  };
  expect_dense(c.k_codes, DType::u8, {2, 3, 203, 48});  // rows padded to 16 bytes
  expect_dense(c.k_scales, DType::f32, {2, 3, 2 * 4});  // two key blocks, four thread groups each
  expect_dense(c.k_mean, DType::f32, {2, 3, 40});
  expect_dense(c.v_codes, DType::u8, {2, 3, 40, 208});  // V^T, 203 keys padded to 208
  expect_dense(c.v_scales, DType::f32, {2, 3, 40});     // per channel
  expect_dense(c.v_mean, DType::f32, {2, 3, 40});
  fp8.qk_scales = ffpa::Fp8QkScales::per_block;
  fp8.v_scales = ffpa::Fp8VScales::per_block;
  ASSERT_TRUE(ffpa::fp8_kv_cache_layout(1, 1, 129, 512, fp8, &c).ok());
  expect_dense(c.k_codes, DType::u8, {1, 1, 129, 512});
  expect_dense(c.k_scales, DType::f32, {1, 1, 2});
  expect_dense(c.v_codes, DType::u8, {1, 1, 512, 144});
  expect_dense(c.v_scales, DType::f32, {1, 1, 2});
  // No keys: empty codes, the per-channel scales and means remain.
  ASSERT_TRUE(ffpa::fp8_kv_cache_layout(1, 2, 0, 64, Fp8Options{}, &c).ok());
  expect_dense(c.k_codes, DType::u8, {1, 2, 0, 64});
  expect_dense(c.v_codes, DType::u8, {1, 2, 64, 0});
  expect_dense(c.k_scales, DType::f32, {1, 2, 0});
  expect_dense(c.v_scales, DType::f32, {1, 2, 64});
}

TEST(Fp8KvCacheLayout, RefusesBadArguments) {
  Fp8KvCache c;
  EXPECT_EQ(ffpa::fp8_kv_cache_layout(1, 1, 8, 64, Fp8Options{}, nullptr).code, StatusCode::null_pointer);
  Status s = ffpa::fp8_kv_cache_layout(1, -1, 8, 64, Fp8Options{}, &c);
  EXPECT_EQ(s.code, StatusCode::invalid_option);
  EXPECT_TRUE(contains(s.message, "heads_kv = -1")) << s.message;
  s = ffpa::fp8_kv_cache_layout(1, 1, 8, 12, Fp8Options{}, &c);
  EXPECT_EQ(s.code, StatusCode::unsupported_head_dim);
  EXPECT_TRUE(contains(s.message, "head_dim = 12")) << s.message;
  Fp8Options bad;
  bad.v_scales = static_cast<ffpa::Fp8VScales>(5);
  s = ffpa::fp8_kv_cache_layout(1, 1, 8, 64, bad, &c);
  EXPECT_EQ(s.code, StatusCode::invalid_option);
  EXPECT_TRUE(contains(s.message, "fp8.v_scales = 5")) << s.message;
  s = ffpa::fp8_kv_cache_layout(int64_t{1} << 40, int64_t{1} << 20, 1024, 64, Fp8Options{}, &c);
  EXPECT_EQ(s.code, StatusCode::invalid_option);
  EXPECT_TRUE(contains(s.message, "2^63")) << s.message;
}

TEST(Fp8KvCacheLayout, ACacheTooLargeForInt64IsRefusedByValidation) {
  // k fits (2^59 elements), its V^T would not: one key padded to 16 multiplies by 16.
  Fp8QuantizeKvParams p;
  p.k = ffpa::make_tensor(reinterpret_cast<void*>(uintptr_t{1} << 20), DType::bf16,
                          {int64_t{1} << 25, int64_t{1} << 25, 1, 512});
  p.v = p.k;
  AttentionProblem problem;
  const Status s = ffpa::detail::validate_fp8_quantize_kv(p, &problem);
  EXPECT_EQ(s.code, StatusCode::invalid_option) << s.message;
  EXPECT_TRUE(contains(s.message, "2^63")) << s.message;
}

// --- fp8_quantize_kv on host tensors --------------------------------------------------

struct KvCase {
  std::string name;
  int64_t batch = 1, heads_kv = 2, seq_kv = 203, dim = 40;
  DType dtype = DType::bf16;
  Layout layout = Layout::bhnd;
  Fp8Options fp8;
  bool with_means = true;
};

// k and v with random values (and a few zeros, infinities, NaNs where asked),
// the cache (poisoned), and snapshots of every byte.
struct KvCall {
  KvCase c;
  HostTensor k, v;
  HostKvCache cache;
  std::vector<unsigned char> k_before, v_before;
  std::vector<std::vector<unsigned char>> cache_before;

  explicit KvCall(KvCase kv_case) : c(std::move(kv_case)) {
    k = make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, c.layout);
    v = make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, c.layout);
    const uint64_t seed = fresh_seed();
    // K with per-channel offsets (what smooth-K removes), V around zero.
    ffpa::testing::fill_uniform(k, seed, 3.0f, 5.0f);
    ffpa::testing::fill_uniform(v, seed + 1, -1.0f, 1.0f);
    cache = make_host_kv_cache(c.batch, c.heads_kv, c.seq_kv, c.dim, c.fp8, c.with_means);
    snapshot();
  }

  void snapshot() {
    k_before = k.storage, v_before = v.storage;
    cache_before = cache.bytes();
  }
  bool untouched() const { return k.storage == k_before && v.storage == v_before && cache.bytes() == cache_before; }
  bool inputs_untouched() const { return k.storage == k_before && v.storage == v_before; }

  Fp8QuantizeKvParams params() const {
    Fp8QuantizeKvParams p;
    p.k = k.tensor;
    p.v = v.tensor;
    p.cache = cache.view();
    p.fp8 = c.fp8;
    return p;
  }

  // The CPU model of these k and v (no queries).
  QuantizedInputs model() const {
    AttentionProblem p;
    ffpa::testing::set_problem_shape(p, c.batch, c.heads_kv, c.heads_kv, 0, c.seq_kv, c.dim, c.dtype);
    p.k = k.tensor.data, p.v = v.tensor.data;
    for (int i = 0; i < 3; ++i) p.k_stride[i] = k.tensor.stride[i], p.v_stride[i] = v.tensor.stride[i];
    return ffpa::detail::quantize_attention_inputs(p, ffpa::detail::quantization_options(c.fp8, 0));
  }
};

// Bitwise equality of float vectors (NaN payloads included: both are host code).
void expect_same_bytes(const void* got, const void* want, size_t bytes, const char* what) {
  EXPECT_EQ(std::memcmp(got, want, bytes), 0) << what;
}

// The cache equals the model's K/V in the GPU layout, padding included.
void expect_cache_is_model(const KvCall& call) {
  const QuantizedInputs z = call.model();
  const HostKvCache& cache = call.cache;
  const size_t heads = static_cast<size_t>(call.c.batch * call.c.heads_kv), nkv = static_cast<size_t>(call.c.seq_kv);
  const size_t dim = static_cast<size_t>(call.c.dim);
  const size_t k_pitch = static_cast<size_t>(cache.k_codes.tensor.shape[3]);
  const size_t v_pitch = static_cast<size_t>(cache.v_codes.tensor.shape[3]);
  const std::vector<uint8_t> k_codes = ffpa::testing::padded_code_rows(z.k_codes, heads * nkv, dim, k_pitch);
  const std::vector<uint8_t> v_codes = ffpa::testing::transposed_v_codes(z, v_pitch);
  ASSERT_EQ(cache.k_codes.bytes(), k_codes.size());
  ASSERT_EQ(cache.v_codes.bytes(), v_codes.size());
  ASSERT_EQ(cache.k_scales.bytes(), z.k_scales.size() * sizeof(float));
  ASSERT_EQ(cache.v_scales.bytes(), z.v_scales.size() * sizeof(float));
  expect_same_bytes(cache.k_codes.tensor.data, k_codes.data(), k_codes.size(), "k_codes");
  expect_same_bytes(cache.v_codes.tensor.data, v_codes.data(), v_codes.size(), "v_codes (V^T)");
  expect_same_bytes(cache.k_scales.tensor.data, z.k_scales.data(), cache.k_scales.bytes(), "k_scales");
  expect_same_bytes(cache.v_scales.tensor.data, z.v_scales.data(), cache.v_scales.bytes(), "v_scales");
  if (cache.with_k_mean) expect_same_bytes(cache.k_mean.tensor.data, z.k_mean.data(), cache.k_mean.bytes(), "k_mean");
  if (cache.with_v_mean) expect_same_bytes(cache.v_mean.tensor.data, z.v_mean.data(), cache.v_mean.bytes(), "v_mean");
}

std::vector<KvCase> kv_cases() {
  std::vector<KvCase> all;
  auto add = [&](const std::string& name, auto&& adjust) {
    KvCase c;
    c.name = name;
    adjust(c);
    all.push_back(c);
  };
  add("defaults", [](KvCase&) {});
  add("e4m3", [](KvCase& c) { c.fp8.qk_format = ffpa::Fp8QkFormat::e4m3; });
  add("e4m3_per_block", [](KvCase& c) {
    c.fp8.qk_format = ffpa::Fp8QkFormat::e4m3;
    c.fp8.qk_scales = ffpa::Fp8QkScales::per_block;
  });
  add("int8_per_block", [](KvCase& c) { c.fp8.qk_scales = ffpa::Fp8QkScales::per_block; });
  add("no_smooth_k_with_means", [](KvCase& c) { c.fp8.smooth_k = false; });
  add("no_smooth_k_no_means", [](KvCase& c) {
    c.fp8.smooth_k = false;
    c.with_means = false;
  });
  add("v_per_block", [](KvCase& c) { c.fp8.v_scales = ffpa::Fp8VScales::per_block; });
  add("smooth_v", [](KvCase& c) { c.fp8.smooth_v = true; });
  add("smooth_v_per_block_f16_bnhd", [](KvCase& c) {
    c.fp8.smooth_v = true;
    c.fp8.v_scales = ffpa::Fp8VScales::per_block;
    c.dtype = DType::f16;
    c.layout = Layout::bnhd;
  });
  add("gqa_shape_b2_kv61_d72", [](KvCase& c) {
    c.batch = 2, c.heads_kv = 3, c.seq_kv = 61, c.dim = 72;
  });
  add("d512_kv300", [](KvCase& c) { c.seq_kv = 300, c.dim = 512, c.heads_kv = 1; });
  add("one_key", [](KvCase& c) { c.seq_kv = 1; });
  return all;
}

class Fp8QuantizeKvHost : public ::testing::TestWithParam<KvCase> {};

TEST_P(Fp8QuantizeKvHost, WritesTheModelsBytes) {
  KvCall call(GetParam());
  const Status status = ffpa::fp8_quantize_kv(call.params());
  ASSERT_TRUE(status.ok()) << ffpa::status_name(status.code) << ": " << status.message;
  EXPECT_TRUE(call.inputs_untouched());
  expect_cache_is_model(call);
  // An absent mean stays absent: nothing writes through a null pointer, and
  // the buffers the test kept aside stay poisoned.
  if (!call.cache.with_k_mean) EXPECT_EQ(call.cache.bytes()[2], call.cache_before[2]);
  size_t bytes = 1;
  ASSERT_TRUE(ffpa::fp8_quantize_kv_workspace_size(call.params(), &bytes).ok());
  EXPECT_EQ(bytes, 0u) << "host tensors need no scratch";
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8QuantizeKvHost, ::testing::ValuesIn(kv_cases()),
                         [](const ::testing::TestParamInfo<KvCase>& info) { return info.param.name; });

TEST(Fp8QuantizeKv, NoKeysWritesTheMeansAndPerChannelScales) {
  KvCase c;
  c.seq_kv = 0;
  KvCall call(c);
  Fp8QuantizeKvParams p = call.params();
  p.k.data = p.v.data = nullptr;  // empty: may be null
  ASSERT_TRUE(ffpa::fp8_quantize_kv(p).ok());
  const std::vector<float> v_scales = ffpa::testing::host_values<float>(call.cache.v_scales, 2 * 40);
  for (float s : v_scales) EXPECT_EQ(s, 1.0f);  // a group of no elements: scale 1, as the pre-pass writes
  for (float m : ffpa::testing::host_values<float>(call.cache.k_mean, 2 * 40)) EXPECT_EQ(m, 0.0f);
}

TEST(Fp8QuantizeKv, AnEmptyCallWritesNothing) {
  KvCase c;
  c.batch = 0;
  KvCall call(c);
  Fp8QuantizeKvParams p = call.params();
  p.k.data = p.v.data = nullptr;
  p.cache = Fp8KvCache{};
  Fp8KvCache layout;
  ASSERT_TRUE(ffpa::fp8_kv_cache_layout(0, 2, 203, 40, c.fp8, &layout).ok());
  p.cache = layout;  // every tensor empty, data null
  ASSERT_TRUE(ffpa::fp8_quantize_kv(p).ok());
  EXPECT_TRUE(call.untouched());
}

// --- fp8_quantize_kv's statuses ---------------------------------------------------------

struct Spoil {
  const char* what;  // a word the message must contain
  StatusCode code;
  std::function<void(Fp8QuantizeKvParams&, KvCall&)> spoil;
};

std::vector<Spoil> quantize_kv_spoils() {
  return {
      {"k.rank = 3", StatusCode::invalid_rank, [](Fp8QuantizeKvParams& p, KvCall&) { p.k.rank = 3; }},
      {"cache.v_codes.rank = 3", StatusCode::invalid_rank, [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.v_codes.rank = 3; }},
      {"v.shape[2] = -1", StatusCode::invalid_option, [](Fp8QuantizeKvParams& p, KvCall&) { p.v.shape[2] = -1; }},
      {"fp8.qk_format = 9", StatusCode::invalid_option,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.fp8.qk_format = static_cast<ffpa::Fp8QkFormat>(9); }},
      {"k.dtype = f32", StatusCode::unsupported_dtype,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.k.dtype = p.v.dtype = DType::f32; }},
      {"v.dtype = f16", StatusCode::dtype_mismatch, [](Fp8QuantizeKvParams& p, KvCall&) { p.v.dtype = DType::f16; }},
      {"cache.k_codes.dtype = bf16", StatusCode::unsupported_dtype,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_codes.dtype = DType::bf16; }},
      {"cache.v_scales.dtype = u8", StatusCode::unsupported_dtype,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.v_scales.dtype = DType::u8; }},
      {"v.shape[2] (Nkv)", StatusCode::shape_mismatch, [](Fp8QuantizeKvParams& p, KvCall&) { p.v.shape[2] -= 1; }},
      {"cache.k_codes.shape", StatusCode::shape_mismatch,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_codes.shape[3] = 40; }},  // unpadded rows
      {"cache.k_scales.shape", StatusCode::shape_mismatch,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.fp8.qk_scales = ffpa::Fp8QkScales::per_block; }},  // 2 scales, not 8
      {"cache.v_scales.shape", StatusCode::shape_mismatch,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.fp8.v_scales = ffpa::Fp8VScales::per_block; }},
      {"k.shape[3] (D) = 12", StatusCode::unsupported_head_dim,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.k.shape[3] = p.v.shape[3] = 12; }},
      {"Dv == D", StatusCode::impl_unavailable, [](Fp8QuantizeKvParams& p, KvCall&) { p.v.shape[3] = 32; }},
      {"k.data is null", StatusCode::null_pointer, [](Fp8QuantizeKvParams& p, KvCall&) { p.k.data = nullptr; }},
      {"cache.v_codes.data is null", StatusCode::null_pointer,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.v_codes.data = nullptr; }},
      {"smooth_k needs K's mean", StatusCode::null_pointer,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_mean.data = nullptr; }},
      {"smooth_v needs V's mean", StatusCode::null_pointer,
       [](Fp8QuantizeKvParams& p, KvCall&) {
         p.fp8.smooth_v = true;
         p.cache.v_mean.data = nullptr;
       }},
      {"v.stride[3] = 2", StatusCode::noncontiguous_last_dim, [](Fp8QuantizeKvParams& p, KvCall&) { p.v.stride[3] = 2; }},
      {"k.stride[1] = -40", StatusCode::invalid_stride, [](Fp8QuantizeKvParams& p, KvCall&) { p.k.stride[1] = -40; }},
      {"is not the dense layout", StatusCode::invalid_stride,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.v_codes.stride[2] = 256; }},
      {"k.data", StatusCode::misaligned,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.k.data = offset_pointer(p.k, 8); }},
      {"cache.k_codes.data", StatusCode::misaligned,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_codes.data = offset_pointer(p.cache.k_codes, 8); }},
      {"cache.k_mean.data", StatusCode::misaligned,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_mean.data = offset_pointer(p.cache.k_mean, 8); }},
      {"cache.v_scales.data", StatusCode::misaligned,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.v_scales.data = offset_pointer(p.cache.v_scales, 4); }},
      {"workspace is null", StatusCode::null_pointer, [](Fp8QuantizeKvParams& p, KvCall&) { p.workspace_bytes = 64; }},
      {"cache.k_codes (bytes", StatusCode::output_overlaps_input,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_codes.data = p.k.data; }},
      {"overlaps cache.v_mean", StatusCode::output_overlaps_input,
       [](Fp8QuantizeKvParams& p, KvCall&) { p.cache.k_mean.data = p.cache.v_mean.data; }},
  };
}

TEST(Fp8QuantizeKvRejects, EveryStatusWritesNothing) {
  for (const Spoil& s : quantize_kv_spoils()) {
    KvCall call(KvCase{});
    Fp8QuantizeKvParams p = call.params();
    s.spoil(p, call);
    const Status status = ffpa::fp8_quantize_kv(p);
    EXPECT_EQ(status.code, s.code) << s.what << ": " << ffpa::status_name(status.code) << " " << status.message;
    EXPECT_TRUE(contains(status.message, s.what)) << s.what << ": " << status.message;
    EXPECT_TRUE(call.untouched()) << s.what;
    size_t bytes = 7;
    EXPECT_EQ(ffpa::fp8_quantize_kv_workspace_size(p, &bytes).code, s.code) << s.what;
    EXPECT_EQ(bytes, 7u) << s.what;
    // The C ABI says the same.
    ffpa_fp8_quantize_kv_params c;
    std::memset(&c, 0, sizeof c);
    c.k = ffpa::testing::c_tensor(p.k), c.v = ffpa::testing::c_tensor(p.v);
    c.cache.k_codes = ffpa::testing::c_tensor(p.cache.k_codes), c.cache.k_scales = ffpa::testing::c_tensor(p.cache.k_scales);
    c.cache.k_mean = ffpa::testing::c_tensor(p.cache.k_mean), c.cache.v_codes = ffpa::testing::c_tensor(p.cache.v_codes);
    c.cache.v_scales = ffpa::testing::c_tensor(p.cache.v_scales), c.cache.v_mean = ffpa::testing::c_tensor(p.cache.v_mean);
    c.fp8.qk_format = static_cast<int32_t>(p.fp8.qk_format), c.fp8.qk_scales = static_cast<int32_t>(p.fp8.qk_scales);
    c.fp8.no_smooth_k = p.fp8.smooth_k ? 0 : 1, c.fp8.v_scales = static_cast<int32_t>(p.fp8.v_scales);
    c.fp8.smooth_v = p.fp8.smooth_v ? 1 : 0;
    c.workspace_bytes = p.workspace_bytes;
    char message[256];
    EXPECT_EQ(static_cast<int>(ffpa_fp8_quantize_kv(&c, message, sizeof message)), static_cast<int>(s.code)) << s.what;
    EXPECT_TRUE(contains(message, s.what)) << message;
    EXPECT_TRUE(call.untouched()) << s.what;
  }
}

TEST(Fp8QuantizeKv, LooserAlignmentWhereTheKernelsReadScalars) {
  // K's scales are read one float at a time: 4-byte aligned is enough.
  KvCall call(KvCase{});
  HostTensor shifted = ffpa::testing::host_tensor_like(call.cache.k_scales.tensor);
  shifted.storage.resize(shifted.storage.size() + 16);
  Fp8QuantizeKvParams p = call.params();
  p.cache.k_scales.data = shifted.aligned_data() + 4;
  ASSERT_TRUE(ffpa::fp8_quantize_kv(p).ok());
  const QuantizedInputs z = call.model();
  EXPECT_EQ(std::memcmp(p.cache.k_scales.data, z.k_scales.data(), z.k_scales.size() * sizeof(float)), 0);
}

// --- a forward call with a cache -------------------------------------------------------------

struct ForwardCall {
  int64_t batch = 2, heads_q = 4, heads_kv = 2, seq_q = 70, seq_kv = 203, dim = 64;
  HostTensor q, k, v, o, lse;
  HostKvCache cache;
  std::vector<unsigned char> o_before, lse_before;

  ForwardCall() {
    q = make_host_tensor(DType::bf16, {batch, heads_q, seq_q, dim});
    k = make_host_tensor(DType::bf16, {batch, heads_kv, seq_kv, dim});
    v = make_host_tensor(DType::bf16, {batch, heads_kv, seq_kv, dim});
    o = make_host_tensor(DType::bf16, {batch, heads_q, seq_q, dim});
    lse = ffpa::testing::make_host_lse(batch, heads_q, seq_q);
    const uint64_t seed = fresh_seed();
    ffpa::testing::fill_uniform(q, seed, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(k, seed + 1, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(v, seed + 2, -1.0f, 1.0f);
    ffpa::testing::fill_nan(o);
    ffpa::testing::fill_nan(lse);
    cache = make_host_kv_cache(batch, heads_kv, seq_kv, dim, Fp8Options{});
    o_before = o.storage, lse_before = lse.storage;
  }

  // precision fp8, no hybrid rows, K and V from the cache at *view.
  ForwardParams params(Fp8KvCache* view) const {
    ForwardParams p;
    p.q = q.tensor, p.k = k.tensor, p.v = v.tensor, p.o = o.tensor, p.lse = lse.tensor;
    p.options.precision = ffpa::Precision::fp8;
    p.options.fp8.early_rows = 0;
    *view = cache.view();
    p.fp8_kv_cache = view;
    return p;
  }
  bool outputs_untouched() const { return o.storage == o_before && lse.storage == lse_before; }
};

::testing::AssertionResult rejected(const ForwardCall& call, const ForwardParams& p, StatusCode code,
                                    std::initializer_list<const char*> words) {
  AttentionProblem problem;
  problem.batch = -12345;
  const Status status = ffpa::detail::validate_forward(p, &problem);
  if (status.code != code)
    return ::testing::AssertionFailure() << "expected " << ffpa::status_name(code) << ", got "
                                         << ffpa::status_name(status.code) << " (\"" << status.message << "\")";
  for (const char* word : words)
    if (!contains(status.message, word))
      return ::testing::AssertionFailure() << "message \"" << status.message << "\" does not contain \"" << word << "\"";
  if (problem.batch != -12345) return ::testing::AssertionFailure() << "*problem was written";
  if (!call.outputs_untouched()) return ::testing::AssertionFailure() << "an output was written";
  return ::testing::AssertionSuccess() << status.message;
}

TEST(Fp8KvCacheForward, AValidCacheIsAcceptedWithKAndVAbsent) {
  ForwardCall call;
  Fp8KvCache view;
  ForwardParams p = call.params(&view);
  AttentionProblem problem;
  ASSERT_TRUE(ffpa::detail::validate_forward(p, &problem).ok());
  EXPECT_TRUE(problem.fp8);
  // k and v only give the shapes: null data, any strides (even a zero last one).
  p.k.data = p.v.data = nullptr;
  p.k.stride[3] = 0;
  p.v.stride[1] = -5;
  const Status status = ffpa::detail::validate_forward(p, &problem);
  ASSERT_TRUE(status.ok()) << status.message;
  EXPECT_EQ(problem.k, nullptr);
  EXPECT_EQ(problem.k_stride[2], call.dim);  // dense strides for a tensor nobody reads
  EXPECT_EQ(problem.v_stride[1], call.seq_kv * call.dim);
  // Without smooth-K the cache may omit K's mean; with it, not.
  view.k_mean.data = nullptr;
  EXPECT_TRUE(rejected(call, p, StatusCode::null_pointer, {"fp8_kv_cache.k_mean.data is null", "smooth_k"}));
  p.options.fp8.smooth_k = false;
  EXPECT_TRUE(ffpa::detail::validate_forward(p, &problem).ok());
}

TEST(Fp8KvCacheForward, EveryStatusWritesNothing) {
  struct Case {
    const char* what;
    StatusCode code;
    std::function<void(ForwardParams&, Fp8KvCache&, const ForwardCall&)> spoil;
  };
  const Case cases[] = {
      {"options.precision = 0", StatusCode::invalid_option,
       [](ForwardParams& p, Fp8KvCache&, const ForwardCall&) { p.options.precision = ffpa::Precision::input; }},
      {"k.data is null", StatusCode::null_pointer,
       [](ForwardParams& p, Fp8KvCache&, const ForwardCall&) {
         p.k.data = nullptr;
         p.options.fp8.early_rows.reset();  // the default with a causal mask: 256 hybrid rows
         p.options.causal = ffpa::Causal::top_left;
       }},
      {"early_rows is 64", StatusCode::null_pointer,
       [](ForwardParams& p, Fp8KvCache&, const ForwardCall&) {
         p.v.data = nullptr;
         p.options.fp8.early_rows = 64;
       }},
      {"fp8_kv_cache.k_codes.rank = 3", StatusCode::invalid_rank,
       [](ForwardParams&, Fp8KvCache& c, const ForwardCall&) { c.k_codes.rank = 3; }},
      {"fp8_kv_cache.v_scales.dtype = bf16", StatusCode::unsupported_dtype,
       [](ForwardParams&, Fp8KvCache& c, const ForwardCall&) { c.v_scales.dtype = DType::bf16; }},
      {"fp8_kv_cache.k_codes.shape", StatusCode::shape_mismatch,
       [](ForwardParams& p, Fp8KvCache&, const ForwardCall&) {
         p.q.shape[3] = p.k.shape[3] = p.v.shape[3] = p.o.shape[3] = 40;  // the cache is for D = 64
       }},
      {"fp8_kv_cache.k_scales.shape", StatusCode::shape_mismatch,
       [](ForwardParams& p, Fp8KvCache&, const ForwardCall&) {
         p.options.fp8.qk_scales = ffpa::Fp8QkScales::per_block;  // knobs other than the cache's
       }},
      {"fp8_kv_cache.v_codes.stride", StatusCode::invalid_stride,
       [](ForwardParams&, Fp8KvCache& c, const ForwardCall&) { c.v_codes.stride[1] += 16; }},
      {"fp8_kv_cache.v_codes.data", StatusCode::misaligned,
       [](ForwardParams&, Fp8KvCache& c, const ForwardCall&) { c.v_codes.data = offset_pointer(c.v_codes, 8); }},
      {"fp8_kv_cache.v_mean.data", StatusCode::misaligned,
       [](ForwardParams&, Fp8KvCache& c, const ForwardCall&) { c.v_mean.data = offset_pointer(c.v_mean, 4); }},
      {"overlaps fp8_kv_cache.v_codes", StatusCode::output_overlaps_input,
       [](ForwardParams& p, Fp8KvCache& c, const ForwardCall&) { c.v_codes.data = offset_pointer(p.o, 16); }},
      {"lse (bytes", StatusCode::output_overlaps_input,
       [](ForwardParams& p, Fp8KvCache& c, const ForwardCall&) { c.k_scales.data = p.lse.data; }},
  };
  for (const Case& c : cases) {
    ForwardCall call;
    Fp8KvCache view;
    ForwardParams p = call.params(&view);
    c.spoil(p, view, call);
    EXPECT_TRUE(rejected(call, p, c.code, {c.what})) << c.what;
    const Status status = ffpa::forward(p);  // the public entry point refuses before running
    EXPECT_EQ(status.code, c.code) << c.what << ": " << status.message;
    EXPECT_TRUE(call.outputs_untouched()) << c.what;
  }
}

TEST(Fp8KvCacheForward, U8IsNotAnInputDtype) {
  ForwardCall call;
  Fp8KvCache view;
  ForwardParams p = call.params(&view);
  p.q.dtype = DType::u8;
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"q.dtype = u8"}));
  for (Tensor ForwardParams::*t : {&ForwardParams::k, &ForwardParams::v, &ForwardParams::o}) {
    p = call.params(&view);
    (p.*t).dtype = DType::u8;
    EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {".dtype = u8", "FP8 KV cache"}));
  }
  p = call.params(&view);
  p.fp8_kv_cache = nullptr;
  HostTensor mask = make_host_tensor(DType::u8, {call.batch, 1, 1, call.seq_kv});
  p.mask = mask.tensor;
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"mask.dtype = u8"}));
  p = call.params(&view);
  p.lse.dtype = DType::u8;
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"lse.dtype = u8"}));
}

TEST(Fp8KvCacheForward, HostTensorsAreRefusedByPlanningUntouched) {
  // FP8 runs on the sm90 family only: host tensors are refused (no device
  // here: impl_unavailable; with one: wrong_memory_space), the cache too.
  ForwardCall call;
  Fp8KvCache view;
  const ForwardParams p = call.params(&view);
  const Status status = ffpa::forward(p);
  EXPECT_TRUE(status.code == StatusCode::impl_unavailable || status.code == StatusCode::wrong_memory_space)
      << ffpa::status_name(status.code) << ": " << status.message;
  EXPECT_TRUE(call.outputs_untouched());
  size_t bytes = 3;
  EXPECT_EQ(ffpa::workspace_size(p, &bytes).code, status.code);
  // An empty call is a no-op whatever the cache.
  ForwardParams empty = p;
  empty.q.shape[2] = empty.o.shape[2] = empty.lse.shape[2] = 0;
  EXPECT_TRUE(ffpa::forward(empty).ok());
}

TEST(Fp8KvCacheForward, TheWorkspaceHoldsOnlyTheQueries) {
  ForwardCall call;
  Fp8KvCache view;
  AttentionProblem problem;
  ASSERT_TRUE(ffpa::detail::validate_forward(call.params(&view), &problem).ok());
  const QuantizationOptions& o = problem.quantization;
  const size_t with_cache = ffpa::detail::fp8_workspace_bytes(problem, o, &view);
  const size_t without = ffpa::detail::fp8_workspace_bytes(problem, o);
  // Q's codes (rows of 64 bytes), scales (32 per 64 rows), LSE terms and
  // (int8 codes) row_nan marks, each region 256-byte aligned.
  ASSERT_EQ(o.qk_format, ffpa::detail::QkFormat::int8);
  const size_t q_heads = static_cast<size_t>(call.batch * call.heads_q), rows = static_cast<size_t>(call.seq_q);
  auto aligned = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  EXPECT_EQ(with_cache, aligned(q_heads * rows * 64) + aligned(q_heads * 2 * 32 * 4) + 2 * aligned(q_heads * rows * 4));
  EXPECT_LT(with_cache, without);
  const ffpa::detail::fp8_prepass::WorkspaceLayout layout = ffpa::detail::fp8_prepass::WorkspaceLayout::of(
      problem, o, ffpa::detail::fp8_prepass::Regions::queries);
  const ffpa::detail::fp8_prepass::QuantizedBuffers buffers = layout.bind(reinterpret_cast<void*>(uintptr_t{4096}));
  EXPECT_EQ(buffers.k_codes, nullptr);
  EXPECT_EQ(buffers.k_partials, nullptr);
  EXPECT_NE(buffers.q_codes, nullptr);
  // All rows hybrid: nothing to quantize at all.
  problem.quantization.n_early = 128;
  EXPECT_EQ(ffpa::detail::fp8_workspace_bytes(problem, problem.quantization, &view), 0u);
}

// --- the C ABI --------------------------------------------------------------------------------

ffpa_fp8_kv_cache c_cache(const Fp8KvCache& c) {
  ffpa_fp8_kv_cache out;
  out.k_codes = ffpa::testing::c_tensor(c.k_codes), out.k_scales = ffpa::testing::c_tensor(c.k_scales);
  out.k_mean = ffpa::testing::c_tensor(c.k_mean), out.v_codes = ffpa::testing::c_tensor(c.v_codes);
  out.v_scales = ffpa::testing::c_tensor(c.v_scales), out.v_mean = ffpa::testing::c_tensor(c.v_mean);
  return out;
}

TEST(Fp8KvCacheCApi, LayoutMatchesTheCppOne) {
  ffpa_fp8_kv_cache c;
  std::memset(&c, 0xFF, sizeof c);
  char message[128];
  ASSERT_EQ(ffpa_fp8_kv_cache_layout(2, 3, 203, 40, nullptr, &c, message, sizeof message), FFPA_OK);  // NULL: defaults
  Fp8KvCache cpp;
  ASSERT_TRUE(ffpa::fp8_kv_cache_layout(2, 3, 203, 40, Fp8Options{}, &cpp).ok());
  const ffpa_fp8_kv_cache want = c_cache(cpp);
  EXPECT_EQ(std::memcmp(&c, &want, sizeof c), 0);
  ffpa_fp8_options per_block;
  std::memset(&per_block, 0, sizeof per_block);
  per_block.qk_scales = FFPA_FP8_QK_SCALES_PER_BLOCK;
  ASSERT_EQ(ffpa_fp8_kv_cache_layout(2, 3, 203, 40, &per_block, &c, message, sizeof message), FFPA_OK);
  EXPECT_EQ(c.k_scales.shape[2], 2);
  EXPECT_EQ(ffpa_fp8_kv_cache_layout(2, 3, 203, 40, nullptr, nullptr, message, sizeof message), FFPA_NULL_POINTER);
  EXPECT_EQ(ffpa_fp8_kv_cache_layout(2, 3, 203, 44, nullptr, &c, message, sizeof message), FFPA_UNSUPPORTED_HEAD_DIM);
  EXPECT_TRUE(contains(message, "head_dim = 44")) << message;
}

TEST(Fp8KvCacheCApi, QuantizeKvWritesWhatTheCppApiWrites) {
  KvCase kv;
  kv.fp8.smooth_v = true;
  kv.fp8.qk_format = ffpa::Fp8QkFormat::e4m3;
  KvCall cpp_call(kv);
  KvCall c_call = cpp_call;  // the same k and v, its own cache
  c_call.cache = make_host_kv_cache(kv.batch, kv.heads_kv, kv.seq_kv, kv.dim, kv.fp8);
  ASSERT_TRUE(ffpa::fp8_quantize_kv(cpp_call.params()).ok());
  const Fp8QuantizeKvParams p = c_call.params();
  ffpa_fp8_quantize_kv_params c;
  std::memset(&c, 0, sizeof c);
  c.k = ffpa::testing::c_tensor(p.k), c.v = ffpa::testing::c_tensor(p.v);
  c.cache = c_cache(p.cache);
  c.fp8.qk_format = FFPA_FP8_QK_E4M3;
  c.fp8.smooth_v = 1;
  char message[256] = {};
  ASSERT_EQ(ffpa_fp8_quantize_kv(&c, message, sizeof message), FFPA_OK) << message;
  EXPECT_EQ(c_call.cache.bytes(), cpp_call.cache.bytes());
  size_t bytes = 5;
  ASSERT_EQ(ffpa_fp8_quantize_kv_workspace_size(&c, &bytes, message, sizeof message), FFPA_OK);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(ffpa_fp8_quantize_kv(nullptr, message, sizeof message), FFPA_NULL_POINTER);
  EXPECT_EQ(ffpa_fp8_quantize_kv_workspace_size(&c, nullptr, message, sizeof message), FFPA_NULL_POINTER);
}

TEST(Fp8KvCacheCApi, TheForwardReadsTheTrailingCachePointer) {
  ForwardCall call;
  Fp8KvCache view;
  ForwardParams p = call.params(&view);
  ffpa_forward_params c;
  std::memset(&c, 0, sizeof c);
  c.q = ffpa::testing::c_tensor(p.q), c.k = ffpa::testing::c_tensor(p.k), c.v = ffpa::testing::c_tensor(p.v);
  c.o = ffpa::testing::c_tensor(p.o), c.lse = ffpa::testing::c_tensor(p.lse);
  c.options.fp8.has_early_rows = 1;  // early_rows = 0
  const ffpa_fp8_kv_cache cache = c_cache(view);
  c.fp8_kv_cache = &cache;
  char message[512] = {};
  // Precision input with a cache: refused, so the pointer was read.
  EXPECT_EQ(ffpa_forward(&c, message, sizeof message), FFPA_INVALID_OPTION);
  EXPECT_TRUE(contains(message, "fp8_kv_cache is given")) << message;
  size_t bytes = 0;
  EXPECT_EQ(ffpa_workspace_size(&c, &bytes, message, sizeof message), FFPA_INVALID_OPTION);
  // Precision fp8 with a misaligned cache: the C++ API's status.
  c.options.precision = FFPA_PRECISION_FP8;
  ffpa_fp8_kv_cache broken = cache;
  broken.k_codes.data = offset_pointer(view.k_codes, 4);
  c.fp8_kv_cache = &broken;
  EXPECT_EQ(ffpa_forward(&c, message, sizeof message), FFPA_MISALIGNED);
  EXPECT_TRUE(contains(message, "fp8_kv_cache.k_codes.data")) << message;
  // A valid cache: the same status as the C++ API (planning, on host tensors).
  c.fp8_kv_cache = &cache;
  const Status cpp = ffpa::forward(p);
  EXPECT_EQ(static_cast<int>(ffpa_forward(&c, message, sizeof message)), static_cast<int>(cpp.code)) << message;
  EXPECT_TRUE(call.outputs_untouched());
}

}  // namespace
