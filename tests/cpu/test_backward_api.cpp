// ffpa::backward (and ffpa_backward) on host tensors: the gradients the CPU
// reference's backward computes (reference/cpu_attention_backward.hpp),
// rounded to the outputs' dtype and written through their strides, an additive
// mask's gradient summed over its broadcast dims, outputs poisoned first; and
// each status the backward's validation and planning give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/float16_bits.hpp"
#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention_backward.hpp"
#include "support/c_tensors.hpp"
#include "support/host_tensors.hpp"

namespace ffpa {
namespace {

using testing::HostTensor;
using testing::Layout;
using testing::make_host_tensor;

// One backward call's host tensors: random q, k, v, d_o, an f32 additive
// [B, 1, 1, Nkv] mask, o and lse from the forward, the gradients poisoned.
struct BackwardCall {
  HostTensor q, k, v, o, lse, mask, d_o, d_q, d_k, d_v, d_mask;
  BackwardParams params;

  BackwardCall(DType dtype, int64_t b, int64_t hq, int64_t hkv, int64_t nq, int64_t nkv, int64_t d, bool with_mask) {
    q = make_host_tensor(dtype, {b, hq, nq, d}, Layout::bnhd);
    k = make_host_tensor(dtype, {b, hkv, nkv, d});
    v = make_host_tensor(dtype, {b, hkv, nkv, d}, Layout::bnhd);
    o = make_host_tensor(dtype, {b, hq, nq, d});
    lse = testing::make_host_lse(b, hq, nq);
    d_o = make_host_tensor(dtype, {b, hq, nq, d});
    d_q = make_host_tensor(dtype, {b, hq, nq, d}, Layout::bnhd);
    d_k = make_host_tensor(dtype, {b, hkv, nkv, d});
    d_v = make_host_tensor(dtype, {b, hkv, nkv, d});
    testing::fill_uniform(q, 1, -2.0f, 2.0f);
    testing::fill_uniform(k, 2, -1.0f, 1.0f);
    testing::fill_uniform(v, 3, -1.0f, 1.0f);
    testing::fill_uniform(d_o, 4, -1.0f, 1.0f);
    for (HostTensor* t : {&d_q, &d_k, &d_v}) testing::fill_nan(*t);
    params.q = q.tensor;
    params.k = k.tensor;
    params.v = v.tensor;
    params.o = o.tensor;
    params.lse = lse.tensor;
    params.d_o = d_o.tensor;
    params.d_q = d_q.tensor;
    params.d_k = d_k.tensor;
    params.d_v = d_v.tensor;
    if (with_mask) {
      mask = make_host_tensor(DType::f32, {b, 1, 1, nkv});
      testing::fill_uniform(mask, 5, -1.0f, 0.0f);
      d_mask = make_host_tensor(DType::f32, {b, 1, 1, nkv});
      testing::fill_nan(d_mask);
      params.mask = mask.tensor;
      params.d_mask = d_mask.tensor;
    }
    params.options.impl = Impl::cpu_reference;
    // o and lse: the forward's, on the same host tensors.
    ForwardParams forward;
    forward.q = q.tensor;
    forward.k = k.tensor;
    forward.v = v.tensor;
    forward.o = o.tensor;
    forward.lse = lse.tensor;
    forward.mask = params.mask;
    forward.options.impl = Impl::cpu_reference;
    EXPECT_TRUE(ffpa::forward(forward).ok());
  }
};

// The reference's gradients of the call, in double.
struct ReferenceGradients {
  std::vector<double> d_q, d_k, d_v, d_scores;
};

ReferenceGradients reference(const BackwardParams& params) {
  detail::BackwardProblem problem;
  EXPECT_TRUE(detail::validate_backward(params, &problem).ok());
  const detail::AttentionProblem& p = problem.forward;
  const size_t q_elements = static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.head_dim);
  const size_t kv_elements = static_cast<size_t>(p.batch * p.heads_kv * p.seq_kv * p.head_dim);
  std::vector<double> d_out(q_elements);
  size_t e = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t d = 0; d < p.head_dim; ++d) d_out[e++] = testing::element_as_double(params.d_o, {b, h, i, d});
  ReferenceGradients r{std::vector<double>(q_elements), std::vector<double>(kv_elements),
                       std::vector<double>(kv_elements),
                       std::vector<double>(static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.seq_kv))};
  std::vector<double> d_lse;
  if (params.d_lse.data)
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h)
        for (int64_t i = 0; i < p.seq_q; ++i) d_lse.push_back(testing::element_as_double(params.d_lse, {b, h, i}));
  detail::cpu_attention_backward_f64(p, d_out.data(), params.d_lse.data ? d_lse.data() : nullptr,
                                     detail::AttentionGradients{r.d_q.data(), r.d_k.data(), r.d_v.data(), r.d_scores.data()});
  return r;
}

// Every element of the [B, H, N, D] tensor equals the reference rounded to its dtype.
void expect_rounded(const Tensor& t, const std::vector<double>& want, const char* name) {
  size_t e = 0;
  int mismatches = 0;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t n = 0; n < t.shape[2]; ++n)
        for (int64_t d = 0; d < t.shape[3]; ++d) {
          const double w = want[e++];
          const float f = static_cast<float>(w);
          const double rounded = t.dtype == DType::bf16  ? detail::bf16_bits_to_float(detail::float_to_bf16_bits(f))
                                 : t.dtype == DType::f16 ? detail::half_bits_to_float(detail::float_to_half_bits(f))
                                 : t.dtype == DType::f32 ? static_cast<double>(f)
                                                         : w;
          const double got = testing::element_as_double(t, {b, h, n, d});
          if (got != rounded && mismatches++ < 3) {
            ADD_FAILURE() << name << "[" << b << "," << h << "," << n << "," << d << "] = " << got << ", want " << rounded;
          }
        }
  EXPECT_EQ(mismatches, 0) << name;
}

TEST(BackwardApi, WritesTheReferenceGradientsThroughTheOutputsStrides) {
  // f32 and f64: the CPU reference's own dtypes (gradient checks in double).
  for (DType dtype : {DType::bf16, DType::f16, DType::f32, DType::f64}) {
    BackwardCall call(dtype, 2, 4, 2, 13, 21, 40, /*with_mask=*/true);
    call.params.options.causal = Causal::bottom_right;
    call.params.options.dropout_p = 0.2f;
    call.params.options.dropout_seed = 7;
    call.params.options.dropout_offset = 12345;
    call.params.options.scale = 0.3f;
    const ReferenceGradients want = reference(call.params);
    const Status status = backward(call.params);
    ASSERT_TRUE(status.ok()) << status.message;
    expect_rounded(call.d_q.tensor, want.d_q, "d_q");
    expect_rounded(call.d_k.tensor, want.d_k, "d_k");
    expect_rounded(call.d_v.tensor, want.d_v, "d_v");
    // d_mask [B, 1, 1, Nkv]: each score's gradient summed over heads and rows.
    const int64_t batch = 2, heads = 4, rows = 13, keys = 21;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < keys; ++j) {
        double sum = 0.0;
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < rows; ++i) sum += want.d_scores[static_cast<size_t>(((b * heads + h) * rows + i) * keys + j)];
        EXPECT_NEAR(testing::element_as_double(call.d_mask.tensor, {b, 0, 0, j}), sum, 1e-6 * (1.0 + std::fabs(sum)))
            << "d_mask[" << b << ",0,0," << j << "]";
      }
  }
}

// The gradient of the lse (a loss reading it too) enters every gradient; it
// is read through its strides.
TEST(BackwardApi, TheLseGradientEntersTheGradients) {
  BackwardCall call(DType::f64, 2, 2, 1, 7, 9, 16, /*with_mask=*/true);
  call.params.options.causal = Causal::top_left;
  HostTensor d_lse = testing::make_host_tensor(DType::f32, {2, 2, 7, 1});  // rank-3 view below, row stride 1
  testing::fill_uniform(d_lse, 21, -1.0f, 1.0f);
  call.params.d_lse = d_lse.tensor;
  call.params.d_lse.rank = 3;
  const ReferenceGradients with_lse = reference(call.params);
  ASSERT_TRUE(backward(call.params).ok());
  expect_rounded(call.d_q.tensor, with_lse.d_q, "d_q");
  expect_rounded(call.d_k.tensor, with_lse.d_k, "d_k");
  expect_rounded(call.d_v.tensor, with_lse.d_v, "d_v");
  call.params.d_lse = Tensor{};
  const ReferenceGradients without = reference(call.params);
  EXPECT_NE(with_lse.d_q, without.d_q);
  EXPECT_EQ(with_lse.d_v, without.d_v);  // O does not depend on the lse's weight: d_v is the same
}

TEST(BackwardApi, TheCAbiComputesTheSameGradients) {
  BackwardCall call(DType::bf16, 1, 2, 1, 9, 17, 64, /*with_mask=*/false);
  HostTensor d_lse = testing::make_host_lse(1, 2, 9);
  testing::fill_uniform(d_lse, 22, -1.0f, 1.0f);
  call.params.d_lse = d_lse.tensor;
  const ReferenceGradients want = reference(call.params);
  ffpa_backward_params c{};
  c.q = testing::c_tensor(call.q.tensor);
  c.k = testing::c_tensor(call.k.tensor);
  c.v = testing::c_tensor(call.v.tensor);
  c.o = testing::c_tensor(call.o.tensor);
  c.lse = testing::c_tensor(call.lse.tensor);
  c.d_o = testing::c_tensor(call.d_o.tensor);
  c.d_q = testing::c_tensor(call.d_q.tensor);
  c.d_k = testing::c_tensor(call.d_k.tensor);
  c.d_v = testing::c_tensor(call.d_v.tensor);
  c.d_lse = testing::c_tensor(d_lse.tensor);
  c.options.impl = FFPA_IMPL_CPU_REFERENCE;
  size_t bytes = 1;
  char message[256] = {};
  ASSERT_EQ(ffpa_backward_workspace_size(&c, &bytes, message, sizeof message), FFPA_OK) << message;
  EXPECT_EQ(bytes, 0u);
  ASSERT_EQ(ffpa_backward(&c, message, sizeof message), FFPA_OK) << message;
  expect_rounded(call.d_q.tensor, want.d_q, "d_q");
  expect_rounded(call.d_k.tensor, want.d_k, "d_k");
  expect_rounded(call.d_v.tensor, want.d_v, "d_v");
  EXPECT_EQ(ffpa_backward(nullptr, message, sizeof message), FFPA_NULL_POINTER);
}

// Each refusal: the status, and nothing written.
void expect_refused(BackwardCall& call, StatusCode code) {
  const Status status = backward(call.params);
  EXPECT_EQ(status.code, code) << status_name(status.code) << ": " << status.message;
  EXPECT_FALSE(status.message.empty());
  for (const HostTensor* t : {&call.d_q, &call.d_k, &call.d_v}) {
    const Tensor& view = t->tensor;
    EXPECT_TRUE(std::isnan(testing::element_as_double(view, {0, 0, 0, 0})));
  }
}

TEST(BackwardApi, EachBadArgumentHasItsStatusAndWritesNothing) {
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.lse = Tensor{};
    expect_refused(call, StatusCode::null_pointer);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.d_o.dtype = DType::f16;
    expect_refused(call, StatusCode::dtype_mismatch);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.d_o.shape[2] = 7;
    expect_refused(call, StatusCode::shape_mismatch);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.d_k = call.params.k;  // writing the gradient over k
    expect_refused(call, StatusCode::output_overlaps_input);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.d_v = call.params.d_k;  // two gradients in one buffer
    expect_refused(call, StatusCode::output_overlaps_input);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.d_q.data = static_cast<uint16_t*>(call.params.d_q.data) + 1;  // 2 bytes past 16-byte alignment
    expect_refused(call, StatusCode::misaligned);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, true);
    call.params.d_mask.dtype = DType::bf16;
    expect_refused(call, StatusCode::dtype_mismatch);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.d_lse = call.lse.tensor;
    call.params.d_lse.dtype = DType::bf16;
    expect_refused(call, StatusCode::dtype_mismatch);
    call.params.d_lse.dtype = DType::f32;
    call.params.d_lse.shape[2] = 9;
    expect_refused(call, StatusCode::shape_mismatch);
    call.params.d_lse.shape[2] = 8;
    call.params.d_lse.data = static_cast<char*>(call.params.d_lse.data) + 2;
    expect_refused(call, StatusCode::misaligned);
    call.params.d_lse = call.params.d_q;  // the gradient of lse read from where d_q is written
    call.params.d_lse.dtype = DType::f32, call.params.d_lse.rank = 3;
    call.params.d_lse.shape[2] = 8, call.params.d_lse.stride[2] = 1;
    call.params.d_lse.stride[1] = 8, call.params.d_lse.stride[0] = 16;
    expect_refused(call, StatusCode::output_overlaps_input);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    HostTensor bool_mask = make_host_tensor(DType::boolean, {1, 1, 1, 8});
    testing::fill_bool(bool_mask, 9, 0.9);
    HostTensor d_mask = make_host_tensor(DType::boolean, {1, 1, 1, 8});
    call.params.mask = bool_mask.tensor;
    call.params.d_mask = d_mask.tensor;
    expect_refused(call, StatusCode::invalid_mask_layout);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.options.precision = Precision::fp8;
    expect_refused(call, StatusCode::invalid_option);
  }
  {
    BackwardCall call(DType::f16, 1, 2, 2, 8, 8, 32, false);
    call.params.options.accumulation = Accumulation::f16;
    expect_refused(call, StatusCode::unsupported_accumulation);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    call.params.options.impl = Impl::sm90_wgmma;
    expect_refused(call, StatusCode::impl_unavailable);
  }
  {
    BackwardCall call(DType::bf16, 1, 2, 2, 8, 8, 32, false);
    size_t bytes = 0;
    EXPECT_EQ(backward_workspace_size(call.params, nullptr).code, StatusCode::null_pointer);
    EXPECT_TRUE(backward_workspace_size(call.params, &bytes).ok());
    EXPECT_EQ(bytes, 0u);
  }
}

TEST(BackwardApi, AutomaticOnHostTensorsRunsTheCpuReference) {
  BackwardCall call(DType::bf16, 1, 1, 1, 5, 6, 16, false);
  call.params.options.impl = Impl::automatic;
  const ReferenceGradients want = reference(call.params);
  ASSERT_TRUE(backward(call.params).ok());
  expect_rounded(call.d_k.tensor, want.d_k, "d_k");
}

}  // namespace
}  // namespace ffpa
