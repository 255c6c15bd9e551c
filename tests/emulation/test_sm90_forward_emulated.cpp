// The sm90_wgmma forward kernel (16-bit; D > 512 in clusters of two) on the
// CPU emulator (sm90_emulator.hpp) against the fp64 reference: every CTA of
// the launch forward_launch plans, its tensor maps in the emulator's format,
// with TMA loads landing at issue and at the first wait (two runs). Causal
// alignments, masks (the mask-in-S variant too), dropout, GQA packing, LSE,
// split-KV (partial rows combined on the host), bnhd. The same kernel source
// the GPU runs, compiled as host code; tests/gpu/test_gpu_forward.cpp checks
// the GPU.
#include "emulation/sm90_device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "emulation/forward_check.hpp"
#include "emulation/sm90_tensor_maps.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/sm90_wgmma/arguments.hpp"
#include "kernels/sm90_wgmma/kernel.cuh"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::testing::emulated {
// Each emulated CTA's dynamic shared memory (the kernel reaches it through the
// ptx.cuh shim's cta_shared_memory()): two for a cluster.
alignas(1024) unsigned char cta_smem[2][232448];
}  // namespace ffpa::testing::emulated

namespace ffpa::testing {
namespace {

namespace sm90 = detail::sm90_wgmma;
using emulation::sm90::TmaLanding;

template <class Traits>
void run_traits(const detail::AttentionProblem& problem, sm90::TileLaunch tiles, int wanted_splits, TmaLanding landing) {
  static_assert(Traits::kSmemBytes <= sizeof emulated::cta_smem[0]);
  static_assert(Traits::kSplit <= 2, "clusters of up to two CTAs");
  const detail::KvSplits splits = detail::kv_splits_of(problem.seq_kv, wanted_splits, Traits::kBlockN);
  const int64_t rows = problem.batch * problem.heads_q * problem.seq_q;
  std::vector<float> partial_o;
  std::vector<detail::RowSoftmaxState> states;
  if (splits.count > 1) {
    partial_o.assign(static_cast<size_t>(splits.count * rows * problem.dv()), std::nanf(""));
    states.assign(static_cast<size_t>(splits.count * rows), detail::RowSoftmaxState{std::nanf(""), std::nanf("")});
    tiles.splits = splits.count;
    tiles.split_blocks = static_cast<int>(splits.keys_per_split / Traits::kBlockN);
    tiles.partial_o = partial_o.data();
    tiles.partial_states = states.data();
  }
  const sm90::ForwardLaunch launch = sm90::forward_launch<Traits>(problem, tiles);
  const std::array<sm90::TensorMapSpec, 4> specs = sm90::forward_map_specs<Traits>(problem, launch);
  CUtensorMap maps[4];
  for (int i = 0; i < 4; ++i) maps[i] = emulated_map(specs[static_cast<size_t>(i)]);
  unsigned char* const shared[2] = {emulated::cta_smem[0], emulated::cta_smem[1]};
  for (int64_t tile = 0; tile < launch.tile_count; ++tile) {  // a cluster of kSplit CTAs per tile
    emulation::sm90::run_cluster({static_cast<unsigned>(tile * Traits::kSplit), 0, 0}, Traits::kSplit, Traits::kThreads,
                                 shared, landing,
                                 [&] { sm90::forward_kernel<Traits>(launch.args, maps[0], maps[1], maps[2], maps[3]); });
  }
  if (splits.count > 1) combine_on_host(problem, partial_o, states, splits.count);
}

// The kernel of instance kHeadDim (the variant the launcher picks) on the case,
// `heads_per_tile` query heads of a GQA group packed per tile, V and O with
// `value_dim` columns (0: D).
template <int kHeadDim>
void check(const std::string& name, const ForwardCase& c, int heads_per_tile = 1, int wanted_splits = 1,
           int64_t value_dim = 0) {
  for (TmaLanding landing : {TmaLanding::at_issue, TmaLanding::at_wait}) {
    const std::string label = name + (landing == TmaLanding::at_issue ? " [tma at issue]" : " [tma at wait]");
    check_forward(label, c, value_dim, [&](const detail::AttentionProblem& problem) {
      sm90::TileLaunch tiles;
      tiles.heads_per_tile = heads_per_tile;
      auto run = [&](auto* traits) {
        run_traits<std::remove_pointer_t<decltype(traits)>>(problem, tiles, wanted_splits, landing);
      };
      if (c.dtype == DType::bf16) {
        sm90::with_instance_traits<kHeadDim, __nv_bfloat16>(problem, run);
      } else {
        sm90::with_instance_traits<kHeadDim, __half>(problem, run);
      }
    });
  }
}

// NaN inputs (forward_check.hpp's check_forward_nans) through one landing of
// TMA: plain, masked (mask-in-S), causal, a cluster above D 512, split-KV
// with GQA packing.
template <int kHeadDim>
void check_nans(const std::string& name, const ForwardCase& c, int heads_per_tile = 1, int wanted_splits = 1) {
  check_forward_nans(name, c, 0, [&](const detail::AttentionProblem& problem) {
    sm90::TileLaunch tiles;
    tiles.heads_per_tile = heads_per_tile;
    auto run = [&](auto* traits) {
      run_traits<std::remove_pointer_t<decltype(traits)>>(problem, tiles, wanted_splits, TmaLanding::at_wait);
    };
    if (c.dtype == DType::bf16) {
      sm90::with_instance_traits<kHeadDim, __nv_bfloat16>(problem, run);
    } else {
      sm90::with_instance_traits<kHeadDim, __half>(problem, run);
    }
  });
}

TEST(EmulatedSm90Forward, NanInputsReachTheRowsTheyTouch) {
  check_nans<256>("nan d128 causal", shape_case(DType::bf16, 1, 2, 2, 70, 200, 128).with_causal(Causal::top_left));
  check_nans<256>("nan d256 mask-in-s", shape_case(DType::f16, 1, 2, 1, 64, 256, 256)
                                            .with_mask(DType::bf16, MaskShape::batch_rows, true));
  check_nans<640>("nan d640 cluster causal", shape_case(DType::bf16, 1, 2, 1, 70, 200, 640)
                                                 .with_causal(Causal::bottom_right)
                                                 .with_mask(DType::f32, MaskShape::full, true));
  check_nans<512>("nan d512 packed split-KV", shape_case(DType::bf16, 1, 8, 2, 1, 400, 512), 4, 3);
}

TEST(EmulatedSm90Forward, D128Plain) { check<256>("d128", shape_case(DType::bf16, 1, 2, 2, 70, 200, 128)); }

TEST(EmulatedSm90Forward, D512CausalBottomRightF16) {
  check<512>("d512 causal", shape_case(DType::f16, 1, 1, 1, 100, 260, 512).with_causal(Causal::bottom_right));
}

TEST(EmulatedSm90Forward, D320MaskDropoutGqa) {
  check<320>("d320 mask dropout", shape_case(DType::bf16, 1, 4, 2, 65, 140, 320)
                                      .with_mask(DType::f32, MaskShape::batch_rows, true)
                                      .with_dropout(0.2f));
}

TEST(EmulatedSm90Forward, D256BoolMaskTopLeftBnhd) {
  check<256>("d256 bool mask", shape_case(DType::bf16, 2, 2, 1, 64, 129, 256)
                                   .with_causal(Causal::top_left)
                                   .with_mask(DType::boolean, MaskShape::batch_keys, true)
                                   .with_layout(Layout::bnhd));
}

// D > 512: a cluster of two CTAs per tile, each with half of D, the partial
// S exchanged through distributed shared memory.
TEST(EmulatedSm90Forward, ClusterD640CausalMask) {
  check<640>("d640 cluster", shape_case(DType::bf16, 1, 2, 1, 70, 200, 640)
                                 .with_causal(Causal::top_left)
                                 .with_mask(DType::bf16, MaskShape::batch_keys, false));
}

TEST(EmulatedSm90Forward, ClusterD1024DropoutF16) {
  check<1024>("d1024 cluster dropout", shape_case(DType::f16, 1, 1, 1, 64, 150, 1000).with_dropout(0.1f));
}

// D_qk != D_v: the instance of the wider head dim (routing.cpp's instance_width).
TEST(EmulatedSm90Forward, UnequalValueHeadDims) {
  check<640>("mla 576/512 causal", shape_case(DType::bf16, 1, 4, 1, 70, 150, 576).with_causal(Causal::top_left), 1, 1,
             512);
  check<256>("192/128 mask", shape_case(DType::f16, 1, 2, 2, 65, 100, 192).with_mask(DType::boolean, MaskShape::keys, false),
             1, 1, 128);
  check<1024>("64/1000 dropout split-KV", shape_case(DType::bf16, 1, 2, 1, 2, 600, 64).with_dropout(0.1f), 1, 3, 1000);
}

// The row-split kernel at instance kHeadDim in each of its schedules
// (row_split/traits.cuh's RowSchedule), whichever the build's instances use:
// kConsumers consumer warpgroups, the plain kernel (no mask, no softcap) or
// the full one.
template <int kHeadDim = 128, int kConsumers = 2, bool kPlain = false>
void check_row_schedules(const std::string& name, const ForwardCase& c, int heads_per_tile = 1, int wanted_splits = 1) {
  constexpr int kKeys = sm90::row_split_keys(kHeadDim, kConsumers);
  constexpr bool kFull = !kPlain;
  for (sm90::RowSchedule schedule : {sm90::RowSchedule::serial, sm90::RowSchedule::overlap, sm90::RowSchedule::ping_pong}) {
    const std::string label = name + " schedule " + std::to_string(static_cast<int>(schedule));
    check_forward(label, c, 0, [&](const detail::AttentionProblem& problem) {
      sm90::TileLaunch tiles;
      tiles.heads_per_tile = heads_per_tile;
      auto run = [&](auto element) {
        using Element = decltype(element);
        switch (schedule) {
          case sm90::RowSchedule::serial:
            return run_traits<sm90::RowSplitTraits<Element, kHeadDim, kConsumers, kKeys, sm90::RowSchedule::serial, kFull>>(
                problem, tiles, wanted_splits, TmaLanding::at_wait);
          case sm90::RowSchedule::overlap:
            return run_traits<sm90::RowSplitTraits<Element, kHeadDim, kConsumers, kKeys, sm90::RowSchedule::overlap, kFull>>(
                problem, tiles, wanted_splits, TmaLanding::at_wait);
          case sm90::RowSchedule::ping_pong:
            return run_traits<sm90::RowSplitTraits<Element, kHeadDim, kConsumers, kKeys, sm90::RowSchedule::ping_pong, kFull>>(
                problem, tiles, wanted_splits, TmaLanding::at_wait);
        }
      };
      if (c.dtype == DType::bf16) {
        run(__nv_bfloat16{});
      } else {
        run(__half{});
      }
    });
  }
}

// D 256's row split (KV blocks of 80 keys) in each schedule, and as instance
// 256's kernel (GQA packing, split-KV, softcap-free NaN rows); its dropout
// runs the column split.
TEST(EmulatedSm90Forward, RowSplitD256) {
  check_row_schedules<256>("rows d256 causal", shape_case(DType::bf16, 1, 2, 1, 150, 230, 256).with_causal(Causal::top_left));
  check_row_schedules<256>("rows d192 mask split-KV", shape_case(DType::f16, 1, 2, 2, 70, 500, 192)
                                                               .with_mask(DType::bf16, MaskShape::batch_keys, false), 1, 3);
  check<256>("rows d256 packed gqa4 split-KV", shape_case(DType::bf16, 1, 8, 2, 30, 410, 256), 4, 3);
  check<256>("rows d200 bnhd", shape_case(DType::f16, 2, 2, 1, 129, 161, 200).with_layout(Layout::bnhd));
  check_nans<256>("nan rows d256", shape_case(DType::bf16, 1, 2, 2, 70, 200, 256).with_causal(Causal::bottom_right));
  check<256>("d256 dropout", shape_case(DType::bf16, 1, 2, 1, 70, 200, 256).with_dropout(0.2f));
}

TEST(EmulatedSm90Forward, RowSplitSchedules) {
  check_row_schedules("rows one block", shape_case(DType::bf16, 1, 2, 1, 100, 90, 128));
  check_row_schedules("rows causal", shape_case(DType::f16, 1, 2, 2, 190, 400, 128).with_causal(Causal::bottom_right));
  check_row_schedules("rows packed split-KV mask", shape_case(DType::bf16, 1, 4, 1, 30, 700, 128)
                                                        .with_mask(DType::f32, MaskShape::batch_rows, true), 4, 2);
}

// The row-split instances (D <= 128, row_split/): 128-row tiles, each
// consumer warpgroup 64 rows with all of S and O, P from S's registers.
TEST(EmulatedSm90Forward, RowSplitD128) {
  check<128>("rows d128 odd", shape_case(DType::bf16, 2, 2, 1, 200, 333, 128));
  check<128>("rows d128 causal top-left f16", shape_case(DType::f16, 1, 2, 2, 190, 260, 128).with_causal(Causal::top_left));
  check<128>("rows d128 causal bottom-right", shape_case(DType::bf16, 1, 1, 1, 70, 300, 128).with_causal(Causal::bottom_right));
  check<128>("rows d128 mask empty rows bnhd", shape_case(DType::bf16, 1, 2, 1, 129, 140, 128)
                                                  .with_mask(DType::f32, MaskShape::batch_rows, true)
                                                  .with_layout(Layout::bnhd));
  check<128>("rows d96 bool keys", shape_case(DType::f16, 2, 1, 1, 64, 129, 96).with_mask(DType::boolean, MaskShape::keys, false));
}

TEST(EmulatedSm90Forward, RowSplitPackedSplitAndUnequalDims) {
  check<128>("rows packed decode gqa8", shape_case(DType::bf16, 1, 16, 2, 1, 300, 128), 8);
  check<128>("rows packed gqa2 split-KV", shape_case(DType::bf16, 1, 4, 2, 50, 700, 128), 2, 3);
  check<128>("rows 128/64 causal", shape_case(DType::bf16, 1, 2, 1, 100, 150, 128).with_causal(Causal::top_left), 1, 1, 64);
  check<128>("rows 64/128", shape_case(DType::f16, 1, 2, 2, 65, 100, 64), 1, 1, 128);
  check_nans<128>("nan rows d128 causal", shape_case(DType::bf16, 1, 2, 2, 70, 200, 128).with_causal(Causal::top_left));
}

// Three consumers (a 192-row tile) at D <= 64 for dense calls of plain
// scores whose rows pack no heads (family.hpp's row_split_consumers), in
// each schedule (ping-pong: the turns' round robin), and as instance 64's
// kernel.
TEST(EmulatedSm90Forward, RowSplitThreeConsumers) {
  check_row_schedules<64, 3, true>("rows3 d64 odd", shape_case(DType::bf16, 1, 2, 1, 200, 333, 64));
  check_row_schedules<64, 3, true>("rows3 d64 causal split-KV", shape_case(DType::f16, 1, 2, 2, 390, 700, 64)
                                                                    .with_causal(Causal::bottom_right), 1, 2);
  check<64>("rows3 d64 causal top-left gqa", shape_case(DType::bf16, 2, 4, 2, 250, 260, 64).with_causal(Causal::top_left));
  check<64>("rows3 d48 bnhd", shape_case(DType::f16, 1, 2, 1, 193, 129, 48).with_layout(Layout::bnhd));
  check<64>("rows3 64/32", shape_case(DType::bf16, 1, 2, 1, 100, 150, 64), 1, 1, 32);
  check_nans<64>("nan rows3 d64", shape_case(DType::bf16, 1, 2, 2, 200, 200, 64).with_causal(Causal::top_left));
}

// Instance 64: the row split over one 64-column chunk, and its column-split
// kernels (one chunk of S, O halves of 128 columns) for dropout.
TEST(EmulatedSm90Forward, Instance64) {
  check<64>("rows d64 causal gqa", shape_case(DType::bf16, 1, 4, 2, 150, 300, 64).with_causal(Causal::bottom_right));
  check<64>("rows d40 mask", shape_case(DType::f16, 2, 1, 1, 64, 129, 40).with_mask(DType::boolean, MaskShape::batch_keys, true));
  check<64>("rows d64 split-KV", shape_case(DType::bf16, 1, 2, 1, 40, 900, 64), 1, 2);
  check<64>("d64 dropout", shape_case(DType::bf16, 1, 2, 1, 70, 200, 64).with_dropout(0.2f));
}

// What the row split does not take runs the instance's column-split kernels.
TEST(EmulatedSm90Forward, ColumnSplitAtInstance128) {
  check<128>("d128 dropout mask", shape_case(DType::bf16, 1, 2, 1, 70, 200, 128)
                                      .with_mask(DType::f32, MaskShape::batch_rows, true)
                                      .with_dropout(0.2f));
  check<128>("d96 dropout causal", shape_case(DType::f16, 1, 2, 2, 65, 140, 96).with_causal(Causal::bottom_right).with_dropout(0.1f));
}

TEST(EmulatedSm90Forward, PackedDecodeAndSplitKv) {
  check<512>("d512 packed decode", shape_case(DType::bf16, 1, 8, 2, 1, 300, 512), 4);
  check<384>("d384 split-KV", shape_case(DType::bf16, 1, 2, 1, 3, 700, 384).with_causal(Causal::bottom_right), 1, 3);
}

}  // namespace
}  // namespace ffpa::testing
