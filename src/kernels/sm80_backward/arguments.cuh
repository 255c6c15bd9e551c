// The kernels' arguments and grids for a validated backward call: shared by
// the launcher (launch.cu) and the CPU emulation of the kernels
// (tests/emulation/).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/backward_problem.hpp"
#include "common/ceil_div.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm80_backward/family.hpp"
#include "kernels/sm80_backward/mask_gradient.cuh"
#include "kernels/sm80_backward/preprocess.cuh"
#include "kernels/sm80_backward/sequence_plans.hpp"
#include "kernels/sm80_backward/sink_gradient.cuh"
#include "kernels/sm80_backward/traits.cuh"

namespace ffpa::detail::sm80_backward {

// CTAs per block of keys (dK, dV: kSliceCols columns of max(D, Dv)) and of
// query rows (dQ: of D).
inline int slices_of(const AttentionProblem& p) {
  return static_cast<int>(ceil_div(std::max(p.head_dim, p.dv()), int64_t{kSliceCols}));
}
inline int dq_slices_of(const AttentionProblem& p) {
  return static_cast<int>(ceil_div(p.head_dim, int64_t{kSliceCols}));
}

// The workspace: delta (fp32 [entries][Hq][rows] of q's extent), then, for an
// additive mask's gradient, its dense fp32 sum, and for a sequence batch its
// two plans (query and key tiles), each on a 256-byte boundary.
struct WorkspaceLayout {
  size_t delta = 0, d_mask_sum = 0, query_plan = 0, key_plan = 0, bytes = 0;
  int64_t d_mask_elements = 0;
};

inline WorkspaceLayout workspace_layout(const BackwardProblem& b) {
  constexpr size_t kAlignment = 256;
  auto aligned = [](size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; };
  const AttentionProblem& p = b.forward;
  const RowExtent rows = query_extent(p);
  WorkspaceLayout w;
  w.bytes = aligned(static_cast<size_t>(rows.entries * p.heads_q * rows.rows) * sizeof(float));
  if (b.d_mask != nullptr) {
    w.d_mask_elements = b.d_mask_shape[0] * b.d_mask_shape[1] * b.d_mask_shape[2] * b.d_mask_shape[3];
    w.d_mask_sum = w.bytes;
    w.bytes += aligned(static_cast<size_t>(w.d_mask_elements) * sizeof(float));
  }
  if (p.sequences.active) {
    w.query_plan = w.bytes;
    w.key_plan = w.query_plan + aligned(static_cast<size_t>(serving::plan_bytes(p)));
    w.bytes = w.key_plan + aligned(static_cast<size_t>(serving::plan_bytes(p)));
  }
  return w;
}

// The problem with its plans (a sequence batch's) in the workspace at `base`.
inline BackwardProblem planned_problem(const BackwardProblem& b, unsigned char* base) {
  BackwardProblem planned = b;
  if (b.forward.sequences.active) {
    const WorkspaceLayout w = workspace_layout(b);
    planned.query_plan = base + w.query_plan;
    planned.key_plan = base + w.key_plan;
  }
  return planned;
}

inline MaskGradientArgs mask_gradient_args(const BackwardProblem& b, const float* sum) {
  MaskGradientArgs args{};
  args.sum = sum;
  args.d_mask = b.d_mask;
  args.elements = 1;
  for (int d = 0; d < 4; ++d) {
    args.shape[d] = b.d_mask_shape[d];
    args.stride[d] = b.d_mask_stride[d];
    args.elements *= b.d_mask_shape[d];
  }
  return args;
}

inline PreprocessArgs preprocess_args(const BackwardProblem& b, float* delta) {
  const AttentionProblem& p = b.forward;
  PreprocessArgs args{};
  args.o = p.o;
  args.d_o = b.d_o;
  args.d_lse = b.d_lse;
  for (int i = 0; i < 3; ++i) {
    args.o_stride[i] = p.o_stride[i];
    args.d_o_stride[i] = b.d_o_stride[i];
    args.d_lse_stride[i] = b.d_lse_stride[i];
  }
  args.delta = delta;
  const RowExtent rows = query_extent(p);
  args.heads_q = p.heads_q;
  args.seq_q = rows.rows;
  args.rows = rows.entries * p.heads_q * rows.rows;
  args.value_dim = static_cast<int>(p.dv());
  return args;
}

// Blocks of kPreprocessRows rows (one warp each).
inline int64_t preprocess_blocks(const BackwardProblem& b) {
  const RowExtent rows = query_extent(b.forward);
  return ceil_div(rows.entries * b.forward.heads_q * rows.rows, int64_t{kPreprocessRows});
}

inline SinkGradientArgs sink_gradient_args(const BackwardProblem& b, const float* delta) {
  return {b.forward, delta, b.d_sinks, b.d_sinks_stride, b.query_plan};
}

inline Args kernel_args(const BackwardProblem& b, const float* delta, float* d_mask_sum = nullptr) {
  Args args{};
  args.d_mask_sum = b.d_mask != nullptr ? d_mask_sum : nullptr;
  for (int d = 0; d < 4; ++d) args.mask_shape[d] = b.d_mask_shape[d];
  args.p = b.forward;
  args.delta = delta;
  args.d_q = b.d_q;
  args.d_k = b.d_k;
  args.d_v = b.d_v;
  args.d_o = b.d_o;
  for (int i = 0; i < 3; ++i) {
    args.d_q_stride[i] = b.d_q_stride[i];
    args.d_k_stride[i] = b.d_k_stride[i];
    args.d_v_stride[i] = b.d_v_stride[i];
    args.d_o_stride[i] = b.d_o_stride[i];
  }
  args.slices = slices_of(b.forward);
  args.dq_slices = dq_slices_of(b.forward);
  args.scale_log2 = b.forward.scale * kLog2e;
  args.query_plan = b.query_plan;
  args.key_plan = b.key_plan;
  return args;
}

// The launches' CTAs: a sequence batch's the most its plans can hold (those
// past a plan's tiles return at once).
template <class Traits>
int64_t dkdv_ctas(const AttentionProblem& p) {
  static_assert(Traits::kBlockK == kSequenceBlock, "the key plan's blocks");
  const int64_t blocks = p.sequences.active ? sequence_tile_bound(p, false)
                                            : p.batch * p.heads_kv * ceil_div(p.seq_kv, int64_t{Traits::kBlockK});
  return blocks * slices_of(p);
}

template <class Traits>
int64_t dq_ctas(const AttentionProblem& p) {
  static_assert(Traits::kBlockQ == kSequenceBlock, "the query plan's blocks");
  const int64_t blocks = p.sequences.active ? sequence_tile_bound(p, true)
                                            : p.batch * p.heads_q * ceil_div(p.seq_q, int64_t{Traits::kBlockQ});
  return blocks * dq_slices_of(p);
}

}  // namespace ffpa::detail::sm80_backward
