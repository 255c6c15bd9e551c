// The backward entry points: validate, plan, run (host/dispatch.hpp): the CPU
// reference for host tensors, the GPU kernels for device tensors
// (docs/kernels/backward_plan.md); and backward_route, the plan's answer for a
// representative call.
#include <cstdint>
#include <initializer_list>

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

namespace {

// A backward call of one query row and one key (q [1, 1, 1, D], k [1, 1, 1, D],
// v [1, 1, 1, Dv] and their gradients, dense), for backward_route: what the
// plan reads of a call besides dtype, D and Dv (alignment, sizes) is then that
// of a well-formed call. Its tensors' addresses are distinct, 256-byte aligned
// and never dereferenced (neither validation nor the plan reads the data).
struct RepresentativeBackward {
  BackwardParams params;
  RepresentativeBackward(DType dtype, int64_t head_dim, int64_t value_dim) {
    uintptr_t next = uintptr_t{1} << 20;
    auto tensor = [&next](DType element, std::initializer_list<int64_t> shape) {
      void* const data = reinterpret_cast<void*>(next);
      next += uintptr_t{1} << 16;  // past any tensor here (at most 1024 elements of 8 bytes)
      return make_tensor(data, element, shape);
    };
    params.q = tensor(dtype, {1, 1, 1, head_dim});
    params.k = tensor(dtype, {1, 1, 1, head_dim});
    params.v = tensor(dtype, {1, 1, 1, value_dim});
    params.o = tensor(dtype, {1, 1, 1, value_dim});
    params.lse = tensor(DType::f32, {1, 1, 1});
    params.d_o = tensor(dtype, {1, 1, 1, value_dim});
    params.d_q = tensor(dtype, {1, 1, 1, head_dim});
    params.d_k = tensor(dtype, {1, 1, 1, head_dim});
    params.d_v = tensor(dtype, {1, 1, 1, value_dim});
  }
};

}  // namespace

Status backward_route(int device, DType dtype, int64_t head_dim, int64_t value_dim, Impl requested, Impl* impl) {
  if (impl == nullptr) return {StatusCode::null_pointer, "impl is null"};
  // The requested impl is checked by the route (a GPU impl); the call's options keep their defaults.
  const RepresentativeBackward call(dtype, head_dim, value_dim);
  detail::BackwardProblem problem;
  if (Status status = detail::validate_backward(call.params, &problem); !status.ok()) return status;
  return detail::backward_route(problem, device, requested, impl);
}

Status backward(const BackwardParams& params) {
  detail::BackwardProblem problem;
  if (Status status = detail::validate_backward(params, &problem); !status.ok()) return status;
  detail::BackwardChoice choice;
  if (Status status = detail::plan_backward(problem, params.options.impl, &choice); !status.ok()) return status;
  return detail::run_backward(problem, choice, params.workspace, params.workspace_bytes, params.stream);
}

}  // namespace ffpa
