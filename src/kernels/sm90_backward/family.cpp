// Which calls the sm90 backward's dQ kernel serves, and running it.
#include "kernels/sm90_backward/family.hpp"

#include <cstdint>
#include <string>

#include "common/ceil_div.hpp"
#include "kernels/sm90_backward/dq_arguments.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_backward {

const DqInstance* route_dq(const BackwardProblem& b, std::string* reason) {
  const AttentionProblem& p = b.forward;
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) {
    *reason = "the sm90 dQ kernel: f16 and bf16 inputs only";
    return nullptr;
  }
  const int64_t width = p.dv() > p.head_dim ? p.dv() : p.head_dim;
  const DqInstance* instance = nullptr;
  for (int i = 0; i < kDqInstanceCount && instance == nullptr; ++i) {
    if (kDqInstances[i].head_dim >= width) instance = &kDqInstances[i];
  }
  if (instance == nullptr) {
    *reason = kDqInstanceCount == 0 ? "the build has no sm90 dQ kernels (no sm_90a target)"
                                    : "the sm90 dQ kernel: D and Dv up to " +
                                          std::to_string(kDqInstances[kDqInstanceCount - 1].head_dim) +
                                          " (compiled instances)";
    return nullptr;
  }
  const std::array<sm90_wgmma::TensorMapShape, 4> shapes = dq_launch(b, nullptr, nullptr).maps;
  for (const sm90_wgmma::TensorMapShape& shape : shapes) {
    if (!sm90_wgmma::tensor_map_addressable(shape)) {
      *reason = "the sm90 dQ kernel: q, k, v and d_o need 16-byte aligned bases and strides (TMA)";
      return nullptr;
    }
  }
  // dQ is written two elements (4 bytes) at a time.
  const bool pairs = reinterpret_cast<uintptr_t>(b.d_q) % 4 == 0 && b.d_q_stride[0] % 2 == 0 &&
                     b.d_q_stride[1] % 2 == 0 && b.d_q_stride[2] % 2 == 0;
  if (!pairs) {
    *reason = "the sm90 dQ kernel: d_q needs a 4-byte aligned base and even strides";
    return nullptr;
  }
  if (p.batch * p.heads_q * ceil_div(p.seq_q, int64_t{64}) >= (int64_t{1} << 31)) {
    *reason = "the sm90 dQ kernel: at most 2^31 - 1 CTAs (B x Hq x Nq / 64)";
    return nullptr;
  }
  return instance;
}

std::string dq_kernel_name(const BackwardProblem& b, const DqInstance& instance) {
  return std::string("sm90_backward_dq<") + (b.forward.dtype == DType::bf16 ? "bf16" : "f16") + ",d" +
         std::to_string(instance.head_dim) + ">";
}

Status run_dq(const BackwardProblem& b, const float* delta, float* d_mask_sum, cudaStream_t stream) {
  std::string reason;
  const DqInstance* instance = route_dq(b, &reason);
  if (instance == nullptr) return {StatusCode::impl_unavailable, reason};
  return instance->launch(b, delta, d_mask_sum, stream);
}

}  // namespace ffpa::detail::sm90_backward
