// The 32-bit shared-window address of a shared-memory pointer, the operand
// form of every PTX instruction that names shared memory.
#pragma once

#include <cstdint>

namespace ffpa::detail {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

}  // namespace ffpa::detail
