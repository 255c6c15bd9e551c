// The portable backward kernels (kernels/sm80_backward) run on the CPU
// emulator (sm80_emulator.hpp) against the CPU reference's gradients in
// double: their fragment layouts, ring, indexing, masking, dropout and
// epilogue, on small odd shapes (the emulation runs a CTA's 256 threads as
// fibers: seconds a case). The same kernel source the GPU runs, compiled as
// host code; tests/gpu/test_gpu_backward.cpp checks the GPU.
#include "emulation/device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "kernels/sm80_backward/arguments.cuh"
#include "kernels/sm80_backward/kernels.cuh"
#include "reference/cpu_attention_backward.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::detail::sm80_backward {
// The kernels' dynamic shared memory (an extern array on the GPU).
alignas(128) unsigned char backward_smem[Traits<__nv_bfloat16, kSliceCols>::kSmemBytes];
}  // namespace ffpa::detail::sm80_backward

namespace ffpa::testing {
namespace {

using detail::BackwardProblem;
namespace bwd = detail::sm80_backward;

struct EmulatedCase {
  std::string name;
  ForwardCase shape;
  int64_t value_dim = 0;
  bool with_d_lse = false;
};

// Runs the preprocess and both kernels of a validated host problem, CTA by CTA.
template <class Element>
void run_emulated(const BackwardProblem& b) {
  using T = bwd::Traits<Element, bwd::kSliceCols>;
  static_assert(T::kSmemBytes <= sizeof bwd::backward_smem);
  std::vector<float> delta(static_cast<size_t>(b.forward.batch * b.forward.heads_q * b.forward.seq_q));
  const bwd::PreprocessArgs preprocess = bwd::preprocess_args(b, delta.data());
  for (int64_t block = 0; block < bwd::preprocess_blocks(b); ++block)
    emulation::run_cta({static_cast<unsigned>(block), 0, 0}, 32 * bwd::kPreprocessRows, nullptr,
                       [&] { bwd::preprocess_kernel<Element>(preprocess); });
  const bwd::Args args = bwd::kernel_args(b, delta.data());
  for (int64_t cta = 0; cta < bwd::dkdv_ctas<T>(b.forward); ++cta)
    emulation::run_cta({static_cast<unsigned>(cta), 0, 0}, T::kThreads, bwd::backward_smem,
                       [&] { bwd::dkdv_kernel<T>(args); });
  for (int64_t cta = 0; cta < bwd::dq_ctas<T>(b.forward); ++cta)
    emulation::run_cta({static_cast<unsigned>(cta), 0, 0}, T::kThreads, bwd::backward_smem,
                       [&] { bwd::dq_kernel<T>(args); });
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  for_each_index(t, [&](const std::array<int64_t, 4>& i) { out.push_back(element_as_double(t, i)); });
  return out;
}

void check(const EmulatedCase& ec) {
  SCOPED_TRACE(ec.name);
  const ForwardCase& c = ec.shape;
  const uint64_t seed = splitmix64(std::hash<std::string>{}(ec.name));
  const int64_t dv = ec.value_dim > 0 ? ec.value_dim : c.head_dim;
  HostView q = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c, derive_seed(seed, seed_q), -2.0f, 2.0f);
  HostView k = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c, derive_seed(seed, seed_k), -1.0f, 1.0f);
  HostView v = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c, derive_seed(seed, seed_v), -1.0f, 1.0f);
  HostView o = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c.layout, c.row_pad);
  HostView lse = make_lse(c);
  HostView mask = make_mask(c, derive_seed(seed, seed_mask));
  HostView d_o = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, dv}, c, derive_seed(seed, 101), -1.0f, 1.0f);
  HostView d_lse;
  if (ec.with_d_lse) {
    d_lse = make_lse(c);
    fill_uniform(d_lse.buffer, derive_seed(seed, 102), -1.0f, 1.0f);
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
  HostView d_q = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c.layout, c.row_pad);
  HostView d_k = make_padded(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c.layout, c.row_pad);
  HostView d_v = make_padded(c.dtype, {c.batch, c.heads_kv, c.seq_kv, dv}, c.layout, c.row_pad);
  for (HostView* t : {&d_q, &d_k, &d_v}) fill_nan(t->buffer);
  BackwardParams params;
  params.q = q.view, params.k = k.view, params.v = v.view, params.o = o.view, params.lse = lse.view;
  params.mask = mask.view, params.d_o = d_o.view, params.d_lse = d_lse.view;
  params.d_q = d_q.view, params.d_k = d_k.view, params.d_v = d_v.view;
  params.options = options;
  BackwardProblem problem;
  {
    const Status status = detail::validate_backward(params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  const std::vector<double> g = values(d_o.view);
  std::vector<double> gl;
  if (ec.with_d_lse)
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seq_q; ++i) gl.push_back(element_as_double(d_lse.view, {b, h, i, 0}));
  std::vector<double> want_q(static_cast<size_t>(c.batch * c.heads_q * c.seq_q * c.head_dim));
  std::vector<double> want_k(static_cast<size_t>(c.batch * c.heads_kv * c.seq_kv * c.head_dim));
  std::vector<double> want_v(static_cast<size_t>(c.batch * c.heads_kv * c.seq_kv * dv));
  detail::cpu_attention_backward_f64(problem.forward, g.data(), gl.empty() ? nullptr : gl.data(),
                                     {want_q.data(), want_k.data(), want_v.data(), nullptr});

  if (c.dtype == DType::bf16) {
    run_emulated<__nv_bfloat16>(problem);
  } else {
    run_emulated<__half>(problem);
  }

  struct Checked {
    const char* name;
    const HostView* got;
    const std::vector<double>* want;
  };
  for (const Checked& grad : {Checked{"d_q", &d_q, &want_q}, Checked{"d_k", &d_k, &want_k}, Checked{"d_v", &d_v, &want_v}}) {
    const std::vector<double> got = values(grad.got->view);
    int64_t not_finite = 0;
    for (double x : got) not_finite += std::isfinite(x) ? 0 : 1;
    EXPECT_EQ(not_finite, 0) << grad.name << ": elements left unwritten or not finite";
    int64_t gaps_written = 0;
    for_each_gap_element(*grad.got, [&](const std::array<int64_t, 4>& i) {
      gaps_written += std::isnan(element_as_double(grad.got->buffer.tensor, i)) ? 0 : 1;
    });
    EXPECT_EQ(gaps_written, 0) << grad.name << ": the gaps between padded rows were written";
    const ErrorMetrics m = error_metrics(got, *grad.want);
    std::cout << "[ emulated bwd ] " << ec.name << " " << grad.name << " relative L2 " << m.relative_l2 << "\n";
    // The rounding of the 16-bit outputs and of P and dS in the products (measured 2.4e-3 bf16, 3e-4 f16).
    EXPECT_LE(m.relative_l2, c.dtype == DType::bf16 ? 5e-3 : 1e-3) << grad.name;
    double want_norm = 0.0;
    for (double x : *grad.want) want_norm += x * x;
    EXPECT_GT(want_norm, 0.0) << grad.name << ": an all-zero reference checks nothing";
  }
}

TEST(EmulatedSm80Backward, MhaOddSizes) { check({"mha", shape_case(DType::bf16, 1, 2, 2, 70, 75, 72)}); }

TEST(EmulatedSm80Backward, GqaCausalTopLeftFp16) {
  check({"gqa", shape_case(DType::f16, 1, 4, 2, 65, 65, 32).with_causal(Causal::top_left)});
}

TEST(EmulatedSm80Backward, CausalBottomRightRowsWithoutKeysBnhd) {
  check({"bottom-right", shape_case(DType::bf16, 2, 1, 1, 80, 50, 40).with_causal(Causal::bottom_right).with_layout(
                             Layout::bnhd)});
}

TEST(EmulatedSm80Backward, TwoSlicesMaskDropout) {
  check({"two slices", shape_case(DType::bf16, 1, 2, 1, 40, 70, 200)
                           .with_mask(DType::f32, MaskShape::batch_rows, true)
                           .with_dropout(0.25f)});
}

TEST(EmulatedSm80Backward, WideValueDimBooleanMaskLseGradient) {
  check({"dv wider", shape_case(DType::f16, 2, 2, 2, 33, 66, 64).with_mask(DType::boolean, MaskShape::batch_keys, true),
         136, true});
}

TEST(EmulatedSm80Backward, NarrowValueDimMqaCausal) {
  check({"dv narrower", shape_case(DType::bf16, 1, 4, 1, 70, 90, 192).with_causal(Causal::bottom_right), 128});
}

TEST(EmulatedSm80Backward, DropoutGqaCausalFullMask) {
  check({"dropout gqa", shape_case(DType::bf16, 1, 4, 2, 66, 80, 48)
                            .with_causal(Causal::top_left)
                            .with_dropout(0.3f)
                            .with_mask(DType::bf16, MaskShape::full, false)});
}

TEST(EmulatedSm80Backward, Stride0MaskF16) {
  check({"stride0 mask", shape_case(DType::f16, 2, 2, 2, 40, 50, 80).with_mask(DType::f16, MaskShape::stride0_view, false)});
}

TEST(EmulatedSm80Backward, HeadDim1024) { check({"d1024", shape_case(DType::bf16, 1, 1, 1, 20, 70, 1024)}); }

TEST(EmulatedSm80Backward, PaddedRowsScale) {
  check({"padded", shape_case(DType::bf16, 1, 1, 1, 64, 64, 64).with_row_pad(8).with_scale(0.3f)});
}

}  // namespace
}  // namespace ffpa::testing
