// The backward of a sequence batch (packed training, docs/serving.md) on host
// tensors through the public API: the gradients of q, k, v and the sinks
// against central finite differences of the fp64 serving oracle
// (support/serving_inputs.hpp, written from the spec) on packed and batched
// sequences with empty ones, GQA, both causal alignments, windows, softcap,
// sinks, seqused_k and the lse's gradient; a packed batch's gradients equal,
// bit for bit, those of each sequence's own dense call (padding-free
// training gives the padded step's gradients); rows of no sequence stay NaN
// (and their NaN d_o is never read); each status of the batch's backward, with
// nothing written; the C ABI.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <tuple>
#include <string>
#include <vector>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "support/c_tensors.hpp"
#include "support/serving_backward.hpp"

namespace ffpa {
namespace {

using testing::KeyForm;
using testing::ServingBackward;
using testing::ServingCase;

// The central difference of the oracle's loss along one element of t: f64
// inputs a step of 1e-6, the f32 sinks one of 2^-12 (exact in f32 for |x| < 2).
double finite_difference(ServingBackward& s, const Tensor& t, std::array<int64_t, 4> index) {
  const double step = t.dtype == DType::f64 ? 1e-6 : 1.0 / 4096;
  const double x0 = testing::element_as_double(t, index);
  testing::set_element(t, index, x0 + step);
  const double up = testing::serving_loss(s), x_up = testing::element_as_double(t, index);
  testing::set_element(t, index, x0 - step);
  const double down = testing::serving_loss(s), x_down = testing::element_as_double(t, index);
  testing::set_element(t, index, x0);
  return (up - down) / (x_up - x_down);
}

// Every element of a sequence's rows of `input` against the finite
// difference; every other row of `gradient` still NaN.
void expect_gradient(ServingBackward& s, const Tensor& input, const Tensor& gradient, bool queries, const char* name) {
  int checked = 0;
  for (int64_t e = 0; e < input.shape[0]; ++e)
    for (int64_t n = 0; n < input.shape[2]; ++n) {
      const bool owned = queries ? testing::owned_query_row(s, e, n) : testing::owned_key_row(s, e, n);
      for (int64_t h = 0; h < input.shape[1]; ++h)
        for (int64_t d = 0; d < input.shape[3]; ++d) {
          const double got = testing::element_as_double(gradient, {e, h, n, d});
          if (!owned) {
            ASSERT_TRUE(std::isnan(got)) << name << " row " << n << " of entry " << e << " belongs to no sequence";
            continue;
          }
          const double want = finite_difference(s, input, {e, h, n, d});
          ASSERT_NEAR(got, want, 1e-7 * std::max(1.0, std::fabs(want)))
              << name << "[" << e << "," << h << "," << n << "," << d << "]";
          ++checked;
        }
    }
  std::cout << name << ": " << checked << " elements checked\n";
}

void check_finite_differences(const ServingCase& c, bool with_d_lse) {
  SCOPED_TRACE(c.describe());
  ServingBackward s;
  ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(c, with_d_lse, c.sinks, &s));
  const Status status = backward(s.params);
  ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  expect_gradient(s, s.in.q.tensor, s.d_q.tensor, true, "d_q");
  expect_gradient(s, s.in.k, s.d_k.tensor, false, "d_k");
  expect_gradient(s, s.in.v, s.d_v.tensor, false, "d_v");
  for (int64_t h = 0; h < (c.sinks ? c.heads_q : 0); ++h) {
    const double want = finite_difference(s, s.in.sinks.tensor, {h, 0, 0, 0});
    // d_sinks is f32: its rounding, and the larger step's truncation.
    EXPECT_NEAR(testing::element_as_double(s.d_sinks.tensor, {h, 0, 0, 0}), want, 2e-6 * std::max(1.0, std::fabs(want)))
        << "d_sinks[" << h << "]";
  }
}

ServingCase f64_case(uint64_t seed) {
  ServingCase c;
  c.seed = seed;
  c.dtype = DType::f64;
  c.heads_q = 4, c.heads_kv = 2, c.dim = 8, c.value_dim = 16;
  return c;
}

TEST(ServingBackward, PackedSequencesMatchFiniteDifferences) {
  ServingCase c = f64_case(1);
  c.seq_q = {3, 0, 4, 2};
  c.seq_kv = {5, 3, 4, 0};  // an empty sequence with keys, one with queries and no key
  c.causal = Causal::bottom_right;
  check_finite_differences(c, false);
  c = f64_case(2);
  c.seq_q = {2, 5};
  c.seq_kv = {6, 3};  // Nq > Nkv: rows before the first key
  c.causal = Causal::top_left;
  c.seqused = true;   // keys past seqused_k: no gradient, not written
  check_finite_differences(c, true);
}

TEST(ServingBackward, WindowsSinksAndSoftcapMatchFiniteDifferences) {
  ServingCase c = f64_case(3);
  c.seq_q = {4, 1, 3};
  c.seq_kv = {7, 5, 3};
  c.causal = Causal::bottom_right;
  c.window_left = 2;
  c.sinks = true;
  check_finite_differences(c, true);
  c = f64_case(4);
  c.seq_q = {3, 4};
  c.seq_kv = {6, 2};
  c.window_left = 1, c.window_right = 1;
  c.softcap = 1.5f;
  c.heads_q = 2, c.heads_kv = 1;
  check_finite_differences(c, false);
}

TEST(ServingBackward, BatchedQueriesAndKeysMatchFiniteDifferences) {
  ServingCase c = f64_case(5);
  c.packed_q = false;
  c.keys = KeyForm::batched;
  c.seq_q = {3, 3, 3};
  c.seq_kv = {4, 0, 6};
  c.causal = Causal::bottom_right;
  c.sinks = true;
  check_finite_differences(c, true);
}

// A packed bf16 batch against each sequence's own dense call (q [1, Hq, Nq_b,
// D] views of the same rows): the same gradients, bit for bit; the sinks'
// gradient the sum of the dense calls'.
TEST(ServingBackward, APackedBatchGivesEachSequencesDenseGradients) {
  ServingCase c;
  c.seed = 7;
  c.dtype = DType::bf16;
  c.heads_q = 6, c.heads_kv = 2, c.dim = 24, c.value_dim = 40;
  c.seq_q = {9, 1, 0, 13};
  c.seq_kv = {9, 17, 4, 13};
  c.causal = Causal::bottom_right;
  c.window_left = 6;
  c.sinks = true;
  ServingBackward s;
  ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(c, true, true, &s));
  ASSERT_TRUE(backward(s.params).ok());
  std::vector<double> sink_sum(static_cast<size_t>(c.heads_q), 0.0);
  for (int64_t b = 0; b < c.batch(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    auto rows = [](Tensor t, int64_t first, int64_t count) {  // rows [first, first + count) of entry 0
      t.data = static_cast<unsigned char*>(t.data) + first * t.stride[2] * static_cast<int64_t>(testing::dtype_size(t.dtype));
      t.shape[2] = count;
      return t;
    };
    const int64_t q0 = s.in.q_begin[b], nq = c.seq_q[b], k0 = s.in.k_begin[b], nkv = c.seq_kv[b];
    BackwardParams dense;
    dense.q = rows(s.in.q.tensor, q0, nq), dense.o = rows(s.in.o.tensor, q0, nq), dense.lse = rows(s.in.lse.tensor, q0, nq);
    dense.d_o = rows(s.d_o.tensor, q0, nq), dense.d_lse = rows(s.d_lse.tensor, q0, nq);
    dense.k = rows(s.in.k, k0, nkv), dense.v = rows(s.in.v, k0, nkv);
    testing::HostTensor d_q = testing::poisoned_like(dense.q), d_k = testing::poisoned_like(dense.k),
                        d_v = testing::poisoned_like(dense.v);
    testing::HostTensor d_sinks = testing::host_tensor_detail::allocate(DType::f32, 1, s.in.sinks.tensor.shape);
    dense.d_q = d_q.tensor, dense.d_k = d_k.tensor, dense.d_v = d_v.tensor;
    dense.sinks = s.in.sinks.tensor, dense.d_sinks = d_sinks.tensor;
    dense.options = s.params.options;
    const Status status = backward(dense);
    ASSERT_TRUE(status.ok()) << status.message;
    for (auto [packed, own, first] : {std::tuple{&s.d_q.tensor, &d_q.tensor, q0}, std::tuple{&s.d_k.tensor, &d_k.tensor, k0},
                                      std::tuple{&s.d_v.tensor, &d_v.tensor, k0}})
      for (int64_t h = 0; h < own->shape[1]; ++h)
        for (int64_t n = 0; n < own->shape[2]; ++n)
          for (int64_t d = 0; d < own->shape[3]; ++d)
            ASSERT_EQ(testing::element_as_double(*packed, {0, h, first + n, d}),
                      testing::element_as_double(*own, {0, h, n, d}))
                << "head " << h << " row " << n << " column " << d;
    for (int64_t h = 0; h < c.heads_q; ++h)
      sink_sum[static_cast<size_t>(h)] += testing::element_as_double(d_sinks.tensor, {h, 0, 0, 0});
  }
  for (int64_t h = 0; h < c.heads_q; ++h)
    EXPECT_NEAR(testing::element_as_double(s.d_sinks.tensor, {h, 0, 0, 0}), sink_sum[static_cast<size_t>(h)],
                1e-5 * std::max(1.0, std::fabs(sink_sum[static_cast<size_t>(h)])));
}

// Everything a batch's backward writes is still NaN.
void expect_nothing_written(const ServingBackward& s) {
  for (const testing::HostTensor* t : {&s.d_q, &s.d_k, &s.d_v}) {
    const Tensor& view = t->tensor;
    for (int64_t e = 0; e < view.shape[0]; ++e)
      for (int64_t h = 0; h < view.shape[1]; ++h)
        for (int64_t n = 0; n < view.shape[2]; ++n)
          ASSERT_TRUE(std::isnan(testing::element_as_double(view, {e, h, n, 0}))) << "row " << n << " written";
  }
  if (!s.params.d_sinks.data) return;
  for (int64_t h = 0; h < s.in.c.heads_q; ++h)
    ASSERT_TRUE(std::isnan(testing::element_as_double(s.d_sinks.tensor, {h, 0, 0, 0})));
}

ServingCase small_case() {
  ServingCase c;
  c.dtype = DType::bf16;
  c.seq_q = {3, 5};
  c.seq_kv = {4, 6};
  c.sinks = true;
  c.causal = Causal::bottom_right;
  return c;
}

// Runs `fault` on a fresh call, expects `code` from backward (and its
// workspace query) and nothing written.
template <class Fault>
void expect_refused(StatusCode code, Fault&& fault, ServingCase c = small_case()) {
  ServingBackward s;
  ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(c, false, true, &s));
  fault(s);
  const Status status = backward(s.params);
  EXPECT_EQ(status.code, code) << status_name(status.code) << ": " << status.message;
  EXPECT_FALSE(status.message.empty());
  size_t bytes = 0;
  EXPECT_EQ(backward_workspace_size(s.params, &bytes).code, code == StatusCode::invalid_sequence_lengths ? StatusCode::ok : code)
      << "the lengths are data: the host checks them when the call runs";
  expect_nothing_written(s);
}

TEST(ServingBackward, EachBadArgumentHasItsStatusAndWritesNothing) {
  // The lengths (data): decreasing offsets, a sequence past q's rows, seqused_k beyond its keys.
  expect_refused(StatusCode::invalid_sequence_lengths, [](ServingBackward& s) {
    static_cast<int32_t*>(s.in.batch.cu_seqlens_q.data)[1] = 9;  // past cu_seqlens_q[2] = 8
  });
  expect_refused(StatusCode::invalid_sequence_lengths,
                 [](ServingBackward& s) { static_cast<int32_t*>(s.in.batch.cu_seqlens_k.data)[2] = 99; });
  {
    ServingCase c = small_case();
    c.seqused = true;
    expect_refused(StatusCode::invalid_sequence_lengths,
                   [](ServingBackward& s) { static_cast<int32_t*>(s.in.batch.seqused_k.data)[0] = 99; }, c);
  }
  // A paged cache: no backward.
  expect_refused(StatusCode::invalid_option, [](ServingBackward& s) {
    s.in.batch.block_table = s.in.batch.cu_seqlens_k;  // any int32 tensor: refused before its shape is read
    s.in.batch.block_table.rank = 2;
    s.in.batch.block_table.shape[0] = 2, s.in.batch.block_table.shape[1] = 1;
    s.in.batch.block_table.stride[0] = 1, s.in.batch.block_table.stride[1] = 1;
    s.in.batch.cu_seqlens_k = Tensor{};
    s.params.k.shape[0] = s.params.v.shape[0] = s.params.d_k.shape[0] = s.params.d_v.shape[0] = 1;
  });
  // The forward's refusals hold in the backward: dropout, a mask.
  expect_refused(StatusCode::invalid_dropout, [](ServingBackward& s) { s.params.options.dropout_p = 0.1f; });
  expect_refused(StatusCode::invalid_mask_layout, [](ServingBackward& s) {
    s.params.mask = s.params.q;
    s.params.mask.shape[3] = s.params.k.shape[2];
  });
  // Gradients laid out unlike their tensors.
  expect_refused(StatusCode::shape_mismatch, [](ServingBackward& s) { s.params.d_q.shape[2] -= 1; });
  expect_refused(StatusCode::shape_mismatch, [](ServingBackward& s) { s.params.d_k.shape[0] = 2; });
  // d_sinks: without sinks, its shape, dtype, alignment, stride, overlaps.
  expect_refused(StatusCode::invalid_option, [](ServingBackward& s) { s.params.sinks = Tensor{}; });
  expect_refused(StatusCode::shape_mismatch, [](ServingBackward& s) { s.params.d_sinks.shape[0] = 3; });
  expect_refused(StatusCode::dtype_mismatch, [](ServingBackward& s) { s.params.d_sinks.dtype = DType::bf16; });
  expect_refused(StatusCode::misaligned,
                 [](ServingBackward& s) { s.params.d_sinks.data = static_cast<char*>(s.params.d_sinks.data) + 1; });
  expect_refused(StatusCode::invalid_stride, [](ServingBackward& s) { s.params.d_sinks.stride[0] = 0; });
  expect_refused(StatusCode::output_overlaps_input, [](ServingBackward& s) { s.params.d_sinks = s.params.sinks; });
  // A gradient over the lengths it is computed from.
  expect_refused(StatusCode::output_overlaps_input, [](ServingBackward& s) {
    s.params.d_sinks.data = s.in.batch.cu_seqlens_q.data;
  });
  // The lse missing: its message names the packed shape.
  {
    ServingBackward s;
    ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(small_case(), false, false, &s));
    s.params.lse = Tensor{};
    const Status status = backward(s.params);
    EXPECT_EQ(status.code, StatusCode::null_pointer);
    EXPECT_NE(status.message.find("total_q"), std::string::npos) << status.message;
    expect_nothing_written(s);
  }
  // A GPU implementation on host tensors: no device here (impl_unavailable), or host pointers (wrong_memory_space).
  {
    ServingBackward s;
    ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(small_case(), false, true, &s));
    s.params.options.impl = Impl::sm80_split_d;
    const StatusCode code = backward(s.params).code;
    EXPECT_TRUE(code == StatusCode::impl_unavailable || code == StatusCode::wrong_memory_space) << status_name(code);
    expect_nothing_written(s);
  }
}

TEST(ServingBackward, TheCAbiComputesTheSameGradients) {
  ServingCase c = small_case();
  c.dtype = DType::f32;
  ServingBackward cpp, via_c;
  ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(c, true, true, &cpp));
  ASSERT_NO_FATAL_FAILURE(testing::make_serving_backward(c, true, true, &via_c));
  ASSERT_TRUE(backward(cpp.params).ok());
  const BackwardParams& p = via_c.params;
  ffpa_sequence_batch batch{};
  batch.cu_seqlens_q = testing::c_tensor(p.sequences->cu_seqlens_q);
  batch.cu_seqlens_k = testing::c_tensor(p.sequences->cu_seqlens_k);
  ffpa_backward_params cp{};
  cp.q = testing::c_tensor(p.q), cp.k = testing::c_tensor(p.k), cp.v = testing::c_tensor(p.v);
  cp.o = testing::c_tensor(p.o), cp.lse = testing::c_tensor(p.lse), cp.d_o = testing::c_tensor(p.d_o);
  cp.d_lse = testing::c_tensor(p.d_lse);
  cp.d_q = testing::c_tensor(p.d_q), cp.d_k = testing::c_tensor(p.d_k), cp.d_v = testing::c_tensor(p.d_v);
  cp.sinks = testing::c_tensor(p.sinks), cp.d_sinks = testing::c_tensor(p.d_sinks);
  cp.options.causal = FFPA_CAUSAL_BOTTOM_RIGHT;
  cp.options.impl = FFPA_IMPL_CPU_REFERENCE;
  cp.sequences = &batch;
  char message[512] = {};
  size_t bytes = 1;
  ASSERT_EQ(ffpa_backward_workspace_size(&cp, &bytes, message, sizeof message), FFPA_OK) << message;
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(ffpa_backward(&cp, message, sizeof message), FFPA_OK) << message;
  for (auto [a, b] : {std::pair{&cpp.d_q, &via_c.d_q}, std::pair{&cpp.d_k, &via_c.d_k}, std::pair{&cpp.d_v, &via_c.d_v},
                      std::pair{&cpp.d_sinks, &via_c.d_sinks}})
    EXPECT_EQ(0, std::memcmp(a->tensor.data, b->tensor.data, a->bytes())) << "the same bytes, NaN included";
}

}  // namespace
}  // namespace ffpa
