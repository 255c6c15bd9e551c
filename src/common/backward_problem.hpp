// The validated, normalized description of one backward call: the forward
// call it differentiates (q, k, v, o, mask, lse and the options), the
// gradient of o, and where the gradients go. Host validation produces it
// (host/validate.hpp); the implementations consume it.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"

namespace ffpa::detail {

struct BackwardProblem {
  AttentionProblem forward;  // its o and lse are the forward's outputs, read here
  const void* d_o = nullptr;
  void* d_q = nullptr;
  void* d_k = nullptr;
  void* d_v = nullptr;
  int64_t d_o_stride[3] = {}, d_q_stride[3] = {}, d_k_stride[3] = {}, d_v_stride[3] = {};  // b, h, n
  // An additive mask's gradient (null: not requested): the mask's dtype, its
  // logical sizes (1 where it broadcasts) and strides.
  void* d_mask = nullptr;
  int64_t d_mask_shape[4] = {}, d_mask_stride[4] = {};
  // The gradient of lse (null: zero), f32, b, h, i strides.
  const float* d_lse = nullptr;
  int64_t d_lse_stride[3] = {};
  // The gradient of the sinks (forward.sinks), f32 [Hq] (null: not requested).
  float* d_sinks = nullptr;
  int64_t d_sinks_stride = 0;
  // A sequence batch on the GPU: its plans (kernels/serving/plan.hpp) in the
  // workspace, written before the kernels run: the query-stationary kernels'
  // tiles and the key-stationary ones' (sm80_backward/arguments.cuh).
  const void* query_plan = nullptr;
  const void* key_plan = nullptr;
};

// Where a call's query rows lie in q, o, d_o, lse, d_lse and the backward's
// delta: batch entries of rows each (a dense call's B and Nq; a sequence
// batch's packed [1, total_q] or batched [B, Nq]), and its keys in k, v
// (packed [1, total_k], batched or dense [B, Nkv]). The kernels address a
// sequence's rows through sequence_at (common/sequence_batch.hpp); these are
// the tensors' extents (TMA maps, the preprocess's rows).
struct RowExtent {
  int64_t entries = 0, rows = 0;
};

FFPA_HOST_DEVICE RowExtent query_extent(const AttentionProblem& p) {
  if (p.sequences.packed_q()) return {1, p.sequences.packed_rows_q};
  return {p.batch, p.seq_q};  // a batch's batched queries: seq_q is Nq
}

FFPA_HOST_DEVICE RowExtent key_extent(const AttentionProblem& p) {
  if (p.sequences.packed_k()) return {1, p.sequences.packed_rows_k};
  return {p.batch, p.sequences.active ? p.sequences.keys_per_sequence : p.seq_kv};
}

}  // namespace ffpa::detail
