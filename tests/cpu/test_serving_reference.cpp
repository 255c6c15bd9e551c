// The CPU reference's serving semantics (docs/spec.md, "Serving semantics")
// through the public API, against the fp64 oracle of support/serving_inputs.hpp
// on fresh random batches: packed, batched and paged queries and keys (page
// sizes 1 to 64 and odd ones, shuffled tables, NHD / HND / stacked caches, V
// inside K's rows), empty sequences, mixed prefill and decode rows, both
// causal alignments, windows, softcap, sinks, an e4m3 cache with per-tensor
// and per-sequence descales, GQA, D 8 to 1024 and D_qk != D_v. Outputs are
// poisoned: rows that belong to no sequence must stay NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "support/c_tensors.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa {
namespace {

using testing::CacheLayout;
using testing::KeyForm;
using testing::ServingCase;
using testing::ServingInputs;

// Runs the case through ffpa::forward and checks every row of every sequence
// against the oracle; rows of no sequence stay NaN.
void expect_matches_oracle(const ServingCase& c) {
  SCOPED_TRACE(c.describe());
  ServingInputs in = testing::make_serving_inputs(c);
  const Status status = forward(in.params);
  ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  // Output rounding: f32 exact to ~1e-6; 16-bit outputs to their ulp.
  const double tolerance = c.dtype == DType::f32 ? 2e-5 : c.dtype == DType::bf16 ? 1.6e-2 : 2e-3;
  std::vector<bool> written(static_cast<size_t>(in.o.tensor.shape[0] * in.o.tensor.shape[2]), false);
  for (int64_t b = 0; b < c.batch(); ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q[b]; ++i) {
        const testing::OracleRow want = testing::serving_oracle_row(in, b, h, i);
        const int64_t batch = c.packed_q ? 0 : b, row = in.q_begin[b] + i;
        written[batch * in.o.tensor.shape[2] + row] = true;
        double scale = 1e-30;
        for (double x : want.out) scale = std::max(scale, std::abs(x));
        for (int64_t d = 0; d < c.value_dim; ++d) {
          const double got = testing::element_as_double(in.o.tensor, {batch, h, row, d});
          ASSERT_NEAR(got, want.out[d], tolerance * std::max(scale, 1.0))
              << "sequence " << b << " head " << h << " row " << i << " column " << d;
        }
        if (c.lse) {
          const double got = testing::element_as_double(in.lse.tensor, {batch, h, row, 0});
          if (std::isinf(want.lse)) {
            EXPECT_TRUE(std::isinf(got) && got < 0) << "sequence " << b << " head " << h << " row " << i;
          } else {
            EXPECT_NEAR(got, want.lse, 2e-5 * std::max(1.0, std::abs(want.lse)));
          }
        }
      }
    }
  }
  for (int64_t batch = 0; batch < in.o.tensor.shape[0]; ++batch)
    for (int64_t row = 0; row < in.o.tensor.shape[2]; ++row)
      if (!written[batch * in.o.tensor.shape[2] + row])
        for (int64_t h = 0; h < c.heads_q; ++h)
          ASSERT_TRUE(std::isnan(testing::element_as_double(in.o.tensor, {batch, h, row, 0})))
              << "row " << row << " of no sequence was written";
}

std::vector<int64_t> draw_lengths(std::mt19937_64& rng, int64_t count, int64_t lo, int64_t hi) {
  std::vector<int64_t> lengths(count);
  for (int64_t& n : lengths) n = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  return lengths;
}

TEST(ServingReference, PackedQueriesAndKeys) {
  std::mt19937_64 rng(11);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    ServingCase c;
    c.seed = seed;
    c.seq_q = draw_lengths(rng, 4, 0, 9);
    c.seq_kv = draw_lengths(rng, 4, 0, 21);
    c.causal = seed % 2 ? Causal::bottom_right : Causal::none;
    expect_matches_oracle(c);
  }
}

TEST(ServingReference, PagedCachesEveryPageSizeAndLayout) {
  std::mt19937_64 rng(12);
  const int64_t page_sizes[] = {1, 3, 7, 16, 64};
  const CacheLayout layouts[] = {CacheLayout::nhd, CacheLayout::hnd, CacheLayout::stacked};
  uint64_t seed = 1;
  for (int64_t page : page_sizes)
    for (CacheLayout layout : layouts) {
      ServingCase c;
      c.seed = seed++;
      c.keys = KeyForm::paged;
      c.page_size = page;
      c.cache = layout;
      c.seq_q = draw_lengths(rng, 3, 1, 6);
      c.seq_kv = draw_lengths(rng, 3, 0, 70);
      for (size_t b = 0; b < c.seq_kv.size(); ++b) c.seq_kv[b] = std::max(c.seq_kv[b], c.seq_q[b]);
      c.seqused = seed % 2 == 0;
      c.causal = Causal::bottom_right;
      expect_matches_oracle(c);
    }
}

TEST(ServingReference, MixedPrefillAndDecodeRows) {
  // One prefill chunk, decode rows and an empty sequence, as a chunked-prefill scheduler sends them.
  ServingCase c;
  c.keys = KeyForm::paged;
  c.page_size = 16;
  c.seq_q = {37, 1, 1, 0, 1, 1};
  c.seq_kv = {50, 90, 17, 12, 1, 0};
  c.seqused = true;
  c.causal = Causal::bottom_right;
  c.heads_q = 8, c.heads_kv = 2;
  expect_matches_oracle(c);
}

TEST(ServingReference, BatchedQueriesOverPagedAndBatchedKeys) {
  std::mt19937_64 rng(13);
  for (KeyForm keys : {KeyForm::paged, KeyForm::batched}) {
    for (int64_t nq : {1, 3}) {
      ServingCase c;
      c.seed = static_cast<uint64_t>(nq) + (keys == KeyForm::paged ? 10 : 20);
      c.packed_q = false;
      c.keys = keys;
      c.page_size = 5;
      c.seq_q.assign(5, nq);
      c.seq_kv = draw_lengths(rng, 5, 0, 40);
      c.seqused = true;
      c.causal = Causal::bottom_right;
      c.heads_q = 6, c.heads_kv = 3;
      expect_matches_oracle(c);
    }
  }
}

TEST(ServingReference, WindowsSoftcapAndSinks) {
  std::mt19937_64 rng(14);
  struct Variant {
    int64_t left, right;
    Causal causal;
    float softcap;
    bool sinks;
  };
  const Variant variants[] = {{4, -1, Causal::bottom_right, 0.0f, false}, {3, 2, Causal::none, 0.0f, false},
                              {-1, 0, Causal::none, 0.0f, false},         {0, 0, Causal::none, 0.0f, true},
                              {6, -1, Causal::top_left, 5.0f, false},     {-1, -1, Causal::none, 2.5f, true},
                              {2, 5, Causal::bottom_right, 30.0f, true}};
  uint64_t seed = 1;
  for (const Variant& variant : variants) {
    for (KeyForm keys : {KeyForm::packed, KeyForm::paged}) {
      ServingCase c;
      c.seed = seed++;
      c.keys = keys;
      c.page_size = 4;
      c.seq_q = draw_lengths(rng, 3, 0, 12);
      c.seq_kv = draw_lengths(rng, 3, 0, 30);
      c.window_left = variant.left, c.window_right = variant.right;
      c.causal = variant.causal;
      c.softcap = variant.softcap;
      c.sinks = variant.sinks;
      expect_matches_oracle(c);
    }
  }
}

TEST(ServingReference, E4m3CacheWithDescales) {
  std::mt19937_64 rng(15);
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool per_sequence : {false, true}) {
      ServingCase c;
      c.seed = per_sequence ? 3 : 4;
      c.dtype = dtype;
      c.e4m3_kv = true;
      c.per_sequence_descale = per_sequence;
      c.keys = KeyForm::paged;
      c.page_size = 16;
      c.seq_q = draw_lengths(rng, 3, 1, 5);
      c.seq_kv = draw_lengths(rng, 3, 5, 60);
      c.causal = Causal::bottom_right;
      expect_matches_oracle(c);
    }
  }
}

TEST(ServingReference, HeadDimsAndValueInKeyRows) {
  std::mt19937_64 rng(16);
  struct Dims {
    int64_t d, dv;
    bool v_in_k;
  };
  const Dims dims[] = {{8, 8, false},    {64, 64, false},  {136, 72, false}, {256, 256, false},
                       {48, 32, true},   {576, 512, true}, {1024, 1024, false}};
  uint64_t seed = 1;
  for (const Dims& d : dims) {
    ServingCase c;
    c.seed = seed++;
    c.dim = d.d, c.value_dim = d.dv;
    c.value_in_key_rows = d.v_in_k;
    c.keys = KeyForm::paged;
    c.page_size = 8;
    c.heads_q = d.d >= 512 ? 2 : 4, c.heads_kv = d.v_in_k ? 1 : 2;
    c.seq_q = draw_lengths(rng, 2, 1, 4);
    c.seq_kv = draw_lengths(rng, 2, 4, 20);
    c.causal = Causal::bottom_right;
    c.dtype = DType::bf16;
    expect_matches_oracle(c);
  }
}

TEST(ServingReference, CAbiGivesTheSameBytes) {
  ServingCase c;
  c.keys = KeyForm::paged;
  c.page_size = 3;
  c.seq_q = {3, 1, 4};
  c.seq_kv = {5, 9, 4};
  c.causal = Causal::bottom_right;
  c.window_left = 2;
  c.sinks = true;
  c.softcap = 4.0f;
  c.dtype = DType::bf16;
  ServingInputs cpp = testing::make_serving_inputs(c), via_c = testing::make_serving_inputs(c);
  ASSERT_TRUE(forward(cpp.params).ok());

  ffpa_sequence_batch batch;
  std::memset(&batch, 0, sizeof batch);
  batch.cu_seqlens_q = testing::c_tensor(via_c.batch.cu_seqlens_q);
  batch.block_table = testing::c_tensor(via_c.batch.block_table);
  batch.seqused_k = testing::c_tensor(via_c.batch.seqused_k);
  ffpa_forward_params p;
  std::memset(&p, 0, sizeof p);
  p.q = testing::c_tensor(via_c.params.q);
  p.k = testing::c_tensor(via_c.params.k);
  p.v = testing::c_tensor(via_c.params.v);
  p.o = testing::c_tensor(via_c.params.o);
  p.lse = testing::c_tensor(via_c.params.lse);
  p.sinks = testing::c_tensor(via_c.params.sinks);
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  p.options.causal = FFPA_CAUSAL_BOTTOM_RIGHT;
  p.options.has_window = 1;
  p.options.window_left = 2;
  p.options.window_right = -1;
  p.options.softcap = 4.0f;
  p.sequences = &batch;
  char message[256];
  ASSERT_EQ(ffpa_forward(&p, message, sizeof message), FFPA_OK) << message;
  EXPECT_EQ(std::memcmp(cpp.o.tensor.data, via_c.o.tensor.data, cpp.o.bytes()), 0);
  EXPECT_EQ(std::memcmp(cpp.lse.tensor.data, via_c.lse.tensor.data, cpp.lse.bytes()), 0);
}

TEST(ServingReference, ZeroInitialisedCOptionsMeanNoWindow) {
  // has_window = 0: window_left / window_right are not read (a zeroed struct is a dense, unwindowed call).
  ffpa_options options;
  std::memset(&options, 0, sizeof options);
  EXPECT_EQ(options.has_window, 0);
  ServingCase c;
  c.seq_q = {4};
  c.seq_kv = {9};
  ServingInputs cpp = testing::make_serving_inputs(c), via_c = testing::make_serving_inputs(c);
  ASSERT_TRUE(forward(cpp.params).ok());
  ffpa_sequence_batch batch;
  std::memset(&batch, 0, sizeof batch);
  batch.cu_seqlens_q = testing::c_tensor(via_c.batch.cu_seqlens_q);
  batch.cu_seqlens_k = testing::c_tensor(via_c.batch.cu_seqlens_k);
  ffpa_forward_params p;
  std::memset(&p, 0, sizeof p);
  p.q = testing::c_tensor(via_c.params.q);
  p.k = testing::c_tensor(via_c.params.k);
  p.v = testing::c_tensor(via_c.params.v);
  p.o = testing::c_tensor(via_c.params.o);
  p.lse = testing::c_tensor(via_c.params.lse);
  p.options = options;
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  p.sequences = &batch;
  char message[256];
  ASSERT_EQ(ffpa_forward(&p, message, sizeof message), FFPA_OK) << message;
  EXPECT_EQ(std::memcmp(cpp.o.tensor.data, via_c.o.tensor.data, cpp.o.bytes()), 0);
}

}  // namespace
}  // namespace ffpa
