// Emulation shim of src/kernels/common/fast_math.cuh: ex2.approx.ftz's
// result flushes below 2^-126 (its approximation error, 2 ulp, is not
// modelled); tanh.approx is std::tanh.
#pragma once

#include <cmath>

namespace ffpa::detail {

inline float fast_exp2(float x) {
  const float y = std::exp2(x);
  return y < 0x1p-126f ? 0.0f : y;
}

// tanh.approx.f32 as the exact tanh (its 2^-11 error is not modelled).
inline float fast_tanh(float x) { return std::tanh(x); }

}  // namespace ffpa::detail
