#include "host/memory_space.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace ffpa::detail {
namespace {

struct Location {
  bool device = false;  // device or managed memory
  int device_id = -1;
};

// Pointers CUDA does not know (or no driver at all) are plain host memory.
Location locate(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error this query leaves behind
    return {};
  }
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
    return {true, attributes.device};
  }
  return {};
}

}  // namespace

Status common_memory_space(const AttentionProblem& problem, MemorySpace* space) {
  struct Named {
    const char* name;
    const void* pointer;
  };
  // q is located first; the others must be where it is (one query per pointer:
  // each is a driver call, and a small call's host time counts).
  const Named tensors[] = {{"k", problem.k}, {"v", problem.v}, {"o", problem.o},
                           {"mask", problem.mask}, {"lse", problem.lse}};
  const Location first = locate(problem.q);
  for (const Named& tensor : tensors) {
    if (tensor.pointer == nullptr) continue;
    const Location location = locate(tensor.pointer);
    if (location.device != first.device || location.device_id != first.device_id) {
      return {StatusCode::wrong_memory_space,
              std::string(tensor.name) + " is in " + (location.device ? "device" : "host") +
                  " memory" + (location.device ? " of device " + std::to_string(location.device_id) : "") +
                  " but q is in " + (first.device ? "device" : "host") + " memory" +
                  (first.device ? " of device " + std::to_string(first.device_id) : "")};
    }
  }
  if (first.device) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != first.device_id) {
      (void)cudaGetLastError();
      return {StatusCode::wrong_memory_space,
              "the tensors are on device " + std::to_string(first.device_id) +
                  " but the current device is " + std::to_string(current)};
    }
  }
  *space = first.device ? MemorySpace::device : MemorySpace::host;
  return {};
}

}  // namespace ffpa::detail
