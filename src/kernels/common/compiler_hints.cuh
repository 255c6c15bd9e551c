// Register-pressure tools shared by the GPU families.
#pragma once

namespace ffpa::detail {

// A value the compiler must treat as unknown at this point: what is derived
// from it is computed here, not hoisted out of the enclosing loops (where it
// would pin registers next to the O accumulator for the whole kernel).
template <typename T>
__device__ __forceinline__ T opaque(T value) {
  if constexpr (sizeof(T) == 8) {
    asm volatile("" : "+l"(value));
  } else {
    asm volatile("" : "+r"(value));
  }
  return value;
}

}  // namespace ffpa::detail
