// NaN inputs on the GPU (issue 31; spec.md, "Non-finite inputs"): a NaN in
// q, k, v or an additive mask reaches exactly the rows it touches in every
// forward path (sm80_split_d, sm90_wgmma with clusters above D 512, split-KV
// decode and its combine, FP8 with int8 and e4m3 codes); rows that masking
// alone empties stay O = 0, LSE = -inf. Each case runs on device tensors
// twice, without and with put_nans(): every element NaN where a NaN must
// reach it (expect_forward_nans, with a kernel's key window), bit-identical
// to the clean run where none may; FP8 (whose means move with a NaN left out)
// finite there and close to the fp64 reference instead. The backward's NaN
// test is in test_gpu_backward.cpp, the combine's in test_split_kv_combine.cpp.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/device_tensor.hpp"
#include "gpu/forward_case.hpp"
#include "gpu/host_forward.hpp"
#include "host/dispatch.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention.hpp"
#include "support/error_metrics.hpp"
#include "support/nonfinite_expectation.hpp"

namespace ffpa::testing {
namespace {

struct NanCase {
  std::string name;
  ForwardCase shape;
  Impl impl = Impl::automatic;
  int kv_splits = 0;  // 0: the library's plan; else about this many (detail::with_kv_splits)
  Precision precision = Precision::input;
  Fp8QkFormat qk_format = Fp8QkFormat::int8;
};

void PrintTo(const NanCase& c, std::ostream* out) { *out << c.name; }

// Runs the case's call on device copies of f's tensors and copies o and lse
// back into f's host buffers. Returns false (with the reason) where the
// library declines the call (no such kernel on this device or build).
bool run_on_device(const NanCase& nc, HostForward& f, std::string* declined) {
  DeviceTensor q, k, v, o, lse, mask;
  EXPECT_NO_FATAL_FAILURE(mirror_to_device(f.q.buffer, f.q.view, &q));
  EXPECT_NO_FATAL_FAILURE(mirror_to_device(f.k.buffer, f.k.view, &k));
  EXPECT_NO_FATAL_FAILURE(mirror_to_device(f.v.buffer, f.v.view, &v));
  EXPECT_NO_FATAL_FAILURE(mirror_to_device(f.o.buffer, f.o.view, &o));
  if (f.lse.present()) EXPECT_NO_FATAL_FAILURE(mirror_to_device(f.lse.buffer, f.lse.view, &lse));
  if (f.mask.present()) EXPECT_NO_FATAL_FAILURE(mirror_to_device(f.mask.buffer, f.mask.view, &mask));
  ForwardParams params = f.params;
  params.q = q.tensor, params.k = k.tensor, params.v = v.tensor, params.o = o.tensor;
  params.lse = f.lse.present() ? lse.tensor : Tensor{};
  params.mask = f.mask.present() ? mask.tensor : Tensor{};
  params.options.impl = nc.impl;
  params.options.precision = nc.precision;
  params.options.fp8.qk_format = nc.qk_format;
  KernelChoice choice;
  if (const Status status = select_kernel(params, &choice); !status.ok()) {
    *declined = status.message;
    return false;
  }
  detail::AttentionProblem problem;
  EXPECT_TRUE(detail::validate_forward(params, &problem).ok());
  if (nc.kv_splits > 0) {
    const Status status = detail::with_kv_splits(problem, nc.kv_splits, &choice);
    EXPECT_TRUE(status.ok()) << status.message;
  }
  const size_t bytes = static_cast<size_t>(detail::workspace_bytes(problem, choice));
  DeviceBuffer workspace;
  if (bytes > 0) EXPECT_NO_FATAL_FAILURE(workspace.allocate(bytes));
  const Status status = detail::run_forward(problem, choice, workspace.data(), bytes, nullptr);
  EXPECT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  EXPECT_NO_FATAL_FAILURE(copy_to_host(o, &f.o.buffer, nullptr));
  if (f.lse.present()) EXPECT_NO_FATAL_FAILURE(copy_to_host(lse, &f.lse.buffer, nullptr));
  return true;
}

std::vector<double> o_values(const HostForward& f) {
  std::vector<double> out;
  for_each_index(f.o.view, [&](const std::array<int64_t, 4>& i) { out.push_back(element_as_double(f.o.view, i)); });
  return out;
}

std::vector<double> lse_values(const HostForward& f, const ForwardCase& c) {
  std::vector<double> out;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) out.push_back(element_as_double(f.lse.view, {b, h, i, 0}));
  return out;
}

// FP8: elements expected `same` finite, their relative L2 error against the
// fp64 reference of the poisoned inputs within the FP8 tolerance; LSE within 2e-2.
void expect_fp8_elsewhere(const std::vector<Expect>& expect, const std::vector<double>& got,
                          const std::vector<double>& want, double tolerance, const char* what) {
  std::vector<double> got_same, want_same;
  int64_t not_finite = 0;
  for (size_t e = 0; e < expect.size(); ++e) {
    if (expect[e] != Expect::same) continue;
    if (!std::isfinite(want[e])) continue;  // -inf LSE of a row with no attended key
    not_finite += std::isfinite(got[e]) ? 0 : 1;
    got_same.push_back(got[e]);
    want_same.push_back(want[e]);
  }
  EXPECT_EQ(not_finite, 0) << what << ": elements no NaN reaches are not finite";
  if (!got_same.empty()) EXPECT_LE(error_metrics(got_same, want_same).relative_l2, tolerance) << what;
}

class GpuNanInputs : public ::testing::TestWithParam<NanCase> {};

TEST_P(GpuNanInputs, ReachTheRowsTheyTouch) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const NanCase& nc = GetParam();
  const ForwardCase& c = nc.shape;
  const uint64_t seed = splitmix64(std::hash<std::string>{}(nc.name));
  HostForward clean, poisoned;
  ASSERT_NO_FATAL_FAILURE(make_host_forward(c, 0, seed, &clean));
  ASSERT_NO_FATAL_FAILURE(make_host_forward(c, 0, seed, &poisoned));
  put_nans(poisoned.q.view, poisoned.k.view, poisoned.v.view, &poisoned.mask.view);
  // The poisoned inputs' reference (make_host_forward ran it before the NaNs).
  detail::cpu_attention_forward_f64(poisoned.problem, {}, poisoned.want_o.data(), poisoned.want_lse.data());
  const ForwardExpectation want = expect_forward_nans(poisoned.problem, kKernelKeyWindow);
  ASSERT_GT(want.nan_elements, 0);

  std::string declined;
  if (!run_on_device(nc, clean, &declined)) GTEST_SKIP() << declined;
  ASSERT_TRUE(run_on_device(nc, poisoned, &declined)) << declined;
  const std::vector<double> got_o = o_values(poisoned), got_lse = lse_values(poisoned, c);
  if (nc.precision == Precision::fp8) {
    std::vector<Expect> nan_only_o = want.o, nan_only_lse = want.lse;
    for (Expect& x : nan_only_o) x = x == Expect::nan ? Expect::nan : Expect::either;
    for (Expect& x : nan_only_lse) x = x == Expect::nan ? Expect::nan : Expect::either;
    EXPECT_EQ(count_off(nan_only_o, got_o, got_o, "o"), 0);
    EXPECT_EQ(count_off(nan_only_lse, got_lse, got_lse, "lse"), 0);
    expect_fp8_elsewhere(want.o, got_o, poisoned.want_o, 5e-2, "o");
    expect_fp8_elsewhere(want.lse, got_lse, poisoned.want_lse, 2e-2, "lse");
    return;
  }
  EXPECT_EQ(count_off(want.o, got_o, o_values(clean), "o"), 0);
  EXPECT_EQ(count_off(want.lse, got_lse, lse_values(clean, c), "lse"), 0);
}

std::vector<NanCase> cases() {
  const DType bf16 = DType::bf16, f16 = DType::f16;
  const ForwardCase shapes[] = {
      shape_case(bf16, 1, 2, 2, 130, 300, 128).with_causal(Causal::top_left),
      shape_case(f16, 2, 2, 1, 100, 260, 320).with_mask(DType::f32, MaskShape::batch_rows, true).with_dropout(0.2f),
      shape_case(bf16, 1, 2, 2, 128, 256, 512).with_mask(DType::boolean, MaskShape::full, true),
      shape_case(bf16, 1, 2, 1, 70, 200, 1024).with_causal(Causal::bottom_right),
      shape_case(bf16, 2, 8, 2, 1, 700, 512),  // decode: GQA packing, split-KV
  };
  std::vector<NanCase> all;
  for (const ForwardCase& shape : shapes) {
    const std::string name = case_name(shape);
    all.push_back({name + "_auto", shape});
    all.push_back({name + "_sm80", shape, Impl::sm80_split_d});
    all.push_back({name + "_sm90", shape, Impl::sm90_wgmma});
    all.push_back({name + "_sm90_kv_splits3", shape, Impl::sm90_wgmma, 3});
    all.push_back({name + "_sm80_kv_splits3", shape, Impl::sm80_split_d, 3});
    all.push_back({name + "_fp8_int8", shape, Impl::automatic, 0, Precision::fp8, Fp8QkFormat::int8});
    all.push_back({name + "_fp8_e4m3", shape, Impl::automatic, 0, Precision::fp8, Fp8QkFormat::e4m3});
  }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuNanInputs, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<NanCase>& info) { return info.param.name; });

// The issue's call: q [1, 2, 128, 512] bf16 with one NaN in row 7, 256 keys:
// row 7 of that head is NaN (O and LSE) on every path, every other row as
// without the NaN.
TEST(GpuNanInputsIssue31, OneNanInAQueryRow) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const ForwardCase c = shape_case(DType::bf16, 1, 2, 2, 128, 256, 512);
  for (const NanCase& path : {NanCase{"auto", c}, NanCase{"sm80", c, Impl::sm80_split_d},
                              NanCase{"sm90", c, Impl::sm90_wgmma}, NanCase{"sm90 split-KV", c, Impl::sm90_wgmma, 2},
                              NanCase{"fp8", c, Impl::automatic, 0, Precision::fp8}}) {
    SCOPED_TRACE(path.name);
    HostForward clean, poisoned;
    ASSERT_NO_FATAL_FAILURE(make_host_forward(c, 0, 31, &clean));
    ASSERT_NO_FATAL_FAILURE(make_host_forward(c, 0, 31, &poisoned));
    set_element(poisoned.q.view, {0, 1, 7, 100}, std::nan(""));
    std::string declined;
    if (!run_on_device(path, clean, &declined)) continue;  // this device or build lacks the path
    ASSERT_TRUE(run_on_device(path, poisoned, &declined)) << declined;
    const std::vector<double> got = o_values(poisoned), base = o_values(clean);
    const std::vector<double> got_lse = lse_values(poisoned, c), base_lse = lse_values(clean, c);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 128; ++i) {
        const size_t row = static_cast<size_t>(h * 128 + i);
        const bool touched = h == 1 && i == 7;
        EXPECT_EQ(std::isnan(got_lse[row]), touched) << "lse row " << row;
        int64_t nan = 0, changed = 0;
        for (int64_t d = 0; d < 512; ++d) {
          nan += std::isnan(got[row * 512 + d]) ? 1 : 0;
          changed += got[row * 512 + d] != base[row * 512 + d] ? 1 : 0;
        }
        if (touched) {
          EXPECT_EQ(nan, 512) << "row " << row;
        } else {
          EXPECT_EQ(nan, 0) << "row " << row;
          if (path.precision != Precision::fp8) EXPECT_EQ(changed, 0) << "row " << row;
        }
      }
  }
}

}  // namespace
}  // namespace ffpa::testing
