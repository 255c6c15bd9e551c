// device_shim.hpp plus what the sm90 family's kernel sources use beyond the
// portable kernels: the sm_90a feature macro (the kernel body is compiled
// under it), __grid_constant__ and the sm90 emulator.
#pragma once

#include "emulation/device_shim.hpp"
#include "emulation/sm90_emulator.hpp"

#define __CUDA_ARCH_FEAT_SM90_ALL 1
#undef __grid_constant__
#define __grid_constant__

inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, 4);
  return x;
}
