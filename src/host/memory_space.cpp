#include "host/memory_space.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "host/cuda_status.hpp"

namespace ffpa::detail {
namespace {

struct Location {
  bool device = false;  // device or managed memory
  int device_id = -1;
  cudaError_t error = cudaSuccess;  // the runtime could not say (a driver too old)
};

// Whether a failing pointer query still tells that no pointer is in device
// memory: there is no driver, or no device, so there is no device memory.
bool no_device_memory(cudaError_t error) {
  if (error == cudaErrorNoDevice) return true;
  int driver = 0;
  const bool no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
  (void)cudaGetLastError();
  return no_driver;
}

// Plain host memory for pointers CUDA does not know and where there is no
// driver or no device at all. A query that fails because the runtime cannot
// use the driver (a driver older than the runtime, which torch's own runtime
// may work with) leaves the memory unknown: it is never read as host memory.
Location locate(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer); error != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error this query leaves behind
    if (!is_device_unavailable(error) || no_device_memory(error)) return {};
    return {false, -1, error};
  }
  if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
    return {true, attributes.device};
  }
  return {};
}

// A Location's error (is_device_unavailable) as the call's status.
Status unknown_location(const char* name, cudaError_t error) {
  return {StatusCode::impl_unavailable,
          std::string("cannot tell whether ") + name +
              " is in host or device memory: cudaPointerGetAttributes returned " +
              cudaGetErrorName(error) + ": " + driver_problem(error)};
}

}  // namespace

Status common_memory_space(const NamedPointer* tensors, int count, MemorySpace* space) {
  // The first is located first; the others must be where it is (one query per
  // pointer: each is a driver call, and a small call's host time counts).
  const Location first = locate(tensors[0].pointer);
  if (first.error != cudaSuccess) return unknown_location(tensors[0].name, first.error);
  for (int i = 1; i < count; ++i) {
    const NamedPointer& tensor = tensors[i];
    if (tensor.pointer == nullptr) continue;
    const Location location = locate(tensor.pointer);
    if (location.error != cudaSuccess) return unknown_location(tensor.name, location.error);
    if (location.device != first.device || location.device_id != first.device_id) {
      return {StatusCode::wrong_memory_space,
              std::string(tensor.name) + " is in " + (location.device ? "device" : "host") +
                  " memory" + (location.device ? " of device " + std::to_string(location.device_id) : "") +
                  " but " + tensors[0].name + " is in " + (first.device ? "device" : "host") + " memory" +
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

Status common_memory_space(const AttentionProblem& problem, MemorySpace* space) {
  const SequenceLayout& s = problem.sequences;
  const NamedPointer tensors[] = {{"q", problem.q},
                                  {"k", problem.k},
                                  {"v", problem.v},
                                  {"o", problem.o},
                                  {"mask", problem.mask},
                                  {"lse", problem.lse},
                                  {"sinks", problem.sinks},
                                  {"k_descale", problem.k_descale},
                                  {"v_descale", problem.v_descale},
                                  {"sequences.cu_seqlens_q", s.cu_seqlens_q},
                                  {"sequences.cu_seqlens_k", s.cu_seqlens_k},
                                  {"sequences.seqused_k", s.seqused_k},
                                  {"sequences.block_table", s.block_table},
                                  {"sequence_plan", s.plan}};
  return common_memory_space(tensors, static_cast<int>(sizeof tensors / sizeof tensors[0]), space);
}

}  // namespace ffpa::detail
