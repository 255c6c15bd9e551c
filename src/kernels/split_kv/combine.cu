// Split-KV's combine kernel (portable: every architecture the library builds):
// one warp per output row and 128 columns of it (blockIdx.y), so that a
// decode call's few rows still spread over many SMs. The lanes merge the
// splits' states (a split per lane, up to four per lane: kMaxKvSplits = 128),
// each lane keeps the weights of its splits, and the warp sums its columns
// (lane c holds columns c, c + 32, c + 64, c + 96 of the chunk) over the
// splits, each split's weight broadcast from its lane, four splits' loads in
// flight at a time (one at a time, B1 H32 Nkv32768's 37 splits took 58 us).
#include "kernels/split_kv/combine.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <string>

#include "host/cuda_status.hpp"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/split_kv.hpp"

namespace ffpa::detail::split_kv {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kSplitsPerLane = kMaxKvSplits / 32;
constexpr int kChunkColumns = 128;  // columns of a row per warp
constexpr int kColumnsPerLane = kChunkColumns / 32;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, offset));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
  return x;
}

template <typename Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) combine_kernel(const AttentionProblem p, const Partials partials,
                                                                        int64_t rows) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  // The merged state: the maximum over the splits, then the sum relative to it
  // (split_kv.hpp's merge_split_states, spread over the lanes).
  RowSoftmaxState mine[kSplitsPerLane];
  float max_log2 = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) {
    const int s = lane + 32 * k;
    mine[k] = s < partials.splits ? partials.states[s * rows + row] : RowSoftmaxState{};
    max_log2 = fmaxf(max_log2, mine[k].max_log2);
  }
  RowSoftmaxState merged;
  merged.max_log2 = warp_max(max_log2);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) sum += mine[k].sum * rescale_factor(mine[k].max_log2, merged.max_log2);
  merged.sum = warp_sum(sum);
  float weight[kSplitsPerLane];
  const float keep_scale = p.dropout_p > 0.0f ? p.dropout_scale : 1.0f;
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) weight[k] = split_weight(mine[k], merged) * keep_scale;

  const int64_t seq_q = p.seq_q;
  const int64_t bh = row / seq_q, i = row % seq_q;
  const int64_t b = bh / p.heads_q, h = bh % p.heads_q;
  if (p.lse != nullptr && lane == 0 && blockIdx.y == 0) store_lse(p, static_cast<int>(b), static_cast<int>(h), static_cast<int>(i), log_sum_exp(merged));
  const int64_t out_row = b * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2];
  const int head_dim = static_cast<int>(p.head_dim);
  const int col0 = static_cast<int>(blockIdx.y) * kChunkColumns + lane;
  float acc[kColumnsPerLane];
#pragma unroll
  for (int k = 0; k < kColumnsPerLane; ++k) acc[k] = 0.0f;
#pragma unroll 4
  for (int s = 0; s < partials.splits; ++s) {
    float w = 0.0f;  // split s's weight: lane s % 32, slot s / 32
#pragma unroll
    for (int k = 0; k < kSplitsPerLane; ++k) {
      const float from_lane = __shfl_sync(0xFFFFFFFFu, weight[k], s % 32);
      if (s / 32 == k) w = from_lane;
    }
    // The loads are unconditional (every split row lies in the workspace), so
    // that several splits' are in flight; a split the row does not attend
    // (weight 0) contributes nothing, whatever its O holds.
    const float* const o_split = partials.o + (s * rows + row) * head_dim;
#pragma unroll
    for (int k = 0; k < kColumnsPerLane; ++k) {
      const int c = col0 + 32 * k;
      const float value = c < head_dim ? o_split[c] : 0.0f;
      acc[k] += w != 0.0f ? value * w : 0.0f;
    }
  }
  Out* const out = static_cast<Out*>(p.o) + out_row;
#pragma unroll
  for (int k = 0; k < kColumnsPerLane; ++k) {
    const int c = col0 + 32 * k;
    if (c < head_dim) out[c] = Out(acc[k]);
  }
}

}  // namespace

PartialLayout partial_layout(const AttentionProblem& problem, int splits) {
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t rows = static_cast<int64_t>(splits) * problem.batch * problem.heads_q * problem.seq_q;
  PartialLayout layout;
  layout.states_offset = aligned(rows * problem.head_dim * 4);
  layout.bytes = layout.states_offset + aligned(rows * static_cast<int64_t>(sizeof(RowSoftmaxState)));
  return layout;
}

Status launch_combine(const AttentionProblem& problem, const Partials& partials, cudaStream_t stream) {
  if (partials.splits < 1 || partials.splits > kMaxKvSplits) {
    return {StatusCode::invalid_option, "split-KV combine: " + std::to_string(partials.splits) +
                                            " splits, expected 1 to " + std::to_string(kMaxKvSplits)};
  }
  const int64_t rows = problem.batch * problem.heads_q * problem.seq_q;
  if (rows == 0) return {};
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > INT_MAX) return {StatusCode::impl_unavailable, "split-KV combine: more than 2^31 blocks of rows"};
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((problem.head_dim + kChunkColumns - 1) / kChunkColumns));
  const dim3 block(kWarpsPerBlock * 32);
  if (problem.dtype == DType::bf16) {
    combine_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(problem, partials, rows);
  } else {
    combine_kernel<__half><<<grid, block, 0, stream>>>(problem, partials, rows);
  }
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    return device_status(error, "split_kv", "combine_kernel launch");
  }
  return {};
}

}  // namespace ffpa::detail::split_kv
