// Whether an output's layout maps two different elements to the same memory:
// rows of `width` contiguous elements placed by up to three (size, stride)
// dims. Validation rejects outputs that alias themselves (a write would race).
#pragma once

#include <cstdint>

namespace ffpa::detail {

enum class Aliasing { none, found, undecided };

struct Dim {
  int64_t size, stride;  // stride >= 0; extents fit int64 (validation checks both first)
};

// Exact: is there a nonzero index difference (d0, d1, d2), |di| < size_i, with
// |d0 s0 + d1 s1 + d2 s2| < width? Nested layouts (each stride beyond the
// reach of the smaller ones: dense and padded) are decided at once. Others by
// a search over the two dims whose candidates are fewest, the third solved as
// an interval: the largest stride only meets the others' reach for a few
// multiples, so interleaved layouts of 4097^3 rows take thousands of steps.
// Beyond 2^24 steps the answer is `undecided` (an error for the caller: such
// a layout interleaves near-equal strides over thousands of rows each).
Aliasing find_self_aliasing(const Dim (&dims)[3], int64_t width);

}  // namespace ffpa::detail
