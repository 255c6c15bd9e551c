// The public entry points: validate, plan, run.
#include <string>

#include "ffpa/ffpa.hpp"
#include "host/dispatch.hpp"
#include "host/memory_space.hpp"
#include "host/validate.hpp"
#include "host/validate_sequences.hpp"
#include "kernels/sm80_split_d/family.hpp"

namespace ffpa {
namespace {

bool is_empty(const detail::AttentionProblem& problem) {
  return problem.batch == 0 || problem.heads_q == 0 || problem.seq_q == 0;
}

// An empty forward() runs nothing, but bad input is still refused: a
// sequence batch's lengths and block ids in host memory are checked as a
// call with work checks them (device data is the plan's to check, and no plan
// runs; select_kernel and workspace_size read no data, empty or not).
Status check_empty_call(const detail::AttentionProblem& problem) {
  if (!problem.sequences.active) return {};
  detail::MemorySpace space = detail::MemorySpace::host;
  if (Status status = detail::common_memory_space(problem, &space); !status.ok()) return status;
  return space == detail::MemorySpace::host ? detail::check_sequence_data(problem) : Status{};
}

}  // namespace

Status select_kernel(const ForwardParams& params, KernelChoice* choice) {
  if (choice == nullptr) return {StatusCode::null_pointer, "choice is null"};
  detail::AttentionProblem problem;
  if (Status status = detail::validate_forward(params, &problem); !status.ok()) return status;
  if (is_empty(problem)) {  // forward() runs nothing and succeeds, whatever impl was asked for
    *choice = KernelChoice{};
    choice->impl = params.options.impl;
    choice->kernel = "none (empty problem: B, Hq or Nq is 0)";
    return {};
  }
  if (Status status = detail::plan_forward(problem, params.options.impl, choice, params.fp8_kv_cache); !status.ok()) {
    return status;
  }
  choice->kernel = detail::kernel_name(problem, *choice);
  return {};
}

Status workspace_size(const ForwardParams& params, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::null_pointer, "bytes is null"};
  detail::AttentionProblem problem;
  if (Status status = detail::validate_forward(params, &problem); !status.ok()) return status;
  *bytes = 0;
  if (is_empty(problem)) return {};
  KernelChoice choice;
  if (Status status = detail::plan_forward(problem, params.options.impl, &choice, params.fp8_kv_cache); !status.ok()) {
    return status;
  }
  *bytes = static_cast<size_t>(detail::workspace_bytes(problem, choice, params.fp8_kv_cache));
  return {};
}

Status forward(const ForwardParams& params) {
  detail::AttentionProblem problem;
  if (Status status = detail::validate_forward(params, &problem); !status.ok()) return status;
  if (is_empty(problem)) return check_empty_call(problem);
  KernelChoice choice;
  if (Status status = detail::plan_forward(problem, params.options.impl, &choice, params.fp8_kv_cache); !status.ok()) {
    return status;
  }
  return detail::run_forward(problem, choice, params.workspace, params.workspace_bytes, params.stream,
                             params.fp8_kv_cache);
}

Status device_support(int device, Impl impl) { return detail::device_support(device, impl); }

std::string compiled_head_dims() {
  std::string list;
  for (int i = 0; i < detail::sm80_split_d::kInstanceCount; ++i) {
    if (i > 0) list += ",";
    list += std::to_string(detail::sm80_split_d::kInstances[i].out_cols);
  }
  return list;
}

}  // namespace ffpa
