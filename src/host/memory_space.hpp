// Where the tensors of a call live: host memory, or device memory of the
// current device. Decides which implementations can serve the call.
#pragma once

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

enum class MemorySpace { host, device };

// The memory space shared by every tensor of the problem, or an error
// (wrong_memory_space) naming the tensor that differs, or a pointer on a
// device other than the current one.
Status common_memory_space(const AttentionProblem& problem, MemorySpace* space);

// The same over any tensors, the first one's space the reference (null
// pointers skipped but the first's).
struct NamedPointer {
  const char* name;
  const void* pointer;
};
Status common_memory_space(const NamedPointer* tensors, int count, MemorySpace* space);

}  // namespace ffpa::detail
