// Launching the seesaw kernel: tensor maps, shared-memory opt-in, chunked grid.
// Included only by the generated per-head-dim translation units.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "host/cuda_status.hpp"
#include "kernels/sm90/seesaw.hpp"
#include "kernels/sm90/seesaw_kernel.cuh"
#include "kernels/sm90/tensor_map.hpp"

namespace ffpa::detail::sm90 {

template <class Traits>
Status launch_seesaw(const AttentionProblem& problem, cudaStream_t stream) {
  const auto kernel = seesaw_forward_kernel<Traits>;
  const cudaError_t set_smem =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes);
  if (set_smem == cudaErrorInvalidDeviceFunction || set_smem == cudaErrorNoKernelImageForDevice) {
    (void)cudaGetLastError();
    return {StatusCode::impl_unavailable,
            "impl sm90_wgmma: this build has no sm_90a kernel image for the current device"};
  }
  FFPA_RETURN_IF_CUDA_ERROR(set_smem);

  CUtensorMap q_map, k_map, v_map, o_map;
  const auto shape = [&](const void* base, int64_t heads, int64_t seq, const int64_t* stride) {
    return TensorMapShape{base, problem.dtype, problem.batch, heads, seq, problem.head_dim, stride};
  };
  if (Status s = encode_tensor_map(shape(problem.q, problem.heads_q, problem.seq_q, problem.q_stride),
                                   Traits::kBlockM, &q_map);
      !s.ok())
    return s;
  if (Status s = encode_tensor_map(shape(problem.k, problem.heads_kv, problem.seq_kv, problem.k_stride),
                                   Traits::kBlockN, &k_map);
      !s.ok())
    return s;
  if (Status s = encode_tensor_map(shape(problem.v, problem.heads_kv, problem.seq_kv, problem.v_stride),
                                   64, &v_map);
      !s.ok())
    return s;
  if (Status s = encode_tensor_map(shape(problem.o, problem.heads_q, problem.seq_q, problem.o_stride),
                                   Traits::kBlockM, &o_map);
      !s.ok())
    return s;

  SeesawArgs args{};
  args.p = problem;
  args.row_blocks = static_cast<int>((problem.seq_q + Traits::kBlockM - 1) / Traits::kBlockM);
  args.scale_log2 = problem.scale * 1.4426950408889634f;
  const int64_t blocks = problem.batch * problem.heads_q * args.row_blocks;  // < 2^31 (routing)
  kernel<<<static_cast<unsigned>(blocks), Traits::kThreads, Traits::kSmemBytes, stream>>>(
      args, q_map, k_map, v_map, o_map);
  FFPA_RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return {};
}

// D up to kHeadDim: S over ceil(D / 64) chunks, O split in two halves of whole
// 64-column boxes (at least 128 columns: the smallest instantiated wgmma N).
template <int kHeadDim>
Status launch_seesaw_instance(const AttentionProblem& problem, cudaStream_t stream) {
  static_assert(kHeadDim % 64 == 0);
  constexpr int kQKChunks = kHeadDim / 64;
  constexpr int kHalfCols = std::max(128, (kHeadDim + 127) / 128 * 64);
  if (problem.dtype == DType::bf16)
    return launch_seesaw<SeesawTraits<__nv_bfloat16, kQKChunks, kHalfCols>>(problem, stream);
  return launch_seesaw<SeesawTraits<__half, kQKChunks, kHalfCols>>(problem, stream);
}

}  // namespace ffpa::detail::sm90
