// device_shim.hpp plus what the sm90 family's kernel sources use beyond the
// portable kernels: the sm_90a feature macro (the kernel body is compiled
// under it), __grid_constant__ and the sm90 emulator.
#pragma once

#include "emulation/device_shim.hpp"
#include "emulation/sm90_emulator.hpp"

#define __CUDA_ARCH_FEAT_SM90_ALL 1
#undef __grid_constant__
#define __grid_constant__

