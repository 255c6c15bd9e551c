// The sm80 split-D forward kernel (kernels/sm80_split_d) on the CPU emulator
// (sm80_emulator.hpp) against the CPU reference: every tile shape of its
// routing table (tiles.hpp: out_cols 64 to 1024, warps_n 1 to 8, value
// splits), masks, causal alignments, dropout, GQA, LSE, fp16 accumulation,
// D_qk != D_v. The same kernel source the GPU runs, compiled as host code;
// tests/gpu/test_gpu_forward.cpp checks the GPU.
#include "emulation/device_shim.hpp"  // first: the CUDA built-ins as the emulator's
#include "emulation/forward_check.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/sm80_split_d/kernel.cuh"
#include "reference/cpu_attention.hpp"
#include "support/error_metrics.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::detail::sm80_split_d {
// The kernel's dynamic shared memory (an extern array on the GPU).
alignas(128) unsigned char cta_smem[232448];
}  // namespace ffpa::detail::sm80_split_d

namespace ffpa::testing {
namespace {

namespace split_d = detail::sm80_split_d;

template <typename Element, bool kAccumF16, int kOutCols>
using TileTraits = split_d::Traits<Element, kAccumF16, kOutCols, split_d::tile_shape(kOutCols).warp_rows,
                                   split_d::tile_shape(kOutCols).warps_m, split_d::tile_shape(kOutCols).warps_n,
                                   split_d::tile_shape(kOutCols).block_n, split_d::tile_shape(kOutCols).pv_keys,
                                   split_d::tile_shape(kOutCols).stages>;

// The kernel on every CTA; with wanted_splits > 1 split-KV: the partial rows,
// then the combine's arithmetic on the host (split_kv.hpp's merge and weights,
// what kernels/split_kv/combine.cu runs) into o and lse.
template <class Traits>
void run_emulated(const detail::AttentionProblem& problem, int value_splits, int wanted_splits) {
  static_assert(Traits::kSmemBytes <= sizeof split_d::cta_smem);
  split_d::SplitLaunch split;
  const detail::KvSplits splits = detail::kv_splits_of(problem.seq_kv, wanted_splits, Traits::kBlockN);
  const int64_t rows = problem.batch * problem.heads_q * problem.seq_q, dv = problem.dv();
  std::vector<float> partial_o;
  std::vector<detail::RowSoftmaxState> states;
  if (splits.count > 1) {
    partial_o.assign(static_cast<size_t>(splits.count * rows * dv), std::nanf(""));
    states.assign(static_cast<size_t>(splits.count * rows), detail::RowSoftmaxState{std::nanf(""), std::nanf("")});
    split = {splits.count, splits.keys_per_split, partial_o.data(), states.data()};
  }
  const split_d::Args args = split_d::forward_args<Traits>(problem, value_splits, split);
  for (int64_t cta = 0; cta < split_d::forward_ctas<Traits>(args); ++cta)
    emulation::run_cta({static_cast<unsigned>(cta), 0, 0}, Traits::kThreads, split_d::cta_smem,
                       [&] { split_d::forward_kernel<Traits>(args); });
  if (splits.count > 1) combine_on_host(problem, partial_o, states, splits.count);
}

// The kernel of instance kOutCols (value splits as routing would give them)
// for the case's dtype and accumulation.
template <int kOutCols>
std::function<void(const detail::AttentionProblem&)> runner(const ForwardCase& c, int wanted_splits) {
  return [c, wanted_splits](const detail::AttentionProblem& problem) {
    const int64_t dv = problem.dv();
    const int value_splits = static_cast<int>((dv + kOutCols - 1) / kOutCols);
    if (c.dtype == DType::bf16) {
      run_emulated<TileTraits<__nv_bfloat16, false, kOutCols>>(problem, value_splits, wanted_splits);
    } else if (c.accumulation == Accumulation::f16) {
      run_emulated<TileTraits<__half, true, kOutCols>>(problem, value_splits, wanted_splits);
    } else {
      run_emulated<TileTraits<__half, false, kOutCols>>(problem, value_splits, wanted_splits);
    }
  };
}

// Runs the kernel on the case and compares o and lse with the fp64 reference.
template <int kOutCols>
void check(const std::string& name, const ForwardCase& c, int64_t value_dim = 0, int wanted_splits = 1) {
  check_forward(name, c, value_dim, runner<kOutCols>(c, wanted_splits));
}

TEST(EmulatedSm80Forward, Out64OneWarpColumn) { check<64>("out64", shape_case(DType::bf16, 1, 2, 1, 70, 77, 64)); }

TEST(EmulatedSm80Forward, Out128CausalF16Accumulation) {
  check<128>("out128 f16acc", shape_case(DType::f16, 1, 2, 2, 65, 90, 120)
                                  .with_causal(Causal::bottom_right)
                                  .with_f16_accumulation());
}

TEST(EmulatedSm80Forward, Out384TwoWarpColumnsMaskDropout) {
  check<384>("out384", shape_case(DType::bf16, 2, 2, 2, 40, 150, 320)
                           .with_mask(DType::f32, MaskShape::batch_rows, true)
                           .with_dropout(0.2f));
}

TEST(EmulatedSm80Forward, Out512ValueSplitsGqa) {
  check<512>("out512 split", shape_case(DType::bf16, 1, 4, 2, 33, 140, 96).with_causal(Causal::top_left), 1000);
}

TEST(EmulatedSm80Forward, Out1024EightWarpColumnsBnhd) {
  check<1024>("out1024", shape_case(DType::f16, 1, 1, 1, 40, 300, 1024).with_layout(Layout::bnhd));
}

// GQA packing (decode): a tile holds the same rows of several query heads.
TEST(EmulatedSm80Forward, PackedHeadsDecodeMaskDropout) {
  check<128>("packed decode", shape_case(DType::bf16, 2, 16, 2, 1, 300, 128)
                                  .with_mask(DType::f32, MaskShape::full, false)
                                  .with_dropout(0.2f));
  check<64>("packed speculative", shape_case(DType::f16, 1, 32, 2, 4, 130, 64).with_causal(Causal::bottom_right));
}

TEST(EmulatedSm80Forward, MlaDecodePacked) {
  check<512>("mla decode 576/512", shape_case(DType::bf16, 2, 16, 1, 1, 200, 576), 512);
}

// Split-KV: each split's partial rows combined as the combine kernel does.
TEST(EmulatedSm80Forward, SplitKvDecodeAndShortPrefill) {
  check<128>("split decode gqa", shape_case(DType::bf16, 1, 8, 2, 1, 700, 128).with_dropout(0.1f), 0, 4);
  check<64>("split causal mask", shape_case(DType::f16, 1, 2, 2, 40, 500, 64)
                                     .with_causal(Causal::bottom_right)
                                     .with_mask(DType::boolean, MaskShape::batch_keys, false).with_f16_accumulation(),
            0, 3);
  check<512>("split mla decode", shape_case(DType::bf16, 1, 16, 1, 1, 600, 576), 512, 5);
}

// NaN inputs (forward_check.hpp's check_forward_nans): q, k, v and mask NaNs
// reach the rows they touch, masking alone still empties rows to 0, the rest
// is bit-identical; through value splits, f16 accumulation and split-KV too.
TEST(EmulatedSm80Forward, NanInputsReachTheRowsTheyTouch) {
  ForwardCase c = shape_case(DType::bf16, 1, 2, 1, 70, 150, 128).with_causal(Causal::top_left);
  check_forward_nans("nan causal", c, 0, runner<128>(c, 1));
  c = shape_case(DType::f16, 2, 2, 2, 40, 140, 96).with_mask(DType::f32, MaskShape::batch_rows, true).with_dropout(0.2f);
  check_forward_nans("nan mask dropout", c, 0, runner<128>(c, 1));
  c = shape_case(DType::f16, 1, 2, 2, 65, 90, 120).with_causal(Causal::bottom_right).with_f16_accumulation();
  check_forward_nans("nan f16acc", c, 0, runner<128>(c, 1));
  c = shape_case(DType::bf16, 1, 4, 2, 33, 140, 96).with_causal(Causal::top_left);
  check_forward_nans("nan value splits", c, 1000, runner<512>(c, 1));
  c = shape_case(DType::bf16, 1, 8, 2, 1, 700, 128).with_mask(DType::bf16, MaskShape::full, true);
  check_forward_nans("nan split-KV decode", c, 0, runner<128>(c, 4));
  c = shape_case(DType::f16, 1, 2, 2, 40, 500, 64).with_causal(Causal::bottom_right);
  check_forward_nans("nan split-KV causal", c, 0, runner<64>(c, 3));
}

TEST(EmulatedSm80Forward, NarrowValueDim) {
  check<128>("dv 128 < d 576", shape_case(DType::bf16, 1, 2, 1, 64, 100, 576).with_causal(Causal::bottom_right), 128);
}

// Random small cases (FFPA_EMULATION_CASES of them, 8 by default; seed
// FFPA_TEST_SEED): every feature drawn at once (split-KV included), the
// instance the smallest of 64 / 128 / 256 columns that holds Dv.
TEST(EmulatedSm80Forward, RandomCases) {
  const char* count_text = std::getenv("FFPA_EMULATION_CASES");
  const char* seed_text = std::getenv("FFPA_TEST_SEED");
  const int count = count_text ? std::atoi(count_text) : 8;
  std::mt19937_64 rng(seed_text ? std::strtoull(seed_text, nullptr, 0) : 20261201);
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  for (int n = 0; n < count; ++n) {
    const int heads_kv = pick(1, 2), group = 1 << pick(0, 3);
    const bool decode = pick(0, 3) == 0;
    ForwardCase c = shape_case(pick(0, 1) ? DType::bf16 : DType::f16, pick(1, 2), heads_kv * group, heads_kv,
                               decode ? pick(1, 4) : pick(1, 90), pick(1, 150), 8 * pick(1, 32));
    const int64_t dv = pick(0, 3) == 0 ? 8 * pick(1, 32) : c.head_dim;
    c.causal = static_cast<Causal>(pick(0, 2));
    if (pick(0, 2) == 0) {
      const DType mask_dtypes[] = {DType::boolean, DType::f32, c.dtype};
      const MaskShape shapes[] = {MaskShape::keys, MaskShape::batch_keys, MaskShape::batch_rows, MaskShape::full,
                                  MaskShape::stride0_view};
      c = c.with_mask(mask_dtypes[pick(0, 2)], shapes[pick(0, 4)], pick(0, 3) == 0);
    }
    if (pick(0, 3) == 0) c.dropout_p = 0.2f;
    if (pick(0, 2) == 0) c.layout = Layout::bnhd;
    if (pick(0, 3) == 0) c.row_pad = 8;
    if (c.dtype == DType::f16 && pick(0, 3) == 0) c.accumulation = Accumulation::f16;
    const std::string name = "random " + std::to_string(n) + " " + case_name(c) + " Dv" + std::to_string(dv);
    const int wanted_splits = pick(1, 3);  // split-KV where the keys make whole blocks of more than one
    if (dv <= 64) {
      check<64>(name, c, dv, wanted_splits);
    } else if (dv <= 128) {
      check<128>(name, c, dv, wanted_splits);
    } else {
      check<256>(name, c, dv, wanted_splits);
    }
  }
}

}  // namespace
}  // namespace ffpa::testing
