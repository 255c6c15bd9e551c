// The row-split kernel's producer (row_split/traits.cuh): one thread issues
// every TMA load. Q as kConsumers parts of 64 rows (a part per consumer, each
// kChunks boxes), then the ring in ring.hpp's order with one stage a block:
// K_0, then K_j and V_{j-1} for j >= 1, then V_{n-1}; a stage is a whole K or
// V block, kChunks boxes of [kBlockN keys][64 columns]. Dense K and V (the
// serving API's paged and gathered caches stay with the column-split
// instances: routing.cpp's row_split_serves).
#pragma once

#include <cuda.h>

#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

// Tile row r's coordinates in the Q and O maps, whose boxes are a 64-row part
// (forward_launch's part_box): its query row and head (GQA packing puts
// several heads' rows in a part, or a head's rows in several parts).
struct PartOrigin {
  int row, head;
};
__device__ __forceinline__ PartOrigin part_origin(const TileCoordinates& tile, int first_row) {
  return {tile.q0 + (first_row & tile.row_offset_mask()), tile.head + (first_row >> tile.row_shift)};
}

template <class Traits>
struct RowSplitProducer {
  static constexpr int kStages = Traits::kStages, kChunks = Traits::kChunks, kBoxCols = Traits::kBoxCols;
  const Cta<Traits>& cta;
  int position = 0;  // the next ring position

  // Waits until the stage of the next position is free, and announces its bytes.
  __device__ __forceinline__ int acquire() {
    const int stage = position % kStages;
    mbarrier_wait(cta.empty(stage), ((position / kStages) & 1) ^ 1);
    mbarrier_arrive_expect_tx(cta.full(position), Traits::kStageBytes);
    ++position;
    return stage;
  }

  __device__ __forceinline__ void load_q(const CUtensorMap* q_map) const {
    const TileCoordinates* tile = cta.tile();
    const TileSequence* seq = cta.sequence();
    mbarrier_arrive_expect_tx(cta.q_full(), Traits::kConsumers * Traits::kQPartBytes);
#pragma unroll 1
    for (int part = 0; part < Traits::kConsumers; ++part) {
      const PartOrigin at = part_origin(*tile, 64 * part);
#pragma unroll 1
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(cta.q_tiles() + part * Traits::kQPartBytes + c * Traits::kTileBytes, q_map, cta.q_full(),
                    c * kBoxCols, seq->q_begin + at.row, at.head, seq->q_batch);
    }
  }

  // A K or V block: its kChunks boxes of [kBlockN keys][64 columns].
  __device__ __forceinline__ void load_block(const CUtensorMap* map, int j) {
    const int stage = acquire();
    const TileSequence* seq = cta.sequence();
#pragma unroll 1
    for (int c = 0; c < kChunks; ++c)
      tma_load_4d(cta.ring() + stage * Traits::kStageBytes + c * Traits::kKBoxBytes, map, cta.full(position - 1),
                  c * kBoxCols, seq->kv_begin + cta.block_key(j), cta.tile()->kv_head, seq->kv_batch);
  }

  __device__ __forceinline__ void run(const CUtensorMap* q_map, const CUtensorMap* k_map, const CUtensorMap* v_map) {
    prefetch_tensor_map(k_map);
    prefetch_tensor_map(v_map);
    load_q(q_map);
    const int blocks = cta.tile()->kv_blocks;
    if (blocks == 0) return;
    load_block(k_map, 0);
    for (int j = 1; j < blocks; ++j) {
      load_block(k_map, j);
      load_block(v_map, j - 1);
    }
    load_block(v_map, blocks - 1);
  }
};

}  // namespace ffpa::detail::sm90_wgmma
