// Whether a kernel of this build runs on the current device: asked of the CUDA
// runtime (cudaFuncGetAttributes loads the kernel's image for the device, or
// has the driver compile its PTX), never restated from compute capabilities.
#pragma once

#include <cuda_runtime_api.h>

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

// The devices on which a kernel's dynamic shared memory opt-in
// (cudaFuncAttributeMaxDynamicSharedMemorySize, one fixed size per kernel) has
// been set. Setting it costs 0.5 us of host time per call on an H200
// (bench/host_launch_parts.cu), and the runtime keeps it per function and
// context: set once per device, and again if a launch fails (a device reset
// since then drops it). One per kernel, with static storage duration.
struct SharedMemoryOptIn {
  std::atomic<uint64_t> devices{0};
};

// Sets `kernel`'s opt-in to `bytes` on the current device, `device`, unless
// the memo says it is set; cudaSuccess or the runtime's error.
cudaError_t opt_in_shared_memory(const void* kernel, int bytes, int device, SharedMemoryOptIn* memo);

// Forgets the opt-in on `device` (after a failed launch: it is set again before the retry).
void forget_shared_memory_opt_in(int device, SharedMemoryOptIn* memo);

}  // namespace ffpa::detail
