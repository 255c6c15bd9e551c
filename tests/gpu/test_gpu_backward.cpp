// The GPU backward (ffpa::backward on device tensors: the portable kernels of
// kernels/sm80_backward) against the CPU reference's gradients in double
// (reference/cpu_attention_backward.hpp), on fresh random inputs: odd sizes,
// GQA / MQA, both causal alignments with rows that see no key, masks of every
// dtype and broadcast pattern with fully masked rows, dropout (the forward's
// keep mask), a custom scale, D_qk != D_v, the lse's gradient, both layouts,
// padded rows. Gradients are poisoned with NaN first (rows and the gaps
// between padded rows): every element must be written, no gap touched.
// The errors are printed ([ bwd ] lines). Seeds: FFPA_TEST_SEED mixed with the
// case name.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/device_tensor.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention_backward.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {
namespace {

// Relative L2 of each gradient against the fp64 reference: P is recomputed
// in fp32 and rounded with dS to the inputs' dtype for the products, as in
// FlashAttention's backward.
double tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 1e-2; }

enum BackwardSeedUse : uint64_t { seed_d_o = 101, seed_d_lse };

struct BackwardCase {
  std::string name;
  ForwardCase shape;
  int64_t value_dim = 0;  // Dv; 0: D
  bool with_d_lse = false;
};

void PrintTo(const BackwardCase& c, std::ostream* out) { *out << c.name; }

std::vector<BackwardCase> cases() {
  std::vector<BackwardCase> all;
  auto add = [&](std::string name, ForwardCase shape, int64_t value_dim = 0, bool with_d_lse = false) {
    all.push_back({std::move(name), shape, value_dim, with_d_lse});
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
  add("Small_f32_mask_rows_empty_rows",
      shape_case(bf16, 2, 2, 1, 70, 66, 128).with_mask(DType::f32, MaskShape::batch_rows, true));
  add("Small_bf16_full_mask", shape_case(bf16, 1, 3, 3, 33, 100, 64).with_mask(DType::bf16, MaskShape::full, false));
  add("Small_f16_stride0_mask", shape_case(f16, 2, 2, 2, 45, 77, 32).with_mask(DType::f16, MaskShape::stride0_view, false));
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

// The [B, H, N] elements of a (rank-3) view as doubles, row-major.
std::vector<double> as_doubles3(const Tensor& t) {
  std::vector<double> out;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t n = 0; n < t.shape[2]; ++n) out.push_back(element_as_double(t, {b, h, n, 0}));
  return out;
}

std::vector<double> as_doubles4(const Tensor& t) {
  std::vector<double> out;
  for_each_index(t, [&](const std::array<int64_t, 4>& i) { out.push_back(element_as_double(t, i)); });
  return out;
}

class GpuBackward : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(GpuBackward, GradientsMatchTheReference) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const BackwardCase& bc = GetParam();
  const ForwardCase& c = bc.shape;
  const uint64_t seed = case_seed(bc);
  SCOPED_TRACE(bc.name + " (seed " + std::to_string(seed) + ")");
  const int64_t dv = bc.value_dim > 0 ? bc.value_dim : c.head_dim;

  // The forward on the host: its o and lse are what the backward reads.
  HostView q = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c, derive_seed(seed, seed_q), -2.0f, 2.0f);
  HostView k = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c, derive_seed(seed, seed_k), -1.0f, 1.0f);
  HostView v = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c, derive_seed(seed, seed_v), -1.0f, 1.0f);
  HostView o = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c.layout, c.row_pad);
  HostView lse = make_lse(c);
  HostView mask = make_mask(c, derive_seed(seed, seed_mask));
  HostView d_o = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c, derive_seed(seed, seed_d_o), -1.0f, 1.0f);
  HostView d_lse;
  if (bc.with_d_lse) {
    d_lse = make_lse(c);
    fill_uniform(d_lse.buffer, derive_seed(seed, seed_d_lse), -1.0f, 1.0f);
  }
  Options options;
  options.scale = c.scale;
  options.causal = c.causal;
  options.dropout_p = c.dropout_p;
  options.dropout_seed = derive_seed(seed, seed_dropout);
  options.dropout_offset = derive_seed(seed, seed_dropout_offset);
  {
    ForwardParams forward;
    forward.q = q.view, forward.k = k.view, forward.v = v.view, forward.o = o.view, forward.mask = mask.view;
    forward.lse = lse.view;
    forward.options = options;
    forward.options.impl = Impl::cpu_reference;
    const Status status = ffpa::forward(forward);
    ASSERT_TRUE(status.ok()) << status.message;
  }

  // The gradients: host buffers poisoned (gaps too), mirrored to the device.
  HostView d_q = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c.layout, c.row_pad);
  HostView d_k = make_padded(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c.layout, c.row_pad);
  HostView d_v = make_padded(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c.layout, c.row_pad);
  for (HostView* t : {&d_q, &d_k, &d_v}) fill_nan(t->buffer);

  BackwardParams params;
  params.q = q.view, params.k = k.view, params.v = v.view, params.o = o.view, params.lse = lse.view;
  params.mask = mask.view, params.d_o = d_o.view, params.d_lse = d_lse.view;
  params.d_q = d_q.view, params.d_k = d_k.view, params.d_v = d_v.view;
  params.options = options;

  // The reference in double.
  detail::BackwardProblem problem;
  {
    const Status status = detail::validate_backward(params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  const std::vector<double> g = as_doubles4(d_o.view);
  const std::vector<double> gl = bc.with_d_lse ? as_doubles3(d_lse.view) : std::vector<double>{};
  std::vector<double> want_q(static_cast<size_t>(c.batch * c.heads_q * c.seq_q * c.head_dim));
  std::vector<double> want_k(static_cast<size_t>(c.batch * c.heads_kv * c.seq_kv * c.head_dim));
  std::vector<double> want_v(static_cast<size_t>(c.batch * c.heads_kv * c.seq_kv * dv));
  detail::cpu_attention_backward_f64(problem.forward, g.data(), gl.empty() ? nullptr : gl.data(),
                                     {want_q.data(), want_k.data(), want_v.data(), nullptr});

  DeviceTensor dq_, dk_, dv_, dq, dk, dvv, dlse, dmask, ddo, dgl;
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(q.buffer, q.view, &dq_));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(k.buffer, k.view, &dk_));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(v.buffer, v.view, &dv_));
  DeviceTensor d_out_o;
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(o.buffer, o.view, &d_out_o));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(lse.buffer, lse.view, &dlse));
  if (mask.present()) ASSERT_NO_FATAL_FAILURE(mirror_to_device(mask.buffer, mask.view, &dmask));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(d_o.buffer, d_o.view, &ddo));
  if (bc.with_d_lse) ASSERT_NO_FATAL_FAILURE(mirror_to_device(d_lse.buffer, d_lse.view, &dgl));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(d_q.buffer, d_q.view, &dq));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(d_k.buffer, d_k.view, &dk));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(d_v.buffer, d_v.view, &dvv));

  BackwardParams device = params;
  device.q = dq_.tensor, device.k = dk_.tensor, device.v = dv_.tensor, device.o = d_out_o.tensor;
  device.lse = dlse.tensor, device.mask = mask.present() ? dmask.tensor : Tensor{}, device.d_o = ddo.tensor;
  device.d_lse = bc.with_d_lse ? dgl.tensor : Tensor{};
  device.d_q = dq.tensor, device.d_k = dk.tensor, device.d_v = dvv.tensor;
  cudaStream_t stream = nullptr;
  FFPA_ASSERT_CUDA(cudaStreamCreate(&stream));
  device.stream = stream;
  size_t workspace_bytes = 0;
  {
    const Status status = backward_workspace_size(device, &workspace_bytes);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  DeviceBuffer workspace;
  if (workspace_bytes > 0) ASSERT_NO_FATAL_FAILURE(workspace.allocate(workspace_bytes));
  device.workspace = workspace.data(), device.workspace_bytes = workspace_bytes;
  {
    const Status status = backward(device);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dq, &d_q.buffer, stream));
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dk, &d_k.buffer, stream));
  ASSERT_NO_FATAL_FAILURE(copy_to_host(dvv, &d_v.buffer, stream));
  FFPA_EXPECT_CUDA(cudaStreamDestroy(stream));

  struct Checked {
    const char* name;
    const HostView* got;
    const std::vector<double>* want;
  };
  for (const Checked& grad : {Checked{"d_q", &d_q, &want_q}, Checked{"d_k", &d_k, &want_k}, Checked{"d_v", &d_v, &want_v}}) {
    const std::vector<double> got = as_doubles4(grad.got->view);
    int64_t not_finite = 0;
    for (double x : got) not_finite += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(not_finite, 0) << grad.name << ": elements left unwritten or not finite";
    int64_t gaps_written = 0;
    for_each_gap_element(*grad.got, [&](const std::array<int64_t, 4>& i) {
      gaps_written += std::isnan(element_as_double(grad.got->buffer.tensor, i)) ? 0 : 1;
    });
    EXPECT_EQ(gaps_written, 0) << grad.name << ": the gaps between padded rows were written";
    const ErrorMetrics m = error_metrics(got, *grad.want);
    std::cout << "[ bwd ] " << bc.name << " " << grad.name << " relative L2 " << m.relative_l2 << " max abs "
              << m.max_abs << "\n";
    EXPECT_LE(m.relative_l2, tolerance(c.dtype)) << grad.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBackward, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BackwardCase>& info) { return info.param.name; });

// Refusals on device tensors: an explicit sm90_wgmma (no backward kernels of
// its own yet) and an additive mask's gradient (CPU reference only for now),
// each with its status, nothing written.
TEST(GpuBackwardRefusals, Sm90ImplAndMaskGradient) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const ForwardCase c = shape_case(DType::bf16, 1, 1, 1, 16, 16, 64).with_mask(DType::f32, MaskShape::full, false);
  DeviceBuffer buffer;
  ASSERT_NO_FATAL_FAILURE(buffer.allocate(1 << 20));
  auto tensor = [&](size_t offset, DType dtype, std::array<int64_t, 4> shape, int rank = 4) {
    Tensor t;
    t.data = static_cast<unsigned char*>(buffer.data()) + offset;
    t.dtype = dtype;
    t.rank = rank;
    int64_t stride = 1;
    for (int d = rank - 1; d >= 0; --d) t.shape[d] = shape[d], t.stride[d] = stride, stride *= shape[d];
    return t;
  };
  BackwardParams p;
  p.q = tensor(0, c.dtype, {1, 1, 16, 64});
  p.k = tensor(1 << 12, c.dtype, {1, 1, 16, 64});
  p.v = tensor(2 << 12, c.dtype, {1, 1, 16, 64});
  p.o = tensor(3 << 12, c.dtype, {1, 1, 16, 64});
  p.d_o = tensor(4 << 12, c.dtype, {1, 1, 16, 64});
  p.d_q = tensor(5 << 12, c.dtype, {1, 1, 16, 64});
  p.d_k = tensor(6 << 12, c.dtype, {1, 1, 16, 64});
  p.d_v = tensor(7 << 12, c.dtype, {1, 1, 16, 64});
  p.lse = tensor(8 << 12, DType::f32, {1, 1, 16, 1}, 3);
  p.options.impl = Impl::sm90_wgmma;
  EXPECT_EQ(backward(p).code, StatusCode::impl_unavailable);
  p.options.impl = Impl::automatic;
  p.mask = tensor(9 << 12, DType::f32, {1, 1, 16, 16});
  p.d_mask = tensor(10 << 12, DType::f32, {1, 1, 16, 16});
  const Status status = backward(p);
  EXPECT_EQ(status.code, StatusCode::impl_unavailable) << status.message;
  EXPECT_NE(status.message.find("d_mask"), std::string::npos) << status.message;
}

}  // namespace
}  // namespace ffpa::testing
