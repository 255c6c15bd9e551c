// Validation of a forward call: every bad input gets its own status and a
// message naming the argument, before anything is launched or written.
#pragma once

#include "common/attention_problem.hpp"
#include "common/backward_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// Checks shapes, dtypes, strides, alignment, mask layout, options and
// overlaps (it never dereferences the tensors' pointers). On success fills
// *problem with the normalized description. Implementation availability and
// memory space are checked later, by dispatch.
Status validate_forward(const ForwardParams& params, AttentionProblem* problem);

// The same for a backward call: its forward call (q, k, v, o, mask, lse,
// options) as validate_forward sees it, lse required, then d_o (o's shape
// and dtype), the gradients (q's, k's, v's; d_mask the mask's, additive masks
// only) laid out like the forward's tensors, no output overlapping another
// tensor of the call, the inputs' precision.
Status validate_backward(const BackwardParams& params, BackwardProblem* problem);

}  // namespace ffpa::detail
