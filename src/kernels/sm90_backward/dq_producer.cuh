// The dQ kernel's producer: one thread issues every TMA load. Q and dO once
// (q_full), then the ring in the order of sm90_wgmma/ring.hpp with block j's
// score part (K_j then V_j, read by its owner for S and dP) as the "K block"
// and its product part (K_j's columns of each consumer's dQ half) as the "V
// block": score 0, score 1, product 0, score 2, product 1, ..., product n-1.
#pragma once

#include <cuda.h>

#include "kernels/sm90_backward/dq_cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_backward {

template <class Traits>
struct DqProducer {
  static constexpr int kStages = Traits::kStages, kStageTiles = Traits::kStageTiles;
  const DqCta<Traits>& cta;
  int position = 0;  // the next ring position

  // Waits until the stage of the next position is free, and announces its bytes.
  __device__ __forceinline__ int acquire(uint32_t bytes) {
    const int stage = position % kStages;
    sm90_wgmma::mbarrier_wait(cta.empty(stage), ((position / kStages) & 1) ^ 1);
    sm90_wgmma::mbarrier_arrive_expect_tx(cta.full(position), bytes);
    ++position;
    return stage;
  }

  // Boxes [first_box, first_box + boxes) of the block's 64 rows of `map`
  // (K or V), a stage of up to kStageTiles at a time.
  __device__ __forceinline__ void load_boxes(const CUtensorMap* map, int j, int first_box, int boxes) {
    const TileCoordinates* tile = cta.tile();
    for (int done = 0; done < boxes; done += kStageTiles) {
      const int count = boxes - done < kStageTiles ? boxes - done : kStageTiles;
      const int stage = acquire(count * Traits::kTileBytes);
      for (int b = 0; b < count; ++b)
        sm90_wgmma::tma_load_4d(cta.ring() + stage * Traits::kStageBytes + b * Traits::kTileBytes, map,
                                cta.full(position - 1), (first_box + done + b) * 64, cta.block_key(j),
                                tile->kv_head, tile->batch);
    }
  }

  __device__ __forceinline__ void load_score_part(const CUtensorMap* k_map, const CUtensorMap* v_map, int j) {
    load_boxes(k_map, j, 0, Traits::kChunks);
    load_boxes(v_map, j, 0, Traits::kChunks);
  }

  __device__ __forceinline__ void load_product_part(const CUtensorMap* k_map, int j) {
    for (int w = 0; w < 2; ++w) load_boxes(k_map, j, w * Traits::kHalfTiles, Traits::kHalfTiles);
  }

  __device__ __forceinline__ void run(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                      const CUtensorMap* do_map) {
    const TileCoordinates* tile = cta.tile();
    sm90_wgmma::prefetch_tensor_map(q_map);
    sm90_wgmma::prefetch_tensor_map(k_map);
    sm90_wgmma::prefetch_tensor_map(v_map);
    sm90_wgmma::prefetch_tensor_map(do_map);
    sm90_wgmma::mbarrier_arrive_expect_tx(cta.q_full(), 2 * Traits::kChunks * Traits::kTileBytes);
#pragma unroll 1
    for (int c = 0; c < Traits::kChunks; ++c) {
      sm90_wgmma::tma_load_4d(cta.q_tiles() + c * Traits::kTileBytes, q_map, cta.q_full(), c * 64, tile->q0,
                              tile->head, tile->batch);
      sm90_wgmma::tma_load_4d(cta.do_tiles() + c * Traits::kTileBytes, do_map, cta.q_full(), c * 64, tile->q0,
                              tile->head, tile->batch);
    }
    const int n = tile->kv_blocks;
    if (n > 0) {
      load_score_part(k_map, v_map, 0);
      for (int j = 1; j < n; ++j) {
        load_score_part(k_map, v_map, j);
        load_product_part(k_map, j - 1);
      }
      load_product_part(k_map, n - 1);
    }
  }
};

}  // namespace ffpa::detail::sm90_backward
