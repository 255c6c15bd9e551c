// Launching the sm90_wgmma kernel: tensor maps, shared-memory opt-in, one CTA per tile.
// Included only by the generated per-head-dim translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "kernels/sm90_wgmma/kernel.cuh"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
Status launch(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream) {
  static_assert(Traits::kBlockM == kTileRows && Traits::kBlockN == kTileKeys, "the tile the host plans with");
  const auto kernel = forward_kernel<Traits>;
  static SharedMemoryOptIn opt_in;
  int device = 0;
  FFPA_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  // A device without an sm_90a image fails here (impl_unavailable), as does a
  // launch the device cannot give its resources or cluster, below.
  FFPA_RETURN_IF_DEVICE_ERROR("sm90_wgmma", opt_in_shared_memory(reinterpret_cast<const void*>(kernel),
                                                                 Traits::kSmemBytes, device, &opt_in));

  // Q and O in boxes of a tile's 64 rows (64 / heads_per_tile rows of each of
  // its heads: TMA fills the box row by row, head after head, the order of
  // TileCoordinates::row_head), K of 128 (a KV block), V of 64 (half a block:
  // one ring stage per key half and consumer).
  const std::array<TensorMapShape, 4> shapes = attention_tensor_shapes(problem);
  const int head_rows = rows_per_head(Traits::kBlockM, tiles.heads_per_tile);
  const int box_rows[4] = {head_rows, Traits::kBlockN, 64, head_rows};
  const int box_heads[4] = {tiles.heads_per_tile, 1, 1, tiles.heads_per_tile};
  CUtensorMap maps[4];
  for (int i = 0; i < 4; ++i) {
    if (Status status = encode_tensor_map(shapes[i], box_rows[i], box_heads[i], &maps[i]); !status.ok()) {
      return status;
    }
  }

  Args args{};
  args.p = problem;
  args.heads_per_tile = tiles.heads_per_tile;
  args.row_blocks = static_cast<int>(head_row_blocks(problem.seq_q, Traits::kBlockM, tiles.heads_per_tile));
  args.scale_log2 = problem.scale * kLog2e;
  args.inverse_scale = 1.0f / problem.scale;
  args.kv_splits = tiles.splits;
  args.split_blocks = tiles.split_blocks;
  args.partial_o = tiles.partial_o;
  args.partial_states = tiles.partial_states;
  // One CTA per tile, or a cluster of kSplit consecutive CTAs per tile; a tile per KV split.
  const int64_t tile_count =
      problem.batch * (problem.heads_q / tiles.heads_per_tile) * args.row_blocks * tiles.splits;  // < 2^30 (routing)
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(tile_count * Traits::kSplit));
  config.blockDim = dim3(Traits::kThreads);
  config.dynamicSmemBytes = Traits::kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = Traits::kSplit;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = Traits::kSplit > 1 ? 1 : 0;
  cudaError_t error = cudaLaunchKernelEx(&config, kernel, args, maps[0], maps[1], maps[2], maps[3]);
  if (error != cudaSuccess) {
    // The opt-in may be gone (a device reset since it was set): set it and launch once more.
    (void)cudaGetLastError();
    forget_shared_memory_opt_in(device, &opt_in);
    error = opt_in_shared_memory(reinterpret_cast<const void*>(kernel), Traits::kSmemBytes, device, &opt_in);
    if (error == cudaSuccess) error = cudaLaunchKernelEx(&config, kernel, args, maps[0], maps[1], maps[2], maps[3]);
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return device_status(error, "sm90_wgmma", "cudaLaunchKernelEx");
  }
  return {};
}

template <class Traits>
Status runnable(int device) {
  static KernelImageMemo memo;
  return kernel_runnable(reinterpret_cast<const void*>(&forward_kernel<Traits>), Traits::kThreads,
                         "sm90_wgmma", device, &memo);
}

// D up to kHeadDim. Up to 512 one CTA per tile, above a cluster of two, each
// CTA with half of D. A CTA computes S over its D / 64 (or D / 128) chunks and
// splits its columns of O between its two consumers in whole 64-column boxes
// (at least 128 columns: the smallest instantiated wgmma N).
template <int kHeadDim>
struct InstanceTraits {
  static constexpr int kSplit = cluster_size(kHeadDim);
  static_assert(kHeadDim % (64 * kSplit) == 0);
  static constexpr int kCtaDim = kHeadDim / kSplit;
  static constexpr int kQKChunks = kCtaDim / 64;
  static constexpr int kHalfCols = std::max(128, (kCtaDim + 127) / 128 * 64);
  template <class Element, bool kDropout = false, bool kMaskInS = false>
  using type = Traits<Element, kQKChunks, kHalfCols, kSplit, kDropout, kMaskInS>;
};

template <int kHeadDim, class Element>
Status launch_element(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream) {
  using Kernels = InstanceTraits<kHeadDim>;
  if (problem.has_dropout()) return launch<typename Kernels::template type<Element, true>>(problem, tiles, stream);
  if (starts_s_at_mask(problem, kHeadDim)) {
    return launch<typename Kernels::template type<Element, false, true>>(problem, tiles, stream);
  }
  return launch<typename Kernels::template type<Element, false>>(problem, tiles, stream);
}

template <int kHeadDim>
Status launch_instance(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream) {
  if (problem.dtype == DType::bf16) return launch_element<kHeadDim, __nv_bfloat16>(problem, tiles, stream);
  return launch_element<kHeadDim, __half>(problem, tiles, stream);
}

template <int kHeadDim>
Status instance_runnable(DType dtype, int device) {
  using Kernels = InstanceTraits<kHeadDim>;
  if (dtype == DType::bf16) return runnable<typename Kernels::template type<__nv_bfloat16>>(device);
  return runnable<typename Kernels::template type<__half>>(device);
}

}  // namespace ffpa::detail::sm90_wgmma
