// Turning CUDA runtime errors into ffpa statuses.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

inline Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return {};
  return {StatusCode::cuda_error,
          std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")"};
}

// Whether a CUDA error says that this device cannot run this build's kernels,
// as opposed to a failure of the call's own work or a broken context: no
// device or no driver, a driver older than the library's CUDA runtime, no
// kernel image the device loads (SASS for another architecture, PTX the
// driver cannot compile), a launch asking for more resources (registers,
// cluster size) than the device has. None of them is sticky: the context
// stays usable, and the caller may run something else (the Python package's
// impl="auto" runs PyTorch's SDPA).
bool is_device_unavailable(cudaError_t error);

// cuda_status, except that an is_device_unavailable error is impl_unavailable,
// naming the implementation, the error and what to do about it.
Status device_status(cudaError_t error, const char* impl, const char* what);

// Why the CUDA runtime cannot use a device (an is_device_unavailable error of
// a device query such as cudaGetDevice), in words: no driver, or the driver's
// CUDA version against the runtime's.
std::string driver_problem(cudaError_t error);

}  // namespace ffpa::detail

// Returns the Status of a failing CUDA call from the enclosing function.
#define FFPA_RETURN_IF_CUDA_ERROR(call)                                     \
  do {                                                                      \
    const ::ffpa::Status ffpa_status_ = ::ffpa::detail::cuda_status((call), #call); \
    if (!ffpa_status_.ok()) return ffpa_status_;                            \
  } while (0)

// The same for a call whose failure can mean that the device cannot run the
// implementation `impl` (device_status): a kernel launch, a kernel attribute.
// A failure's non-sticky error is cleared, so that no later launch check
// reports it as its own.
#define FFPA_RETURN_IF_DEVICE_ERROR(impl, call)                                     \
  do {                                                                              \
    const cudaError_t ffpa_error_ = (call);                                         \
    if (ffpa_error_ != cudaSuccess) {                                               \
      (void)cudaGetLastError();                                                     \
      return ::ffpa::detail::device_status(ffpa_error_, impl, #call);               \
    }                                                                               \
  } while (0)
