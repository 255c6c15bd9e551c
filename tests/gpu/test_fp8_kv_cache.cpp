// The FP8 KV cache on the GPU (run on the H200 by scripts/gpu_check.sh):
//  - fp8_quantize_kv on device tensors writes, byte for byte, what the
//    forward's pre-pass writes into its workspace for K and V (codes, padding,
//    V^T, scales, means) and what the CPU model writes on host tensors, for
//    each knob, odd sizes, both dtypes and layouts, zeros / infinities / NaN,
//    the caller's workspace or stream-ordered scratch; the cache poisoned first;
//  - a forward call with the cache (k and v null where no hybrid rows need
//    them) is bit-identical to the same call without it (O and LSE, every
//    byte of the NaN-poisoned buffers), for int8 and e4m3 Q K^T, both scale
//    granularities, smooth-K on / off (K's mean absent), smooth-V, V per
//    block, GQA, both causal alignments with and without hybrid rows, masks,
//    dropout, odd sizes, fp16 and bnhd; its workspace query counts Q's
//    regions only and the call runs in exactly that workspace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/quantization_options.hpp"
#include "gpu/device_tensor.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "kernels/fp8_prepass/prepass.hpp"
#include "kernels/fp8_prepass/workspace.hpp"
#include "reference/fp8_quantization.hpp"
#include "support/accuracy_inputs.hpp"
#include "support/fp8_kv_cache.hpp"
#include "support/nonfinite_expectation.hpp"

namespace {

using namespace ffpa;
using namespace ffpa::detail;
using namespace ffpa::testing;

// The six tensors of a cache in device memory, poisoned, from the layout query.
struct DeviceKvCache {
  DeviceBuffer buffers[6];
  Fp8KvCache view;

  void allocate(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t dim, const Fp8Options& fp8,
                bool with_means) {
    ASSERT_TRUE(fp8_kv_cache_layout(batch, heads_kv, seq_kv, dim, fp8, &view).ok());
    Tensor* tensors[6] = {&view.k_codes, &view.k_scales, &view.k_mean, &view.v_codes, &view.v_scales, &view.v_mean};
    for (int i = 0; i < 6; ++i) {
      if (!with_means && (i == 2 || i == 5)) continue;  // absent: data null
      const size_t bytes = host_tensor_like(*tensors[i]).bytes();
      ASSERT_NO_FATAL_FAILURE(buffers[i].allocate(bytes > 0 ? bytes : 16));
      FFPA_ASSERT_CUDA(cudaMemset(buffers[i].data(), 0xA5, buffers[i].bytes()));
      tensors[i]->data = buffers[i].data();
    }
  }

  // Tensor i's bytes (the layout's size), copied to the host.
  std::vector<uint8_t> bytes(int i) const {
    const Tensor* tensors[6] = {&view.k_codes, &view.k_scales, &view.k_mean, &view.v_codes, &view.v_scales, &view.v_mean};
    std::vector<uint8_t> out(host_tensor_like(*tensors[i]).bytes());
    if (!out.empty() && tensors[i]->data != nullptr) {
      EXPECT_EQ(cudaMemcpy(out.data(), tensors[i]->data, out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }
};

// A host tensor's bytes (its dense extent).
std::vector<uint8_t> host_bytes(const HostTensor& t) {
  std::vector<uint8_t> out(t.bytes());
  if (!out.empty()) std::memcpy(out.data(), t.tensor.data, out.size());
  return out;
}

// A seed of the case's own, from its name.
uint64_t name_seed(const std::string& name) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (unsigned char ch : name) hash = (hash ^ ch) * 0x100000001B3ull;
  return splitmix64(hash);
}

constexpr const char* kTensorNames[6] = {"k_codes", "k_scales", "k_mean", "v_codes", "v_scales", "v_mean"};

bool on_sm90() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

// Bytes equal, reporting the first differing one.
void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t e = 0; e < got.size(); ++e) {
    if (got[e] != want[e]) {
      ADD_FAILURE() << what << ": byte " << e << " of " << got.size() << " is " << +got[e] << ", expected " << +want[e];
      return;
    }
  }
}

// --- fp8_quantize_kv: the pre-pass's bytes, the model's bytes -----------------------------------

struct QuantizeCase {
  std::string name;
  AccuracyCase shape;
  Fp8Options fp8;
  bool with_means = true;
  bool special_values = false;
  bool stream_ordered = false;  // no workspace given
};

std::vector<QuantizeCase> quantize_cases() {
  auto shape = [](int64_t b, int64_t hkv, int64_t nkv, int64_t d) {
    AccuracyCase c;
    c.batch = b, c.heads_q = hkv, c.heads_kv = hkv, c.seq_q = 1, c.seq_kv = nkv, c.dim = d;
    return c;
  };
  std::vector<QuantizeCase> all;
  const AccuracyCase base = shape(1, 2, 384, 512);
  Fp8Options o;
  all.push_back({"defaults", base, o});
  AccuracyCase llm = base;
  llm.kind = InputKind::llm_like;
  all.push_back({"defaults_llm_like_stream_ordered", llm, o, true, false, true});
  o.qk_format = Fp8QkFormat::e4m3;
  all.push_back({"e4m3", base, o});
  o.qk_scales = Fp8QkScales::per_block;
  all.push_back({"e4m3_per_block", base, o});
  o = {};
  o.qk_scales = Fp8QkScales::per_block;
  all.push_back({"int8_per_block", base, o});
  o = {};
  o.smooth_k = false;
  all.push_back({"no_smooth_k_no_means", llm, o, false});
  all.push_back({"no_smooth_k_zero_means", base, o, true});
  o = {};
  o.v_scales = Fp8VScales::per_block;
  all.push_back({"v_per_block", base, o});
  o.smooth_v = true;
  all.push_back({"smooth_v_per_block", base, o});
  o.v_scales = Fp8VScales::per_channel;
  all.push_back({"smooth_v_per_channel_stream_ordered", base, o, true, false, true});
  AccuracyCase c = shape(2, 3, 203, 40);
  c.layout = Layout::bnhd;
  c.dtype = DType::f16;
  all.push_back({"b2_hkv3_kv203_d40_f16_bnhd", c, Fp8Options{}});
  all.push_back({"kv61_d520", shape(1, 1, 61, 520), Fp8Options{}});
  all.push_back({"kv1000_d1024", shape(1, 1, 1000, 1024), Fp8Options{}});
  all.push_back({"kv1_d64", shape(1, 2, 1, 64), Fp8Options{}});
  o = {};
  o.qk_format = Fp8QkFormat::e4m3;
  o.v_scales = Fp8VScales::per_block;
  all.push_back({"special_values", shape(1, 1, 300, 64), Fp8Options{}, true, true});
  all.push_back({"special_values_e4m3_v_per_block", shape(1, 1, 300, 64), o, true, true});
  return all;
}

// Zeros over a K group and a V block, infinities and NaNs where they reach a
// mean, a scale and a code (as test_fp8_prepass.cpp's cases).
void add_special_values(AccuracyInputs& in) {
  const AttentionProblem& p = in.problem;
  for (int64_t d = 0; d < p.head_dim; ++d) {
    for (int64_t j = 128; j < 256; ++j) set_element(in.v.tensor, {0, 0, j, d}, 0.0);
    for (int64_t j = 128; j < 256; ++j)
      if ((j % 8) / 2 == 1) set_element(in.k.tensor, {0, 0, j, d}, 0.0);
  }
  const double inf = std::numeric_limits<double>::infinity();
  set_element(in.k.tensor, {0, 0, 260, 7}, -inf);
  set_element(in.k.tensor, {0, 0, 10, 9}, std::numeric_limits<double>::quiet_NaN());
  set_element(in.v.tensor, {0, 0, 40, 3}, inf);
  set_element(in.v.tensor, {0, 0, 41, 4}, std::numeric_limits<double>::quiet_NaN());
}

// NaN scales or means compare by class (the GPU's NaN payload is not the CPU's).
void expect_same_floats_or_nans(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t e = 0; e + 4 <= got.size(); e += 4) {
    float g, w;
    std::memcpy(&g, got.data() + e, 4);
    std::memcpy(&w, want.data() + e, 4);
    if (std::memcmp(&g, &w, 4) == 0 || (std::isnan(g) && std::isnan(w))) continue;
    ADD_FAILURE() << what << "[" << e / 4 << "]: gpu " << g << ", expected " << w;
    return;
  }
}

class Fp8QuantizeKvGpu : public ::testing::TestWithParam<QuantizeCase> {};

TEST_P(Fp8QuantizeKvGpu, WritesThePrepasssAndTheModelsBytes) {
  if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  if (!on_sm90()) GTEST_SKIP() << "the FP8 pre-pass is built for sm_90a";
  const QuantizeCase& c = GetParam();
  AccuracyInputs in = make_accuracy_inputs(c.shape);
  if (c.special_values) add_special_values(in);
  const QuantizationOptions options = quantization_options(c.fp8, 0);
  const AccuracyCase& s = c.shape;

  // The model's bytes: fp8_quantize_kv on the host tensors.
  HostKvCache host = make_host_kv_cache(s.batch, s.heads_kv, s.seq_kv, s.dim, c.fp8, c.with_means);
  Fp8QuantizeKvParams host_params;
  host_params.k = in.k.tensor, host_params.v = in.v.tensor, host_params.cache = host.view(), host_params.fp8 = c.fp8;
  ASSERT_TRUE(fp8_quantize_kv(host_params).ok());

  // The same call on device tensors.
  DeviceBuffer k, v, scratch;
  ASSERT_NO_FATAL_FAILURE(k.allocate(in.k.bytes()));
  ASSERT_NO_FATAL_FAILURE(v.allocate(in.v.bytes()));
  FFPA_ASSERT_CUDA(cudaMemcpy(k.data(), in.k.tensor.data, in.k.bytes(), cudaMemcpyHostToDevice));
  FFPA_ASSERT_CUDA(cudaMemcpy(v.data(), in.v.tensor.data, in.v.bytes(), cudaMemcpyHostToDevice));
  DeviceKvCache cache;
  ASSERT_NO_FATAL_FAILURE(cache.allocate(s.batch, s.heads_kv, s.seq_kv, s.dim, c.fp8, c.with_means));
  Fp8QuantizeKvParams params = host_params;
  params.k.data = k.data(), params.v.data = v.data(), params.cache = cache.view;
  cudaStream_t stream = nullptr;
  FFPA_ASSERT_CUDA(cudaStreamCreate(&stream));
  params.stream = stream;
  size_t bytes = 0;
  ASSERT_TRUE(fp8_quantize_kv_workspace_size(params, &bytes).ok());
  EXPECT_GT(bytes, 0u);
  if (!c.stream_ordered) {
    ASSERT_NO_FATAL_FAILURE(scratch.allocate(bytes));
    FFPA_ASSERT_CUDA(cudaMemset(scratch.data(), 0xA5, bytes));
    params.workspace = scratch.data(), params.workspace_bytes = bytes;
  }
  const Status status = fp8_quantize_kv(params);
  ASSERT_TRUE(status.ok()) << status.message;
  FFPA_ASSERT_CUDA(cudaStreamSynchronize(stream));
  FFPA_ASSERT_CUDA(cudaStreamDestroy(stream));

  // The forward's pre-pass on the same K and V (and a query row), into its workspace.
  AttentionProblem p = in.problem;
  p.k = k.data(), p.v = v.data(), p.q = nullptr, p.seq_q = 0;
  p.heads_q = p.heads_kv;
  const fp8_prepass::WorkspaceLayout layout = fp8_prepass::WorkspaceLayout::of(p, options);
  DeviceBuffer workspace;
  ASSERT_NO_FATAL_FAILURE(workspace.allocate(layout.bytes));
  FFPA_ASSERT_CUDA(cudaMemset(workspace.data(), 0x5A, layout.bytes));
  ASSERT_TRUE(fp8_prepass::launch_prepass(p, options, layout.bind(workspace.data()), nullptr).ok());
  FFPA_ASSERT_CUDA(cudaDeviceSynchronize());
  const size_t offsets[6] = {layout.k_codes, layout.k_scales, layout.k_mean, layout.v_codes, layout.v_scales, layout.v_mean};

  const HostTensor* model[6] = {&host.k_codes, &host.k_scales, &host.k_mean, &host.v_codes, &host.v_scales, &host.v_mean};
  for (int i = 0; i < 6; ++i) {
    if (!c.with_means && (i == 2 || i == 5)) continue;
    const std::vector<uint8_t> got = cache.bytes(i);
    std::vector<uint8_t> prepass(got.size());
    if (!got.empty()) {
      FFPA_ASSERT_CUDA(cudaMemcpy(prepass.data(), static_cast<unsigned char*>(workspace.data()) + offsets[i],
                                  got.size(), cudaMemcpyDeviceToHost));
    }
    const std::vector<uint8_t> want = host_bytes(*model[i]);
    const std::string name = kTensorNames[i];
    if (i == 0 || i == 3) {  // codes
      expect_same_bytes(got, prepass, name + " against the pre-pass");
      expect_same_bytes(got, want, name + " against the model");
    } else {
      expect_same_floats_or_nans(got, prepass, name + " against the pre-pass");
      expect_same_floats_or_nans(got, want, name + " against the model");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8QuantizeKvGpu, ::testing::ValuesIn(quantize_cases()),
                         [](const ::testing::TestParamInfo<QuantizeCase>& info) { return info.param.name; });

// --- forward with a cache == forward without, bit for bit ------------------------------------------

struct CacheForwardCase {
  std::string name;
  ForwardCase shape;
  Fp8Options fp8;  // early_rows: unset = the default (256 with causal)
  bool kv_null = true;  // k and v data null (only where no hybrid rows need them)
  bool with_means = true;
  bool with_nans = false;  // put_nans() into q, k and v: the cache carries them as the workspace does
};

std::vector<CacheForwardCase> forward_cases() {
  std::vector<CacheForwardCase> all;
  Fp8Options none;  // no hybrid rows
  none.early_rows = 0;
  auto add = [&](const std::string& name, const ForwardCase& shape, Fp8Options fp8, bool kv_null = true,
                 bool with_means = true) { all.push_back({name, shape, fp8, kv_null, with_means}); };
  const ForwardCase d512 = shape_case(DType::bf16, 1, 2, 2, 256, 384, 512);
  add("d512", d512, none);
  add("d512_k_v_given", d512, none, false);
  Fp8Options o = none;
  o.qk_scales = Fp8QkScales::per_block;
  add("d512_int8_per_block", d512, o);
  o = none;
  o.qk_format = Fp8QkFormat::e4m3;
  add("d512_e4m3", d512, o);
  o.qk_scales = Fp8QkScales::per_block;
  add("d512_e4m3_per_block", d512, o);
  o = none;
  o.smooth_k = false;
  add("d512_no_smooth_k_no_means", d512, o, true, false);
  o = none;
  o.smooth_v = true;
  add("d512_smooth_v", shape_case(DType::bf16, 2, 2, 1, 130, 260, 512).with_layout(Layout::bnhd), o);
  o.v_scales = Fp8VScales::per_block;
  add("d320_smooth_v_per_block_empty_rows",
      shape_case(DType::bf16, 2, 2, 2, 150, 300, 320).with_mask(DType::bf16, MaskShape::batch_keys, true), o);
  o = none;
  o.v_scales = Fp8VScales::per_block;
  add("d512_v_per_block_kv700", shape_case(DType::bf16, 1, 2, 2, 200, 700, 512), o);
  add("d512_gqa2_q200_kv333", shape_case(DType::bf16, 2, 4, 2, 200, 333, 512), none);
  add("d320_q77_kv203_mqa", shape_case(DType::bf16, 1, 3, 1, 77, 203, 320), none);
  add("d40_q65_kv129_f16", shape_case(DType::f16, 2, 2, 1, 65, 129, 40), none);
  add("d512_top_left_no_hybrid_rows", d512.with_causal(Causal::top_left), none);
  Fp8Options hybrid;  // the default with a causal mask: 256 hybrid rows, k and v needed
  add("d512_top_left_default_hybrid_rows", shape_case(DType::bf16, 1, 2, 1, 300, 300, 512).with_causal(Causal::top_left),
      hybrid, false);
  hybrid.early_rows = 128;
  add("d320_bottom_right_hybrid128_dropout",
      shape_case(DType::bf16, 1, 2, 2, 200, 260, 320).with_causal(Causal::bottom_right).with_dropout(0.1f), hybrid,
      false);
  add("d512_bool_rows_empty", d512.with_mask(DType::boolean, MaskShape::batch_rows, true), none);
  add("d512_dropout_bnhd", d512.with_dropout(0.2f).with_layout(Layout::bnhd), none);
  add("d512_f16_pad8_no_lse", shape_case(DType::f16, 1, 2, 2, 150, 150, 512).with_row_pad(8).without_lse(), none);
  add("d1024_q130_kv200", shape_case(DType::bf16, 1, 2, 1, 130, 200, 1024), none);
  add("d512_q64_kv8192", shape_case(DType::bf16, 1, 1, 1, 64, 8192, 512), none);
  add("d512_top_left_nans", d512.with_causal(Causal::top_left), none);
  all.back().with_nans = true;
  o = none;
  o.qk_format = Fp8QkFormat::e4m3;
  add("d320_e4m3_nans_mask", shape_case(DType::bf16, 1, 2, 1, 130, 300, 320).with_mask(DType::f32, MaskShape::full, true), o);
  all.back().with_nans = true;
  o = none;
  o.qk_scales = Fp8QkScales::per_block;
  add("d512_int8_per_block_bottom_right_nans", d512.with_causal(Causal::bottom_right), o);
  all.back().with_nans = true;
  return all;
}

// Device copies of a host problem's tensors (o and lse poisoned as on the host).
struct DeviceProblem {
  DeviceTensor q, k, v, mask, o, lse;
  ForwardParams params;

  void mirror(const HostProblem& host) {
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.q.buffer, host.q.view, &q));
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.k.buffer, host.k.view, &k));
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.v.buffer, host.v.view, &v));
    if (host.mask.present()) ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.mask.buffer, host.mask.view, &mask));
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.o.buffer, host.o.view, &o));
    if (host.lse.present()) ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.lse.buffer, host.lse.view, &lse));
    params = host_params(host);
    params.q = q.tensor, params.k = k.tensor, params.v = v.tensor, params.mask = mask.tensor;
    params.o = o.tensor, params.lse = lse.tensor;
  }
};

std::vector<uint8_t> device_bytes(const DeviceBuffer& buffer) {
  std::vector<uint8_t> out(buffer.bytes());
  if (!out.empty()) EXPECT_EQ(cudaMemcpy(out.data(), buffer.data(), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

class Fp8KvCacheForwardGpu : public ::testing::TestWithParam<CacheForwardCase> {};

TEST_P(Fp8KvCacheForwardGpu, IsBitIdenticalToTheForwardWithoutACache) {
  if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  const CacheForwardCase& c = GetParam();
  HostProblem host = make_host_problem(c.shape, name_seed(c.name));
  if (c.with_nans) put_nans(host.q.view, host.k.view, host.v.view, &host.mask.view);
  DeviceProblem plain, cached;
  ASSERT_NO_FATAL_FAILURE(plain.mirror(host));
  ASSERT_NO_FATAL_FAILURE(cached.mirror(host));
  plain.params.options.precision = cached.params.options.precision = Precision::fp8;
  plain.params.options.fp8 = cached.params.options.fp8 = c.fp8;
  KernelChoice choice;
  if (Status why = select_kernel(plain.params, &choice); !why.ok()) {
    ASSERT_EQ(why.code, StatusCode::impl_unavailable) << why.message;  // no FP8 kernel for this D / device
    GTEST_SKIP() << why.message;
  }

  // Without a cache: the pre-pass quantizes Q, K and V.
  cudaStream_t stream = nullptr;
  FFPA_ASSERT_CUDA(cudaStreamCreate(&stream));
  plain.params.stream = stream;
  size_t plain_bytes = 0;
  ASSERT_TRUE(workspace_size(plain.params, &plain_bytes).ok());
  Status status = forward(plain.params);  // stream-ordered workspace
  ASSERT_TRUE(status.ok()) << status.message;

  // The cache, from the same k and v on the same stream.
  DeviceKvCache cache;
  ASSERT_NO_FATAL_FAILURE(cache.allocate(c.shape.batch, c.shape.heads_kv, c.shape.seq_kv, c.shape.head_dim, c.fp8,
                                         c.with_means));
  Fp8QuantizeKvParams quantize;
  quantize.k = cached.params.k, quantize.v = cached.params.v, quantize.cache = cache.view, quantize.fp8 = c.fp8;
  quantize.stream = stream;
  status = fp8_quantize_kv(quantize);
  ASSERT_TRUE(status.ok()) << status.message;

  // With the cache: only Q quantized, in exactly the workspace the query asks for.
  cached.params.stream = stream;
  cached.params.fp8_kv_cache = &cache.view;
  if (c.kv_null) cached.params.k.data = cached.params.v.data = nullptr;  // read them and the test faults
  KernelChoice cached_choice;
  ASSERT_TRUE(select_kernel(cached.params, &cached_choice).ok());
  EXPECT_EQ(cached_choice.kernel, choice.kernel);
  size_t cached_bytes = 0;
  ASSERT_TRUE(workspace_size(cached.params, &cached_bytes).ok());
  EXPECT_LT(cached_bytes, plain_bytes);
  DeviceBuffer workspace;
  if (cached_bytes > 0) {
    ASSERT_NO_FATAL_FAILURE(workspace.allocate(cached_bytes));
    FFPA_ASSERT_CUDA(cudaMemset(workspace.data(), 0xA5, cached_bytes));
    cached.params.workspace = workspace.data(), cached.params.workspace_bytes = cached_bytes;
  }
  status = forward(cached.params);
  ASSERT_TRUE(status.ok()) << status.message;
  FFPA_ASSERT_CUDA(cudaStreamSynchronize(stream));
  FFPA_ASSERT_CUDA(cudaStreamDestroy(stream));

  // Every byte of O and LSE (row gaps included: still NaN on both sides).
  const std::vector<uint8_t> o_plain = device_bytes(plain.o.buffer), o_cached = device_bytes(cached.o.buffer);
  expect_same_bytes(o_cached, o_plain, "o");
  if (host.lse.present()) expect_same_bytes(device_bytes(cached.lse.buffer), device_bytes(plain.lse.buffer), "lse");
  // And both calls computed something: O is not the poison it started as.
  EXPECT_NE(o_plain, host_bytes(host.o.buffer));
}

INSTANTIATE_TEST_SUITE_P(Cases, Fp8KvCacheForwardGpu, ::testing::ValuesIn(forward_cases()),
                         [](const ::testing::TestParamInfo<CacheForwardCase>& info) { return info.param.name; });

}  // namespace
