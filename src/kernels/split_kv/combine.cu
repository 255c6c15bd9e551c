// Split-KV's combine kernel (portable: every architecture the library builds):
// one CTA per output row and a group of its 128-column chunks (blockIdx.y),
// so that a decode call's few rows still spread over many SMs (a chunk a
// CTA) and a batch's many rows take one wave (the whole row a CTA: a CTA per
// chunk paid the row's plan lookups and state merge once per chunk, in four
// waves). Its warps take the splits round-robin and every warp's loads are
// independent (a lane reads four columns of each chunk of a split's row as
// float4s), so a row's partials are read in about one memory latency, not
// one per split; shared memory sums the warps. Each warp merges the states
// itself (a split per lane, up to four per lane: kMaxKvSplits = 128) and
// broadcasts a split's weight from its lane. Where the row's partials lie
// (the plan's arrays, written before the attention kernel started) is read
// before the wait for the attention kernel, so it overlaps that kernel's
// tail.
// Measured at B1 H32 Nkv32768 with 37 splits (ncu): a warp per row, one split
// at a time, 58 us; a warp per 128 columns, four splits in flight, 36; a CTA
// per 128 columns 8.6 (docs/perf/h200-2026-12-01d/).
#include "kernels/split_kv/combine.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <string>

#include "host/cuda_status.hpp"
#include "kernels/common/epilogue.cuh"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/serving/plan.hpp"

namespace ffpa::detail::split_kv {
namespace {

constexpr int kMaxWarps = 8;
constexpr int kSplitsPerLane = kMaxKvSplits / 32;
constexpr int kChunkColumns = 128;  // columns of a chunk: a float4 per lane
static_assert(kChunkColumns == 32 * 4, "a lane reads one float4 of each chunk of a split's row");
// A CTA's chunks at most: a 512-column row, its chunks' partial sums from
// every warp in shared memory (16 KB), and a warp to finish each chunk.
constexpr int kMaxGroupChunks = 4;
static_assert(kMaxGroupChunks <= kMaxWarps, "warp c finishes chunk c");
// Rows from which a CTA takes a group of chunks, not one: enough CTAs to fill
// the H200's 132 SMs twice over at one chunk each.
constexpr int64_t kRowsForGroups = 256;

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

// Every split adds its O row times its weight, 0 or not (split_kv.hpp's
// split_weight: a NaN there reaches the row as in an unsplit tile); every
// split row lies in the workspace, written by its tile.
__device__ __forceinline__ void add_scaled(float4& acc, float4 value, float w) {
  acc.x += value.x * w;
  acc.y += value.y * w;
  acc.z += value.z * w;
  acc.w += value.w * w;
}

// Which output row a combine CTA merges, and where its splits' partial rows
// are: slot(s) = first + s x stride. A dense call's row (b x Hq + h) x Nq + i;
// a sequence batch's row q x Hq + h of its plan's query rows q (sequence b's
// row i), or none (past the plan's rows, or a plan with no split).
struct CombineRow {
  bool valid = false;
  int64_t b = 0, h = 0, i = 0;
  int splits = 0;
  int64_t first = 0, stride = 0;
  TileSequence seq{};
};

__device__ __forceinline__ CombineRow combine_row(const AttentionProblem& p, const Partials& partials, int64_t row,
                                                  int64_t rows) {
  CombineRow c;
  if (!p.sequences.active) {
    const int64_t bh = row / p.seq_q;
    c.i = row % p.seq_q, c.b = bh / p.heads_q, c.h = bh % p.heads_q;
    c.splits = partials.splits, c.first = row, c.stride = rows;
    c.seq = tile_sequence(p, static_cast<int>(c.b));
    c.valid = true;
    return c;
  }
  const auto* header = static_cast<const SequenceScheduleHeader*>(p.sequences.plan);
  const PlanArrays arrays = plan_arrays(p.sequences.plan, p.batch);
  const int64_t q = row / p.heads_q;
  if (header->tiles == 0 || header->split_blocks == 0 || q >= arrays.first_row[p.batch]) return c;
  c.h = row % p.heads_q;
  c.b = sequence_holding(arrays.first_row, static_cast<int>(p.batch), static_cast<int>(q));
  c.i = q - arrays.first_row[c.b];
  c.seq = tile_sequence(p, static_cast<int>(c.b));
  Sequence lengths;
  lengths.seq_kv = c.seq.seq_kv;
  c.splits = static_cast<int>(sequence_splits(lengths, header->tiling.block_n, header->split_blocks));
  c.first = arrays.first_partial[c.b] + c.h * c.seq.seq_q + c.i;
  c.stride = p.heads_q * static_cast<int64_t>(c.seq.seq_q);
  c.valid = true;
  return c;
}

template <typename Out>
__global__ void __launch_bounds__(kMaxWarps * 32) combine_kernel(const AttentionProblem p, const Partials partials,
                                                                  int64_t rows, int group_chunks) {
  __shared__ float4 warp_sums[kMaxWarps][kMaxGroupChunks][32];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  const CombineRow row = combine_row(p, partials, blockIdx.x, rows);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent of the attention kernel (Hopper):
  // its partial rows are complete and visible from here on.
  cudaGridDependencySynchronize();
#endif
  if (!row.valid) return;
  // The merged state: the maximum over the splits, then the sum relative to it
  // (split_kv.hpp's merge_split_states, spread over the lanes).
  RowSoftmaxState mine[kSplitsPerLane];
  float max_log2 = -INFINITY;
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) {
    const int s = lane + 32 * k;
    mine[k] = s < row.splits ? partials.states[row.first + s * row.stride] : RowSoftmaxState{};
    max_log2 = fmaxf(max_log2, mine[k].max_log2);
  }
  RowSoftmaxState merged;
  merged.max_log2 = warp_max(max_log2);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) sum += mine[k].sum * rescale_factor(mine[k].max_log2, merged.max_log2);
  merged.sum = warp_sum(sum);
  const RowSoftmaxState keys = merged;  // without the sink: whether the row attends a key (combined_output)
  // The head's sink joins the denominator once (common/epilogue.cuh's finish_row).
  if (p.sinks != nullptr) {
    merged = merge_row_states(merged, RowSoftmaxState{p.sinks[row.h * p.sinks_stride] * kLog2e, 1.0f}).state;
  }
  float weight[kSplitsPerLane];
  const float keep_scale = p.dropout_p > 0.0f ? p.dropout_scale : 1.0f;
#pragma unroll
  for (int k = 0; k < kSplitsPerLane; ++k) weight[k] = split_weight(mine[k], merged) * keep_scale;

  // This CTA's chunks: [first_chunk, first_chunk + chunks), lane's columns
  // 4 x lane + 128 x chunk of each (Dv % 8 == 0: a lane has all four or none).
  const int head_dim = static_cast<int>(p.dv());  // O's columns (Dv)
  const int first_chunk = static_cast<int>(blockIdx.y) * group_chunks;
  const int chunks = min(group_chunks, (head_dim + kChunkColumns - 1) / kChunkColumns - first_chunk);
  float4 acc[kMaxGroupChunks];
#pragma unroll
  for (int c = 0; c < kMaxGroupChunks; ++c) acc[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 2
  for (int s = warp; s < row.splits; s += warps) {
    float w = 0.0f;  // split s's weight: lane s % 32, slot s / 32
#pragma unroll
    for (int k = 0; k < kSplitsPerLane; ++k) {
      const float from_lane = __shfl_sync(0xFFFFFFFFu, weight[k], s % 32);
      if (s / 32 == k) w = from_lane;
    }
    const float* const o_split = partials.o + (row.first + s * row.stride) * head_dim;
#pragma unroll
    for (int c = 0; c < kMaxGroupChunks; ++c) {
      const int col = (first_chunk + c) * kChunkColumns + 4 * lane;
      if (c < chunks && col < head_dim) add_scaled(acc[c], __ldg(reinterpret_cast<const float4*>(o_split + col)), w);
    }
  }
#pragma unroll
  for (int c = 0; c < kMaxGroupChunks; ++c) warp_sums[warp][c][lane] = acc[c];
  __syncthreads();
  // Warp c finishes chunk c (warps >= kMaxGroupChunks >= chunks).
  if (warp >= chunks) return;
  const int col = (first_chunk + warp) * kChunkColumns + 4 * lane;
  float4 total = warp_sums[0][warp][lane];
  for (int w = 1; w < warps; ++w) add_scaled(total, warp_sums[w][warp][lane], 1.0f);
  const int64_t h = row.h, i = row.seq.q_begin + row.i;  // a sequence's rows lie from q_begin
  if (p.lse != nullptr && lane == 0 && first_chunk + warp == 0) {
    store_lse(p, row.seq.q_batch, static_cast<int>(h), static_cast<int>(i), log_sum_exp(merged));
  }
  if (col >= head_dim) return;
  Out* const out = static_cast<Out*>(p.o) + row.seq.q_batch * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2] + col;
  out[0] = Out(combined_output(total.x, keys));
  out[1] = Out(combined_output(total.y, keys));
  out[2] = Out(combined_output(total.z, keys));
  out[3] = Out(combined_output(total.w, keys));
}

}  // namespace

PartialLayout partial_layout(const AttentionProblem& problem, int splits) {
  return partial_layout_of_rows(problem, static_cast<int64_t>(splits) * problem.batch * problem.heads_q * problem.seq_q);
}

PartialLayout partial_layout_of_rows(const AttentionProblem& problem, int64_t rows) {
  auto aligned = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  PartialLayout layout;
  layout.states_offset = aligned(rows * problem.dv() * 4);
  layout.bytes = layout.states_offset + aligned(rows * static_cast<int64_t>(sizeof(RowSoftmaxState)));
  return layout;
}

Status launch_combine(const AttentionProblem& problem, const Partials& partials, bool programmatic,
                      cudaStream_t stream) {
  const bool sequences = problem.sequences.active;  // each sequence its plan's splits (at most kMaxKvSplits)
  if (!sequences && (partials.splits < 1 || partials.splits > kMaxKvSplits)) {
    return {StatusCode::invalid_option, "split-KV combine: " + std::to_string(partials.splits) +
                                            " splits, expected 1 to " + std::to_string(kMaxKvSplits)};
  }
  // A sequence batch: a CTA per (head, query row of the bound on its pass's
  // rows); the plan says which are rows.
  const int64_t rows = sequences ? problem.heads_q * serving::max_query_rows(problem, partials.pass)
                                 : problem.batch * problem.heads_q * problem.seq_q;
  if (rows == 0) return {};
  if (rows > INT_MAX) return {StatusCode::impl_unavailable, "split-KV combine: more than 2^31 rows"};
  cudaLaunchConfig_t config = {};
  const int chunks = static_cast<int>((problem.dv() + kChunkColumns - 1) / kChunkColumns);
  const int group_chunks = rows >= kRowsForGroups ? kMaxGroupChunks : 1;
  config.gridDim = dim3(static_cast<unsigned>(rows), static_cast<unsigned>((chunks + group_chunks - 1) / group_chunks));
  // Warps: with groups, kMaxGroupChunks (a warp to finish each chunk; at 63
  // registers, eight 8-warp CTAs an SM took two waves of a 1024-row batch);
  // else up to kMaxWarps, the splits in flight at once.
  const int warps = group_chunks > 1 ? kMaxGroupChunks : sequences ? kMaxWarps : std::min(partials.splits, kMaxWarps);
  config.blockDim = dim3(32 * warps);
  config.stream = stream;
  // On Hopper the combine is the attention kernel's programmatic dependent:
  // its CTAs launch while the last attention CTAs finish, find their rows and
  // wait in cudaGridDependencySynchronize.
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  const cudaError_t launched =
      problem.dtype == DType::bf16
          ? cudaLaunchKernelEx(&config, combine_kernel<__nv_bfloat16>, problem, partials, rows, group_chunks)
          : cudaLaunchKernelEx(&config, combine_kernel<__half>, problem, partials, rows, group_chunks);
  if (launched != cudaSuccess) {
    (void)cudaGetLastError();
    return device_status(launched, "split_kv", "combine_kernel launch");
  }
  return {};
}

}  // namespace ffpa::detail::split_kv
