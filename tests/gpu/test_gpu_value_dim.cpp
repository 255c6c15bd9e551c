// D_qk != D_v on the GPU (issue 14): forward() on device tensors against the
// fp64 CPU reference (every element of o and lse, o poisoned first, the gaps
// of padded rows untouched), under impl auto (on Hopper the sm90 family, by the
// wider head dim), sm80_split_d and sm90_wgmma (the instance of the wider head
// dim; skipped off Hopper): masks, both causal alignments, dropout, GQA/MQA, packed decode
// with split-KV, bnhd, padded rows, odd sizes.
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
  Impl impl = Impl::automatic;
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
  device.options.impl = vc.impl;
  device.q = dq.tensor, device.k = dk.tensor, device.v = dvv.tensor, device.o = dout.tensor, device.lse = dlse.tensor;
  device.mask = mask.present() ? dmask.tensor : Tensor{};
  {
    const Status status = forward(device);
    if (vc.impl == Impl::sm90_wgmma && status.code == StatusCode::impl_unavailable) GTEST_SKIP() << status.message;
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dout, &o.buffer, nullptr));
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dlse, &lse.buffer, nullptr));

  expect_forward_matches(f, c, c.dtype == DType::bf16 ? 1e-2 : 5e-3, "dv", vc.name);
}

std::vector<ValueDimCase> cases() {
  const ValueDimCase shapes[] = {
      {"Small_mla_576_512_mqa_causal", shape_case(DType::bf16, 1, 8, 1, 100, 129, 576).with_causal(Causal::bottom_right),
       512},
      {"Small_192_128_gqa_mask_empty_rows",
       shape_case(DType::f16, 2, 4, 2, 77, 90, 192).with_mask(DType::boolean, MaskShape::batch_keys, true), 128},
      {"Small_64_1000_dropout", shape_case(DType::bf16, 1, 2, 2, 50, 70, 64).with_dropout(0.1f), 1000},
      {"Small_mla_decode_packed_long_keys", shape_case(DType::bf16, 2, 16, 1, 1, 1500, 576), 512},
      {"Small_320_128_bnhd_padded_f32_mask",
       shape_case(DType::f16, 2, 4, 2, 33, 77, 320)
           .with_layout(Layout::bnhd)
           .with_row_pad(8)
           .with_mask(DType::f32, MaskShape::full, false)
           .with_causal(Causal::top_left),
       128},
      {"Small_1024_64_dropout_causal", shape_case(DType::bf16, 1, 2, 1, 70, 90, 1024)
                                           .with_dropout(0.2f)
                                           .with_causal(Causal::bottom_right),
       64},
  };
  std::vector<ValueDimCase> all;
  for (Impl impl : {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma})
    for (const ValueDimCase& c : shapes) {
      all.push_back(c);
      all.back().impl = impl;
      if (impl == Impl::sm80_split_d) all.back().name += "_sm80";
      if (impl == Impl::sm90_wgmma) all.back().name += "_sm90";
    }
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuValueDim, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ValueDimCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ffpa::testing
