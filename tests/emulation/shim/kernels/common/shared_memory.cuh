// Emulation shim of src/kernels/common/shared_memory.cuh: shared-window
// addresses are offsets from the running CTA's shared memory.
#pragma once

#include <cstdint>

#include "emulation/sm80_emulator.hpp"

namespace ffpa::detail {

inline uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(static_cast<const unsigned char*>(pointer) - ::ffpa::emulation::shared_memory_base());
}

}  // namespace ffpa::detail
