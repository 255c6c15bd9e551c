// The backward entry points: validate, locate, run. Only the CPU reference
// computes gradients today (host tensors); the GPU families get theirs with
// issue 13's kernels (docs/kernels/backward_plan.md).
#include <new>
#include <string>

#include "ffpa/ffpa.hpp"
#include "host/memory_space.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention_backward.hpp"

namespace ffpa {
namespace {

const char* impl_text(Impl impl) {
  switch (impl) {
    case Impl::automatic: return "auto";
    case Impl::cpu_reference: return "cpu_reference";
    case Impl::sm80_split_d: return "sm80_split_d";
    case Impl::sm90_wgmma: return "sm90_wgmma";
  }
  return "unknown";
}

// Where the call runs, or why it cannot: host tensors on the CPU reference,
// nothing on the GPU yet.
Status plan_backward(const detail::BackwardProblem& problem, Impl impl) {
  const detail::AttentionProblem& f = problem.forward;
  const detail::NamedPointer tensors[] = {{"q", f.q},         {"k", f.k},         {"v", f.v},
                                          {"o", f.o},         {"mask", f.mask},   {"lse", f.lse},
                                          {"d_o", problem.d_o}, {"d_q", problem.d_q}, {"d_k", problem.d_k},
                                          {"d_v", problem.d_v}, {"d_mask", problem.d_mask}};
  detail::MemorySpace space = detail::MemorySpace::host;
  if (Status status = detail::common_memory_space(tensors, 11, &space); !status.ok()) return status;
  if (impl == Impl::sm80_split_d || impl == Impl::sm90_wgmma) {
    return {StatusCode::impl_unavailable,
            std::string("impl ") + impl_text(impl) + " has no backward kernels yet (issue 13); impl cpu_reference "
                                                     "computes the gradients of host tensors"};
  }
  if (space == detail::MemorySpace::device) {
    return {impl == Impl::cpu_reference ? StatusCode::wrong_memory_space : StatusCode::impl_unavailable,
            impl == Impl::cpu_reference
                ? "impl cpu_reference needs host pointers, but the tensors are in device memory"
                : "impl auto: no GPU backward kernels yet (issue 13); the gradients of host tensors run on the CPU "
                  "reference"};
  }
  return {};
}

}  // namespace

Status backward_workspace_size(const BackwardParams& params, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::null_pointer, "bytes is null"};
  detail::BackwardProblem problem;
  if (Status status = detail::validate_backward(params, &problem); !status.ok()) return status;
  if (Status status = plan_backward(problem, params.options.impl); !status.ok()) return status;
  *bytes = 0;
  return {};
}

Status backward(const BackwardParams& params) {
  detail::BackwardProblem problem;
  if (Status status = detail::validate_backward(params, &problem); !status.ok()) return status;
  if (Status status = plan_backward(problem, params.options.impl); !status.ok()) return status;
  try {
    detail::cpu_attention_backward(problem);
  } catch (const std::bad_alloc&) {
    return {StatusCode::out_of_memory, "impl cpu_reference: out of host memory for the backward's fp64 buffers"};
  }
  return {};
}

}  // namespace ffpa
