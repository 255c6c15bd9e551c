// D_qk != D_v on the GPU (issue 14): forward() on device tensors, whose Dv
// the portable family serves (the sm90 family declines it for now), against
// the fp64 CPU reference: every element of o and lse, o poisoned first.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/device_tensor.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {
namespace {

struct ValueDimCase {
  std::string name;
  ForwardCase shape;
  int64_t value_dim;
};

void PrintTo(const ValueDimCase& c, std::ostream* out) { *out << c.name; }

class GpuValueDim : public ::testing::TestWithParam<ValueDimCase> {};

TEST_P(GpuValueDim, ForwardMatchesTheReference) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const ValueDimCase& vc = GetParam();
  const ForwardCase& c = vc.shape;
  const int64_t dv = vc.value_dim;
  uint64_t seed = 0xD1CEull;
  if (const char* text = std::getenv("FFPA_TEST_SEED")) seed = std::strtoull(text, nullptr, 0);
  for (char ch : vc.name) seed = splitmix64(seed ^ static_cast<unsigned char>(ch));
  SCOPED_TRACE(vc.name + " (seed " + std::to_string(seed) + ")");

  HostView q = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c, derive_seed(seed, seed_q), -2.0f, 2.0f);
  HostView k = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c, derive_seed(seed, seed_k), -1.0f, 1.0f);
  HostView v = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c, derive_seed(seed, seed_v), -1.0f, 1.0f);
  HostView o = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c.layout, c.row_pad);
  HostView lse = make_lse(c);
  HostView mask = make_mask(c, derive_seed(seed, seed_mask));
  fill_nan(o.buffer);
  fill_nan(lse.buffer);
  ForwardParams params;
  params.q = q.view, params.k = k.view, params.v = v.view, params.o = o.view, params.mask = mask.view;
  params.lse = lse.view;
  params.options.causal = c.causal;
  params.options.dropout_p = c.dropout_p;
  params.options.dropout_seed = derive_seed(seed, seed_dropout);
  detail::AttentionProblem problem;
  {
    const Status status = detail::validate_forward(params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  const size_t rows = static_cast<size_t>(c.batch * c.heads_q * c.seq_q);
  std::vector<double> want_o(rows * static_cast<size_t>(dv)), want_lse(rows);
  detail::cpu_attention_forward_f64(problem, {}, want_o.data(), want_lse.data());

  DeviceTensor dq, dk, dvv, dout, dlse, dmask;
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(q.buffer, q.view, &dq));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(k.buffer, k.view, &dk));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(v.buffer, v.view, &dvv));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(o.buffer, o.view, &dout));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(lse.buffer, lse.view, &dlse));
  if (mask.present()) ASSERT_NO_FATAL_FAILURE(mirror_to_device(mask.buffer, mask.view, &dmask));
  ForwardParams device = params;
  device.q = dq.tensor, device.k = dk.tensor, device.v = dvv.tensor, device.o = dout.tensor, device.lse = dlse.tensor;
  device.mask = mask.present() ? dmask.tensor : Tensor{};
  {
    const Status status = forward(device);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dout, &o.buffer, nullptr));
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dlse, &lse.buffer, nullptr));

  std::vector<double> got_o;
  for_each_index(o.view, [&](const std::array<int64_t, 4>& i) { got_o.push_back(element_as_double(o.view, i)); });
  int64_t not_finite = 0;
  for (double x : got_o) not_finite += std::isfinite(x) ? 0 : 1;
  EXPECT_EQ(not_finite, 0);
  const ErrorMetrics m = error_metrics(got_o, want_o);
  std::cout << "[ dv ] " << vc.name << " o relative L2 " << m.relative_l2 << "\n";
  EXPECT_LE(m.relative_l2, c.dtype == DType::bf16 ? 1e-2 : 5e-3);
  size_t r = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i, ++r) {
        const double got = element_as_double(lse.view, {b, h, i, 0});
        if (std::isinf(want_lse[r])) {
          EXPECT_EQ(got, want_lse[r]) << "lse row " << r;
        } else {
          EXPECT_NEAR(got, want_lse[r], 2e-3 * std::max(1.0, std::fabs(want_lse[r]))) << "lse row " << r;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuValueDim,
    ::testing::Values(
        ValueDimCase{"Small_mla_576_512_mqa_causal",
                     shape_case(DType::bf16, 1, 8, 1, 100, 129, 576).with_causal(Causal::bottom_right), 512},
        ValueDimCase{"Small_192_128_gqa_mask",
                     shape_case(DType::f16, 2, 4, 2, 77, 90, 192).with_mask(DType::boolean, MaskShape::batch_keys, true),
                     128},
        ValueDimCase{"Small_64_1000_dropout", shape_case(DType::bf16, 1, 2, 2, 50, 70, 64).with_dropout(0.1f), 1000}),
    [](const ::testing::TestParamInfo<ValueDimCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ffpa::testing
