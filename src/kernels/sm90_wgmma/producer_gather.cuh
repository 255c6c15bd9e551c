// The sm90_wgmma producer warpgroup on a paged cache it gathers (Args::
// gather_pages, chosen by page size: gathers_pages in family.hpp). Its 128
// threads copy K and V with cp.async into the ring, in the order of ring.hpp
// and in the layout producer.cuh's TMA loads give the stages (128-byte rows,
// 128-byte swizzle: 16-byte chunk c of row r of a 1024-byte aligned box at
// chunk c ^ (r % 8)), so the consumers are the same as for any other cache.
//
// Thread t owns key t of every 128-key block: it loads its table entry once a
// block (block j + 1's while block j's stages are filled, so that the
// table's latency passes under copies), and copies its row's columns of each
// K stage and, where its key is in the stage's half, of each V stage ([64
// keys][kHalfCols] per (key half, consumer)). It keeps pages, not addresses,
// across the blocks (a row's address is two registers; the producer runs in
// Traits::kProducerRegisters = 24). A warp's copy reads chunk c of 32 rows,
// half of 32 sectors; the next copy's chunk c + 1 reads the other halves from
// L1 (cp_async_16 is .ca). Copies spread over a warp's lanes by row address
// instead (lane l: chunk l % 8 of rows l / 8 + 4 i, each row's address
// shuffled from its lane) read whole lines but ran slower (pages 4 to 31:
// 1.57 ms against 1.12, H200 2026-12-03; the shuffle-to-copy chain a copy,
// in order behind the volatile copies, is the suspect): docs/kernels/
// serving.md. A key past the sequence's Nkv, and
// columns past D (K) or Dv (V), are zero-filled (src-size 0): an unused cache
// row's NaN never meets P = 0. Each thread arrives on a stage's full barrier
// once its copies have landed (cp.async.mbarrier.arrive.noinc: 128 arrivals a
// phase, cta.cuh); thread 0 loads Q by TMA on its own barrier.
//
// cp.async writes shared memory through the generic proxy and the consumers'
// wgmmas read it through the async proxy; the barrier's phase completes only
// once the copies have been performed, which FA3's PagedKVNonTMA and
// FlashInfer's sparse mainloop also rely on (no proxy fence).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/common/compiler_hints.cuh"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/producer.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
struct GatherProducer {
  static_assert(Traits::kGathersPages && Traits::kBlockN == 128, "a producer thread per key of a block");
  static constexpr int kStages = Traits::kStages, kKStages = Traits::kKStages, kBoxCols = Traits::kBoxCols;
  static constexpr int kElementBytes = Traits::kElementBytes;
  static constexpr int kRowChunks = kSwizzleRowBytes / 16;  // 16-byte copies of a 128-byte row

  const Cta<Traits>& cta;
  const int thread;       // 0..127: key `thread` of every KV block
  int position = 0;       // the next ring position
  // This thread's page of a block (-1: its key is past the sequence's Nkv):
  // of the block whose K is loaded, and of the next one (its load in flight).
  int page = -1, next_page = -1;

  // Waits until the stage of the next position is free (every thread: each
  // copies into it). No bytes to announce: the arrivals complete the phase.
  __device__ __forceinline__ int acquire() {
    const int stage = position % kStages;
    mbarrier_wait(cta.empty(stage), ((position / kStages) & 1) ^ 1);
    ++position;
    return stage;
  }

  // Loads this thread's table entry of block j (a load in flight until used).
  __device__ __forceinline__ void look_up_page(int j) {
    const SequenceLayout& s = cta.p.sequences;
    const int key = cta.block_key(j) + thread;
    next_page = key < cta.sequence()->seq_kv
                    ? s.block_table[cta.tile()->batch * s.block_table_stride[0] +
                                    (key / static_cast<int>(s.page_size)) * s.block_table_stride[1]]
                    : -1;
  }

  // The global address of this thread's key row of block j, on page
  // `block_page`, in a k or v tensor (b, h, n strides); 0: past the sequence.
  __device__ __forceinline__ uint64_t row_address(const void* base, const int64_t (&stride)[3], int block_page,
                                                  int j) const {
    if (block_page < 0) return 0;
    const int row = (cta.block_key(j) + thread) % static_cast<int>(cta.p.sequences.page_size);
    const int64_t offset = block_page * stride[0] + cta.tile()->kv_head * stride[1] + row * stride[2];
    return reinterpret_cast<uint64_t>(base) + static_cast<uint64_t>(offset * kElementBytes);
  }

  // Columns [col, col + kBoxCols) of a row (global address `row`, 0: none;
  // `width` columns in the tensor) into row `box_row` of the 1024-byte
  // aligned box at `box` (128-byte rows): chunk c at chunk c ^ (box_row % 8),
  // i.e. at address (box + 128 box_row + 16 (box_row % 8)) ^ 16 c. The row is
  // opaque: its address is computed here, once a box, not hoisted across the
  // stages (eight swizzled addresses, or even one, held across the loop
  // would spill the producer's 24 registers).
  __device__ __forceinline__ void copy_row(uint32_t box, int box_row, uint64_t row, int col, int width) const {
    const int bytes = row == 0 ? 0 : (width - col) * kElementBytes;  // of the row from `col` on
    const uint64_t src = row + static_cast<uint64_t>(col * kElementBytes);
    const int r = opaque(box_row);
    const uint32_t swizzled = box + r * kSwizzleRowBytes + ((r & 7) << 4);
#pragma unroll
    for (int c = 0; c < kRowChunks; ++c) {
      const int chunk_bytes = min(max(bytes - 16 * c, 0), 16);
      cp_async_16(swizzled ^ (c << 4), reinterpret_cast<const void*>(src + 16 * c), static_cast<uint32_t>(chunk_bytes));
    }
  }

  // K_j (on `page`): its kKStages stages, this thread's row of each box.
  __device__ __forceinline__ void load_k(int j) {
    const uint64_t k_row = row_address(cta.p.k, cta.p.k_stride, page, j);
#pragma unroll
    for (int ks = 0; ks < kKStages; ++ks) {
      constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
      const int stage = acquire();
      // At D 1024 the CTA's first column, hoisted out of the KV loop, would
      // not fit the 24 registers (as in producer.cuh).
      const int col0 = Traits::kSplit == 2 ? opaque(cta.qk_col0()) : cta.qk_col0();
#pragma unroll
      for (int b = 0; b < (ks + 1 < kKStages ? 2 : kLast); ++b)
        copy_row(cta.ring() + stage * Traits::kStageBytes + b * Traits::kKBoxBytes, thread, k_row,
                 col0 + (2 * ks + b) * kBoxCols, static_cast<int>(cta.p.head_dim));
      cp_async_arrive_noinc(cta.full(position - 1));
    }
  }

  // V_j (this thread's key on `block_page`): a stage per (key half,
  // consumer), this thread's row in its half.
  __device__ __forceinline__ void load_v(int j, int block_page) {
    const uint64_t v_row = row_address(cta.p.v, cta.p.v_stride, block_page, j);
#pragma unroll 1
    for (int key_half = 0; key_half < 2; ++key_half)
#pragma unroll 1
      for (int w = 0; w < 2; ++w) {
        const int stage = acquire();
        if (thread / 64 == key_half) {  // whole warps
          const int col0 = (Traits::kSplit == 2 ? opaque(cta.vo_col0()) : cta.vo_col0()) + w * Traits::kHalfCols;
#pragma unroll
          for (int box = 0; box < Traits::kHalfCols / kBoxCols; ++box)
            copy_row(cta.ring() + stage * Traits::kStageBytes + box * Traits::kTileBytes, thread % 64, v_row,
                     col0 + box * kBoxCols, static_cast<int>(cta.p.dv()));
        }
        cp_async_arrive_noinc(cta.full(position - 1));  // every thread: 128 arrivals a phase
      }
  }

  __device__ __forceinline__ void run(const CUtensorMap* q_map) {
    if (thread == 0) load_q(cta, q_map);
    if (cta.tile()->kv_blocks > 0) {
      look_up_page(0);
      for (int j = 0; j < cta.tile()->kv_blocks; ++j) {  // V_{j-1} follows K_j (ring.hpp)
        const int previous_page = page;
        page = next_page;
        if (j + 1 < cta.tile()->kv_blocks) look_up_page(j + 1);
        load_k(j);
        if (j > 0) load_v(j - 1, previous_page);
      }
      load_v(cta.tile()->kv_blocks - 1, page);
    }
  }
};

}  // namespace ffpa::detail::sm90_wgmma
