// Emulation shim of src/kernels/common/compiler_hints.cuh: no compiler to hint.
#pragma once

namespace ffpa::detail {

template <typename T>
inline T opaque(T value) {
  return value;
}

}  // namespace ffpa::detail
