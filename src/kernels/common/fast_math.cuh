// Fast math the kernels share, as single instructions.
#pragma once

namespace ffpa::detail {

// exp2 on the MUFU unit alone: exp2f adds a subnormal fix-up around it (a
// compare and two predicated multiplies, 5 instructions an element instead of
// 2); here results below 2^-126 flush to 0, which no softmax sum misses.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// tanh on the MUFU unit (sm_75+): max relative error about 2^-11, below the
// bf16 rounding of the scores it caps.
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ffpa::detail
