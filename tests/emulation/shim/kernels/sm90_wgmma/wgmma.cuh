// Emulation shim of src/kernels/sm90_wgmma/wgmma.cuh: the same wrappers on the
// CPU emulator's warpgroup model (sm90_emulator.hpp), for any N the
// instruction has (the real header's asserts name the shapes it instantiates).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "emulation/sm90_emulator.hpp"
#include "kernels/common/element.cuh"

namespace ffpa::detail::sm90_wgmma {

template <typename Element, int N, bool kTransposeB, bool kTransposeA = false>
inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(ElementTraits<Element>::kBytes == 2, "16-bit operands: bf16 or fp16");
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "a wgmma N (the real header restricts it to its shapes)");
  ::ffpa::emulation::sm90::wgmma(ElementTraits<Element>::kIsBf16 ? ::ffpa::emulation::sm90::WgmmaKind::bf16
                                                                 : ::ffpa::emulation::sm90::WgmmaKind::f16,
                                 N, kTransposeB, desc_a, desc_b, accumulate != 0, d, kTransposeA);
}

template <typename Element, int N, bool kTransposeB>
inline void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  static_assert(ElementTraits<Element>::kBytes == 2, "16-bit operands: bf16 or fp16");
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "a wgmma N (the real header restricts it to its shapes)");
  ::ffpa::emulation::sm90::wgmma_rs(ElementTraits<Element>::kIsBf16 ? ::ffpa::emulation::sm90::WgmmaKind::bf16
                                                                    : ::ffpa::emulation::sm90::WgmmaKind::f16,
                                    N, kTransposeB, a, desc_b, accumulate != 0, d);
}

template <int N>
inline void wgmma_ss_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "a wgmma N");
  ::ffpa::emulation::sm90::wgmma(::ffpa::emulation::sm90::WgmmaKind::e4m3, N, false, desc_a, desc_b, accumulate != 0, d);
}

template <int N>
inline void wgmma_ss_s8(int32_t (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "a wgmma N");
  ::ffpa::emulation::sm90::wgmma(::ffpa::emulation::sm90::WgmmaKind::s8, N, false, desc_a, desc_b, accumulate != 0, d);
}

}  // namespace ffpa::detail::sm90_wgmma
