// Bad serving calls (a sequence batch, a window, a softcap, sinks, an e4m3
// cache): each fault gets its own status and a message naming the argument,
// the same through the C ABI, and writes nothing (the poisoned output stays).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "support/serving_inputs.hpp"

namespace ffpa {
namespace {

using testing::KeyForm;
using testing::ServingCase;
using testing::ServingInputs;

ServingCase paged_case() {
  ServingCase c;
  c.keys = KeyForm::paged;
  c.page_size = 4;
  c.seq_q = {3, 1, 2};
  c.seq_kv = {6, 9, 2};
  c.seqused = true;
  c.causal = Causal::bottom_right;
  c.dtype = DType::bf16;
  return c;
}

int32_t* i32(const testing::HostTensor& t) { return static_cast<int32_t*>(t.tensor.data); }

bool all_nan(const testing::HostTensor& t) {
  const auto* bits = static_cast<const uint16_t*>(t.tensor.data);
  for (int64_t e = 0; e < t.numel(); ++e)
    if (bits[e] != 0x7FC0u) return false;
  return true;
}

// Breaks a fresh call with `fault`, expects `code` with `words` in its
// message, and an untouched output.
void expect_refused(const ServingCase& c, const std::function<void(ServingInputs&)>& fault, StatusCode code,
                    const std::string& words) {
  ServingInputs in = testing::make_serving_inputs(c);
  fault(in);
  const Status status = forward(in.params);
  EXPECT_EQ(status.code, code) << status_name(status.code) << ": " << status.message;
  EXPECT_NE(status.message.find(words), std::string::npos) << status.message;
  EXPECT_TRUE(all_nan(in.o)) << "a refused call wrote its output";
}

TEST(ServingValidation, LengthsThatDoNotHold) {
  const ServingCase c = paged_case();
  expect_refused(c, [](ServingInputs& in) { i32(in.cu_q)[2] = 1; }, StatusCode::invalid_sequence_lengths,
                 "non-decreasing");
  expect_refused(c, [](ServingInputs& in) { i32(in.cu_q)[3] = 99; }, StatusCode::invalid_sequence_lengths,
                 "packed rows");
  expect_refused(c, [](ServingInputs& in) { i32(in.used)[1] = 1000; }, StatusCode::invalid_sequence_lengths,
                 "seqused_k[1]");
  expect_refused(c, [](ServingInputs& in) { i32(in.used)[0] = -1; }, StatusCode::invalid_sequence_lengths,
                 "seqused_k[0]");
  expect_refused(c, [](ServingInputs& in) { in.batch.max_seqlen_q = 2; }, StatusCode::invalid_sequence_lengths,
                 "max_seqlen_q");
  expect_refused(c, [](ServingInputs& in) { in.batch.max_seqlen_k = 8; }, StatusCode::invalid_sequence_lengths,
                 "max_seqlen_k");
  ServingCase batched_q = c;  // batched queries: a shape beyond the bound, refused by validation
  batched_q.packed_q = false;
  batched_q.seq_q = {2, 2, 2};
  expect_refused(batched_q, [](ServingInputs& in) { in.batch.max_seqlen_q = 1; },
                 StatusCode::invalid_sequence_lengths, "max_seqlen_q = 1");
  ServingCase packed = c;
  packed.keys = KeyForm::packed;
  expect_refused(packed, [](ServingInputs& in) { i32(in.cu_k)[1] = i32(in.cu_k)[2] + 1; },
                 StatusCode::invalid_sequence_lengths, "cu_seqlens_k");
}

// A batch without query rows runs nothing, and its bad lengths are refused
// all the same (host memory: checked before the empty call returns).
TEST(ServingValidation, ACallWithoutQueriesChecksItsLengths) {
  ServingCase c = paged_case();
  c.seq_q = {0, 0, 0};
  {
    ServingInputs in = testing::make_serving_inputs(c);
    const Status status = forward(in.params);
    EXPECT_TRUE(status.ok()) << status.message;
  }
  expect_refused(c, [](ServingInputs& in) { i32(in.cu_q)[2] = 1; }, StatusCode::invalid_sequence_lengths,
                 "non-decreasing");
  expect_refused(c, [](ServingInputs& in) { i32(in.used)[1] = 1000; }, StatusCode::invalid_sequence_lengths,
                 "seqused_k[1]");
}

TEST(ServingValidation, BlockIdsOutsideTheCache) {
  const ServingCase c = paged_case();
  expect_refused(c, [](ServingInputs& in) { i32(in.table)[in.table.tensor.stride[0] + 2] = 9999; },
                 StatusCode::invalid_block_table, "block_table[1][2]");
  expect_refused(c, [](ServingInputs& in) { i32(in.table)[0] = -1; }, StatusCode::invalid_block_table,
                 "block_table[0][0]");
}

TEST(ServingValidation, WindowSoftcapSinksDescales) {
  const ServingCase c = paged_case();
  expect_refused(c, [](ServingInputs& in) { in.params.options.window_left = -2; }, StatusCode::invalid_window,
                 "window_left = -2");
  expect_refused(c, [](ServingInputs& in) { in.params.options.window_right = -5; }, StatusCode::invalid_window,
                 "window_right = -5");
  expect_refused(c, [](ServingInputs& in) { in.params.options.softcap = -1.0f; }, StatusCode::invalid_option,
                 "softcap");
  expect_refused(c, [](ServingInputs& in) { in.params.options.softcap = std::numeric_limits<float>::quiet_NaN(); },
                 StatusCode::invalid_option, "softcap");
  ServingCase sinks = c;
  sinks.sinks = true;
  expect_refused(sinks, [](ServingInputs& in) { in.params.sinks.shape[0] = 3; }, StatusCode::shape_mismatch,
                 "sinks.shape[0]");
  expect_refused(sinks, [](ServingInputs& in) { in.params.sinks.dtype = DType::f16; }, StatusCode::unsupported_dtype,
                 "sinks.dtype");
  expect_refused(sinks, [](ServingInputs& in) { in.params.sinks.stride[0] = -1; }, StatusCode::invalid_stride,
                 "sinks.stride");
  ServingCase e4m3 = c;
  e4m3.e4m3_kv = true;
  expect_refused(e4m3, [](ServingInputs& in) { in.params.k_descale.shape[0] = 7; }, StatusCode::shape_mismatch,
                 "k_descale.shape[0]");
  expect_refused(e4m3, [](ServingInputs& in) { in.params.v.dtype = DType::bf16; }, StatusCode::dtype_mismatch,
                 "v.dtype");
  ServingCase narrow = e4m3;
  narrow.dim = narrow.value_dim = 24;
  expect_refused(narrow, [](ServingInputs&) {}, StatusCode::unsupported_head_dim, "multiples of 16");
  expect_refused(c, [](ServingInputs& in) { in.params.k_descale = in.params.q; }, StatusCode::unsupported_dtype,
                 "k_descale.dtype");
}

TEST(ServingValidation, TensorsOfTheBatch) {
  const ServingCase c = paged_case();
  expect_refused(c, [](ServingInputs& in) { in.batch.cu_seqlens_q.dtype = DType::f32; },
                 StatusCode::unsupported_dtype, "cu_seqlens_q.dtype");
  expect_refused(c, [](ServingInputs& in) { in.batch.block_table.rank = 1; }, StatusCode::invalid_rank,
                 "block_table.rank");
  expect_refused(c, [](ServingInputs& in) { in.batch.block_table.shape[0] = 2; }, StatusCode::shape_mismatch,
                 "block_table.shape[0]");
  expect_refused(c, [](ServingInputs& in) { in.batch.seqused_k.shape[0] = 4; }, StatusCode::shape_mismatch,
                 "seqused_k.shape[0]");
  expect_refused(c, [](ServingInputs& in) { in.batch.max_seqlen_k = -3; }, StatusCode::invalid_option,
                 "max_seqlen_k");
  expect_refused(c, [](ServingInputs& in) { in.params.q.shape[0] = 2; }, StatusCode::shape_mismatch, "q.shape[0]");
  expect_refused(c, [](ServingInputs& in) { in.params.v.shape[2] = 5; }, StatusCode::shape_mismatch, "v.shape[2]");
  expect_refused(c, [](ServingInputs& in) { in.batch.cu_seqlens_q.stride[0] = -1; }, StatusCode::invalid_stride,
                 "cu_seqlens_q.stride");
  expect_refused(c,
                 [](ServingInputs& in) {
                   in.batch.block_table.data = static_cast<char*>(in.batch.block_table.data) + 2;
                 },
                 StatusCode::misaligned, "block_table.data");
  ServingCase batched = c;
  batched.keys = KeyForm::batched;
  expect_refused(batched, [](ServingInputs& in) { in.params.k.shape[0] = 1, in.params.v.shape[0] = 1; },
                 StatusCode::shape_mismatch, "k.shape[0]");
}

TEST(ServingValidation, WhatABatchDoesNotServe) {
  const ServingCase c = paged_case();
  testing::HostTensor mask = testing::make_host_tensor(DType::boolean, {1, 1, 1, 1});
  expect_refused(c, [&](ServingInputs& in) { in.params.mask = mask.tensor; }, StatusCode::invalid_mask_layout,
                 "mask with a sequence batch");
  expect_refused(c, [](ServingInputs& in) { in.params.options.dropout_p = 0.1f; }, StatusCode::invalid_dropout,
                 "sequence batch");
  expect_refused(c, [](ServingInputs& in) { in.params.options.precision = Precision::fp8; },
                 StatusCode::invalid_option, "precision fp8");
}

TEST(ServingValidation, OutputsOverlappingTheBatch) {
  const ServingCase c = paged_case();
  expect_refused(c, [](ServingInputs& in) { in.params.lse.data = in.batch.block_table.data; },
                 StatusCode::output_overlaps_input, "block_table");
}

TEST(ServingValidation, CAbiGivesTheSameStatus) {
  ServingInputs in = testing::make_serving_inputs(paged_case());
  i32(in.table)[0] = 12345;
  ffpa_sequence_batch batch;
  std::memset(&batch, 0, sizeof batch);
  auto to_c = [](const Tensor& t) {
    ffpa_tensor c;
    std::memset(&c, 0, sizeof c);
    c.data = t.data, c.dtype = static_cast<int32_t>(t.dtype), c.rank = t.rank;
    for (int d = 0; d < 4; ++d) c.shape[d] = t.shape[d], c.stride[d] = t.stride[d];
    return c;
  };
  batch.cu_seqlens_q = to_c(in.batch.cu_seqlens_q);
  batch.block_table = to_c(in.batch.block_table);
  batch.seqused_k = to_c(in.batch.seqused_k);
  ffpa_forward_params p;
  std::memset(&p, 0, sizeof p);
  p.q = to_c(in.params.q), p.k = to_c(in.params.k), p.v = to_c(in.params.v), p.o = to_c(in.params.o);
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  p.options.causal = FFPA_CAUSAL_BOTTOM_RIGHT;
  p.sequences = &batch;
  char message[256];
  EXPECT_EQ(ffpa_forward(&p, message, sizeof message), FFPA_INVALID_BLOCK_TABLE);
  EXPECT_STREQ(ffpa_status_name(FFPA_INVALID_BLOCK_TABLE), "invalid_block_table");
  EXPECT_STREQ(ffpa_status_name(FFPA_INVALID_SEQUENCE_LENGTHS), "invalid_sequence_lengths");
  EXPECT_STREQ(ffpa_status_name(FFPA_INVALID_WINDOW), "invalid_window");
  EXPECT_TRUE(all_nan(in.o));
}

}  // namespace
}  // namespace ffpa
