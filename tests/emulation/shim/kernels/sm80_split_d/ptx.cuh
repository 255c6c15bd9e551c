// Emulation shim of src/kernels/sm80_split_d/ptx.cuh: the same wrappers on the
// emulator (cp.async lands when its group is waited for).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "emulation/sm80_emulator.hpp"

namespace ffpa::detail::sm80_split_d {

inline void cp_async_16(uint32_t dst, const void* src, bool valid) { ::ffpa::emulation::cp_async(dst, src, valid, 16); }
inline uint4 ld_shared_16(uint32_t src) {
  uint4 v;
  std::memcpy(&v, ::ffpa::emulation::shared_memory_base() + src, 16);
  return v;
}

inline void st_shared_16(uint32_t dst, const uint32_t (&words)[4]) {
  std::memcpy(::ffpa::emulation::shared_memory_base() + dst, words, 16);
}

inline void cp_async_commit() { ::ffpa::emulation::cp_async_commit(); }

template <int kPending>
inline void cp_async_wait() {
  ::ffpa::emulation::cp_async_wait(kPending);
}

inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) { ::ffpa::emulation::ldmatrix_x4(r, addr, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) { ::ffpa::emulation::ldmatrix_x4(r, addr, true); }

template <typename Element>
inline void mma_f32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::ffpa::emulation::mma_m16n8k16(
      d, a, b0, b1,
      std::is_same_v<Element, __nv_bfloat16> ? ::ffpa::emulation::MmaType::bf16 : ::ffpa::emulation::MmaType::f16);
}

inline void mma_f16(uint32_t (&d)[2], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::ffpa::emulation::mma_m16n8k16_f16(d, a, b0, b1);
}

inline float2 unpack_half2(uint32_t r) {
  __half2 h;
  std::memcpy(&h, &r, 4);
  return __half22float2(h);
}

}  // namespace ffpa::detail::sm80_split_d
