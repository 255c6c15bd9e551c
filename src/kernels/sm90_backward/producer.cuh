// The producer of an sm90 backward kernel: one thread issues every TMA load.
// The stationary tiles once (stationary_full), then the ring in the order of
// sm90_wgmma/ring.hpp with streamed block j's score part (the operands of S
// and dP) as the "K block" and its product part (the product's B operand,
// each consumer's columns) as the "V block": score 0, score 1, product 0,
// score 2, product 1, ..., product n-1.
#pragma once

#include <cuda.h>

#include "kernels/sm90_backward/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_backward {

template <class Traits>
struct Producer {
  static constexpr int kStages = Traits::kStages, kStageTiles = Traits::kStageTiles;
  const Cta<Traits>& cta;
  int position = 0;  // the next ring position
  // Read once (run): the plan lives in shared memory, which every asm
  // volatile of a load would otherwise make the producer read again. batch:
  // the streamed rows' batch entry (their sequence's: keys for dq, query rows
  // for dk and dv).
  int batch = 0, col0 = 0;

  // Waits until the stage of the next position is free, and announces its bytes.
  __device__ __forceinline__ int acquire(uint32_t bytes) {
    const int stage = position % kStages;
    sm90_wgmma::mbarrier_wait(cta.empty(stage), ((position / kStages) & 1) ^ 1);
    sm90_wgmma::mbarrier_arrive_expect_tx(cta.full(position), bytes);
    ++position;
    return stage;
  }

  // Boxes [first_box, first_box + boxes) of this CTA's columns (from col0()),
  // 64 rows from `row` of (head, batch) of `map`, a stage of up to
  // kStageTiles at a time.
  __device__ __forceinline__ void load_boxes(const CUtensorMap* map, int row, int head, int first_box, int boxes) {
    for (int done = 0; done < boxes; done += kStageTiles) {
      const int count = boxes - done < kStageTiles ? boxes - done : kStageTiles;
      const int stage = acquire(count * Traits::kTileBytes);
      for (int b = 0; b < count; ++b)
        sm90_wgmma::tma_load_4d(cta.ring() + stage * Traits::kStageBytes + b * Traits::kTileBytes, map,
                                cta.full(position - 1), col0 + (first_box + done + b) * 64, row, head, batch);
    }
  }

  // Streamed block j's first row in its tensor: keys of the KV head (dq) or
  // query rows of a head of the group, from its sequence's first row.
  __device__ __forceinline__ int block_row(int j) const {
    const BlockPlan* plan = cta.plan();
    return plan->streamed_row0 + (Traits::kQueryStationary ? j : j % plan->row_blocks) * Traits::kBlockN;
  }
  __device__ __forceinline__ int block_head(int j) const {
    return Traits::kQueryStationary ? cta.plan()->tile.kv_head : cta.block_tile(j).head;
  }

  // maps: q, k, v, dO. The score part streams K, V (dq) or Q, dO (dk; dv: Q).
  __device__ __forceinline__ void load_score_part(const CUtensorMap* const (&maps)[4], int j) {
    const int row = block_row(j), head = block_head(j);
    load_boxes(maps[Traits::kQueryStationary ? 1 : 0], row, head, 0, Traits::kChunks);
    if constexpr (Traits::kWithDp) load_boxes(maps[Traits::kQueryStationary ? 2 : 3], row, head, 0, Traits::kChunks);
  }

  // The product's B operand: K (dq), Q (dk) or dO (dv), consumer w's columns,
  // a stage per part: (part 0, consumer 0), (part 0, consumer 1), (part 1, consumer 0), ...
  __device__ __forceinline__ void load_product_part(const CUtensorMap* const (&maps)[4], int j) {
    constexpr int kMap = Traits::kRole == Role::dq ? 1 : Traits::kRole == Role::dk ? 0 : 3;
    const int row = block_row(j), head = block_head(j);
    for (int part = 0; part < Traits::kProductParts; ++part)
      for (int w = 0; w < 2; ++w)
        load_boxes(maps[kMap], row, head, w * Traits::kHalfTiles + part * kStageTiles, kStageTiles);
  }

  __device__ __forceinline__ void run(const CUtensorMap* const (&maps)[4]) {
    const BlockPlan* plan = cta.plan();
    if (plan->idle) return;
    for (const CUtensorMap* map : maps) sm90_wgmma::prefetch_tensor_map(map);
    const TileSequence& seq = plan->seq;
    batch = Traits::kQueryStationary ? seq.kv_batch : seq.q_batch;
    col0 = cta.col0();
    // Q and dO at the tile's rows (dq), K and V at the stationary keys (dk), K (dv).
    const int row = Traits::kQueryStationary ? seq.q_begin + plan->tile.q0 : seq.kv_begin + plan->key0;
    const int head = Traits::kQueryStationary ? plan->tile.head : plan->tile.kv_head;
    const int stationary_batch = Traits::kQueryStationary ? seq.q_batch : seq.kv_batch;
    const CUtensorMap* first = maps[Traits::kQueryStationary ? 0 : 1];
    const CUtensorMap* second = maps[Traits::kQueryStationary ? 3 : 2];
    sm90_wgmma::mbarrier_arrive_expect_tx(cta.stationary_full(), Traits::kStationaryTiles * Traits::kTileBytes);
#pragma unroll 1
    for (int c = 0; c < Traits::kChunks; ++c) {
      sm90_wgmma::tma_load_4d(cta.stationary() + c * Traits::kTileBytes, first, cta.stationary_full(),
                              cta.col0() + c * 64, row, head, stationary_batch);
      if constexpr (Traits::kWithDp)
        sm90_wgmma::tma_load_4d(cta.stationary() + (Traits::kChunks + c) * Traits::kTileBytes, second,
                                cta.stationary_full(), cta.col0() + c * 64, row, head, stationary_batch);
    }
    const int n = plan->blocks;
    if (n > 0) {
      load_score_part(maps, 0);
      for (int j = 1; j < n; ++j) {
        load_score_part(maps, j);
        load_product_part(maps, j - 1);
      }
      load_product_part(maps, n - 1);
    }
  }
};

}  // namespace ffpa::detail::sm90_backward
