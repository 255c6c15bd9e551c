// The GPU backward (ffpa::backward on device tensors: the portable kernels of
// kernels/sm80_backward, and beside them the sm90 dQ kernel of
// kernels/sm90_backward; each case runs under impl auto, sm80_split_d and,
// where the library serves it, sm90_wgmma) against the CPU reference's gradients in double
// (reference/cpu_attention_backward.hpp), on fresh random inputs: odd sizes,
// GQA / MQA, both causal alignments with rows that see no key, masks of every
// dtype and broadcast pattern with fully masked rows, dropout (the forward's
// keep mask), a custom scale, D_qk != D_v, the lse's gradient, both layouts,
// padded rows. Gradients are poisoned with NaN first (rows and the gaps
// between padded rows): every element must be written, no gap touched.
// The errors are printed ([ bwd ] lines). Seeds: FFPA_TEST_SEED mixed with the
// case name. The case harness (backward_case.hpp) is shared with the CPU
// emulation of these kernels (tests/emulation/).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/backward_case.hpp"
#include "gpu/device_tensor.hpp"
#include "host/dispatch.hpp"

namespace ffpa::testing {
namespace {

// Relative L2 of each gradient against the fp64 reference: P is recomputed
// in fp32 (ex2.approx) and rounded with dS to the inputs' dtype for the
// products, as in FlashAttention's backward (the CPU emulation of these
// kernels measures 2.4e-3 bf16, 3e-4 f16).
constexpr double kToleranceBf16 = 1e-2, kToleranceF16 = 3e-3;

std::vector<BackwardCase> cases() {
  std::vector<BackwardCase> all;
  auto add = [&](std::string name, ForwardCase shape, int64_t value_dim = 0, bool with_d_lse = false,
                 bool with_d_mask = false) {
    all.push_back({std::move(name), shape, value_dim, with_d_lse, with_d_mask});
  };
  const DType bf16 = DType::bf16, f16 = DType::f16;
  add("Small_mha_odd_d64", shape_case(bf16, 2, 3, 3, 77, 131, 64));
  add("Small_f16_d40", shape_case(f16, 1, 2, 2, 65, 63, 40));
  add("Small_d8", shape_case(bf16, 1, 2, 1, 19, 23, 8));
  add("Small_gqa4_causal_top_left_d128", shape_case(bf16, 1, 8, 2, 128, 128, 128).with_causal(Causal::top_left));
  add("Small_causal_bottom_right_short_q_bnhd_d96",
      shape_case(bf16, 2, 2, 1, 50, 129, 96).with_causal(Causal::bottom_right).with_layout(Layout::bnhd));
  add("Small_causal_bottom_right_rows_without_keys_d72",
      shape_case(f16, 1, 2, 2, 129, 70, 72).with_causal(Causal::bottom_right));
  add("Small_bool_key_padding_empty_rows",
      shape_case(bf16, 2, 2, 2, 67, 93, 64).with_mask(DType::boolean, MaskShape::batch_keys, true));
  add("Small_f32_mask_rows_empty_rows_d_mask",
      shape_case(bf16, 2, 2, 1, 70, 66, 128).with_mask(DType::f32, MaskShape::batch_rows, true), 0, false, true);
  add("Small_bf16_full_mask_d_mask", shape_case(bf16, 1, 3, 3, 33, 100, 64).with_mask(DType::bf16, MaskShape::full, false),
      0, false, true);
  add("Small_f16_stride0_mask", shape_case(f16, 2, 2, 2, 45, 77, 32).with_mask(DType::f16, MaskShape::stride0_view, false));
  add("Small_f32_key_mask_d_mask_causal",
      shape_case(f16, 2, 4, 2, 60, 80, 96).with_mask(DType::f32, MaskShape::keys, false).with_causal(Causal::top_left),
      0, false, true);
  add("Small_dropout_d128", shape_case(bf16, 1, 2, 2, 96, 120, 128).with_dropout(0.2f));
  add("Small_dropout_gqa_causal_d256",
      shape_case(bf16, 1, 4, 1, 100, 110, 256).with_dropout(0.3f).with_causal(Causal::top_left));
  add("Small_scale_row_pad_d136", shape_case(f16, 1, 2, 2, 80, 90, 136).with_scale(0.05f).with_row_pad(24));
  add("Small_d_lse_d64", shape_case(bf16, 2, 2, 1, 70, 71, 64).with_causal(Causal::bottom_right), 0, true);
  add("Small_dv_narrower_d192_dv128", shape_case(bf16, 1, 4, 1, 90, 100, 192).with_causal(Causal::top_left), 128);
  add("Small_dv_wider_d64_dv200", shape_case(f16, 1, 2, 2, 50, 60, 64), 200);
  add("Large_d320", shape_case(bf16, 1, 2, 2, 300, 333, 320));
  add("Large_d512_causal", shape_case(bf16, 1, 2, 1, 257, 257, 512).with_causal(Causal::top_left));
  add("Large_mla_576_512_mqa", shape_case(bf16, 1, 8, 1, 130, 200, 576).with_causal(Causal::bottom_right), 512);
  add("Large_d1024_dropout_mask",
      shape_case(f16, 1, 2, 2, 130, 190, 1024).with_dropout(0.1f).with_mask(DType::boolean, MaskShape::keys, false));
  return all;
}

uint64_t case_seed(const BackwardCase& c) {
  uint64_t seed = 0x5EEDull;
  if (const char* text = std::getenv("FFPA_TEST_SEED")) seed = std::strtoull(text, nullptr, 0);
  for (char ch : c.name) seed = splitmix64(seed ^ static_cast<unsigned char>(ch));
  return seed;
}

// Device copies of a case's host tensors (same strides and gaps) and the call
// on them.
struct DeviceBackward {
  DeviceTensor q, k, v, o, lse, mask, d_o, d_lse, d_q, d_k, d_v, d_mask;
  BackwardParams params;

  void mirror(const BackwardTensors& t) {
    struct Mirrored {
      const HostView* host;
      DeviceTensor* device;
      Tensor* param;
    };
    params = t.params;
    for (const Mirrored& m : {Mirrored{&t.q, &q, &params.q}, Mirrored{&t.k, &k, &params.k},
                              Mirrored{&t.v, &v, &params.v}, Mirrored{&t.o, &o, &params.o},
                              Mirrored{&t.lse, &lse, &params.lse}, Mirrored{&t.mask, &mask, &params.mask},
                              Mirrored{&t.d_o, &d_o, &params.d_o}, Mirrored{&t.d_lse, &d_lse, &params.d_lse},
                              Mirrored{&t.d_q, &d_q, &params.d_q}, Mirrored{&t.d_k, &d_k, &params.d_k},
                              Mirrored{&t.d_v, &d_v, &params.d_v}, Mirrored{&t.d_mask, &d_mask, &params.d_mask}}) {
      if (!m.host->present()) continue;
      ASSERT_NO_FATAL_FAILURE(mirror_to_device(m.host->buffer, m.host->view, m.device));
      *m.param = m.device->tensor;
    }
  }

  // The gradients back into the host buffers.
  void copy_back(BackwardTensors& t, cudaStream_t stream) {
    ASSERT_NO_FATAL_FAILURE(copy_to_host(d_q, &t.d_q.buffer, stream));
    ASSERT_NO_FATAL_FAILURE(copy_to_host(d_k, &t.d_k.buffer, stream));
    ASSERT_NO_FATAL_FAILURE(copy_to_host(d_v, &t.d_v.buffer, stream));
    if (t.d_mask.present()) ASSERT_NO_FATAL_FAILURE(copy_to_host(d_mask, &t.d_mask.buffer, stream));
  }
};

// The call on the device under `impl`, in the workspace the size query reports, on a stream of its own.
void run_on_device(BackwardTensors& t, Impl impl) {
  DeviceBackward device;
  ASSERT_NO_FATAL_FAILURE(device.mirror(t));
  device.params.options.impl = impl;
  cudaStream_t stream = nullptr;
  FFPA_ASSERT_CUDA(cudaStreamCreate(&stream));
  device.params.stream = stream;
  size_t workspace_bytes = 0;
  {
    const Status status = backward_workspace_size(device.params, &workspace_bytes);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  DeviceBuffer workspace;
  if (workspace_bytes > 0) ASSERT_NO_FATAL_FAILURE(workspace.allocate(workspace_bytes));
  device.params.workspace = workspace.data(), device.params.workspace_bytes = workspace_bytes;
  {
    const Status status = backward(device.params);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  ASSERT_NO_FATAL_FAILURE(device.copy_back(t, stream));
  FFPA_EXPECT_CUDA(cudaStreamDestroy(stream));
}

class GpuBackward : public ::testing::TestWithParam<BackwardCase> {};

// Whether the library serves the case's call under `impl` (its own answer:
// the workspace query plans the call as backward() would).
bool serves(const BackwardCase& c, Impl impl) {
  BackwardTensors t;
  make_backward_tensors(c, 1, &t);
  DeviceBackward device;
  device.mirror(t);
  device.params.options.impl = impl;
  size_t bytes = 0;
  return backward_workspace_size(device.params, &bytes).ok();
}

TEST_P(GpuBackward, GradientsMatchTheReference) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  for (Impl impl : {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma}) {
    if (impl == Impl::sm90_wgmma && !serves(GetParam(), impl)) continue;
    const char* label = impl == Impl::automatic ? "bwd auto" : impl == Impl::sm80_split_d ? "bwd sm80" : "bwd sm90";
    check_backward(GetParam(), case_seed(GetParam()), label, kToleranceBf16, kToleranceF16,
                   [impl](BackwardTensors& t, const detail::BackwardProblem&) { run_on_device(t, impl); });
  }
}

// backward_route is the plan's own answer: for each case and GPU impl, the
// query of (device, dtype, D, Dv) has the status and implementation that
// plan_backward (what backward() runs) has for the case's device tensors,
// whatever their mask, causal alignment, dropout, scale, GQA ratio or layout.
TEST_P(GpuBackward, TheRouteQueryAgreesWithWhatThePlanRuns) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const BackwardCase& c = GetParam();
  BackwardTensors t;
  ASSERT_NO_FATAL_FAILURE(make_backward_tensors(c, case_seed(c), &t));
  DeviceBackward device;
  ASSERT_NO_FATAL_FAILURE(device.mirror(t));
  int current = 0;
  FFPA_ASSERT_CUDA(cudaGetDevice(&current));
  const int64_t value_dim = c.value_dim > 0 ? c.value_dim : c.shape.head_dim;
  for (Impl impl : {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma}) {
    SCOPED_TRACE(impl == Impl::automatic ? "auto" : impl == Impl::sm80_split_d ? "sm80_split_d" : "sm90_wgmma");
    device.params.options.impl = impl;
    detail::BackwardProblem problem;
    {
      const Status status = detail::validate_backward(device.params, &problem);
      ASSERT_TRUE(status.ok()) << status.message;
    }
    detail::BackwardChoice choice;
    const Status planned = detail::plan_backward(problem, impl, &choice);
    const auto untouched = static_cast<Impl>(99);
    Impl routed = untouched;
    const Status route = backward_route(current, c.shape.dtype, c.shape.head_dim, value_dim, impl, &routed);
    EXPECT_EQ(route.code, planned.code) << "route: " << route.message << "; plan: " << planned.message;
    EXPECT_EQ(routed, planned.ok() ? choice.impl : untouched);
    int after = -1;
    FFPA_EXPECT_CUDA(cudaGetDevice(&after));
    EXPECT_EQ(after, current) << "the query restores the current device";
  }
  int count = 0;
  FFPA_ASSERT_CUDA(cudaGetDeviceCount(&count));
  Impl routed = Impl::automatic;
  EXPECT_EQ(backward_route(count, c.shape.dtype, c.shape.head_dim, value_dim, Impl::automatic, &routed).code,
            StatusCode::invalid_option);
}

// NaN inputs (backward_case.hpp's check_backward_nans; spec.md, "Non-finite
// inputs"): under the portable and (where served) the Hopper kernels, a NaN in
// q, k, v or the mask reaches the gradients of the rows and keys it touches;
// every other element is bit-identical to the run without it.
TEST(GpuBackwardNans, ReachTheGradientsTheyTouch) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const BackwardCase nan_cases[] = {
      {"nan_gqa_causal_d128", shape_case(DType::bf16, 1, 4, 2, 130, 200, 128).with_causal(Causal::top_left)},
      {"nan_mask_empty_rows_d320",
       shape_case(DType::f16, 2, 2, 1, 100, 150, 320).with_mask(DType::f32, MaskShape::batch_rows, true)},
      {"nan_cluster_d1024_bottom_right", shape_case(DType::bf16, 1, 2, 2, 70, 140, 1024).with_causal(Causal::bottom_right)},
  };
  for (const BackwardCase& bc : nan_cases) {
    for (Impl impl : {Impl::sm80_split_d, Impl::sm90_wgmma}) {
      if (impl == Impl::sm90_wgmma && !serves(bc, impl)) continue;
      SCOPED_TRACE(impl == Impl::sm80_split_d ? "sm80" : "sm90");
      check_backward_nans(bc, case_seed(bc),
                          [impl](BackwardTensors& t, const detail::BackwardProblem&) { run_on_device(t, impl); });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBackward, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BackwardCase>& info) { return info.param.name; });

}  // namespace
}  // namespace ffpa::testing
