// Included before the kernel sources when they are compiled as host code for
// the CPU emulation (sm80_emulator.hpp): the CUDA built-ins they use, mapped
// to the emulator. The CUDA headers come first (their host declarations), the
// macros after them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "emulation/sm80_emulator.hpp"

#undef __launch_bounds__
#define __launch_bounds__(...)
#define threadIdx (::ffpa::emulation::thread_index())
#define blockIdx (::ffpa::emulation::block_index())
#define blockDim (::ffpa::emulation::block_dim())

inline void __syncthreads() { ::ffpa::emulation::sync_threads(); }

// The 32-bit reinterpretations, as memcpy.
template <typename To, typename From>
To bits_as(From from) {
  static_assert(sizeof(To) == 4 && sizeof(From) == 4, "32-bit reinterpretations");
  To to;
  std::memcpy(&to, &from, 4);
  return to;
}

// 32-bit shuffles (bits_as asserts the size); a 64-bit one as two, as the
// hardware does.
template <typename T>
T __shfl_sync(unsigned, T value, int source_lane, int width = 32) {
  if constexpr (sizeof(T) == 8) {
    uint32_t half[2];
    std::memcpy(half, &value, 8);
    for (uint32_t& h : half) h = ::ffpa::emulation::shuffle(h, source_lane, width);
    T to;
    std::memcpy(&to, half, 8);
    return to;
  } else {
    return bits_as<T>(::ffpa::emulation::shuffle(bits_as<uint32_t>(value), source_lane, width));
  }
}

template <typename T>
T __shfl_xor_sync(unsigned, T value, int lane_mask, int width = 32) {
  return bits_as<T>(::ffpa::emulation::shuffle_xor(bits_as<uint32_t>(value), lane_mask, width));
}

inline void __syncwarp(unsigned = 0xffffffffu) { ::ffpa::emulation::sync_warp(); }
inline int __any_sync(unsigned, int predicate) { return ::ffpa::emulation::any(predicate != 0); }

inline unsigned __float_as_uint(float x) { return bits_as<unsigned>(x); }
inline float __uint_as_float(unsigned u) { return bits_as<float>(u); }
inline int __float_as_int(float x) { return bits_as<int>(x); }
inline float __int_as_float(int i) { return bits_as<float>(i); }

// Fibers switch only at collectives: a read-modify-write is atomic here.
inline float atomicAdd(float* address, float value) {
  const float old = *address;
  *address = old + value;
  return old;
}

template <typename T>
T __ldg(const T* p) {
  return *p;
}

using std::max;
using std::min;
