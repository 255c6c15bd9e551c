// The backward entry points: validate, plan, run (host/dispatch.hpp): the CPU
// reference for host tensors, the portable GPU kernels for device tensors
// (docs/kernels/backward_plan.md).
#include "ffpa/ffpa.hpp"
#include "host/dispatch.hpp"
#include "host/validate.hpp"

namespace ffpa {

Status backward_workspace_size(const BackwardParams& params, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::null_pointer, "bytes is null"};
  detail::BackwardProblem problem;
  if (Status status = detail::validate_backward(params, &problem); !status.ok()) return status;
  detail::BackwardChoice choice;
  if (Status status = detail::plan_backward(problem, params.options.impl, &choice); !status.ok()) return status;
  *bytes = detail::backward_workspace_bytes(problem, choice);
  return {};
}

Status backward(const BackwardParams& params) {
  detail::BackwardProblem problem;
  if (Status status = detail::validate_backward(params, &problem); !status.ok()) return status;
  detail::BackwardChoice choice;
  if (Status status = detail::plan_backward(problem, params.options.impl, &choice); !status.ok()) return status;
  return detail::run_backward(problem, choice, params.workspace, params.workspace_bytes, params.stream);
}

}  // namespace ffpa
