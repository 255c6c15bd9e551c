#include "host/dispatch.hpp"

#include <new>
#include <string>

#include "host/cuda_status.hpp"
#include "host/memory_space.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "reference/cpu_attention.hpp"

namespace ffpa::detail {
namespace {

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::automatic: return "auto";
    case Impl::cpu_reference: return "cpu_reference";
    case Impl::sm80_split_d: return "sm80_split_d";
    case Impl::sm90_wgmma: return "sm90_wgmma";
  }
  return "unknown";
}

Status plan_cpu_reference(MemorySpace space, KernelChoice* choice) {
  if (space != MemorySpace::host) {
    return {StatusCode::wrong_memory_space,
            "impl cpu_reference needs host pointers, but the tensors are in device memory"};
  }
  choice->impl = Impl::cpu_reference;
  choice->kernel = "cpu_reference<f64>";
  return {};
}

struct DeviceInfo {
  int device = 0, major = 0, minor = 0;
  std::string compute_capability() const {
    return "device " + std::to_string(device) + " has " + std::to_string(major) + "." +
           std::to_string(minor);
  }
};

// The current device of a GPU implementation, once it is known that there is
// one and that the tensors live in device memory.
Status current_device(Impl impl, MemorySpace space, DeviceInfo* info) {
  if (const cudaError_t error = cudaGetDevice(&info->device); error != cudaSuccess) {
    (void)cudaGetLastError();
    return {StatusCode::impl_unavailable, std::string("impl ") + impl_name(impl) +
                                              " needs a CUDA device: " + cudaGetErrorString(error)};
  }
  if (space != MemorySpace::device) {
    return {StatusCode::wrong_memory_space, std::string("impl ") + impl_name(impl) +
                                                " needs device pointers, but the tensors are in host memory"};
  }
  FFPA_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&info->major, cudaDevAttrComputeCapabilityMajor, info->device));
  FFPA_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&info->minor, cudaDevAttrComputeCapabilityMinor, info->device));
  return {};
}

Status plan_sm80_split_d(const AttentionProblem& problem, MemorySpace space,
                         KernelChoice* choice) {
  DeviceInfo info;
  if (Status status = current_device(Impl::sm80_split_d, space, &info); !status.ok()) return status;
  const int device = info.device;
  if (info.major < 8) {
    return {StatusCode::impl_unavailable,
            "impl sm80_split_d needs compute capability 8.0 or newer; " + info.compute_capability()};
  }
  if (problem.seq_q > kMaxSequenceLength || problem.seq_kv > kMaxSequenceLength) {
    return {StatusCode::impl_unavailable,
            "impl sm80_split_d serves sequence lengths up to " + std::to_string(kMaxSequenceLength)};
  }
  int smem_limit = 0;
  FFPA_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const sm80_split_d::Route route = sm80_split_d::route(problem.head_dim, smem_limit);
  if (route.out_cols == 0) {
    return {StatusCode::impl_unavailable,
            "impl sm80_split_d: no kernel of this build fits the " + std::to_string(smem_limit) +
                " bytes of shared memory per block of device " + std::to_string(device)};
  }
  choice->impl = Impl::sm80_split_d;
  choice->kernel = sm80_split_d::kernel_name(problem, route);
  choice->padded_head_dim = route.out_cols;
  choice->value_splits = route.value_splits;
  return {};
}

// The sm90 family runs sm_90a code: compute capability 9.0 exactly.
Status plan_sm90_wgmma(const AttentionProblem& problem, MemorySpace space, KernelChoice* choice) {
  DeviceInfo info;
  if (Status status = current_device(Impl::sm90_wgmma, space, &info); !status.ok()) return status;
  if (info.major != 9 || info.minor != 0) {
    return {StatusCode::impl_unavailable,
            "impl sm90_wgmma needs compute capability 9.0; " + info.compute_capability()};
  }
  std::string reason;
  const sm90_wgmma::Instance* instance = sm90_wgmma::route(problem, &reason);
  if (instance == nullptr) {
    return {StatusCode::impl_unavailable, "impl sm90_wgmma does not serve this call: " + reason};
  }
  choice->impl = Impl::sm90_wgmma;
  choice->kernel = sm90_wgmma::kernel_name(problem, *instance);
  choice->padded_head_dim = instance->head_dim;
  choice->value_splits = 1;
  return {};
}

// Device pointers under Impl::automatic: the sm90 family where it serves the
// call and is measured faster (docs/kernels/sm90_wgmma.md), else split-D.
Status plan_automatic_device(const AttentionProblem& problem, KernelChoice* choice) {
  // H200, N = 8192, bf16 (docs/kernels/sm90_wgmma.md): D = 128 split-D 218 vs
  // sm90 137 TFLOP/s; D = 256 split-D 249 vs sm90 451.
  constexpr int64_t kSm90MinHeadDim = 129;
  if (problem.head_dim >= kSm90MinHeadDim &&
      plan_sm90_wgmma(problem, MemorySpace::device, choice).ok()) {
    return {};
  }
  (void)cudaGetLastError();
  return plan_sm80_split_d(problem, MemorySpace::device, choice);
}

}  // namespace

Status plan_forward(const AttentionProblem& problem, Impl requested, KernelChoice* choice) {
  *choice = KernelChoice{};
  MemorySpace space = MemorySpace::host;
  if (Status status = common_memory_space(problem, &space); !status.ok()) return status;
  switch (requested) {
    case Impl::cpu_reference: return plan_cpu_reference(space, choice);
    case Impl::sm80_split_d: return plan_sm80_split_d(problem, space, choice);
    case Impl::sm90_wgmma: return plan_sm90_wgmma(problem, space, choice);
    case Impl::automatic:
      return space == MemorySpace::host ? plan_cpu_reference(space, choice)
                                        : plan_automatic_device(problem, choice);
  }
  return {StatusCode::invalid_option,
          "options.impl = " + std::to_string(static_cast<int>(requested)) + " is not an Impl"};
}

Status run_forward(const AttentionProblem& problem, const KernelChoice& choice,
                   cudaStream_t stream) {
  switch (choice.impl) {
    case Impl::cpu_reference:
      try {
        cpu_attention_forward(problem);
      } catch (const std::bad_alloc&) {
        return {StatusCode::out_of_memory,
                "impl cpu_reference: out of host memory for the converted K/V of one head"};
      }
      return {};
    case Impl::sm80_split_d:
      return sm80_split_d::run(
          problem, sm80_split_d::Route{static_cast<int>(choice.padded_head_dim), choice.value_splits},
          stream);
    case Impl::sm90_wgmma:
      return sm90_wgmma::run(problem, static_cast<int>(choice.padded_head_dim), stream);
    case Impl::automatic: break;
  }
  return {StatusCode::impl_unavailable,
          std::string("no runner for impl ") + impl_name(choice.impl)};
}

}  // namespace ffpa::detail
