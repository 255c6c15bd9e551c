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

}  // namespace ffpa::detail

// Returns the Status of a failing CUDA call from the enclosing function.
#define FFPA_RETURN_IF_CUDA_ERROR(call)                                     \
  do {                                                                      \
    const ::ffpa::Status ffpa_status_ = ::ffpa::detail::cuda_status((call), #call); \
    if (!ffpa_status_.ok()) return ffpa_status_;                            \
  } while (0)
