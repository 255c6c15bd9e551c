// The sm90_wgmma kernel on serving calls (docs/serving.md), on the CPU
// emulator, against the fp64 oracle of support/serving_inputs.hpp: packed and
// batched queries over packed, batched and paged keys (TMA boxes of a page:
// page sizes 64 to 256; gathered by the producer warpgroup's cp.async: page
// sizes 1 to 56, their unused rows NaN; NHD / HND / stacked caches, V inside
// K's rows, D_qk != D_v), the
// plan computed on the host, windows, softcap, sinks, GQA-packed decode, a
// sequence's last partial row block stored without TMA (rows of no sequence
// stay NaN), a cluster of two CTAs (D > 512), mixed batches in two passes
// (the short sequences GQA-packed and split, then the rest: plan_tiles's
// passes, each its own plan and launch, as the host runs them). TMA lands at
// issue and at the first wait (two runs).
#include "emulation/sm90_device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "emulation/sequence_combine.hpp"
#include "emulation/sm90_tensor_maps.hpp"
#include "host/validate.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm90_wgmma/arguments.hpp"
#include "kernels/sm90_wgmma/kernel.cuh"
#include "kernels/sm90_wgmma/tensor_map.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/split_kv.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa::testing::emulated {
extern unsigned char cta_smem[2][232448];  // test_sm90_forward_emulated.cpp
}  // namespace ffpa::testing::emulated

namespace ffpa::testing {
namespace {

namespace sm90 = detail::sm90_wgmma;
using emulation::sm90::TmaLanding;

template <class Traits>
void run_traits(detail::AttentionProblem problem, sm90::TileLaunch tiles, TmaLanding landing) {
  const detail::SequenceTiling tiling = sm90::sequence_tiling({Traits::kBlockM, Traits::kBlockN}, tiles);
  std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(problem)));
  detail::serving::plan_on_host(problem, tiling, plan.data(), tiles.pass);
  ASSERT_EQ(detail::serving::plan_header(plan.data())->fault, 0);
  problem.sequences.plan = plan.data();
  std::vector<float> partial_o;
  std::vector<detail::RowSoftmaxState> states;
  if (tiles.split_slots > 0) {
    const int64_t rows = detail::serving::max_partial_rows(problem, tiling, tiles.pass);
    partial_o.assign(static_cast<size_t>(rows * problem.dv()), std::nanf(""));
    states.assign(static_cast<size_t>(rows), detail::RowSoftmaxState{std::nanf(""), std::nanf("")});
    tiles.partial_o = partial_o.data();
    tiles.partial_states = states.data();
  }
  const sm90::ForwardLaunch launch = sm90::forward_launch<Traits>(problem, tiles);
  const std::array<sm90::TensorMapSpec, 4> specs = sm90::forward_map_specs<Traits>(problem, launch);
  CUtensorMap maps[4];
  for (int i = 0; i < 4; ++i) maps[i] = emulated_map(specs[static_cast<size_t>(i)]);
  unsigned char* const shared[2] = {emulated::cta_smem[0], emulated::cta_smem[1]};
  for (int64_t tile = 0; tile < launch.tile_count; ++tile)
    emulation::sm90::run_cluster({static_cast<unsigned>(tile * Traits::kSplit), 0, 0}, Traits::kSplit, Traits::kThreads,
                                 shared, landing,
                                 [&] { sm90::forward_kernel<Traits>(launch.args, maps[0], maps[1], maps[2], maps[3]); });
  if (detail::serving::plan_header(plan.data())->split_blocks > 0)
    combine_sequences_on_host(problem, tiles.pass, partial_o, states);
}

// The passes of plan_tiles (the host's: dispatch.cpp), one after the other.
// split_slots > 0: the KV split on, each plan choosing for that many CTA
// slots (few, so that short batches split too). Returns the passes run.
template <int kHeadDim>
int run_instance(const detail::AttentionProblem& problem, TmaLanding landing, int split_slots) {
  const sm90::TilePlan plan = sm90::plan_tiles(problem, kHeadDim, split_slots * sm90::cluster_size(kHeadDim));
  std::vector<sm90::TileLaunch> passes;
  sm90::TileLaunch tiles;
  if (plan.short_rows > 0) {
    tiles.heads_per_tile = plan.short_heads_per_tile;
    tiles.split_slots = plan.short_split_slots;
    tiles.pass = {0, plan.short_rows};
    passes.push_back(tiles);
    tiles.pass = {plan.short_rows + 1, INT64_MAX};
  }
  tiles.heads_per_tile = plan.heads_per_tile;
  tiles.split_slots = plan.split_slots;
  passes.push_back(tiles);
  for (const sm90::TileLaunch& pass : passes) {
    auto run = [&](auto* traits) { run_traits<std::remove_pointer_t<decltype(traits)>>(problem, pass, landing); };
    if (problem.dtype == DType::bf16) {
      sm90::with_instance_traits<kHeadDim, __nv_bfloat16>(problem, run);
    } else {
      sm90::with_instance_traits<kHeadDim, __half>(problem, run);
    }
  }
  return static_cast<int>(passes.size());
}

// The rows of K and V no sequence uses: NaN. A paged cache's rows past each
// sequence's keys in its last page, packed keys' slots past seqused_k and
// the spare row after the last sequence, a batched cache's slots past
// seqused_k: the gather zero-fills them, TMA loads them whole and the
// consumers zero V's (a NaN there would reach P V as 0 x NaN).
void poison_unused_key_rows(const ServingInputs& in) {
  const ServingCase& c = in.c;
  const double nan = std::nan("");
  auto poison = [&](int64_t outer, int64_t row) {
    for (int64_t h = 0; h < c.heads_kv; ++h) {
      for (int64_t d = 0; d < c.dim; ++d) set_element(in.k, {outer, h, row, d}, nan);
      for (int64_t d = 0; d < c.value_dim; ++d) set_element(in.v, {outer, h, row, d}, nan);
    }
  };
  const int64_t inner = in.k.shape[2];
  for (int64_t b = 0; b < c.batch(); ++b) {
    if (c.keys == KeyForm::paged) {
      for (int64_t j = c.seq_kv[b]; j < static_cast<int64_t>(in.pages[b].size()) * c.page_size; ++j)
        poison(in.pages[b][j / c.page_size], j % c.page_size);
    } else if (c.keys == KeyForm::packed) {
      for (int64_t j = c.seq_kv[b]; j < in.capacity[b]; ++j) poison(0, in.k_begin[b] + j);
    } else {
      for (int64_t j = c.seq_kv[b]; j < inner; ++j) poison(b, j);
    }
  }
  if (c.keys == KeyForm::packed) poison(0, inner - 1);
}

// passes: how many passes the case must run in (0: any).
template <int kHeadDim>
void expect_matches_oracle(const ServingCase& c, int split_slots = 0, int passes = 0) {
  for (TmaLanding landing : {TmaLanding::at_issue, TmaLanding::at_wait}) {
    SCOPED_TRACE(c.describe() + (landing == TmaLanding::at_issue ? " [tma at issue]" : " [tma at wait]"));
    ServingInputs in = make_serving_inputs(c);
    poison_unused_key_rows(in);
    detail::AttentionProblem problem;
    const Status status = detail::validate_forward(in.params, &problem);
    ASSERT_TRUE(status.ok()) << status.message;
    const int ran = run_instance<kHeadDim>(problem, landing, split_slots);
    if (passes > 0) ASSERT_EQ(ran, passes);
    const double tolerance = c.dtype == DType::bf16 ? 2e-2 : 4e-3;
    std::vector<bool> written(static_cast<size_t>(in.o.tensor.shape[0] * in.o.tensor.shape[2]), false);
    for (int64_t b = 0; b < c.batch(); ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seq_q[b]; ++i) {
          const OracleRow want = serving_oracle_row(in, b, h, i);
          const int64_t batch = c.packed_q ? 0 : b, row = in.q_begin[b] + i;
          written[batch * in.o.tensor.shape[2] + row] = true;
          double scale = 1e-30;
          for (double x : want.out) scale = std::max(scale, std::abs(x));
          for (int64_t d = 0; d < c.value_dim; ++d)
            ASSERT_NEAR(element_as_double(in.o.tensor, {batch, h, row, d}), want.out[d],
                        tolerance * std::max(scale, 1.0))
                << "sequence " << b << " head " << h << " row " << i << " column " << d;
          const double lse = element_as_double(in.lse.tensor, {batch, h, row, 0});
          if (std::isinf(want.lse)) {
            EXPECT_TRUE(std::isinf(lse) && lse < 0) << "sequence " << b << " head " << h << " row " << i;
          } else {
            EXPECT_NEAR(lse, want.lse, 1e-3 * std::max(1.0, std::abs(want.lse)))
                << "sequence " << b << " head " << h << " row " << i;
          }
        }
    for (int64_t batch = 0; batch < in.o.tensor.shape[0]; ++batch)
      for (int64_t row = 0; row < in.o.tensor.shape[2]; ++row)
        if (!written[batch * in.o.tensor.shape[2] + row])
          for (int64_t h = 0; h < c.heads_q; ++h)
            ASSERT_TRUE(std::isnan(element_as_double(in.o.tensor, {batch, h, row, 0}))) << "row " << row << " written";
  }
}

// Whether the case runs the row-split kernel at instance head_dim.
bool runs_row_split(const ServingCase& c, int head_dim) {
  ServingInputs in = make_serving_inputs(c);
  detail::AttentionProblem problem;
  EXPECT_TRUE(detail::validate_forward(in.params, &problem).ok());
  return sm90::runs_row_split(problem, head_dim);
}

ServingCase base_case(uint64_t seed, int64_t dim) {
  ServingCase c;
  c.seed = seed;
  c.dtype = DType::bf16;
  c.dim = c.value_dim = dim;
  c.causal = Causal::bottom_right;
  c.heads_q = 2, c.heads_kv = 1;
  return c;
}

TEST(EmulatedSm90Serving, PackedSequencesPartialRowBlocks) {
  ServingCase c = base_case(1, 256);
  c.seq_q = {70, 0, 5, 64};
  c.seq_kv = {70, 9, 200, 130};
  expect_matches_oracle<256>(c);
}

// At instance 128 a sequence batch of packed or batched keys runs the
// row-split kernel (128-row tiles: partial row blocks in packed q stored
// row by row, the last V block cleared past the sequence's keys, whose
// slots past seqused_k hold NaN), a paged cache the column split
// (family.hpp's row_split_serves).
TEST(EmulatedSm90Serving, SequencesAtTheRowSplitInstance) {
  ServingCase c = base_case(2, 128);
  c.seq_q = {70, 1, 130};
  c.seq_kv = {70, 90, 140};
  ASSERT_TRUE(runs_row_split(c, 128));
  expect_matches_oracle<128>(c);
  ServingCase used = base_case(3, 128);
  used.seqused = true;
  used.heads_q = 4, used.heads_kv = 1;
  used.seq_q = {200, 0, 3, 129};
  used.seq_kv = {250, 40, 131, 129};
  used.window_left = 100;
  used.softcap = 15.0f;
  used.sinks = true;
  expect_matches_oracle<128>(used);
  expect_matches_oracle<128>(used, 6);  // split over 6 CTA slots
  ServingCase batched = base_case(4, 128);
  batched.packed_q = false;
  batched.keys = KeyForm::batched;
  batched.dtype = DType::f16;
  batched.value_dim = 64;
  batched.seq_q = {1, 1, 1};
  batched.seq_kv = {300, 129, 1};
  ASSERT_TRUE(runs_row_split(batched, 128));
  expect_matches_oracle<128>(batched, 8);  // decode, heads packed, split
  ServingCase mixed = base_case(5, 128);
  mixed.heads_q = 8, mixed.heads_kv = 1;
  mixed.seq_q = {1, 150, 3, 0};
  mixed.seq_kv = {400, 160, 90, 20};
  expect_matches_oracle<128>(mixed, 16, 2);  // the short rows' pass, then the chunk
  ServingCase paged = base_case(6, 128);
  paged.keys = KeyForm::paged;
  paged.page_size = 32;
  paged.seq_q = {9, 1};
  paged.seq_kv = {150, 300};
  ASSERT_FALSE(runs_row_split(paged, 128));
  expect_matches_oracle<128>(paged);
}

// Pages TMA boxes in key groups (Traits::kPageGroups; D = Dv = the instance's:
// the KV head folded into the chunks (NHD, stacked) or the pages (HND), or
// one KV head), and a box per chunk (D_qk != D_v), every cache layout.
TEST(EmulatedSm90Serving, PagedCachesByTmaBoxes) {
  const int64_t pages[] = {16, 32, 64, 80, 128, 256, 16};
  const CacheLayout layouts[] = {CacheLayout::nhd,     CacheLayout::hnd, CacheLayout::stacked, CacheLayout::hnd,
                                 CacheLayout::stacked, CacheLayout::nhd, CacheLayout::hnd};
  for (int i = 0; i < 7; ++i) {
    ServingCase c = base_case(10 + static_cast<uint64_t>(i), 256);
    c.keys = KeyForm::paged;
    c.page_size = pages[i];
    c.cache = layouts[i];
    if (i % 3 != 2) c.heads_q = 4, c.heads_kv = 2;
    if (i == 6) c.value_dim = 192;
    c.seq_q = {9, 1};
    c.seq_kv = {150 + 20 * i, 300 - 40 * i};
    c.dtype = i % 2 ? DType::f16 : DType::bf16;
    expect_matches_oracle<256>(c);
  }
}

// Page sizes TMA cannot box and small ones (gathers_pages): the producer
// warpgroup's cp.async, whole lines a warp, prefill and decode rows, odd
// lengths (keys past Nkv, NaN in the cache, zero-filled), every cache layout.
TEST(EmulatedSm90Serving, PagedCachesGathered) {
  const int64_t pages[] = {1, 3, 8, 7, 63};
  const CacheLayout layouts[] = {CacheLayout::nhd, CacheLayout::hnd, CacheLayout::stacked, CacheLayout::nhd,
                                 CacheLayout::hnd};
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(sm90::gathers_pages(pages[i]));
    ServingCase c = base_case(50 + static_cast<uint64_t>(i), 256);
    c.keys = KeyForm::paged;
    c.page_size = pages[i];
    c.cache = layouts[i];
    c.seq_q = {70, 1, 9};
    c.seq_kv = {131 + 20 * i, 257 - 50 * i, 9};
    c.dtype = i % 2 ? DType::f16 : DType::bf16;
    expect_matches_oracle<256>(c);
  }
}

// D_qk != D_v through the gather: K's columns past D and V's past Dv of the
// instance's boxes zero-filled (the narrower one of each pair).
TEST(EmulatedSm90Serving, GatheredValueDimOtherThanKeyDim) {
  ServingCase c = base_case(60, 192);
  c.value_dim = 128;
  c.keys = KeyForm::paged;
  c.page_size = 3;
  c.seq_q = {20, 1};
  c.seq_kv = {150, 77};
  expect_matches_oracle<256>(c);
  ServingCase wide = base_case(61, 128);
  wide.value_dim = 256;
  wide.keys = KeyForm::paged;
  wide.page_size = 5;
  wide.cache = CacheLayout::hnd;
  wide.causal = Causal::none;
  wide.seq_q = {3};
  wide.seq_kv = {200};
  expect_matches_oracle<256>(wide);
}

// Decode at D 512: GQA-packed rows over pages of 1 and 3 keys, unsplit and
// split (the partial rows combined on the host).
TEST(EmulatedSm90Serving, GatheredDecodePackedHeadsD512) {
  ServingCase c = base_case(62, 512);
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.page_size = 1;
  c.heads_q = 8, c.heads_kv = 1;
  c.seq_q.assign(3, 1);
  c.seq_kv = {1, 200, 0};
  expect_matches_oracle<512>(c);
  ServingCase split = base_case(63, 512);
  split.packed_q = false;
  split.keys = KeyForm::paged;
  split.page_size = 3;
  split.heads_q = 4, split.heads_kv = 2;
  split.seq_q.assign(2, 1);
  split.seq_kv = {700, 130};
  split.sinks = true;
  expect_matches_oracle<512>(split, 12);
}

TEST(EmulatedSm90Serving, DecodePackedHeadsOverPagesD512) {
  ServingCase c = base_case(20, 512);
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.heads_q = 8, c.heads_kv = 1;
  c.seq_q.assign(3, 1);
  c.seq_kv = {1, 200, 0};
  expect_matches_oracle<512>(c);
}

// Decode rows whose plan splits the keys (few CTA slots: every sequence
// splits), the partial rows combined on the host as the combine kernel does.
TEST(EmulatedSm90Serving, SplitDecodeOverPages) {
  ServingCase c = base_case(25, 256);
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.heads_q = 4, c.heads_kv = 2;
  c.seq_q.assign(3, 1);
  c.seq_kv = {900, 130, 0};
  c.sinks = true;
  expect_matches_oracle<256>(c, 16);
  ServingCase spec = base_case(26, 512);
  spec.keys = KeyForm::paged;
  spec.page_size = 64;
  spec.heads_q = 8, spec.heads_kv = 1;
  spec.seq_q = {2, 3};
  spec.seq_kv = {700, 400};
  expect_matches_oracle<512>(spec, 12);
}

// A chunked-prefill batch: a prefill chunk beside decode and speculative
// rows (and an empty sequence) over a paged cache, GQA 8. The rows of at most
// 8 run first, 8 heads a tile and split; then the chunk unpacked, unsplit.
TEST(EmulatedSm90Serving, MixedBatchInTwoPasses) {
  ServingCase c = base_case(27, 512);
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.heads_q = 8, c.heads_kv = 1;
  c.seq_q = {1, 70, 3, 0, 1, 8, 9};
  c.seq_kv = {600, 90, 300, 40, 17, 200, 130};
  c.sinks = true;
  expect_matches_oracle<512>(c, 16, 2);
}

TEST(EmulatedSm90Serving, WindowSoftcapSinks) {
  ServingCase c = base_case(30, 256);
  c.keys = KeyForm::paged;
  c.page_size = 32;
  c.seq_q = {140, 3};
  c.seq_kv = {300, 200};
  c.window_left = 100;
  c.softcap = 20.0f;
  c.sinks = true;
  expect_matches_oracle<256>(c);
  ServingCase both = base_case(31, 256);
  both.causal = Causal::none;
  both.seq_q = {60};
  both.seq_kv = {260};
  both.window_left = 30, both.window_right = 40;
  expect_matches_oracle<256>(both);
}

// An e4m3 cache (producer_codes.cuh): the producer warpgroup copies the
// codes into the ring and widens them in place; the descales on the scores
// and on O (before the splits merge). Paged caches of TMA-sized and gathered
// page sizes in every layout, packed and batched keys, decode GQA-packed and
// split, D_qk != D_v and D between the instances, a window, softcap and
// sinks, both dtypes; the cache's unused rows NaN.
TEST(EmulatedSm90Serving, E4m3Cache) {
  ServingCase paged = base_case(80, 256);
  paged.e4m3_kv = true;
  paged.keys = KeyForm::paged;
  paged.page_size = 16;
  paged.seq_q = {1, 40};
  paged.seq_kv = {150, 60};
  expect_matches_oracle<256>(paged);

  ServingCase narrow = base_case(81, 256);
  narrow.e4m3_kv = true;
  narrow.dtype = DType::f16;
  narrow.value_dim = 192;
  narrow.per_sequence_descale = true;
  narrow.keys = KeyForm::paged;
  narrow.page_size = 1;
  narrow.cache = CacheLayout::hnd;
  narrow.seq_q = {3, 1};
  narrow.seq_kv = {131, 257};
  narrow.softcap = 20.0f;
  expect_matches_oracle<256>(narrow);

  ServingCase dense = base_case(82, 128);
  dense.e4m3_kv = true;
  dense.keys = KeyForm::packed;
  dense.seq_q = {70, 5};
  dense.seq_kv = {70, 200};
  dense.window_left = 50;
  expect_matches_oracle<256>(dense);

  ServingCase batched = base_case(83, 448);
  batched.e4m3_kv = true;
  batched.packed_q = false;
  batched.keys = KeyForm::batched;
  batched.heads_q = 4, batched.heads_kv = 2;
  batched.seq_q.assign(2, 1);
  batched.seq_kv = {300, 77};
  expect_matches_oracle<512>(batched);

  ServingCase decode = base_case(84, 512);
  decode.e4m3_kv = true;
  decode.per_sequence_descale = true;
  decode.packed_q = false;
  decode.keys = KeyForm::paged;
  decode.page_size = 3;
  decode.cache = CacheLayout::stacked;
  decode.heads_q = 8, decode.heads_kv = 1;
  decode.seq_q.assign(3, 1);
  decode.seq_kv = {700, 130, 0};
  decode.sinks = true;
  expect_matches_oracle<512>(decode, 12);
}

TEST(EmulatedSm90Serving, ClusterMlaLatentCache) {
  ServingCase c = base_case(40, 576);
  c.value_dim = 512;
  c.value_in_key_rows = true;
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.page_size = 64;
  c.heads_q = 4, c.heads_kv = 1;
  c.seq_q = {1, 1};
  c.seq_kv = {130, 70};
  expect_matches_oracle<640>(c);
}

}  // namespace
}  // namespace ffpa::testing
