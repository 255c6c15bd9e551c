// What every role of a dQ CTA shares: the shared-memory layout (DqTraits),
// the barriers and the tile (thread 0 computes it into shared memory; the
// roles read it where used).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/shared_memory.cuh"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm90_backward/dq_traits.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_backward {

using sm90_wgmma::cta_shared_memory;

template <class Traits>
struct DqCta {
  static constexpr int kStages = Traits::kStages, kFull = Traits::kFullBarriers;

  const DqArgs& args;
  const AttentionProblem& p;

  __device__ __forceinline__ explicit DqCta(const DqArgs& args_) : args(args_), p(args_.p) {}

  __device__ __forceinline__ static unsigned char* smem() { return cta_shared_memory(); }
  __device__ __forceinline__ uint32_t q_tiles() const { return smem_address(smem() + Traits::kQOffset); }
  __device__ __forceinline__ uint32_t do_tiles() const { return smem_address(smem() + Traits::kDoOffset); }
  __device__ __forceinline__ unsigned char* ds_tile(int buffer) const {
    return smem() + Traits::kDsOffset + buffer * Traits::kTileBytes;
  }
  __device__ __forceinline__ uint32_t ring() const { return smem_address(smem() + Traits::kRingOffset); }
  __device__ __forceinline__ TileCoordinates* tile() const {
    return reinterpret_cast<TileCoordinates*>(smem() + Traits::kTileOffset);
  }
  // The first key of KV block j of the tile.
  __device__ __forceinline__ int block_key(int j) const { return (tile()->kv_first + j) * Traits::kBlockN; }

  // --- barriers -------------------------------------------------------------
  __device__ __forceinline__ uint32_t barriers() const { return smem_address(smem() + Traits::kBarrierOffset); }
  __device__ __forceinline__ uint32_t q_full() const { return barriers(); }  // Q and dO landed
  __device__ __forceinline__ uint32_t full(int position) const { return barriers() + 8 * (1 + position % kFull); }
  __device__ __forceinline__ static uint32_t full_parity(int position) {
    return static_cast<uint32_t>((position / kFull) & 1);
  }
  __device__ __forceinline__ uint32_t empty(int stage) const { return barriers() + 8 * (1 + kFull + stage); }
  // dS_j written (every thread of its owner) / read by the other consumer (a warp each).
  __device__ __forceinline__ uint32_t ds_full(int buffer) const {
    return barriers() + 8 * (1 + kFull + kStages + buffer);
  }
  __device__ __forceinline__ uint32_t ds_empty(int buffer) const {
    return barriers() + 8 * (3 + kFull + kStages + buffer);
  }

  // Thread 0: the tile (row block fastest, then head, then batch; the KV
  // blocks its rows attend: tile_schedule.hpp) and the barriers.
  __device__ __forceinline__ void setup() const {
    if (threadIdx.x == 0) {
      *tile() = tile_coordinates<int>(p, static_cast<int>(blockIdx.x), args.row_blocks, Traits::kBlockM,
                                      Traits::kBlockN);
      sm90_wgmma::mbarrier_init(q_full(), 1);
      for (int f = 0; f < kFull; ++f) sm90_wgmma::mbarrier_init(full(f), 1);
      for (int s = 0; s < kStages; ++s) sm90_wgmma::mbarrier_init(empty(s), 4);  // a warp of the consumer each
      for (int b = 0; b < 2; ++b) {
        sm90_wgmma::mbarrier_init(ds_full(b), 128);
        sm90_wgmma::mbarrier_init(ds_empty(b), 4);
      }
      sm90_wgmma::fence_barrier_init();
    }
    __syncthreads();
  }
};

}  // namespace ffpa::detail::sm90_backward
