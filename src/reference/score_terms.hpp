// What the CPU reference adds to one query row's scaled scores before the
// softmax: the causal limit, the window and the user's mask. Shared by the fp64 reference
// (cpu_attention.cpp) and the model of the quantized path
// (fp8_quantization.cpp), so that both mask exactly alike.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"

namespace ffpa::detail {

// One past the last key row i may attend before the mask (the causal limit
// and the window's right bound: attended_keys(p, i, Nq, Nkv).end). A window's
// left bound starts the range later (attended_keys(...).first).
int64_t visible_keys(const AttentionProblem& p, int64_t i);

// Mask row (b, h, i) for keys [0, n) as an additive bias: the mask value, or
// 0 (attend) / -inf (excluded) for a boolean mask; all 0 without a mask.
void mask_bias(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t n, double* bias);

}  // namespace ffpa::detail
