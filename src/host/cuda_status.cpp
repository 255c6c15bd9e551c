// Which CUDA errors mean "this device cannot run this build's kernels", and
// what to tell the caller about them.
#include "host/cuda_status.hpp"

#include <string>

namespace ffpa::detail {
namespace {

// 13000 -> "13.0" (cudaDriverGetVersion's and cudaRuntimeGetVersion's encoding).
std::string cuda_version(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// What a caller can do about an is_device_unavailable error.
std::string remedy(cudaError_t error) {
  switch (error) {
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
      return "this build has no kernel image this device loads: rebuild with the device's "
             "architecture in CMAKE_CUDA_ARCHITECTURES, or with PTX of an older one "
             "(docs: README, 'Build')";
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
      return "the driver cannot compile this build's PTX for this device: update the driver, or "
             "rebuild with the device's architecture in CMAKE_CUDA_ARCHITECTURES";
    case cudaErrorLaunchOutOfResources:
    case cudaErrorInvalidClusterSize:
      return "the kernel asks for more registers, threads or cluster resources than this device "
             "gives it";
    default:
      return driver_problem(error);
  }
}

}  // namespace

bool is_device_unavailable(cudaError_t error) {
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidKernelImage:
    case cudaErrorInvalidPtx:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorJitCompilerNotFound:
    case cudaErrorJitCompilationDisabled:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorInvalidClusterSize:
      return true;
    default:
      return false;
  }
}

std::string driver_problem(cudaError_t error) {
  switch (error) {
    case cudaErrorNoDevice:
      return "no CUDA device is visible";
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver: {
      int driver = 0, runtime = 0;
      if (cudaDriverGetVersion(&driver) != cudaSuccess ||
          cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
        (void)cudaGetLastError();
        return "the CUDA driver is older than this library's CUDA runtime: update the driver";
      }
      if (driver == 0) return "no CUDA driver is installed";
      return "the CUDA driver supports CUDA " + cuda_version(driver) +
             ", older than the CUDA runtime " + cuda_version(runtime) +
             " this library was built with: update the driver";
    }
    case cudaErrorSystemDriverMismatch:
      return "the CUDA driver library and the kernel module are of different versions";
    case cudaErrorCompatNotSupportedOnDevice:
      return "the CUDA forward-compatibility driver does not support this device";
    default:
      return cudaGetErrorString(error);
  }
}

Status device_status(cudaError_t error, const char* impl, const char* what) {
  if (!is_device_unavailable(error)) return cuda_status(error, what);
  return {StatusCode::impl_unavailable, std::string("impl ") + impl + " cannot run on this device: " +
                                            what + " returned " + cudaGetErrorName(error) + ": " +
                                            remedy(error)};
}

}  // namespace ffpa::detail
