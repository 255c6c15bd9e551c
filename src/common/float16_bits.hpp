// Raw fp16 / bf16 bits (how ffpa tensors hold them) <-> fp32 on the host, by
// the CUDA toolkit's conversions (host code of cuda_fp16.h / cuda_bf16.h,
// usable from g++): float -> 16 bits rounds to nearest even. NaNs come out
// canonical (fp16/bf16 0x7FFF, fp32 0x7FFFFFFF), sign and payload dropped.
// Same bits as the GPU's cvt for every input, NaNs included (checked on an
// H200 over all 2^32 floats and all 16-bit patterns).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace ffpa::detail {

inline float half_bits_to_float(uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

inline uint16_t float_to_half_bits(float f) { return static_cast<__half_raw>(__float2half_rn(f)).x; }

inline float bf16_bits_to_float(uint16_t bits) {
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

inline uint16_t float_to_bf16_bits(float f) {
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(f)).x;
}

}  // namespace ffpa::detail
