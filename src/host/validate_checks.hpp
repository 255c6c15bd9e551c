// The checks every validation shares: a tensor argument and its name, the
// status of a failing check, ranks, sizes, extents, self-aliasing, alignment
// and overlaps. Each validation file (forward, backward, FP8, sequence batch)
// composes them in its own fixed order. Nothing here dereferences a tensor.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// Returns the Status of a failing check from the enclosing function.
#define FFPA_RETURN_IF_ERROR(expr)     \
  do {                                 \
    Status status_ = (expr);           \
    if (!status_.ok()) return status_; \
  } while (0)

template <typename... Parts>
Status fail(StatusCode code, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  return Status{code, message.str()};
}

// A tensor argument and the name its messages use.
struct Arg {
  const Tensor& t;
  const char* name;
};

std::string dtype_name(DType dtype);
int64_t element_size(DType dtype);
std::string list_text(const int64_t* values, int32_t count);
// Number of elements; false when it does not fit in int64.
bool element_count(const Tensor& t, int64_t* count);
bool is_empty(const Tensor& t);

Status check_rank(Arg a, int32_t expected, const char* logical_shape);
// Sizes non-negative, the element count within int64.
Status check_sizes(Arg a);
// a.shape[ai] must equal ref.shape[ri]; `what` names the logical size.
Status check_same_size(Arg a, int32_t ai, Arg ref, int32_t ri, const char* what);

// The bytes a tensor's elements occupy, first to last inclusive, as addresses.
struct ByteRange {
  bool empty = true;
  uintptr_t first = 0, last = 0;
};
// Needs non-negative strides. Fails when the extent does not fit the address space.
Status byte_range(Arg a, ByteRange* range);
// An output of rank >= 3 whose first three dims map distinct elements to distinct memory.
Status check_self_aliasing(Arg a, int64_t width);
bool aligned(const void* pointer, uintptr_t bytes);
// The kernels move rows in 16-byte vectors: a row tensor's data and its
// strides over b, h and n must keep that alignment.
Status check_vector_alignment(Arg a);
Status check_overlap(const char* output, const ByteRange& out, const char* input, const ByteRange& in);

void copy_strides(const Tensor& t, int64_t (&stride)[3]);
// The b, h, n strides of a contiguous [B, H, N, D] tensor of t's shape.
void dense_strides(const Tensor& t, int64_t (&stride)[3]);

}  // namespace ffpa::detail
