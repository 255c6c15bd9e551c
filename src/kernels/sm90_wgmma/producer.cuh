// The sm90_wgmma producer warpgroup: one thread issues every TMA load. Q once,
// then the ring in the order of ring.hpp: K_0, then K_j and V_{j-1} for
// j >= 1, then V_{n-1}. A K block is kKStages stages of [128 keys][2 boxes], a
// V block 4 stages of [64 keys][kHalfCols], one per (key half, consumer), or
// with 8-bit operands 2 stages of V^T [kHalfCols][128 keys], one per consumer.
// Tile coordinates are read from shared memory where used: the producer runs
// in 24 registers. kPaged: K and V from a paged cache, whose pages the whole
// warp looks up (a separate instance: the dense producer keeps its registers).
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
  static constexpr int kStages = Traits::kStages, kKStages = Traits::kKStages, kBoxCols = Traits::kBoxCols;
  const Cta<Traits>& cta;
  // The lane of warp 0 this thread is: a dense call's producer is thread 0
  // alone (lane 0); a paged cache's is the whole warp (kernel.cuh), each lane
  // looking up one page of a KV block, lane 0 issuing every TMA load.
  const int lane;
  int position = 0;  // the next ring position
  // A paged cache: the coordinates of this lane's page-box of KV blocks j,
  // even and odd j (K_j is loaded before V_{j-1}, which reads the other);
  // scalars, not an array: a run-time index would put them in local memory.
  int page_row_even = 0, page_batch_even = 0, page_row_odd = 0, page_batch_odd = 0;

  // Waits until the stage of the next position is free, and announces its bytes.
  __device__ __forceinline__ int acquire(uint32_t bytes) {
    const int stage = position % kStages;
    mbarrier_wait(cta.empty(stage), ((position / kStages) & 1) ^ 1);
    if (lane == 0) mbarrier_arrive_expect_tx(cta.full(position), bytes);
    ++position;
    return stage;
  }

  // Where key `key` of the tile's sequence lies in the K and V maps: its row
  // and batch coordinates (a paged cache: its page's row and the page; a key
  // past the sequence's Nkv reads its last page's rows past it, or past the
  // page: TMA fills those with zeros, and the mask discards them).
  struct KeyCoordinates {
    int row, batch;
  };
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

  // A paged cache: lane c looks up page-box c of KV block j (Args::
  // page_box_rows keys each, at most 32 of them), all in one round of loads.
  __device__ __forceinline__ void look_up_pages(int j) {
    const int box_rows = cta.args.page_box_rows;
    KeyCoordinates at{0, 0};
    if (lane * box_rows < Traits::kBlockN) at = key_coordinates(cta.block_key(j) + lane * box_rows);
    if (j & 1) {
      page_row_odd = at.row, page_batch_odd = at.batch;
    } else {
      page_row_even = at.row, page_batch_even = at.batch;
    }
  }

  // A paged cache: rows [first, first + rows) of KV block j into `dst` (a box
  // of 128-byte rows), one TMA load per page-box, by lane 0 with the lanes'
  // looked-up pages (every lane runs this: the shuffles).
  __device__ __forceinline__ void load_paged_rows(uint32_t dst, const CUtensorMap* map, int col, int j, int first,
                                                  int rows) {
    const int box_rows = cta.args.page_box_rows;
    for (int r = 0; r < rows; r += box_rows) {
      const int box = (first + r) / box_rows;
      const int row = __shfl_sync(0xFFFFFFFFu, (j & 1) ? page_row_odd : page_row_even, box);
      const int batch = __shfl_sync(0xFFFFFFFFu, (j & 1) ? page_batch_odd : page_batch_even, box);
      if (lane == 0)
        tma_load_4d(dst + r * kSwizzleRowBytes, map, cta.full(position - 1), col, row, cta.tile()->kv_head, batch);
    }
  }

  __device__ __forceinline__ void load_k(const CUtensorMap* k_map, int j) {
    const TileCoordinates* tile = cta.tile();
    if constexpr (kPaged) look_up_pages(j);
#pragma unroll
    for (int ks = 0; ks < kKStages; ++ks) {
      constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
      const int boxes = ks + 1 < kKStages ? 2 : kLast;
      const int stage = acquire(boxes * Traits::kKBoxBytes);
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

  __device__ __forceinline__ void run(const CUtensorMap* q_map, const CUtensorMap* k_map,
                                      const CUtensorMap* v_map) {
    const TileCoordinates* tile = cta.tile();
    if (lane == 0) {
      prefetch_tensor_map(k_map);
      prefetch_tensor_map(v_map);
      load_q(cta, q_map);
    }
    if (tile->kv_blocks > 0) {
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
