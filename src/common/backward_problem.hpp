// The validated, normalized description of one backward call: the forward
// call it differentiates (q, k, v, o, mask, lse and the options), the
// gradient of o, and where the gradients go. Host validation produces it
// (host/validate.hpp); the implementations consume it.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"

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
};

}  // namespace ffpa::detail
