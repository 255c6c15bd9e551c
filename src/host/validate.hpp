// Validation of a forward call: every bad input gets its own status and a
// message naming the argument, before anything is launched or written.
#pragma once

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// Checks shapes, dtypes, strides, alignment, mask layout, options and
// overlaps (it never dereferences the tensors' pointers). On success fills
// *problem with the normalized description. Implementation availability and
// memory space are checked later, by dispatch.
Status validate_forward(const ForwardParams& params, AttentionProblem* problem);

}  // namespace ffpa::detail
