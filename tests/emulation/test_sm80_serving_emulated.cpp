// The sm80 split-D kernel on serving calls (docs/serving.md), on the CPU
// emulator, against the fp64 oracle of support/serving_inputs.hpp: packed,
// batched and paged sequences (page sizes 1 to 64, NHD / HND / stacked
// caches, V inside K's rows), the plan computed on the host
// (kernels/serving/plan.hpp), windows, softcap, sinks, GQA packing,
// empty sequences; rows of no sequence stay NaN, CTAs past the plan's tiles
// write nothing. Decode batches split their keys where the plan says (CTA
// slots chosen so that these short batches split), the partial rows
// combined on the host.
#include "emulation/device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "host/validate.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm80_split_d/kernel.cuh"
#include "emulation/sequence_combine.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa::detail::sm80_split_d {
extern unsigned char cta_smem[232448];  // test_sm80_forward_emulated.cpp
}  // namespace ffpa::detail::sm80_split_d

namespace ffpa::testing {
namespace {

namespace split_d = detail::sm80_split_d;

template <typename Element, int kOutCols>
using TileTraits = split_d::Traits<Element, false, kOutCols, split_d::tile_shape(kOutCols).warp_rows,
                                   split_d::tile_shape(kOutCols).warps_m, split_d::tile_shape(kOutCols).warps_n,
                                   split_d::tile_shape(kOutCols).block_n, split_d::tile_shape(kOutCols).pv_keys,
                                   split_d::tile_shape(kOutCols).stages>;

// The plan on the host (its keys split for `split_slots` CTA slots where the
// call may split: sequence_split_slots), then every CTA of the launch's
// bound, then the combine of the partial rows on the host.
template <class Traits>
void run_emulated(detail::AttentionProblem problem, int value_splits, int split_slots) {
  const split_d::Route route{Traits::kOutCols, value_splits};
  const int slots = split_slots > 0 ? split_d::sequence_split_slots(problem, route, split_slots * value_splits) : 0;
  const detail::SequenceTiling tiling = split_d::sequence_tiling(problem, route, slots);
  std::vector<unsigned char> plan(static_cast<size_t>(detail::serving::plan_bytes(problem)));
  detail::serving::plan_on_host(problem, tiling, plan.data());
  ASSERT_EQ(detail::serving::plan_header(plan.data())->fault, 0);
  problem.sequences.plan = plan.data();
  split_d::SplitLaunch split;
  std::vector<float> partial_o;
  std::vector<detail::RowSoftmaxState> states;
  if (slots > 0) {
    const int64_t rows = detail::serving::max_partial_rows(problem, tiling);
    partial_o.assign(static_cast<size_t>(rows * problem.dv()), std::nanf(""));
    states.assign(static_cast<size_t>(rows), detail::RowSoftmaxState{std::nanf(""), std::nanf("")});
    split.split_slots = slots;
    split.partial_o = partial_o.data();
    split.partial_states = states.data();
  }
  const split_d::Args args = split_d::forward_args<Traits>(problem, value_splits, split);
  for (int64_t cta = 0; cta < split_d::forward_ctas<Traits>(args); ++cta)
    emulation::run_cta({static_cast<unsigned>(cta), 0, 0}, Traits::kThreads, split_d::cta_smem,
                       [&] { split_d::forward_kernel<Traits>(args); });
  // The split cases' batches are long enough for a few slots to split them.
  if (slots > 0) EXPECT_GT(detail::serving::plan_header(plan.data())->split_blocks, 0) << "the plan did not split";
  if (detail::serving::plan_header(plan.data())->split_blocks > 0)
    combine_sequences_on_host(problem, detail::PassRows{}, partial_o, states);
}

template <int kOutCols>
void run_instance(const detail::AttentionProblem& problem, int split_slots) {
  const int value_splits = static_cast<int>((problem.dv() + kOutCols - 1) / kOutCols);
  if (problem.dtype == DType::bf16) {
    run_emulated<TileTraits<__nv_bfloat16, kOutCols>>(problem, value_splits, split_slots);
  } else {
    run_emulated<TileTraits<__half, kOutCols>>(problem, value_splits, split_slots);
  }
}

// split_slots > 0: the plan splits decode batches for that many CTA slots.
void expect_matches_oracle(const ServingCase& c, int split_slots = 0) {
  SCOPED_TRACE(c.describe() + " split slots " + std::to_string(split_slots));
  ServingInputs in = make_serving_inputs(c);
  detail::AttentionProblem problem;
  const Status status = detail::validate_forward(in.params, &problem);
  ASSERT_TRUE(status.ok()) << status.message;
  if (c.value_dim <= 64) {
    run_instance<64>(problem, split_slots);
  } else if (c.value_dim <= 128) {
    run_instance<128>(problem, split_slots);
  } else {
    run_instance<512>(problem, split_slots);
  }
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
          ASSERT_NEAR(element_as_double(in.o.tensor, {batch, h, row, d}), want.out[d], tolerance * std::max(scale, 1.0))
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

std::vector<int64_t> draw(std::mt19937_64& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int64_t> v(count);
  for (int64_t& n : v) n = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  return v;
}

ServingCase base_case(uint64_t seed) {
  ServingCase c;
  c.seed = seed;
  c.dtype = DType::bf16;
  c.dim = c.value_dim = 64;
  c.causal = Causal::bottom_right;
  return c;
}

TEST(EmulatedSm80Serving, PackedSequences) {
  std::mt19937_64 rng(1);
  ServingCase c = base_case(1);
  c.seq_q = {70, 0, 5, 130};
  c.seq_kv = {70, 9, 200, 130};
  expect_matches_oracle(c);
  c = base_case(2);
  c.causal = Causal::none;
  c.dtype = DType::f16;
  c.seq_q = draw(rng, 3, 1, 80);
  c.seq_kv = draw(rng, 3, 0, 150);
  expect_matches_oracle(c);
}

TEST(EmulatedSm80Serving, PagedCaches) {
  std::mt19937_64 rng(2);
  const int64_t pages[] = {1, 3, 16, 64};
  const CacheLayout layouts[] = {CacheLayout::nhd, CacheLayout::hnd, CacheLayout::stacked};
  uint64_t seed = 10;
  for (int64_t page : pages) {
    ServingCase c = base_case(seed);
    c.keys = KeyForm::paged;
    c.page_size = page;
    c.cache = layouts[seed % 3];
    c.seq_q = draw(rng, 3, 1, 40);
    c.seq_kv = draw(rng, 3, 1, 180);
    for (size_t b = 0; b < c.seq_kv.size(); ++b) c.seq_kv[b] = std::max(c.seq_kv[b], c.seq_q[b]);
    expect_matches_oracle(c);
    ++seed;
  }
}

TEST(EmulatedSm80Serving, DecodeRowsPackedHeadsOverPages) {
  // Nq = 1 with batched q, GQA 8 packed into one tile; a mixed batch with a prefill chunk.
  ServingCase c = base_case(20);
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.heads_q = 8, c.heads_kv = 1;
  c.seq_q.assign(4, 1);
  c.seq_kv = {1, 77, 300, 0};
  expect_matches_oracle(c);
  ServingCase mixed = base_case(21);
  mixed.keys = KeyForm::paged;
  mixed.page_size = 5;
  mixed.heads_q = 4, mixed.heads_kv = 2;
  mixed.seq_q = {90, 1, 1, 1};
  mixed.seq_kv = {120, 40, 1, 257};
  expect_matches_oracle(mixed);
}

TEST(EmulatedSm80Serving, WindowSoftcapSinks) {
  std::mt19937_64 rng(3);
  struct Variant {
    int64_t left, right;
    Causal causal;
    float softcap;
    bool sinks;
  };
  const Variant variants[] = {{40, -1, Causal::bottom_right, 0.0f, false},
                              {20, 10, Causal::none, 0.0f, true},
                              {-1, -1, Causal::none, 3.0f, true},
                              {150, 0, Causal::none, 30.0f, false}};
  uint64_t seed = 30;
  for (const Variant& v : variants) {
    ServingCase c = base_case(seed++);
    c.keys = seed % 2 ? KeyForm::paged : KeyForm::packed;
    c.page_size = 7;
    c.seq_q = draw(rng, 2, 1, 150);
    c.seq_kv = draw(rng, 2, 1, 300);
    c.window_left = v.left, c.window_right = v.right;
    c.causal = v.causal;
    c.softcap = v.softcap;
    c.sinks = v.sinks;
    expect_matches_oracle(c);
  }
}

// An e4m3 cache (the serving engines' FP8 format): codes converted as they
// are loaded, the descales on the scores and the output.
// Decode batches whose plan splits the keys (more CTA slots than the
// unsplit tiles): GQA-packed rows
// over pages of 1 and 16 keys, an empty sequence, a window and sinks, an
// e4m3 cache with per-sequence descales (V's applied before the splits
// merge), D_qk != D_v; the partial rows combined on the host.
TEST(EmulatedSm80Serving, DecodeBatchesSplitTheirKeys) {
  ServingCase c = base_case(70);
  c.packed_q = false;
  c.keys = KeyForm::paged;
  c.heads_q = 8, c.heads_kv = 2;
  c.seq_q.assign(4, 1);
  c.seq_kv = {700, 1, 0, 390};
  for (int64_t page : {1, 16}) {
    c.page_size = page;
    expect_matches_oracle(c, /*split_slots=*/32);
  }
  ServingCase w = c;
  w.seed = 71;
  w.window_left = 200, w.window_right = 0;
  w.sinks = true;
  expect_matches_oracle(w, 24);
  ServingCase e = base_case(72);
  e.e4m3_kv = true;
  e.per_sequence_descale = true;
  e.keys = KeyForm::paged;
  e.page_size = 16;
  e.seq_q = {1, 2, 1};
  e.seq_kv = {500, 260, 33};
  expect_matches_oracle(e, 32);
  ServingCase v = base_case(73);
  v.dim = 128, v.value_dim = 64;
  v.seq_q = {1, 1};
  v.seq_kv = {640, 300};
  expect_matches_oracle(v, 16);
}

TEST(EmulatedSm80Serving, E4m3CacheWithDescales) {
  for (bool per_sequence : {false, true}) {
    ServingCase c = base_case(per_sequence ? 50 : 51);
    c.e4m3_kv = true;
    c.per_sequence_descale = per_sequence;
    c.dtype = per_sequence ? DType::f16 : DType::bf16;
    c.keys = KeyForm::paged;
    c.page_size = 16;
    c.seq_q = {1, 40};
    c.seq_kv = {150, 60};
    c.softcap = per_sequence ? 20.0f : 0.0f;
    expect_matches_oracle(c);
  }
}

// An e4m3 cache on every tile shape (tiles.hpp): each copies a different
// number of chunks a thread per K and V step, which the codes' in-place
// conversion (producer.cuh: convert_codes) walks; odd pages, D_qk != D_v.
TEST(EmulatedSm80Serving, E4m3CacheOnEveryTileShape) {
  const int64_t dims[][2] = {{64, 64}, {256, 208}, {320, 320}, {512, 512}, {704, 704}, {1024, 1024}};
  uint64_t seed = 90;
  for (const auto& dim : dims) {
    ServingCase c = base_case(seed++);
    c.e4m3_kv = true;
    c.per_sequence_descale = seed % 2 == 0;
    c.dim = dim[0], c.value_dim = dim[1];
    c.keys = KeyForm::paged;
    c.page_size = seed % 2 == 0 ? 3 : 1;
    c.seq_q = {1, 20};
    c.seq_kv = {150, 37};
    expect_matches_oracle(c);
  }
}

TEST(EmulatedSm80Serving, HeadDims) {
  ServingCase wide = base_case(40);
  wide.dim = 136, wide.value_dim = 120;
  wide.keys = KeyForm::paged;
  wide.page_size = 16;
  wide.seq_q = {33, 1};
  wide.seq_kv = {60, 129};
  expect_matches_oracle(wide);
  ServingCase mla = base_case(41);
  mla.dim = 576, mla.value_dim = 512;
  mla.value_in_key_rows = true;
  mla.heads_q = 4, mla.heads_kv = 1;
  mla.keys = KeyForm::paged;
  mla.page_size = 64;
  mla.packed_q = false;
  mla.seq_q = {1, 1};
  mla.seq_kv = {90, 140};
  expect_matches_oracle(mla);
}

}  // namespace
}  // namespace ffpa::testing
