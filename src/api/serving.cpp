// The serving plan's entry points (ffpa.hpp: sequence_plan_size,
// plan_sequences, check_sequences; docs/serving.md): validated as forward()
// validates the call, planned for the kernel forward() would route it to.
#include <cuda_runtime_api.h>

#include <string>

#include "ffpa/ffpa.hpp"
#include "host/cuda_status.hpp"
#include "host/dispatch.hpp"
#include "host/memory_space.hpp"
#include "host/serving_passes.hpp"
#include "host/validate.hpp"
#include "host/validate_sequences.hpp"
#include "kernels/serving/plan.hpp"

namespace ffpa {
namespace {

// The call's problem and the kernel it routes to; invalid_option for a call
// without sequences.
Status planned_call(const ForwardParams& params, detail::AttentionProblem* problem, KernelChoice* choice) {
  if (params.sequences == nullptr) {
    return {StatusCode::invalid_option, "params.sequences is null: a plan is a sequence batch's"};
  }
  if (Status status = detail::validate_forward(params, problem); !status.ok()) return status;
  problem->sequences.plan = nullptr;  // a plan is being made, not read
  return detail::plan_forward(*problem, params.options.impl, choice, nullptr);
}

}  // namespace

Status sequence_plan_size(const ForwardParams& params, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::null_pointer, "bytes is null"};
  detail::AttentionProblem problem;
  KernelChoice choice;
  if (Status status = planned_call(params, &problem, &choice); !status.ok()) return status;
  *bytes = choice.impl == Impl::cpu_reference ? 0 : static_cast<size_t>(detail::serving_passes(problem, choice).plan_bytes);
  return {};
}

Status plan_sequences(const ForwardParams& params, void* plan, size_t plan_bytes) {
  detail::AttentionProblem problem;
  KernelChoice choice;
  if (Status status = planned_call(params, &problem, &choice); !status.ok()) return status;
  if (choice.impl == Impl::cpu_reference) return {};  // the reference plans nothing
  const detail::ServingPasses passes = detail::serving_passes(problem, choice);  // a plan each, in one buffer
  const auto needed = static_cast<size_t>(passes.plan_bytes);
  if (plan == nullptr) return {StatusCode::null_pointer, "plan is null"};
  if (plan_bytes < needed) {
    return {StatusCode::workspace_too_small,
            "the plan needs " + std::to_string(needed) + " bytes, got " + std::to_string(plan_bytes)};
  }
  if (reinterpret_cast<uintptr_t>(plan) % 8 != 0) return {StatusCode::misaligned, "plan is not 8-byte aligned"};
  return detail::launch_plans(problem, passes, plan, params.stream);
}

Status check_sequences(const ForwardParams& params) {
  if (params.sequences == nullptr) {
    return {StatusCode::invalid_option, "params.sequences is null: there are no sequences to check"};
  }
  detail::AttentionProblem problem;
  if (Status status = detail::validate_forward(params, &problem); !status.ok()) return status;
  detail::MemorySpace space = detail::MemorySpace::host;
  if (Status status = detail::common_memory_space(problem, &space); !status.ok()) return status;
  if (space == detail::MemorySpace::host) return detail::check_sequence_data(problem);
  // Device tensors: the plan kernel's checks (any tiling: they do not depend
  // on it) into stream-ordered memory, its verdict read back.
  problem.sequences.plan = nullptr;
  const size_t bytes = static_cast<size_t>(detail::serving::plan_bytes(problem));
  void* plan = nullptr;
  if (const cudaError_t error = cudaMallocAsync(&plan, bytes, params.stream); error != cudaSuccess) {
    (void)cudaGetLastError();
    return detail::cuda_status(error, "cudaMallocAsync (check_sequences' plan)");
  }
  Status status = detail::serving::launch_plan(problem, detail::SequenceTiling{}, plan, params.stream);
  detail::SequenceScheduleHeader header;
  if (status.ok()) {
    status = detail::cuda_status(cudaMemcpyAsync(&header, plan, sizeof header, cudaMemcpyDeviceToHost, params.stream),
                                 "cudaMemcpyAsync (check_sequences' verdict)");
  }
  if (const cudaError_t error = cudaFreeAsync(plan, params.stream); error != cudaSuccess && status.ok()) {
    status = detail::cuda_status(error, "cudaFreeAsync");
  }
  if (const cudaError_t error = cudaStreamSynchronize(params.stream); error != cudaSuccess && status.ok()) {
    status = detail::cuda_status(error, "cudaStreamSynchronize");
  }
  if (!status.ok()) return status;
  return detail::sequence_fault_status(
      problem, header.sequence,
      detail::SequenceCheck{static_cast<detail::SequenceFault>(header.fault), header.value, header.index});
}

}  // namespace ffpa
