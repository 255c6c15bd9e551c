// Whether a kernel of this build runs on the current device: asked of the CUDA
// runtime (cudaFuncGetAttributes loads the kernel's image for the device, or
// has the driver compile its PTX), never restated from compute capabilities.
#pragma once

#include <atomic>
#include <cstdint>

#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// The devices (ordinals below 64) a kernel is known to run on. A memo of a
// fact fixed for the process (this build's images and the device), so that a
// call pays for the runtime's query once per kernel and device; it never
// changes what runs. One per kernel, with static storage duration.
struct KernelImageMemo {
  std::atomic<uint64_t> runnable_devices{0};
};

// OK when `kernel` (the address of a __global__ function) can be launched with
// `threads` threads per block on the current device, `device`; otherwise
// impl_unavailable naming `impl` and the reason (no image for the device, PTX
// the driver cannot compile, more registers per thread than a block of
// `threads` can have, no driver), or cuda_error for another failure.
Status kernel_runnable(const void* kernel, int threads, const char* impl, int device,
                       KernelImageMemo* memo);

}  // namespace ffpa::detail
