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
#include "gpu/host_forward.hpp"

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

  HostForward f;
  ASSERT_NO_FATAL_FAILURE(make_host_forward(c, dv, seed, &f));
  HostView &q = f.q, &k = f.k, &v = f.v, &o = f.o, &lse = f.lse, &mask = f.mask;
  const ForwardParams& params = f.params;

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

  expect_forward_matches(f, c, c.dtype == DType::bf16 ? 1e-2 : 5e-3, "dv", vc.name);
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
