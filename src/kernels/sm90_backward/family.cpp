// Which calls the sm90 backward kernels serve, and running them.
#include "kernels/sm90_backward/family.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "common/ceil_div.hpp"
#include "kernels/sm90_backward/arguments.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_backward {

const Instance* route(const BackwardProblem& b, std::string* reason) {
  const AttentionProblem& p = b.forward;
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) {
    *reason = "the sm90 backward kernels: f16 and bf16 inputs only";
    return nullptr;
  }
  const int64_t width = sm90_wgmma::instance_width(p);
  const Instance* instance = nullptr;
  for (int i = 0; i < kInstanceCount && instance == nullptr; ++i) {
    if (kInstances[i].head_dim >= width) instance = &kInstances[i];
  }
  if (instance == nullptr) {
    *reason = kInstanceCount == 0 ? "the build has no sm90 backward kernels (no sm_90a target)"
                                    : "the sm90 backward kernels: D and Dv up to " +
                                          std::to_string(kInstances[kInstanceCount - 1].head_dim) +
                                          " (compiled instances)";
    return nullptr;
  }
  const std::array<sm90_wgmma::TensorMapShape, 4> shapes = backward_launch(b, Role::dq, nullptr, nullptr).maps;
  for (const sm90_wgmma::TensorMapShape& shape : shapes) {
    if (!sm90_wgmma::tensor_map_addressable(shape)) {
      *reason = "the sm90 backward kernels: q, k, v and d_o need 16-byte aligned bases and strides (TMA)";
      return nullptr;
    }
  }
  // The gradients are written two elements (4 bytes) at a time.
  for (const auto& [pointer, stride] : {std::pair{b.d_q, b.d_q_stride}, std::pair{b.d_k, b.d_k_stride},
                                        std::pair{b.d_v, b.d_v_stride}}) {
    if (reinterpret_cast<uintptr_t>(pointer) % 4 != 0 || stride[0] % 2 != 0 || stride[1] % 2 != 0 || stride[2] % 2 != 0) {
      *reason = "the sm90 backward kernels: d_q, d_k and d_v need 4-byte aligned bases and even strides";
      return nullptr;
    }
  }
  // Above 512 a cluster of two CTAs per stationary block doubles the grid.
  if (backward_launch(b, Role::dq, nullptr, nullptr).ctas >= (int64_t{1} << 30) ||
      backward_launch(b, Role::dk, nullptr, nullptr).ctas >= (int64_t{1} << 30)) {
    *reason = "the sm90 backward kernels: at most 2^30 stationary blocks (B x Hq x Nq / 64, B x Hkv x Nkv / 64)";
    return nullptr;
  }
  return instance;
}

}  // namespace ffpa::detail::sm90_backward
