// The sm90 backward kernels (kernels/sm90_backward: dK, dV and dQ) on the CPU
// emulator (sm90_emulator.hpp) against the fp64 reference's gradients: their
// rings of score and product parts, the W hand-off between the consumers,
// the transposed products, GQA's streams over the group's heads, masking,
// causal limits from both sides, dropout and the epilogues, with TMA landing
// at issue and at the first wait. delta is computed on the host (the portable
// preprocess's formula). The same kernel source the GPU runs, compiled as
// host code; tests/gpu/test_gpu_backward.cpp checks the GPU, where impl auto
// runs these kernels.
#include "emulation/sm90_device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "emulation/sm90_tensor_maps.hpp"
#include "gpu/backward_case.hpp"
#include "kernels/sm90_backward/arguments.hpp"
#include "kernels/sm90_backward/kernel.cuh"

namespace ffpa::testing::emulated {
alignas(1024) unsigned char backward_cta_smem[2][232448];  // two for a cluster
}  // namespace ffpa::testing::emulated

namespace ffpa::testing {
namespace {

namespace bwd = detail::sm90_backward;
using emulation::sm90::TmaLanding;

// delta_i = dO_i . O_i - d_lse_i in fp32, as the preprocess kernel computes it.
std::vector<float> host_delta(const BackwardTensors& t, const detail::BackwardProblem& b) {
  const detail::AttentionProblem& p = b.forward;
  std::vector<float> delta(static_cast<size_t>(p.batch * p.heads_q * p.seq_q));
  size_t e = 0;
  for (int64_t bi = 0; bi < p.batch; ++bi)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i, ++e) {
        float sum = 0.0f;
        for (int64_t c = 0; c < p.dv(); ++c)
          sum += static_cast<float>(element_as_double(t.d_o.view, {bi, h, i, c}) *
                                    element_as_double(t.o.view, {bi, h, i, c}));
        if (b.d_lse != nullptr) sum -= static_cast<float>(element_as_double(t.d_lse.view, {bi, h, i, 0}));
        delta[e] = sum;
      }
  return delta;
}

template <class Traits>
void run_role(const detail::BackwardProblem& b, const float* delta, TmaLanding landing) {
  static_assert(Traits::kSmemBytes <= sizeof emulated::backward_cta_smem[0]);
  const bwd::Launch launch = bwd::backward_launch(b, Traits::kRole, delta, nullptr);
  CUtensorMap maps[4];
  for (int i = 0; i < 4; ++i) maps[i] = emulated_map(launch.maps[static_cast<size_t>(i)], 64, 1);
  unsigned char* const shared[2] = {emulated::backward_cta_smem[0], emulated::backward_cta_smem[1]};
  for (int64_t block = 0; block < launch.ctas; ++block)  // a cluster of kSplit CTAs per stationary block
    emulation::sm90::run_cluster({static_cast<unsigned>(block * Traits::kSplit), 0, 0}, Traits::kSplit,
                                 Traits::kThreads, shared, landing,
                                 [&] { bwd::backward_kernel<Traits>(launch.args, maps[0], maps[1], maps[2], maps[3]); });
}

template <class Element, int kHeadDim>
void run_all(BackwardTensors& t, const detail::BackwardProblem& b, TmaLanding landing) {
  const std::vector<float> delta = host_delta(t, b);
  run_role<bwd::Traits<Element, kHeadDim, bwd::Role::dk>>(b, delta.data(), landing);
  run_role<bwd::Traits<Element, kHeadDim, bwd::Role::dv>>(b, delta.data(), landing);
  run_role<bwd::Traits<Element, kHeadDim, bwd::Role::dq>>(b, delta.data(), landing);
}

// The three kernels of instance kHeadDim.
template <int kHeadDim>
void check(const BackwardCase& bc) {
  for (TmaLanding landing : {TmaLanding::at_issue, TmaLanding::at_wait}) {
    const char* label = landing == TmaLanding::at_issue ? "emulated sm90 bwd [tma at issue]"
                                                        : "emulated sm90 bwd [tma at wait]";
    const uint64_t seed = splitmix64(std::hash<std::string>{}(bc.name));
    check_backward(bc, seed, label, 5e-3, 1e-3, [&](BackwardTensors& t, const detail::BackwardProblem& b) {
      if (b.forward.dtype == DType::bf16) {
        run_all<__nv_bfloat16, kHeadDim>(t, b, landing);
      } else {
        run_all<__half, kHeadDim>(t, b, landing);
      }
    });
  }
}

// NaN inputs (backward_case.hpp's check_backward_nans): they reach the
// gradients of the rows and keys they touch; the rest is bit-identical. One
// TMA landing; a cluster above D 512.
template <int kHeadDim>
void check_nans(const BackwardCase& bc) {
  check_backward_nans(bc, splitmix64(std::hash<std::string>{}(bc.name)),
                      [&](BackwardTensors& t, const detail::BackwardProblem& b) {
                        if (b.forward.dtype == DType::bf16) {
                          run_all<__nv_bfloat16, kHeadDim>(t, b, TmaLanding::at_wait);
                        } else {
                          run_all<__half, kHeadDim>(t, b, TmaLanding::at_wait);
                        }
                      });
}

TEST(EmulatedSm90Backward, NanInputsReachTheGradientsTheyTouch) {
  check_nans<256>({"nan gqa causal", shape_case(DType::bf16, 1, 4, 2, 70, 150, 128).with_causal(Causal::top_left)});
  check_nans<1024>({"nan cluster mask", shape_case(DType::f16, 1, 2, 1, 64, 130, 576)
                                            .with_mask(DType::bf16, MaskShape::batch_rows, true)});
}

TEST(EmulatedSm90Backward, MhaOddSizes) { check<256>({"mha", shape_case(DType::bf16, 1, 2, 2, 70, 150, 72)}); }

TEST(EmulatedSm90Backward, GqaCausalTopLeftF16D512) {
  check<512>({"gqa causal d512", shape_case(DType::f16, 1, 4, 2, 65, 200, 512).with_causal(Causal::top_left)});
}

TEST(EmulatedSm90Backward, CausalBottomRightRowsWithoutKeysBnhd) {
  check<256>({"bottom-right bnhd", shape_case(DType::bf16, 2, 1, 1, 80, 50, 128)
                                       .with_causal(Causal::bottom_right)
                                       .with_layout(Layout::bnhd)});
}

TEST(EmulatedSm90Backward, MaskDropoutD320) {
  check<512>({"mask dropout d320", shape_case(DType::bf16, 1, 2, 1, 40, 130, 320)
                                       .with_mask(DType::f32, MaskShape::batch_rows, true)
                                       .with_dropout(0.25f)});
}

TEST(EmulatedSm90Backward, UnequalValueDimLseGradient) {
  check<256>({"dv 136 d_lse", shape_case(DType::f16, 2, 2, 2, 33, 66, 64).with_mask(DType::boolean, MaskShape::batch_keys, true),
              136, true});
  check<512>({"d200 dv 392 mqa", shape_case(DType::bf16, 1, 4, 1, 70, 90, 200).with_causal(Causal::bottom_right), 392});
}

// D above 512: a cluster of two CTAs per stationary block, each with half of
// the columns, adding each other's partial S and dP.
TEST(EmulatedSm90Backward, ClusterD1024GqaCausalDropout) {
  check<1024>({"d1024 cluster gqa causal dropout", shape_case(DType::bf16, 1, 4, 2, 70, 130, 1024)
                                                       .with_causal(Causal::top_left)
                                                       .with_dropout(0.2f)});
}

TEST(EmulatedSm90Backward, ClusterMla576512MaskF16) {
  check<1024>({"mla 576/512 cluster mask", shape_case(DType::f16, 1, 4, 1, 65, 100, 576)
                                               .with_mask(DType::f32, MaskShape::batch_rows, true)
                                               .with_causal(Causal::bottom_right),
               512});
}

// Gradient halves of three boxes: stages of three (the 384 and 768 instances).
TEST(EmulatedSm90Backward, ThreeBoxHalves) {
  check<384>({"d320 instance 384 gqa", shape_case(DType::bf16, 1, 4, 2, 70, 100, 320).with_causal(Causal::top_left)});
  check<768>({"d704 cluster bnhd dropout", shape_case(DType::f16, 2, 2, 1, 40, 90, 704)
                                                .with_layout(Layout::bnhd)
                                                .with_dropout(0.1f)});
}

TEST(EmulatedSm90Backward, PaddedRowsScale) {
  check<256>({"padded", shape_case(DType::bf16, 1, 1, 1, 64, 64, 64).with_row_pad(8).with_scale(0.3f)});
}

}  // namespace
}  // namespace ffpa::testing
