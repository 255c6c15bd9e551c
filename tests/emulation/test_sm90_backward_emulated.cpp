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
#include "kernels/serving/plan.hpp"
#include "kernels/sm90_backward/arguments.hpp"
#include "kernels/sm90_backward/kernel.cuh"
#include "reference/element_io.hpp"
#include "support/serving_backward.hpp"

namespace ffpa::testing::emulated {
alignas(1024) unsigned char backward_cta_smem[2][232448];  // two for a cluster
}  // namespace ffpa::testing::emulated

namespace ffpa::testing {
namespace {

namespace bwd = detail::sm90_backward;
using emulation::sm90::TmaLanding;

// delta_i = dO_i . O_i - d_lse_i in fp32, as the preprocess kernel computes
// it, over every row of q's extent ([entries][Hq][rows]; rows of no sequence
// too, NaN there when their d_o is).
std::vector<float> host_delta(const detail::BackwardProblem& b) {
  const detail::AttentionProblem& p = b.forward;
  const detail::RowExtent x = detail::query_extent(p);
  std::vector<float> delta(static_cast<size_t>(x.entries * p.heads_q * x.rows));
  size_t e = 0;
  for (int64_t bi = 0; bi < x.entries; ++bi)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < x.rows; ++i, ++e) {
        float sum = 0.0f;
        for (int64_t c = 0; c < p.dv(); ++c) {
          const int64_t o = bi * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2] + c;
          const int64_t g = bi * b.d_o_stride[0] + h * b.d_o_stride[1] + i * b.d_o_stride[2] + c;
          sum += static_cast<float>(detail::load_element(p.dtype, b.d_o, g) * detail::load_element(p.dtype, p.o, o));
        }
        if (b.d_lse != nullptr)
          sum -= b.d_lse[bi * b.d_lse_stride[0] + h * b.d_lse_stride[1] + i * b.d_lse_stride[2]];
        delta[e] = sum;
      }
  return delta;
}

// A sequence batch's plans on the host, in `storage` (the problem points at them).
detail::BackwardProblem with_plans(const detail::BackwardProblem& b, std::vector<uint64_t>& storage) {
  if (!b.forward.sequences.active) return b;
  const int64_t bytes = detail::serving::plan_bytes(b.forward);
  const size_t words = static_cast<size_t>((bytes + 7) / 8);
  storage.assign(2 * words, 0);
  detail::BackwardProblem planned = b;
  planned.query_plan = storage.data();
  planned.key_plan = storage.data() + words;
  detail::serving::plan_on_host(b.forward, detail::sm80_backward::query_tiling(), storage.data());
  detail::serving::plan_on_host(b.forward, detail::sm80_backward::key_tiling(), storage.data() + words);
  return planned;
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
void run_all(const detail::BackwardProblem& unplanned, TmaLanding landing) {
  std::vector<uint64_t> plans;
  const detail::BackwardProblem b = with_plans(unplanned, plans);
  const std::vector<float> delta = host_delta(b);
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
    check_backward(bc, seed, label, 5e-3, 1e-3, [&](BackwardTensors&, const detail::BackwardProblem& b) {
      if (b.forward.dtype == DType::bf16) {
        run_all<__nv_bfloat16, kHeadDim>(b, landing);
      } else {
        run_all<__half, kHeadDim>(b, landing);
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
                      [&](BackwardTensors&, const detail::BackwardProblem& b) {
                        if (b.forward.dtype == DType::bf16) {
                          run_all<__nv_bfloat16, kHeadDim>(b, TmaLanding::at_wait);
                        } else {
                          run_all<__half, kHeadDim>(b, TmaLanding::at_wait);
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

// --- sequence batches (packed training) -----------------------------------------
// TMA loads a sequence's last, partial block from the tensor's next rows
// (another sequence's, or rows of no sequence, NaN in d_o here): the consumer
// clears them; the gradients' plain stores stop at the sequence's end.

template <int kHeadDim>
void check_serving(const ServingCase& c, bool with_d_lse) {
  for (TmaLanding landing : {TmaLanding::at_issue, TmaLanding::at_wait}) {
    SCOPED_TRACE(c.describe() + (landing == TmaLanding::at_issue ? " [tma at issue]" : " [tma at wait]"));
    ServingBackward s;
    ASSERT_NO_FATAL_FAILURE(make_serving_backward(c, with_d_lse, false, &s));
    const ServingGradients want = serving_reference_gradients(s);
    detail::BackwardProblem problem;
    {
      const Status status = detail::validate_backward(s.params, &problem);
      ASSERT_TRUE(status.ok()) << status.message;
    }
    if (c.dtype == DType::bf16) {
      run_all<__nv_bfloat16, kHeadDim>(problem, landing);
    } else {
      run_all<__half, kHeadDim>(problem, landing);
    }
    check_serving_gradients(s, want, c.dtype == DType::bf16 ? 5e-3 : 1e-3, "emulated sm90 bwd serving");
  }
}

ServingCase serving_case(uint64_t seed, DType dtype, int64_t dim, int64_t value_dim) {
  ServingCase c;
  c.seed = seed;
  c.dtype = dtype;
  c.dim = dim, c.value_dim = value_dim;
  c.causal = Causal::bottom_right;
  return c;
}

TEST(EmulatedSm90Backward, PackedSequencesGqa) {
  ServingCase c = serving_case(11, DType::bf16, 128, 128);
  c.seq_q = {70, 0, 5, 100, 3};
  c.seq_kv = {70, 9, 130, 100, 0};
  check_serving<256>(c, true);
}

TEST(EmulatedSm90Backward, SequencesWithWindowsSinksSeqused) {
  ServingCase c = serving_case(12, DType::f16, 64, 192);
  c.seq_q = {66, 40};
  c.seq_kv = {90, 40};
  c.window_left = 30, c.window_right = 2;
  c.sinks = true;
  c.seqused = true;
  check_serving<256>(c, false);
}

TEST(EmulatedSm90Backward, BatchedSequencesD512) {
  ServingCase c = serving_case(13, DType::bf16, 320, 512);
  c.packed_q = false;
  c.keys = KeyForm::batched;
  c.heads_q = 2, c.heads_kv = 1;
  c.seq_q = {30, 30};
  c.seq_kv = {65, 7};
  check_serving<512>(c, true);
}

TEST(EmulatedSm90Backward, ClusterPackedSequencesD1024) {
  ServingCase c = serving_case(14, DType::bf16, 1024, 1024);
  c.heads_q = 2, c.heads_kv = 1;
  c.seq_q = {70, 2};
  c.seq_kv = {75, 66};
  c.causal = Causal::top_left;
  check_serving<1024>(c, false);
}

}  // namespace
}  // namespace ffpa::testing
