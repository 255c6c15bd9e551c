// The sm90 backward's three gradient kernels (option B with dK and dV apart,
// docs/kernels/backward_plan.md) as data: their roles, launch arguments and
// what a launch is given (Args, the four tensor maps' shapes, the CTA count).
// One home for the launcher (launch.cuh) and the CPU emulation
// (tests/emulation), which encode the maps each their own way.
//
// Every role is the forward's schedule: a CTA holds 64 "stationary" rows and
// streams 64-row blocks of the other side past them; per streamed block its
// owner computes S = Q K^T (and dP = dO V^T), forms a 16-bit tile W, and both
// consumers add W (or W^T) times the block's rows to their half of the
// gradient:
//   dq: stationary Q, dO (query rows); streamed K, V blocks; W = dS;   dQ += dS K
//   dk: stationary K, V (keys);        streamed Q, dO blocks; W = dS;   dK += dS^T Q
//   dv: stationary K (keys);           streamed Q, dO blocks; W = P z; dV += (P z)^T dO
// S is always Q K^T (query rows x keys), so the masking, causal, dropout and
// LSE pieces are the forward's (kernels/common/score_gradients.cuh).
// A sequence batch (packed or batched q, k, v): the CTAs' stationary blocks
// come from the batch's plans (sm80_backward/arguments.cuh: blocks of 64
// query rows or 64 keys of a sequence), the tensor maps cover the tensors'
// extents, and a block's rows are found from its sequence's first row.
#pragma once

#include <array>
#include <cstdint>

#include "common/backward_problem.hpp"
#include "kernels/sm80_backward/sequence_plans.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_backward {

enum class Role : int { dq, dk, dv };

constexpr int kTileRows = 64;  // stationary rows of a CTA, rows of a streamed block

struct Args {
  AttentionProblem p;
  int stationary_blocks;  // 64-row blocks of the stationary side per (batch, head): Nq / 64 (dq) or Nkv / 64
  float scale_log2;       // scale * log2(e)
  const float* delta;     // [entries][Hq][rows] of q's extent: rowsum(dO o O) - d_lse (the preprocess kernel's)
  const void* plan;       // a sequence batch: the role's plan (query tiles for dq, key tiles for dk and dv)
  void* gradient;         // d_q, d_k or d_v: its dtype, element strides b, h, n; last dim contiguous
  int64_t gradient_stride[3];
  float* d_mask_sum;      // dq only: an additive mask's fp32 gradient sum (null: not requested)
  int64_t mask_shape[4];
};

struct Launch {
  Args args{};
  std::array<sm90_wgmma::TensorMapShape, 4> maps{};  // q, k, v, dO (boxes of [64 rows][64 columns])
  int64_t ctas = 0;
};

// delta: the preprocess's [B][Hq][Nq] fp32; d_mask_sum: an additive mask's
// fp32 gradient sum when b.d_mask is set (the dq role adds dS there).
inline Launch backward_launch(const BackwardProblem& b, Role role, const float* delta, float* d_mask_sum) {
  const AttentionProblem& p = b.forward;
  Launch launch;
  // q and dO over q's extent (dO has o's shape, its own strides), k and v over k's.
  const RowExtent q_rows = query_extent(p), k_rows = key_extent(p);
  launch.maps = {sm90_wgmma::TensorMapShape{p.q, p.dtype, q_rows.entries, p.heads_q, q_rows.rows, p.head_dim, p.q_stride},
                 sm90_wgmma::TensorMapShape{p.k, p.dtype, k_rows.entries, p.heads_kv, k_rows.rows, p.head_dim, p.k_stride},
                 sm90_wgmma::TensorMapShape{p.v, p.dtype, k_rows.entries, p.heads_kv, k_rows.rows, p.dv(), p.v_stride},
                 sm90_wgmma::TensorMapShape{b.d_o, p.dtype, q_rows.entries, p.heads_q, q_rows.rows, p.dv(), b.d_o_stride}};
  Args& args = launch.args;
  args.p = p;
  const bool rows = role == Role::dq;
  args.stationary_blocks = static_cast<int>(head_row_blocks(rows ? p.seq_q : p.seq_kv, kTileRows, 1));
  args.scale_log2 = p.scale * kLog2e;
  args.delta = delta;
  args.plan = rows ? b.query_plan : b.key_plan;
  args.gradient = role == Role::dq ? b.d_q : role == Role::dk ? b.d_k : b.d_v;
  const int64_t* stride = role == Role::dq ? b.d_q_stride : role == Role::dk ? b.d_k_stride : b.d_v_stride;
  for (int i = 0; i < 3; ++i) args.gradient_stride[i] = stride[i];
  args.d_mask_sum = role == Role::dq && b.d_mask != nullptr ? d_mask_sum : nullptr;
  for (int i = 0; i < 4; ++i) args.mask_shape[i] = b.d_mask_shape[i];
  static_assert(kTileRows == sm80_backward::kSequenceBlock, "the plans' blocks are the stationary blocks");
  launch.ctas = p.sequences.active ? sm80_backward::sequence_tile_bound(p, rows)
                                   : p.batch * (rows ? p.heads_q : p.heads_kv) * args.stationary_blocks;
  return launch;
}

}  // namespace ffpa::detail::sm90_backward
