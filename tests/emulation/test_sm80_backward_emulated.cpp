// The portable backward kernels (kernels/sm80_backward) run on the CPU
// emulator (sm80_emulator.hpp) against the CPU reference's gradients in
// double: their fragment layouts, ring, indexing, masking, dropout and
// epilogue, on small odd shapes (the emulation runs a CTA's 256 threads as
// fibers: seconds a case); and on sequence batches (packed training: packed
// and batched sequences, empty ones, windows, sinks and their gradient, GQA,
// D_qk != D_v; the plans computed on the host, kernels/serving/plan.hpp),
// where rows of no sequence must stay NaN and their NaN d_o must not leak.
// The same kernel source the GPU runs, compiled as host code;
// tests/gpu/test_gpu_backward.cpp checks the GPU.
#include "emulation/device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/backward_case.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm80_backward/arguments.cuh"
#include "kernels/sm80_backward/kernels.cuh"
#include "support/serving_backward.hpp"

namespace ffpa::detail::sm80_backward {
// The kernels' dynamic shared memory (an extern array on the GPU).
alignas(128) unsigned char backward_smem[Traits<__nv_bfloat16, kSliceCols>::kSmemBytes];
}  // namespace ffpa::detail::sm80_backward

namespace ffpa::testing {
namespace {

using detail::BackwardProblem;
namespace bwd = detail::sm80_backward;

// Runs the preprocess and both kernels of a validated host problem, CTA by
// CTA (a sequence batch: its plans on the host first, the sinks' gradient
// after the preprocess), every CTA of the launches' bounds.
template <class Element>
void run_emulated(const BackwardProblem& unplanned) {
  using T = bwd::Traits<Element, bwd::kSliceCols>;
  static_assert(T::kSmemBytes <= sizeof bwd::backward_smem);
  const bwd::WorkspaceLayout layout = bwd::workspace_layout(unplanned);
  std::vector<uint64_t> workspace((layout.bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t), 0);
  auto* const base = reinterpret_cast<unsigned char*>(workspace.data());
  const BackwardProblem b = bwd::planned_problem(unplanned, base);
  if (b.forward.sequences.active) {
    detail::serving::plan_on_host(b.forward, bwd::query_tiling(), base + layout.query_plan);
    detail::serving::plan_on_host(b.forward, bwd::key_tiling(), base + layout.key_plan);
  }
  float* const delta = reinterpret_cast<float*>(base + layout.delta);
  float* const d_mask_sum = reinterpret_cast<float*>(base + layout.d_mask_sum);
  const bwd::PreprocessArgs preprocess = bwd::preprocess_args(b, delta);
  for (int64_t block = 0; block < bwd::preprocess_blocks(b); ++block)
    emulation::run_cta({static_cast<unsigned>(block), 0, 0}, 32 * bwd::kPreprocessRows, nullptr,
                       [&] { bwd::preprocess_kernel<Element>(preprocess); });
  if (b.d_sinks != nullptr) {
    const bwd::SinkGradientArgs sinks = bwd::sink_gradient_args(b, delta);
    for (int64_t head = 0; head < b.forward.heads_q; ++head)
      emulation::run_cta({static_cast<unsigned>(head), 0, 0}, bwd::kSinkThreads, nullptr,
                         [&] { bwd::sink_gradient_kernel<bwd::kSinkThreads>(sinks); });
  }
  const bwd::Args args = bwd::kernel_args(b, delta, d_mask_sum);
  for (int64_t cta = 0; cta < bwd::dkdv_ctas<T>(b.forward); ++cta)
    emulation::run_cta({static_cast<unsigned>(cta), 0, 0}, T::kThreads, bwd::backward_smem,
                       [&] { bwd::dkdv_kernel<T>(args); });
  for (int64_t cta = 0; cta < bwd::dq_ctas<T>(b.forward); ++cta)
    emulation::run_cta({static_cast<unsigned>(cta), 0, 0}, T::kThreads, bwd::backward_smem,
                       [&] { bwd::dq_kernel<T>(args); });
  if (b.d_mask == nullptr) return;
  const bwd::MaskGradientArgs mask_args = bwd::mask_gradient_args(b, d_mask_sum);
  for (int64_t block = 0; block < (mask_args.elements + 255) / 256; ++block) {
    emulation::run_cta({static_cast<unsigned>(block), 0, 0}, 256, nullptr, [&] {
      switch (b.forward.mask_kind) {
        case detail::MaskKind::additive_f16: bwd::mask_gradient_kernel<__half>(mask_args); break;
        case detail::MaskKind::additive_bf16: bwd::mask_gradient_kernel<__nv_bfloat16>(mask_args); break;
        default: bwd::mask_gradient_kernel<float>(mask_args); break;
      }
    });
  }
}

// Emulation keeps fp32 exactly (exp2 without the hardware's 2-ulp error): the
// errors are the rounding of the 16-bit outputs and of P and dS in the
// products (measured 2.4e-3 bf16, 3e-4 f16).
void check(const BackwardCase& bc) {
  const uint64_t seed = splitmix64(std::hash<std::string>{}(bc.name));
  check_backward(bc, seed, "emulated bwd", 5e-3, 1e-3, [](BackwardTensors&, const BackwardProblem& problem) {
    if (problem.forward.dtype == DType::bf16) {
      run_emulated<__nv_bfloat16>(problem);
    } else {
      run_emulated<__half>(problem);
    }
  });
}

// NaN inputs (backward_case.hpp's check_backward_nans): they reach the
// gradients of the rows and keys they touch; the rest is bit-identical.
TEST(EmulatedSm80Backward, NanInputsReachTheGradientsTheyTouch) {
  for (const BackwardCase& bc :
       {BackwardCase{"nan gqa", shape_case(DType::bf16, 1, 4, 2, 70, 75, 72)},
        BackwardCase{"nan causal mask", shape_case(DType::f16, 2, 2, 1, 65, 140, 64)
                                            .with_causal(Causal::top_left)
                                            .with_mask(DType::f32, MaskShape::batch_rows, true)}}) {
    check_backward_nans(bc, splitmix64(std::hash<std::string>{}(bc.name)), [](BackwardTensors&, const BackwardProblem& problem) {
      if (problem.forward.dtype == DType::bf16) {
        run_emulated<__nv_bfloat16>(problem);
      } else {
        run_emulated<__half>(problem);
      }
    });
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

TEST(EmulatedSm80Backward, MaskDropoutD200) {
  check({"mask dropout d200", shape_case(DType::bf16, 1, 2, 1, 40, 70, 200)
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

// Slices of 256 columns: dK/dV over max(D, Dv), dQ over D, ragged last slices.
TEST(EmulatedSm80Backward, SlicesOfUnequalHeadDims) {
  check({"d200 dv520", shape_case(DType::bf16, 1, 2, 1, 30, 70, 200), 520});
  check({"d520 dv64", shape_case(DType::f16, 1, 2, 2, 30, 40, 520).with_causal(Causal::top_left), 64});
}

TEST(EmulatedSm80Backward, HeadDim1024) { check({"d1024", shape_case(DType::bf16, 1, 1, 1, 20, 70, 1024)}); }

TEST(EmulatedSm80Backward, MaskGradientsOfEveryBroadcast) {
  for (MaskShape shape : {MaskShape::full, MaskShape::batch_rows, MaskShape::batch_keys, MaskShape::keys}) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      const ForwardCase c = shape_case(DType::bf16, 2, 2, 1, 40, 70, 48).with_causal(Causal::bottom_right).with_mask(
          dtype, shape, false);
      BackwardCase bc{"d_mask " + std::to_string(static_cast<int>(shape)) + (dtype == DType::f32 ? " f32" : " bf16"), c};
      bc.with_d_mask = true;
      check(bc);
    }
  }
}

TEST(EmulatedSm80Backward, PaddedRowsScale) {
  check({"padded", shape_case(DType::bf16, 1, 1, 1, 64, 64, 64).with_row_pad(8).with_scale(0.3f)});
}

// Random small cases (FFPA_EMULATION_CASES of them, 6 by default; seed
// FFPA_TEST_SEED): every feature drawn at once, d_lse and d_mask included.
TEST(EmulatedSm80Backward, RandomCases) {
  const char* count_text = std::getenv("FFPA_EMULATION_CASES");
  const char* seed_text = std::getenv("FFPA_TEST_SEED");
  const int count = count_text ? std::atoi(count_text) : 6;
  std::mt19937_64 rng(seed_text ? std::strtoull(seed_text, nullptr, 0) : 20261202);
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  for (int n = 0; n < count; ++n) {
    const int heads_kv = pick(1, 2), group = 1 << pick(0, 2);
    // At least 8 keys: with one key every dS is 0 in exact arithmetic and the
    // fp32 delta's rounding is all that remains (the reference's relative
    // error then measures noise against noise).
    ForwardCase c = shape_case(pick(0, 1) ? DType::bf16 : DType::f16, pick(1, 2), heads_kv * group, heads_kv,
                               pick(1, 80), pick(8, 100), 8 * pick(1, 40));
    BackwardCase bc{"", c};
    bc.require_nonzero = false;
    bc.value_dim = pick(0, 3) == 0 ? 8 * pick(1, 40) : 0;
    bc.shape.causal = static_cast<Causal>(pick(0, 2));
    // Top-left causal over one or two rows leaves each row one key (the degenerate case above).
    if (bc.shape.causal == Causal::top_left && bc.shape.seq_q <= 2) bc.shape.causal = Causal::bottom_right;
    if (pick(0, 2) == 0) {
      const MaskShape shapes[] = {MaskShape::keys, MaskShape::batch_keys, MaskShape::batch_rows, MaskShape::full};
      const bool additive = pick(0, 1) == 1;
      bc.shape = bc.shape.with_mask(additive ? (pick(0, 1) ? DType::f32 : c.dtype) : DType::boolean,
                                    shapes[pick(0, 3)], pick(0, 3) == 0);
      bc.with_d_mask = additive && pick(0, 1) == 1;
    }
    if (pick(0, 3) == 0) bc.shape.dropout_p = 0.2f;
    if (pick(0, 2) == 0) bc.shape.layout = Layout::bnhd;
    if (pick(0, 3) == 0) bc.shape.row_pad = 8;
    bc.with_d_lse = pick(0, 2) == 0;
    bc.name = "random " + std::to_string(n) + " " + case_name(bc.shape) + " Dv" + std::to_string(bc.value_dim) +
              (bc.with_d_lse ? " d_lse" : "") + (bc.with_d_mask ? " d_mask" : "");
    check(bc);
  }
}

// --- sequence batches ---------------------------------------------------------

void check_serving(const ServingCase& c, bool with_d_lse) {
  SCOPED_TRACE(c.describe());
  ServingBackward s;
  ASSERT_NO_FATAL_FAILURE(make_serving_backward(c, with_d_lse, c.sinks, &s));
  const ServingGradients want = serving_reference_gradients(s);
  BackwardProblem problem;
  {
    const Status status = detail::validate_backward(s.params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
  }
  if (c.dtype == DType::bf16) {
    run_emulated<__nv_bfloat16>(problem);
  } else {
    run_emulated<__half>(problem);
  }
  check_serving_gradients(s, want, c.dtype == DType::bf16 ? 5e-3 : 1e-3, "emulated bwd serving");
}

ServingCase serving_case(uint64_t seed, DType dtype, int64_t dim, int64_t value_dim) {
  ServingCase c;
  c.seed = seed;
  c.dtype = dtype;
  c.dim = dim, c.value_dim = value_dim;
  c.causal = Causal::bottom_right;
  return c;
}

// Sequences shorter and longer than a block, an empty one and one without
// keys, packed back to back: each block's rows past its sequence are the
// next sequence's in memory.
TEST(EmulatedSm80Backward, PackedSequences) {
  ServingCase c = serving_case(1, DType::bf16, 64, 64);
  c.seq_q = {70, 0, 5, 130, 9};
  c.seq_kv = {70, 9, 200, 130, 0};
  check_serving(c, true);
  c = serving_case(2, DType::f16, 40, 72);
  c.causal = Causal::none;
  c.heads_q = 6, c.heads_kv = 3;
  c.seq_q = {33, 64, 1};
  c.seq_kv = {17, 64, 80};
  c.seqused = true;  // keys past seqused_k: no gradient, not written
  check_serving(c, false);
}

TEST(EmulatedSm80Backward, SequencesWithWindowsAndSinks) {
  ServingCase c = serving_case(3, DType::bf16, 96, 96);
  c.seq_q = {100, 3, 66};
  c.seq_kv = {130, 70, 66};
  c.window_left = 40;
  c.sinks = true;
  check_serving(c, true);
  c = serving_case(4, DType::f16, 64, 64);
  c.causal = Causal::none;
  c.window_left = 20, c.window_right = 5;
  c.seq_q = {90, 50};
  c.seq_kv = {90, 150};
  check_serving(c, false);
}

TEST(EmulatedSm80Backward, BatchedSequencesTopLeftD520) {
  ServingCase c = serving_case(5, DType::bf16, 520, 136);
  c.packed_q = false;
  c.keys = KeyForm::batched;
  c.causal = Causal::top_left;
  c.heads_q = 2, c.heads_kv = 1;
  c.seq_q = {20, 20};
  c.seq_kv = {75, 3};
  c.sinks = true;
  check_serving(c, true);
}

}  // namespace
}  // namespace ffpa::testing

