// Serving calls (docs/serving.md) on the GPU against the fp64 oracle of
// support/serving_inputs.hpp, under impl auto, sm80_split_d and sm90_wgmma:
// packed, batched and paged sequences (page sizes 1 to 256, NHD / HND /
// stacked caches, V inside K's rows), empty sequences, mixed prefill and
// decode rows, windows, softcap, sinks, GQA, D 64 to 1024 and D_qk != D_v.
// Outputs are poisoned; rows of no sequence must stay NaN. A family that
// does not serve a case says impl_unavailable (auto always serves it).
// Faulty lengths or block ids in device memory: the kernels write nothing.
// Mixed batches (a prefill chunk beside decode rows: sm90_wgmma's two
// passes), with the call's own plan and with a caller's (plan_sequences).
// sm90_wgmma serves every page size (small ones gathered by its producer
// warpgroup's cp.async, multiples of 16 by TMA, in key groups where the
// instance holds D exactly): GpuServingSm90Pages asserts it does.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/device_tensor.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa::testing {
namespace {

// The device copies of a ServingInputs' host tensors and its params rebased
// onto them.
struct DeviceServing {
  std::vector<DeviceTensor> tensors;
  SequenceBatch batch;
  ForwardParams params;
  DeviceTensor* o = nullptr;
  DeviceTensor* lse = nullptr;
};

// Mirrors `host` and returns the device view of `view` (a view into it).
Tensor mirror(DeviceServing& d, const HostTensor& host, const Tensor& view, DeviceTensor** out = nullptr) {
  if (host.storage.empty() || view.data == nullptr) return Tensor{};
  d.tensors.emplace_back();
  DeviceTensor& device = d.tensors.back();
  mirror_to_device(host, view, &device);
  if (out != nullptr) *out = &device;
  return device.tensor;
}

void to_device(const ServingInputs& in, DeviceServing* d) {
  d->tensors.reserve(16);
  d->params = in.params;
  d->params.q = mirror(*d, in.q, in.params.q);
  d->params.o = mirror(*d, in.o, in.params.o, &d->o);
  d->params.lse = mirror(*d, in.lse, in.params.lse, &d->lse);
  d->params.k = mirror(*d, in.k_buffer, in.params.k);
  d->params.v = in.v_buffer.storage.empty() ? [&] {  // V inside K's buffer (stacked or MLA)
    Tensor v = in.params.v;
    const auto offset = static_cast<const unsigned char*>(in.params.v.data) -
                        static_cast<const unsigned char*>(in.k_buffer.tensor.data);
    v.data = static_cast<unsigned char*>(d->tensors.back().buffer.data()) + offset;
    return v;
  }() : mirror(*d, in.v_buffer, in.params.v);
  d->params.sinks = mirror(*d, in.sinks, in.params.sinks);
  d->params.k_descale = mirror(*d, in.k_descale, in.params.k_descale);
  d->params.v_descale = mirror(*d, in.v_descale, in.params.v_descale);
  d->batch = in.batch;
  d->batch.cu_seqlens_q = mirror(*d, in.cu_q, in.batch.cu_seqlens_q);
  d->batch.cu_seqlens_k = mirror(*d, in.cu_k, in.batch.cu_seqlens_k);
  d->batch.block_table = mirror(*d, in.table, in.batch.block_table);
  d->batch.seqused_k = mirror(*d, in.used, in.batch.seqused_k);
  d->params.sequences = &d->batch;
}

bool device_runs_sm90() { return device_support(0, Impl::sm90_wgmma).ok(); }

// Runs `c` under `impl` and checks every row of every sequence; false when
// the impl declines the case (impl_unavailable), which auto never does.
// caller_plan: the call reads a plan made by plan_sequences (every pass's).
// `prepare`: changes the host inputs before they are copied (rows the oracle
// never reads).
bool run_and_check(const ServingCase& c, Impl impl, bool caller_plan = false,
                   void (*prepare)(const ServingInputs&) = nullptr) {
  SCOPED_TRACE(c.describe() + " impl " + std::to_string(static_cast<int>(impl)) + (caller_plan ? " caller's plan" : ""));
  ServingInputs in = make_serving_inputs(c);
  if (prepare != nullptr) prepare(in);
  DeviceServing d;
  to_device(in, &d);
  if (::testing::Test::HasFatalFailure()) return false;
  d.params.options.impl = impl;
  DeviceBuffer plan;
  if (caller_plan) {
    size_t bytes = 0;
    const Status sized = sequence_plan_size(d.params, &bytes);
    if (sized.code == StatusCode::impl_unavailable && impl != Impl::automatic) return false;
    EXPECT_TRUE(sized.ok()) << sized.message;
    if (!sized.ok()) return false;
    plan.allocate(bytes);
    const Status planned = plan_sequences(d.params, plan.data(), bytes);
    EXPECT_TRUE(planned.ok()) << planned.message;
    if (!planned.ok()) return false;
    d.params.sequence_plan = plan.data();
  }
  const Status status = forward(d.params);
  if (status.code == StatusCode::impl_unavailable && impl != Impl::automatic) return false;
  EXPECT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  if (!status.ok()) return false;
  FFPA_EXPECT_CUDA(cudaDeviceSynchronize());
  copy_to_host(*d.o, &in.o, nullptr);
  copy_to_host(*d.lse, &in.lse, nullptr);
  const double tolerance = c.dtype == DType::bf16 ? 2e-2 : 4e-3;
  std::vector<bool> written(static_cast<size_t>(in.o.tensor.shape[0] * in.o.tensor.shape[2]), false);
  const OracleRows oracle = serving_oracle_rows(in);
  for (int64_t b = 0; b < c.batch(); ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q[b]; ++i) {
        const OracleRow& want = oracle.at(b, h, i);
        const int64_t batch = c.packed_q ? 0 : b, row = in.q_begin[b] + i;
        written[batch * in.o.tensor.shape[2] + row] = true;
        double scale = 1e-30;
        for (double x : want.out) scale = std::max(scale, std::abs(x));
        for (int64_t dcol = 0; dcol < c.value_dim; ++dcol) {
          const double got = element_as_double(in.o.tensor, {batch, h, row, dcol});
          if (!(std::abs(got - want.out[dcol]) <= tolerance * std::max(scale, 1.0))) {
            ADD_FAILURE() << "sequence " << b << " head " << h << " row " << i << " column " << dcol << ": " << got
                          << " vs " << want.out[dcol];
            return true;
          }
        }
        const double lse = element_as_double(in.lse.tensor, {batch, h, row, 0});
        if (std::isinf(want.lse) ? !(std::isinf(lse) && lse < 0)
                                 : !(std::abs(lse - want.lse) <= 1e-3 * std::max(1.0, std::abs(want.lse)))) {
          ADD_FAILURE() << "lse of sequence " << b << " head " << h << " row " << i << ": " << lse << " vs "
                        << want.lse;
          return true;
        }
      }
  for (int64_t batch = 0; batch < in.o.tensor.shape[0]; ++batch)
    for (int64_t row = 0; row < in.o.tensor.shape[2]; ++row)
      if (!written[batch * in.o.tensor.shape[2] + row])
        for (int64_t h = 0; h < c.heads_q; ++h)
          if (!std::isnan(element_as_double(in.o.tensor, {batch, h, row, 0}))) {
            ADD_FAILURE() << "row " << row << " of no sequence was written";
            return true;
          }
  return true;
}

// Runs d's call under `impl` and asserts that it wrote no element of O (the
// poison, bf16's NaN 0x7FC0, stays): the call returns ok, since a fault in
// device memory is the plan's, found on the device.
void expect_nothing_written(DeviceServing& d, ServingInputs& in, Impl impl) {
  d.params.options.impl = impl;
  const Status status = forward(d.params);
  ASSERT_TRUE(status.ok()) << status.message;  // asynchronous: the fault is the plan's
  FFPA_ASSERT_CUDA(cudaDeviceSynchronize());
  copy_to_host(*d.o, &in.o, nullptr);
  const auto* bits = static_cast<const uint16_t*>(in.o.tensor.data);
  for (int64_t e = 0; e < in.o.numel(); ++e) ASSERT_EQ(bits[e], 0x7FC0u) << "element " << e << " written";
}

std::vector<int64_t> draw(std::mt19937_64& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int64_t> v(count);
  for (int64_t& n : v) n = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  return v;
}

// A chunked-prefill scheduler's batch, smaller than bench/compass_serving.py's
// mixed-batch-d512 (one 4096-token chunk beside 64 decode rows): a prefill
// chunk, decode rows over long contexts, speculative rows of 2 to 8 and of
// 9 to 16 (the second pass's), an empty sequence; Hq 16 / Hkv 2, D 512,
// pages of 16.
ServingCase chunked_prefill_batch(uint64_t seed) {
  std::mt19937_64 rng(seed);
  ServingCase c;
  c.seed = seed;
  c.dtype = DType::bf16;
  c.dim = c.value_dim = 512;
  c.heads_q = 16, c.heads_kv = 2;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.causal = Causal::bottom_right;
  c.seq_q = {200};
  c.seq_kv = {900};
  for (int b = 0; b < 24; ++b) {
    c.seq_q.push_back(b % 6 == 5 ? 9 + static_cast<int64_t>(rng() % 8) : b % 3 == 2 ? 2 + static_cast<int64_t>(rng() % 7) : 1);
    c.seq_kv.push_back(c.seq_q.back() + static_cast<int64_t>(rng() % 3000));
  }
  c.seq_q.push_back(0);
  c.seq_kv.push_back(33);
  return c;
}

// The cases: every form, page size and feature, at the head dims the families route.
std::vector<ServingCase> serving_cases() {
  std::mt19937_64 rng(20261202);
  std::vector<ServingCase> cases;
  const int64_t dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {320, 320}, {512, 512}, {576, 512}, {1024, 1024}};
  const int64_t pages[] = {1, 3, 8, 16, 64, 256};
  uint64_t seed = 1;
  for (const auto& dim : dims) {
    for (int form = 0; form < 4; ++form) {
      ServingCase c;
      c.seed = seed++;
      c.dtype = seed % 3 == 0 ? DType::f16 : DType::bf16;
      c.dim = dim[0], c.value_dim = dim[1];
      c.value_in_key_rows = dim[0] == 576;
      c.heads_kv = c.value_in_key_rows ? 1 : 2;
      c.heads_q = c.heads_kv * (form == 3 ? 8 : 2);
      c.causal = form == 1 ? Causal::none : Causal::bottom_right;
      c.packed_q = form != 3;
      c.keys = form == 0 ? KeyForm::packed : form == 2 ? KeyForm::batched : KeyForm::paged;
      c.page_size = pages[(seed + static_cast<uint64_t>(form)) % 6];
      c.cache = static_cast<CacheLayout>(seed % 3);
      if (c.value_in_key_rows && c.cache == CacheLayout::stacked) c.cache = CacheLayout::nhd;
      const int64_t count = form == 3 ? 5 : 3;
      c.seq_q = form == 3 ? std::vector<int64_t>(count, 1) : draw(rng, count, 0, dim[0] >= 512 ? 90 : 150);
      c.seq_kv = draw(rng, count, 0, 400);
      c.seqused = form == 0 && seed % 2 == 0;
      if (form == 1) c.window_left = 70, c.window_right = 20;
      if (form == 2) c.softcap = 30.0f, c.sinks = true;
      cases.push_back(c);
    }
  }
  // An e4m3 cache (the engines' FP8 format; sm80_split_d converts its codes
  // in shared memory) on every tile shape, odd and TMA-sized pages, descales
  // per tensor and per (sequence, KV head), decode rows beside a prefill.
  const int64_t e4m3_dims[][2] = {{64, 64}, {128, 128}, {256, 208}, {320, 320}, {512, 512}, {704, 704}, {1024, 1024}};
  for (const auto& dim : e4m3_dims) {
    ServingCase c;
    c.seed = seed++;
    c.dtype = seed % 2 == 0 ? DType::f16 : DType::bf16;
    c.dim = dim[0], c.value_dim = dim[1];
    c.e4m3_kv = true;
    c.per_sequence_descale = seed % 2 == 1;
    c.heads_kv = 2, c.heads_q = 8;
    c.causal = Causal::bottom_right;
    c.keys = KeyForm::paged;
    c.page_size = pages[seed % 6] == 8 ? 1 : pages[seed % 6];
    c.cache = static_cast<CacheLayout>(seed % 3);
    c.seq_q = {1, 1, 37, 1};
    c.seq_kv = draw(rng, 4, 40, 700);
    cases.push_back(c);
  }
  // A mixed batch: one prefill chunk and decode rows over a paged cache
  // (sm90_wgmma: two passes).
  ServingCase mixed;
  mixed.dtype = DType::bf16;
  mixed.dim = mixed.value_dim = 512;
  mixed.heads_q = 8, mixed.heads_kv = 1;
  mixed.keys = KeyForm::paged;
  mixed.page_size = 16;
  mixed.seq_q = {300, 1, 1, 1, 0, 1};
  mixed.seq_kv = {700, 900, 17, 1, 50, 0};
  mixed.causal = Causal::bottom_right;
  cases.push_back(mixed);
  // An e4m3 cache of packed keys (not paged) and in a mixed batch: the sm90
  // e4m3-cache kernels (producer_codes.cuh) copy both.
  ServingCase packed_codes;
  packed_codes.seed = seed++;
  packed_codes.dtype = DType::bf16;
  packed_codes.dim = packed_codes.value_dim = 512;
  packed_codes.e4m3_kv = true;
  packed_codes.heads_q = 8, packed_codes.heads_kv = 2;
  packed_codes.causal = Causal::bottom_right;
  packed_codes.seq_q = {1, 64, 1};
  packed_codes.seq_kv = {300, 64, 129};
  cases.push_back(packed_codes);
  ServingCase mixed_codes = mixed;
  mixed_codes.seed = seed++;
  mixed_codes.e4m3_kv = true;
  mixed_codes.per_sequence_descale = true;
  cases.push_back(mixed_codes);
  cases.push_back(chunked_prefill_batch(42));
  return cases;
}

class GpuServing : public ::testing::TestWithParam<ServingCase> {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  }
};

TEST_P(GpuServing, MatchesTheOracleUnderEveryImpl) {
  EXPECT_TRUE(run_and_check(GetParam(), Impl::automatic));
  run_and_check(GetParam(), Impl::sm80_split_d);
  if (device_runs_sm90()) run_and_check(GetParam(), Impl::sm90_wgmma);
}

INSTANTIATE_TEST_SUITE_P(Small, GpuServing, ::testing::ValuesIn(serving_cases()),
                         [](const ::testing::TestParamInfo<ServingCase>& info) {
                           return "case" + std::to_string(info.index) + "_d" + std::to_string(info.param.dim);
                         });

// Page sizes sm90_wgmma gathers (gathers_pages: not multiples of 16; 16
// itself by TMA here), which it must serve: decode rows (GQA-packed, split by the plan
// on long keys, D 512) and prefill rows, with
// the unused rows of every sequence's last page NaN (the gather zero-fills
// keys past Nkv).
// Over pages of `page` keys: a decode batch at D = Dv = 512 (GQA-packed, split
// by the plan on long keys) and a prefill batch at D 256 / Dv prefill_value_dim
// (its cache the decode's layout), seeds from *seed.
std::pair<ServingCase, ServingCase> paged_decode_and_prefill(int64_t page, uint64_t* seed,
                                                             int64_t prefill_value_dim) {
  ServingCase decode;
  decode.seed = (*seed)++;
  decode.dtype = page % 2 ? DType::bf16 : DType::f16;
  decode.dim = decode.value_dim = 512;
  decode.heads_q = 16, decode.heads_kv = 2;
  decode.packed_q = false;
  decode.keys = KeyForm::paged;
  decode.page_size = page;
  decode.cache = static_cast<CacheLayout>(*seed % 3);
  decode.causal = Causal::bottom_right;
  decode.seq_q.assign(6, 1);
  decode.seq_kv = {1, 700, 0, 3001, 129, 64};
  ServingCase prefill = decode;
  prefill.seed = (*seed)++;
  prefill.dim = 256, prefill.value_dim = prefill_value_dim;
  prefill.heads_q = 4;
  prefill.packed_q = true;
  prefill.seq_q = {150, 1, 67};
  prefill.seq_kv = {400, 33, 67};
  return {decode, prefill};
}

std::vector<ServingCase> gathered_page_cases() {
  std::vector<ServingCase> cases;
  uint64_t seed = 100;
  for (int64_t page : {1, 3, 8, 16}) {
    auto [decode, prefill] = paged_decode_and_prefill(page, &seed, 192);
    prefill.softcap = page == 3 ? 30.0f : 0.0f;
    if (page == 16) prefill.window_left = 100;
    cases.push_back(decode);
    cases.push_back(prefill);
  }
  // (Not above D 512, MLA's 576 / 512 included: the cluster kernels leave
  // gathered pages to sm80_split_d, traits.cuh's kGathersPages.)
  return cases;
}

// Page sizes sm90_wgmma loads by TMA in key groups (the page-group variant of
// instances 256 and 512: routing.cpp's loads_page_groups, asserted by the CPU
// routing tests): D = Dv = 512 decode rows and D = Dv = 256 prefill rows with
// a window, softcap and sinks, pages of 16, 32, 64 and 128 in every cache
// layout (the KV head folded into the pages or the chunks), and D 512 with
// Dv 448 beside them (a box per chunk); the unused rows of each last page NaN.
std::vector<ServingCase> page_group_cases() {
  std::vector<ServingCase> cases;
  uint64_t seed = 400;
  for (int64_t page : {16, 32, 64, 128}) {
    auto [decode, prefill] = paged_decode_and_prefill(page, &seed, 256);
    decode.dtype = page % 32 ? DType::bf16 : DType::f16;
    prefill.cache = static_cast<CacheLayout>((seed + 1) % 3);
    prefill.window_left = page == 32 ? 100 : -1;
    prefill.softcap = page == 64 ? 30.0f : 0.0f;
    prefill.sinks = page == 128;
    cases.push_back(decode);
    cases.push_back(prefill);
  }
  ServingCase narrow_value = cases.front();
  narrow_value.seed = seed++;
  narrow_value.value_dim = 448;
  cases.push_back(narrow_value);
  return cases;
}

// NaN in the rows of each sequence's last page past its keys.
void poison_unused_page_rows(const ServingInputs& in) {
  const ServingCase& c = in.c;
  for (int64_t b = 0; b < c.batch(); ++b)
    for (int64_t j = c.seq_kv[b]; j < static_cast<int64_t>(in.pages[b].size()) * c.page_size; ++j)
      for (int64_t h = 0; h < c.heads_kv; ++h) {
        const int64_t page = in.pages[b][j / c.page_size], row = j % c.page_size;
        for (int64_t d = 0; d < c.dim; ++d) set_element(in.k, {page, h, row, d}, std::nan(""));
        for (int64_t d = 0; d < c.value_dim; ++d) set_element(in.v, {page, h, row, d}, std::nan(""));
      }
}

class GpuServingSm90Pages : public ::testing::TestWithParam<ServingCase> {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
    if (!device_runs_sm90()) GTEST_SKIP() << "no sm_90a device";
  }
};

TEST_P(GpuServingSm90Pages, ServesAndMatchesTheOracle) {
  const std::vector<int32_t> dims = library_info().sm90_wgmma_head_dims;
  const int64_t width = std::max(GetParam().dim, GetParam().value_dim);
  if (dims.empty() || dims.back() < width) GTEST_SKIP() << "no sm90_wgmma instance of this build holds D " << width;
  EXPECT_TRUE(run_and_check(GetParam(), Impl::sm90_wgmma, false, poison_unused_page_rows)) << "sm90_wgmma declined it";
  EXPECT_TRUE(run_and_check(GetParam(), Impl::automatic, false, poison_unused_page_rows));
}

std::string page_case_name(const ::testing::TestParamInfo<ServingCase>& info) {
  return "case" + std::to_string(info.index) + "_page" + std::to_string(info.param.page_size) + "_d" +
         std::to_string(info.param.dim);
}
INSTANTIATE_TEST_SUITE_P(Gathered, GpuServingSm90Pages, ::testing::ValuesIn(gathered_page_cases()), page_case_name);
INSTANTIATE_TEST_SUITE_P(Grouped, GpuServingSm90Pages, ::testing::ValuesIn(page_group_cases()), page_case_name);

// An e4m3 cache (the engines' FP8 format), which sm90_wgmma's e4m3-cache
// kernels (producer_codes.cuh) must serve: decode rows (GQA-packed, split on
// long keys) over pages of 1, 3, 16 and 64 keys and a batched cache, prefill
// rows with a window, softcap and sinks, D_qk != D_v, the unused rows of each
// last page NaN (the converters zero-fill keys past Nkv).
std::vector<ServingCase> e4m3_cache_cases() {
  std::vector<ServingCase> cases;
  uint64_t seed = 200;
  for (int64_t page : {1, 3, 16, 64, 0}) {
    ServingCase decode;
    decode.seed = seed++;
    decode.dtype = page % 2 ? DType::bf16 : DType::f16;
    decode.dim = decode.value_dim = 512;
    decode.e4m3_kv = true;
    decode.per_sequence_descale = seed % 2 == 0;
    decode.heads_q = 16, decode.heads_kv = 2;
    decode.packed_q = false;
    decode.keys = page == 0 ? KeyForm::batched : KeyForm::paged;
    decode.page_size = page == 0 ? 16 : page;
    decode.cache = static_cast<CacheLayout>(seed % 3);
    decode.causal = Causal::bottom_right;
    decode.seq_q.assign(6, 1);
    decode.seq_kv = {1, 700, 0, 3001, 129, 64};
    cases.push_back(decode);
  }
  ServingCase prefill;
  prefill.seed = seed++;
  prefill.dtype = DType::bf16;
  prefill.dim = 256, prefill.value_dim = 192;
  prefill.e4m3_kv = true;
  prefill.per_sequence_descale = true;
  prefill.heads_q = 4, prefill.heads_kv = 2;
  prefill.keys = KeyForm::paged;
  prefill.page_size = 5;
  prefill.causal = Causal::bottom_right;
  prefill.seq_q = {150, 1, 67};
  prefill.seq_kv = {400, 33, 67};
  prefill.window_left = 100;
  prefill.softcap = 30.0f;
  prefill.sinks = true;
  cases.push_back(prefill);
  return cases;
}

class GpuServingSm90Codes : public ::testing::TestWithParam<ServingCase> {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
    if (!device_runs_sm90()) GTEST_SKIP() << "no sm_90a device";
  }
};

TEST_P(GpuServingSm90Codes, ServesAndMatchesTheOracle) {
  const std::vector<int32_t> dims = library_info().sm90_wgmma_head_dims;
  const int64_t width = std::max(GetParam().dim, GetParam().value_dim);
  if (dims.empty() || dims.back() < width) GTEST_SKIP() << "no sm90_wgmma instance of this build holds D " << width;
  void (*poison)(const ServingInputs&) = GetParam().keys == KeyForm::paged ? poison_unused_page_rows : nullptr;
  EXPECT_TRUE(run_and_check(GetParam(), Impl::sm90_wgmma, false, poison)) << "sm90_wgmma declined it";
  EXPECT_TRUE(run_and_check(GetParam(), Impl::automatic, false, poison));
}

INSTANTIATE_TEST_SUITE_P(E4m3, GpuServingSm90Codes, ::testing::ValuesIn(e4m3_cache_cases()),
                         [](const ::testing::TestParamInfo<ServingCase>& info) {
                           return "case" + std::to_string(info.index) + "_page" +
                                  std::to_string(info.param.keys == KeyForm::paged ? info.param.page_size : 0) +
                                  "_d" + std::to_string(info.param.dim);
                         });

class GpuServingSmall : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  }
};

// A NaN through an e4m3 cache on sm90_wgmma (its Q turned to f16 at the
// tile's start, its codes widened by the producer): a NaN in one query row
// reaches that row only; a NaN code in one key reaches the rows of its KV
// head's sequence only, as SDPA's does.
TEST_F(GpuServingSmall, ANanReachesTheRowsItTouchesThroughAnE4m3Cache) {
  if (!device_runs_sm90()) GTEST_SKIP() << "no sm90_wgmma kernel runs on device 0";
  ServingCase c;
  c.seed = 300;
  c.dtype = DType::bf16;
  c.dim = c.value_dim = 512;
  c.e4m3_kv = true;
  c.heads_q = 8, c.heads_kv = 2;
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.causal = Causal::bottom_right;
  c.seq_q.assign(3, 1);
  c.seq_kv = {300, 200, 100};
  ServingInputs in = make_serving_inputs(c);
  set_element(in.q.tensor, {0, 0, 0, 5}, std::nan(""));                   // sequence 0, head 0
  set_element(in.k, {in.pages[1][17 / c.page_size], 1, 17 % c.page_size, 9}, std::nan(""));  // sequence 1, KV head 1
  DeviceServing d;
  to_device(in, &d);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  d.params.options.impl = Impl::sm90_wgmma;
  const Status status = forward(d.params);
  if (status.code == StatusCode::impl_unavailable) GTEST_SKIP() << status.message;
  ASSERT_TRUE(status.ok()) << status.message;
  FFPA_EXPECT_CUDA(cudaDeviceSynchronize());
  copy_to_host(*d.o, &in.o, nullptr);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h) {
      const bool touched = (b == 0 && h == 0) || (b == 1 && h >= c.heads_q / 2);
      for (int64_t col = 0; col < c.value_dim; ++col) {
        const double got = element_as_double(in.o.tensor, {b, h, 0, col});
        ASSERT_EQ(std::isnan(got), touched) << "sequence " << b << " head " << h << " column " << col << ": " << got;
      }
    }
}

// sm90_wgmma runs a mixed batch in two passes: the rows of at most 8 (GQA 8)
// first, 8 heads a tile; select_kernel says so; a caller's plan holds both
// passes' plans.
TEST_F(GpuServingSmall, AMixedBatchRunsInTwoPasses) {
  if (!device_runs_sm90()) GTEST_SKIP() << "no sm90_wgmma kernel runs on device 0";
  const ServingCase c = chunked_prefill_batch(43);
  ServingInputs in = make_serving_inputs(c);
  DeviceServing d;
  ASSERT_NO_FATAL_FAILURE(to_device(in, &d));
  d.params.options.impl = Impl::sm90_wgmma;
  KernelChoice choice;
  ASSERT_TRUE(select_kernel(d.params, &choice).ok());
  EXPECT_EQ(choice.short_rows, 8);
  EXPECT_EQ(choice.short_heads_per_tile, 8);
  EXPECT_GT(choice.short_split_slots, 0);
  EXPECT_EQ(choice.heads_per_tile, 1);
  EXPECT_NE(choice.kernel.find(",rows<=8 first in heads8"), std::string::npos) << choice.kernel;
  size_t plan_bytes = 0, with_plan = 0, without_plan = 0;
  ASSERT_TRUE(sequence_plan_size(d.params, &plan_bytes).ok());
  ASSERT_TRUE(workspace_size(d.params, &without_plan).ok());
  EXPECT_GT(plan_bytes, 256u);  // two plans, the second on a 256-byte offset
  DeviceBuffer plan;  // only its presence counts here (device memory, as the tensors)
  plan.allocate(plan_bytes);
  d.params.sequence_plan = plan.data();
  ASSERT_TRUE(workspace_size(d.params, &with_plan).ok());
  EXPECT_GE(without_plan, with_plan + plan_bytes);
  EXPECT_TRUE(run_and_check(c, Impl::sm90_wgmma));
  EXPECT_TRUE(run_and_check(c, Impl::sm90_wgmma, /*caller_plan=*/true));
  EXPECT_TRUE(run_and_check(c, Impl::automatic, /*caller_plan=*/true));
}

// A caller's plan (plan_sequences) for every form that some family serves.
TEST_F(GpuServingSmall, ACallersPlanServesEveryPass) {
  for (const ServingCase& c : serving_cases()) {
    if (c.dim != 512 && c.dim != 128) continue;
    EXPECT_TRUE(run_and_check(c, Impl::automatic, /*caller_plan=*/true));
    if (device_runs_sm90()) run_and_check(c, Impl::sm90_wgmma, /*caller_plan=*/true);
  }
}

// A block id outside the cache in device memory: the plan finds it, the
// kernels write nothing (the poisoned output stays).
TEST_F(GpuServingSmall, AFaultyBlockTableWritesNothing) {
  ServingCase c;
  c.dtype = DType::bf16;
  c.dim = c.value_dim = 128;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.seq_q = {5, 1};
  c.seq_kv = {40, 70};
  ServingInputs in = make_serving_inputs(c);
  static_cast<int32_t*>(in.table.tensor.data)[1] = 1 << 20;
  DeviceServing d;
  ASSERT_NO_FATAL_FAILURE(to_device(in, &d));
  for (Impl impl : {Impl::sm80_split_d, Impl::sm90_wgmma}) {
    if (impl == Impl::sm90_wgmma && !device_runs_sm90()) continue;
    ASSERT_NO_FATAL_FAILURE(expect_nothing_written(d, in, impl));
  }
}

// A table of more pages than one plan CTA checks (page size 1, 24 sequences
// of ~1k keys: ~24k pages, a CTA a sequence beside the plan's CTA 0, then the
// verdict kernel): the plan serves it, and of two faulty pages the verdict is
// the lowest sequence's, whichever CTA found it; nothing is written.
TEST_F(GpuServingSmall, AManyPageTableIsCheckedByManyCtas) {
  ServingCase c;
  c.dtype = DType::bf16;
  c.dim = c.value_dim = 64;
  c.keys = KeyForm::paged;
  c.page_size = 1;
  c.causal = Causal::bottom_right;
  std::mt19937 rng(45);
  for (int b = 0; b < 24; ++b) {
    c.seq_q.push_back(1 + b % 2);
    c.seq_kv.push_back(700 + static_cast<int64_t>(rng() % 400));
  }
  c.seq_kv[20] = 1000;
  EXPECT_TRUE(run_and_check(c, Impl::automatic));
  for (const auto& [sequence, page] : {std::pair<int64_t, int64_t>{20, 700}, {5, c.seq_kv[5] - 1}}) {
    SCOPED_TRACE("faulty sequence " + std::to_string(sequence));
    ServingInputs in = make_serving_inputs(c);
    auto* table = static_cast<int32_t*>(in.table.tensor.data);
    table[in.table.tensor.stride[0] * sequence + page] = -5;
    table[in.table.tensor.stride[0] * 22 + 3] = 1 << 30;  // a later sequence's, found by another CTA
    DeviceServing d;
    ASSERT_NO_FATAL_FAILURE(to_device(in, &d));
    const Status checked = check_sequences(d.params);
    EXPECT_EQ(checked.code, StatusCode::invalid_block_table) << checked.message;
    const std::string named = "block_table[" + std::to_string(sequence) + "][" + std::to_string(page) + "] = -5";
    EXPECT_NE(checked.message.find(named), std::string::npos) << checked.message;
    ASSERT_NO_FATAL_FAILURE(expect_nothing_written(d, in, Impl::automatic));
  }
}

// A faulty block id in a mixed batch, in a decode sequence (the first pass's)
// or in the prefill chunk (the second's): both passes' plans give the fault,
// neither pass writes anything.
TEST_F(GpuServingSmall, AFaultyBlockTableWritesNothingInEitherPass) {
  for (const int64_t faulty : {3, 0}) {
    SCOPED_TRACE("faulty sequence " + std::to_string(faulty));
    const ServingCase c = chunked_prefill_batch(44);
    ServingInputs in = make_serving_inputs(c);
    static_cast<int32_t*>(in.table.tensor.data)[in.table.tensor.stride[0] * faulty] = -1;
    DeviceServing d;
    ASSERT_NO_FATAL_FAILURE(to_device(in, &d));
    for (Impl impl : {Impl::automatic, Impl::sm90_wgmma}) {
      if (impl == Impl::sm90_wgmma && !device_runs_sm90()) continue;
      ASSERT_NO_FATAL_FAILURE(expect_nothing_written(d, in, impl));
      const Status checked = check_sequences(d.params);
      EXPECT_EQ(checked.code, StatusCode::invalid_block_table) << checked.message;
    }
  }
}

}  // namespace
}  // namespace ffpa::testing
