// The CPU reference's backward pass (issue 13's oracle; docs/kernels/backward_plan.md):
// the gradients of exact attention in double, with every semantic of the
// forward reference (masks, causal alignments, GQA, dropout's keep mask from
// the same stream, scale, windows, softcap, sinks and sequence batches).
// ffpa::backward's CPU implementation (cpu_attention_backward) runs it on the
// call's tensors.
#pragma once

#include "common/attention_problem.hpp"
#include "common/backward_problem.hpp"

namespace ffpa::detail {

// Where the gradients go, contiguous fp64 arrays: d_q [B, Hq, Nq, D],
// d_k [B, Hkv, Nkv, D], d_v [B, Hkv, Nkv, Dv] and, when not null, d_scores
// [B, Hq, Nq, Nkv], the gradient with respect to each scaled score plus its
// mask term (an additive mask's gradient, before summing over the dims the
// mask broadcasts along; 0 for keys a row does not attend).
struct AttentionGradients {
  double* d_q = nullptr;
  double* d_k = nullptr;
  double* d_v = nullptr;
  double* d_scores = nullptr;
  double* d_sinks = nullptr;  // [Hq]: the gradient of the problem's sinks (when not null)
};

// The gradients of sum(O * d_out) + sum(LSE * d_lse) for the problem's q, k,
// v, mask and options (its o and lse are not read), d_out contiguous
// [B, Hq, Nq, Dv] and d_lse [B, Hq, Nq] (null: zero) in double.
// Overwrites every element of the gradients. A sequence batch's arrays are
// its tensors' extents (backward_problem.hpp: query_extent for d_out, d_lse
// and d_q, key_extent for d_k and d_v): rows of no sequence are neither read
// nor written, and it has no d_scores (no mask). num_threads <= 0: hardware
// threads; the result does not depend on it.
void cpu_attention_backward_f64(const AttentionProblem& problem, const double* d_out, const double* d_lse,
                                const AttentionGradients& grads, int num_threads = 0);

// ffpa::backward on host tensors: d_o read in its dtype, the gradients
// computed in double (cpu_attention_backward_f64) and written rounded to the
// outputs' dtypes, an additive mask's gradient summed over the dims the mask
// broadcasts along, the sinks' over every row. A sequence batch one sequence
// at a time (its lengths checked by the caller: check_sequence_data); rows of
// no sequence are not written. Throws std::bad_alloc when host memory runs out.
void cpu_attention_backward(const BackwardProblem& problem, int num_threads = 0);

}  // namespace ffpa::detail
