// FFPA_HOST_DEVICE: functions shared by the CPU reference and the CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define FFPA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FFPA_HOST_DEVICE inline
#endif
