// The sm90_wgmma producer warpgroup: one thread issues the TMA loads. Q once,
// then the ring in the order of ring.hpp: K_0, then K_j and V_{j-1} for
// j >= 1, then V_{n-1}. A K block is kKStages stages of [128 keys][2 boxes], a
// V block 4 stages of [64 keys][kHalfCols], one per (key half, consumer), or
// with 8-bit operands 2 stages of V^T [kHalfCols][128 keys], one per consumer.
// Tile coordinates are read from shared memory where used: the producer runs
// in 24 registers. kPaged: K and V from a paged cache, whose pages the whole
// warp looks up and loads, lane c page-box c of a block (a separate instance:
// the dense producer keeps its registers), a box per chunk, or in the
// page-group variant (Traits::kPageGroups) one box for all the chunks of a
// stage.
#pragma once

#include <cuda.h>

#include "kernels/common/compiler_hints.cuh"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

// The tile's Q by TMA on its own barrier (one thread; every producer).
template <class Traits>
__device__ __forceinline__ void load_q(const Cta<Traits>& cta, const CUtensorMap* q_map) {
  const TileCoordinates* tile = cta.tile();
  prefetch_tensor_map(q_map);
  mbarrier_arrive_expect_tx(cta.q_full(), Traits::kQKChunks * Traits::kTileBytes);
#pragma unroll 1
  for (int c = 0; c < Traits::kQKChunks; ++c)  // (kFp8: the codes' rows start at the first quantized row)
    tma_load_4d(cta.q_tiles() + c * Traits::kTileBytes, q_map, cta.q_full(), cta.qk_col0() + c * Traits::kBoxCols,
                cta.sequence()->q_begin + tile->q0 - (Traits::kFp8 ? cta.args.first_row_block * Traits::kBlockM : 0),
                tile->head, cta.sequence()->q_batch);
}

template <class Traits, bool kPaged>
struct Producer {
  static_assert(kPaged || !Traits::kPageGroups, "the page-group variant loads only paged caches");
  static constexpr int kStages = Traits::kStages, kKStages = Traits::kKStages, kBoxCols = Traits::kBoxCols;
  const Cta<Traits>& cta;
  // The lane of warp 0 this thread is: a dense call's producer is thread 0
  // alone (lane 0); a paged cache's is the whole warp (kernel.cuh), lane c
  // looking up and loading page-box c of each KV block.
  const int lane;
  int position = 0;  // the next ring position

  // Where key `key` of the tile's sequence lies in the K and V maps: its row
  // and batch coordinates (a paged cache: its page's row and the page; a key
  // past the sequence's Nkv reads its last page's rows past it, or past the
  // page: TMA fills those with zeros; the mask discards their scores and the
  // consumers zero their V rows, stage_rows.cuh).
  struct KeyCoordinates {
    int row, batch;
  };
  // A paged cache: this lane's page-box of KV block j in slot j % 3. K_j is
  // loaded before V_{j-1}, and block j + 1's pages are looked up as soon as
  // K_j is issued, so that the block table's latency passes while the
  // producer waits for stages. Scalars, not an array: a run-time index would
  // put them in local memory.
  KeyCoordinates page_box0{0, 0}, page_box1{0, 0}, page_box2{0, 0};

  // Waits until the stage of the next position is free, and announces its bytes.
  __device__ __forceinline__ int acquire(uint32_t bytes) {
    const int stage = position % kStages;
    mbarrier_wait(cta.empty(stage), ((position / kStages) & 1) ^ 1);
    if (lane == 0) mbarrier_arrive_expect_tx(cta.full(position), bytes);
    // A paged cache's warp stays together stage by stage: a lane with no box
    // in a stage gates none of its barriers, so without this it could fall two
    // phases behind lane 0 and wait on a parity that has come round again
    // (the emulator's shuffled schedules deadlocked so).
    if constexpr (kPaged) __syncwarp();
    ++position;
    return stage;
  }

  __device__ __forceinline__ KeyCoordinates key_coordinates(int key) const {
    const TileSequence* seq = cta.sequence();
    if constexpr (!kPaged) {
      return {seq->kv_begin + key, seq->kv_batch};
    } else {
      const SequenceLayout& s = cta.p.sequences;
      const int last = seq->seq_kv - 1, page_size = static_cast<int>(s.page_size);
      const int k = key < last ? key : last;
      const int page = s.block_table[cta.tile()->batch * s.block_table_stride[0] + (k / page_size) * s.block_table_stride[1]];
      return {k % page_size + (key - k), page};
    }
  }

  __device__ __forceinline__ KeyCoordinates page_box(int j) const {
    const int slot = j % 3;
    return slot == 0 ? page_box0 : slot == 1 ? page_box1 : page_box2;
  }

  // A paged cache: lane c looks up page-box c of KV block j (Args::
  // page_box_rows keys each, at most 32 of them), all in one round of loads.
  __device__ __forceinline__ void look_up_pages(int j) {
    if (j >= cta.tile()->kv_blocks) return;
    KeyCoordinates at{0, 0};
    const int box_key = lane * cta.args.page_box_rows;  // this lane's page-box's first key in the block
    if (box_key < Traits::kBlockN) at = key_coordinates(cta.block_key(j) + box_key);
    if constexpr (Traits::kPageGroups) {  // the grouped map's coordinates: the page's 8-row group, the (page, head) index
      const PageMapSteps& steps = cta.args.page_steps;
      at = {at.row / 8, at.batch * steps.page_step + cta.tile()->kv_head * steps.head_step};
    }
    const int slot = j % 3;
    if (slot == 0) {
      page_box0 = at;
    } else if (slot == 1) {
      page_box1 = at;
    } else {
      page_box2 = at;
    }
  }

  // A paged cache: rows [first, first + rows) of KV block j into `dst`, lane
  // c issuing the TMA load of page-box c with its own looked-up page: a
  // block's page-boxes are issued at once, by as many lanes (one thread
  // issuing them one by one, the pages passed by shuffles, cost ~180 ns a box
  // on the H200: page size 16 ran at 0.37 of a batched cache's bandwidth,
  // 2026-12-03). A box of 128-byte rows of the chunk at column `col`, or in
  // the page-group variant `chunks` chunks from it in one load ([groups]
  // [chunks][8 rows][128 bytes]; look_up_pages made the page-boxes the grouped
  // map's coordinates). Lane 0 has announced the stage's bytes (the
  // mbarrier's transaction count may go below zero until it has).
  __device__ __forceinline__ void load_paged_rows(uint32_t dst, const CUtensorMap* map, int col, int j, int first,
                                                  int rows, int chunks = 1) {
    const int box_rows = cta.args.page_box_rows;
    const int box = lane - first / box_rows;  // this lane's page-box among the rows'
    if (box >= 0 && box * box_rows < rows) {
      const KeyCoordinates at = page_box(j);
      const uint32_t box_dst = dst + box * box_rows * chunks * kSwizzleRowBytes;
      if constexpr (Traits::kPageGroups) {
        tma_load_5d(box_dst, map, cta.full(position - 1), 0, 0,
                    col / kBoxCols + cta.tile()->kv_head * cta.args.page_steps.head_chunks, at.row, at.batch);
      } else {
        tma_load_4d(box_dst, map, cta.full(position - 1), col, at.row, cta.tile()->kv_head, at.batch);
      }
    }
  }

  __device__ __forceinline__ void load_k(const CUtensorMap* k_map, int j) {
    const TileCoordinates* tile = cta.tile();
#pragma unroll
    for (int ks = 0; ks < kKStages; ++ks) {
      constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
      const int boxes = ks + 1 < kKStages ? 2 : kLast;
      const int stage = acquire(boxes * Traits::kKBoxBytes);
      if constexpr (Traits::kPageGroups) {  // kQKChunks even: boxes == 2
        load_paged_rows(cta.ring() + stage * Traits::kStageBytes, k_map, cta.qk_col0() + 2 * ks * kBoxCols, j, 0,
                        Traits::kBlockN, 2);
      } else {
        // At D = 1024 the columns of every box, hoisted out of the KV loop,
        // would not fit the producer's 24 registers.
        for (int b = 0; b < boxes; ++b) {
          const int col = (Traits::kSplit == 2 ? opaque(cta.qk_col0()) : cta.qk_col0()) + (2 * ks + b) * kBoxCols;
          const uint32_t dst = cta.ring() + stage * Traits::kStageBytes + b * Traits::kKBoxBytes;
          if constexpr (kPaged) {
            load_paged_rows(dst, k_map, col, j, 0, Traits::kBlockN);
          } else {
            const KeyCoordinates at = key_coordinates(cta.block_key(j));
            tma_load_4d(dst, k_map, cta.full(position - 1), col, at.row, tile->kv_head, at.batch);
          }
        }
      }
    }
    if constexpr (kPaged) look_up_pages(j + 1);
  }

  __device__ __forceinline__ void load_v(const CUtensorMap* v_map, int j) {
    const TileCoordinates* tile = cta.tile();
    if constexpr (Traits::kFp8) {
      // V^T codes [D][keys]: consumer w's [kHalfCols channels][128 keys].
      for (int w = 0; w < 2; ++w) {
        const int stage = acquire(Traits::kVStageBytes);
        tma_load_4d(cta.ring() + stage * Traits::kStageBytes, v_map, cta.full(position - 1), cta.block_key(j),
                    cta.vo_col0() + w * Traits::kHalfCols, tile->kv_head, tile->batch);
      }
    } else {
      for (int key_half = 0; key_half < 2; ++key_half)
        for (int w = 0; w < 2; ++w) {
          const int stage = acquire(Traits::kVStageBytes);
          if constexpr (Traits::kPageGroups) {
            load_paged_rows(cta.ring() + stage * Traits::kStageBytes, v_map, cta.vo_col0() + w * Traits::kHalfCols, j,
                            key_half * 64, 64, Traits::kHalfCols / kBoxCols);
          } else {
            for (int box = 0; box < Traits::kHalfCols / kBoxCols; ++box) {
              const uint32_t dst = cta.ring() + stage * Traits::kStageBytes + box * Traits::kTileBytes;
              const int col = cta.vo_col0() + w * Traits::kHalfCols + box * kBoxCols;
              if constexpr (kPaged) {
                load_paged_rows(dst, v_map, col, j, key_half * 64, 64);
              } else {
                const KeyCoordinates at = key_coordinates(cta.block_key(j) + key_half * 64);
                tma_load_4d(dst, v_map, cta.full(position - 1), col, at.row, tile->kv_head, at.batch);
              }
            }
          }
        }
    }
  }

  __device__ __forceinline__ void run(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                      const CUtensorMap* v_map) {
    const TileCoordinates* tile = cta.tile();
    if (lane == 0) {
      prefetch_tensor_map(k_map);
      prefetch_tensor_map(v_map);
      load_q(cta, q_map);
    }
    if (tile->kv_blocks > 0) {
      if constexpr (kPaged) look_up_pages(0);
      load_k(k_map, 0);
      for (int j = 1; j < tile->kv_blocks; ++j) {
        load_k(k_map, j);
        load_v(v_map, j - 1);
      }
      load_v(v_map, tile->kv_blocks - 1);
    }
  }
};

}  // namespace ffpa::detail::sm90_wgmma
