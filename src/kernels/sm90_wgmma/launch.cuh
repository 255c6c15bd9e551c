// Launching the sm90_wgmma kernel: tensor maps, shared-memory opt-in, one CTA per tile.
// Included only by the generated per-head-dim translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "host/cuda_status.hpp"
#include "host/kernel_image.hpp"
#include "kernels/common/math_constants.hpp"
#include "common/quantization_options.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/fp8_prepass/workspace.hpp"
#include "kernels/sm90_wgmma/arguments.hpp"
#include "kernels/sm90_wgmma/cluster_launch.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "kernels/sm90_wgmma/kernel.cuh"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_wgmma {

// One CTA per tile (a cluster of kSplit consecutive CTAs per tile), maps q, k,
// v, o in that order.
template <class Traits>
Status launch_tiles(const Args& args, const CUtensorMap (&maps)[4], int64_t tile_count, cudaStream_t stream) {
  static_assert(Traits::kRowSplit || (Traits::kBlockM == kTileRows && Traits::kBlockN == kTileKeys),
                "the tile the host plans with (family.hpp's tile_shape)");
  static SharedMemoryOptIn opt_in;
  // A serving call: the programmatic dependent of its plan kernel (plan.cu),
  // whose launch and set-up then pass under the plan (forward_kernel waits
  // before its first global read).
  const bool after_plan = args.p.sequences.active;
  return launch_opted_in("sm90_wgmma", &opt_in, forward_kernel<Traits>, tile_count * Traits::kSplit, Traits::kThreads,
                         Traits::kSmemBytes, Traits::kSplit, /*programmatic=*/after_plan, stream, args, maps[0], maps[1],
                         maps[2], maps[3]);
}

template <class Traits>
Status launch(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream) {
  const ForwardLaunch launch = forward_launch<Traits>(problem, tiles);
  if (launch.args.gather_pages && !Traits::kGathersPages) {  // a paged cache with a mask or dropout: validation refuses
    return {StatusCode::impl_unavailable, "impl sm90_wgmma: this kernel variant does not gather a paged cache"};
  }
  if (problem.kv_e4m3 != Traits::kCacheCodes) {  // routing sends an e4m3 cache only to an instance with its variant
    return {StatusCode::impl_unavailable, "impl sm90_wgmma: this kernel variant does not take an e4m3 KV cache"};
  }
  // TileCoordinates finds a packed row's head by a shift: a power of two rows
  // a head (routing packs no heads into a three-consumer tile's 192 rows).
  const int head_rows = Traits::kBlockM / tiles.heads_per_tile;
  if (tiles.heads_per_tile > 1 && (Traits::kBlockM % tiles.heads_per_tile != 0 || (head_rows & (head_rows - 1)) != 0)) {
    return {StatusCode::impl_unavailable, "impl sm90_wgmma: " + std::to_string(tiles.heads_per_tile) +
                                              " heads packed into a tile of " + std::to_string(Traits::kBlockM) + " rows"};
  }
  CUtensorMap maps[4];
  const std::array<TensorMapSpec, 4> specs = forward_map_specs<Traits>(problem, launch);
  for (int i = 0; i < 4; ++i) {
    if (Status status = encode_tensor_map(specs[i], &maps[i]); !status.ok()) return status;
  }
  return launch_tiles<Traits>(launch.args, maps, launch.tile_count, stream);
}

// The FP8 path (Traits::kFp8): Q and K codes and V^T from the pre-pass's
// workspace (`z`, kernels/fp8_prepass/workspace.hpp): query rows [z.first_row,
// Nq), whole tiles (the hybrid rows before them run on the 16-bit kernel).
// One tile per 64 rows of a head: no GQA packing, no KV split.
template <class Traits>
Status launch_fp8(const AttentionProblem& problem, const QuantizationOptions& options,
                  const fp8_prepass::QuantizedBuffers& z, cudaStream_t stream) {
  const int64_t pitch = z.code_pitch, dim = problem.head_dim;
  const int64_t q_strides[3] = {problem.heads_q * z.rows * pitch, z.rows * pitch, pitch};
  const int64_t k_strides[3] = {problem.heads_kv * problem.seq_kv * pitch, problem.seq_kv * pitch, pitch};
  const int64_t v_strides[3] = {problem.heads_kv * dim * z.v_pitch, dim * z.v_pitch, z.v_pitch};
  const std::array<TensorMapShape, 4> input = attention_tensor_shapes(problem);
  const std::array<TensorMapShape, 4> shapes = {
      TensorMapShape{z.q_codes, problem.dtype, problem.batch, problem.heads_q, z.rows, dim, q_strides, 1},
      TensorMapShape{z.k_codes, problem.dtype, problem.batch, problem.heads_kv, problem.seq_kv, dim, k_strides, 1},
      // V^T: rows are channels, the 128-byte boxes run along the keys.
      TensorMapShape{z.v_codes, problem.dtype, problem.batch, problem.heads_kv, dim, problem.seq_kv, v_strides, 1},
      input[3]};
  CUtensorMap maps[4];
  if (Status status = encode_tensor_maps(shapes, {Traits::kBlockM, Traits::kBlockN, Traits::kHalfCols, Traits::kBlockM},
                                         {1, 1, 1, 1}, maps);
      !status.ok()) {
    return status;
  }
  Args args{};
  args.p = problem;
  args.first_row_block = static_cast<int>(z.first_row / Traits::kBlockM);  // whole tiles: check_fp8
  args.row_blocks = static_cast<int>(head_row_blocks(problem.seq_q, Traits::kBlockM, 1)) - args.first_row_block;
  args.scale_log2 = problem.scale * kLog2e;
  args.inverse_scale = 1.0f / problem.scale;
  args.q_scales = z.q_scales;
  args.k_scales = z.k_scales;
  args.v_scales = z.v_scales;
  args.lse_shift = options.smooth_k ? z.lse_shift : nullptr;
  args.row_nan = options.qk_format == QkFormat::int8 ? z.row_nan : nullptr;
  args.q_scales_per_head = q_scale_count(z.rows, options.qk_granularity);
  args.k_scales_per_head = k_scale_count(problem.seq_kv, options.qk_granularity);
  args.qk_scale_per_block = options.qk_granularity == QkScaleGranularity::per_block;
  args.v_scales_per_head = v_scale_count(problem.seq_kv, problem.head_dim, options.v_granularity);
  args.v_scale_per_block = options.v_granularity == VScaleGranularity::per_block;
  args.v_mean = options.smooth_v ? z.v_mean : nullptr;
  if (args.row_blocks <= 0) return {};
  return launch_tiles<Traits>(args, maps, problem.batch * problem.heads_q * args.row_blocks, stream);
}

template <class Traits>
Status runnable(int device) {
  static KernelImageMemo memo;
  return kernel_runnable(reinterpret_cast<const void*>(&forward_kernel<Traits>), Traits::kThreads,
                         "sm90_wgmma", device, &memo);
}

// The 16-bit kernel for D up to kHeadDim (arguments.hpp's InstanceTraits).
template <int kHeadDim, class Element>
Status launch_element(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream) {
  return with_instance_traits<kHeadDim, Element>(problem, [&](auto* traits) {
    using Kernel = std::remove_pointer_t<decltype(traits)>;
    if constexpr (Kernel::kRowSplit) {
      static_assert(Kernel::kBlockN == row_split_keys(kHeadDim, Kernel::kConsumers),
                    "the tile the host plans with (family.hpp's tile_shape)");
    }
    return launch<Kernel>(problem, tiles, stream);
  });
}

template <int kHeadDim>
Status launch_instance(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream) {
  if (problem.dtype == DType::bf16) return launch_element<kHeadDim, __nv_bfloat16>(problem, tiles, stream);
  return launch_element<kHeadDim, __half>(problem, tiles, stream);
}

// The FP8 instances (Traits::kFp8) for D up to kHeadDim: the 16-bit
// instance's CTAs and O halves, each CTA's part of Q and K in 128-byte chunks.
template <int kHeadDim>
struct Fp8InstanceTraits {
  static constexpr int kSplit = InstanceTraits<kHeadDim>::kSplit;
  static constexpr int kQKChunks = (InstanceTraits<kHeadDim>::kCtaDim + 127) / 128;
  static constexpr int kHalfCols = InstanceTraits<kHeadDim>::kHalfCols;
  template <class Element, Operands kOperands, bool kDropout>
  using type = Traits<Element, kQKChunks, kHalfCols, kSplit, kDropout, false, kOperands>;
};

template <int kHeadDim, class Element, Operands kOperands>
Status launch_fp8_operands(const AttentionProblem& problem, const QuantizationOptions& options,
                           const fp8_prepass::QuantizedBuffers& z, cudaStream_t stream) {
  using Kernels = Fp8InstanceTraits<kHeadDim>;
  if (problem.has_dropout()) {
    return launch_fp8<typename Kernels::template type<Element, kOperands, true>>(problem, options, z, stream);
  }
  return launch_fp8<typename Kernels::template type<Element, kOperands, false>>(problem, options, z, stream);
}

template <int kHeadDim, class Element>
Status launch_fp8_element(const AttentionProblem& problem, const QuantizationOptions& options,
                          const fp8_prepass::QuantizedBuffers& z, cudaStream_t stream) {
  if (options.qk_format == QkFormat::int8) {
    return launch_fp8_operands<kHeadDim, Element, Operands::int8_qk>(problem, options, z, stream);
  }
  return launch_fp8_operands<kHeadDim, Element, Operands::e4m3>(problem, options, z, stream);
}

template <int kHeadDim>
Status launch_fp8_instance(const AttentionProblem& problem, const QuantizationOptions& options,
                           const fp8_prepass::QuantizedBuffers& z, cudaStream_t stream) {
  if (problem.dtype == DType::bf16) return launch_fp8_element<kHeadDim, __nv_bfloat16>(problem, options, z, stream);
  return launch_fp8_element<kHeadDim, __half>(problem, options, z, stream);
}

template <int kHeadDim>
Status instance_runnable(DType dtype, int device) {
  using Kernels = InstanceTraits<kHeadDim>;
  if (dtype == DType::bf16) return runnable<typename Kernels::template type<__nv_bfloat16>>(device);
  return runnable<typename Kernels::template type<__half>>(device);
}

}  // namespace ffpa::detail::sm90_wgmma
