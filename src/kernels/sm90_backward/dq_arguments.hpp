// What a launch of the dQ kernel is given, from the backward problem: its
// DqArgs, its four tensor maps' shapes (q, k, v, dO: boxes of [64 rows][64
// columns]) and the CTA count. One home for the launcher (dq_launch.cuh) and
// the CPU emulation (tests/emulation), which encode the maps each their own way.
#pragma once

#include <array>
#include <cstdint>

#include "common/backward_problem.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_backward {

constexpr int kDqTileRows = 64;  // query rows of a dQ CTA (DqTraits::kBlockM)

struct DqArgs {
  AttentionProblem p;
  int row_blocks;                 // 64-row blocks of a head: the grid is row_blocks x Hq x B
  float scale_log2;               // scale * log2(e)
  const float* delta;             // [B][Hq][Nq]: rowsum(dO o O) - d_lse (the preprocess kernel's)
  void* d_q;                      // q's dtype, element strides b, h, n; last dim contiguous
  int64_t d_q_stride[3];
  float* d_mask_sum;              // an additive mask's fp32 gradient sum (null: not requested)
  int64_t mask_shape[4];
};

struct DqLaunch {
  DqArgs args{};
  std::array<sm90_wgmma::TensorMapShape, 4> maps{};  // q, k, v, dO
  int64_t ctas = 0;
};

// delta: the preprocess's [B][Hq][Nq] fp32; d_mask_sum: an additive mask's
// fp32 gradient sum when b.d_mask is set (else ignored).
inline DqLaunch dq_launch(const BackwardProblem& b, const float* delta, float* d_mask_sum) {
  const AttentionProblem& p = b.forward;
  DqLaunch launch;
  const std::array<sm90_wgmma::TensorMapShape, 4> forward = sm90_wgmma::attention_tensor_shapes(p);
  // dO has o's shape [B, Hq, Nq, Dv], its own strides.
  launch.maps = {forward[0], forward[1], forward[2],
                 sm90_wgmma::TensorMapShape{b.d_o, p.dtype, p.batch, p.heads_q, p.seq_q, p.dv(), b.d_o_stride}};
  DqArgs& args = launch.args;
  args.p = p;
  args.row_blocks = static_cast<int>(head_row_blocks(p.seq_q, kDqTileRows, 1));
  args.scale_log2 = p.scale * kLog2e;
  args.delta = delta;
  args.d_q = b.d_q;
  for (int i = 0; i < 3; ++i) args.d_q_stride[i] = b.d_q_stride[i];
  args.d_mask_sum = b.d_mask != nullptr ? d_mask_sum : nullptr;
  for (int i = 0; i < 4; ++i) args.mask_shape[i] = b.d_mask_shape[i];
  launch.ctas = p.batch * p.heads_q * args.row_blocks;
  return launch;
}

}  // namespace ffpa::detail::sm90_backward
