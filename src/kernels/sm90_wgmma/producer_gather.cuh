// The sm90_wgmma producer warpgroup on a paged cache it gathers (Args::
// gather_pages, chosen by page size: gathers_pages in family.hpp). Its 128
// threads copy K and V with cp.async into the ring, in the order of ring.hpp
// and in the layout producer.cuh's TMA loads give the stages (128-byte rows,
// 128-byte swizzle: 16-byte chunk c of row r of a 1024-byte aligned box at
// chunk c ^ (r % 8)), so the consumers are the same as for any other cache.
//
// Thread t owns key t of every 128-key block: it loads its table entry once a
// block (block j + 1's while block j's stages are filled, so that the
// table's latency passes under copies) and turns it into its row's place in
// K or V (row_units: 16-byte units from the tensor's base), which it writes
// to its warp's row table. A warp copies the rows of its 32 keys a box at a
// time in whole lines: lane l copies chunk l % 8 of rows l / 8 + 4 i, the
// eight rows read from the table in two loads (copy_rows), through L2 only
// (cp_async_16 is .cg). Where a thread
// copied its own row instead, each copy read half of 32 sectors (1.57 ms at
// page 1 through L1, 3.04 through L2 alone); whole lines took it to 0.77 ms
// (H200, 2026-12-03: docs/kernels/serving.md). The producer issues copies
// as fast as its latency chain lets it (ncu: the ring is rarely full), so the
// box's copies stay unrolled: the same loop in 24 registers without spills
// (rolled) ran 20-33 % slower. A key past the sequence's Nkv, and
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
#include "kernels/sm90_wgmma/row_table.cuh"

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

  // This thread's key row of block j, on page `block_page`, in a k or v
  // tensor (b, h, n strides): its offset from the tensor's base in 16-byte
  // units (one word of the warp's row table: gather_units_fit keeps a
  // gathered cache's rows below 2^32 - 1 units), kNoKeyRow past the sequence.
  __device__ __forceinline__ uint32_t row_units(const int64_t (&stride)[3], int block_page, int j) const {
    if (block_page < 0) return kNoKeyRow;
    const int row = (cta.block_key(j) + thread) % static_cast<int>(cta.p.sequences.page_size);
    return static_cast<uint32_t>((block_page * stride[0] + cta.tile()->kv_head * stride[1] + row * stride[2]) *
                                 kElementBytes / 16);
  }

  // This warp's row table of K (kv 0) or V (1) (row_table.cuh): lane l
  // finds its eight rows l / 8 + 4 i at entries 8 (l / 8) + i.
  __device__ __forceinline__ uint32_t row_table(int kv) const { return key_row_table(cta, thread, kv); }
  __device__ __forceinline__ void publish_row(int kv, uint32_t units) const { publish_key_row(cta, thread, kv, units); }

  // Columns [col, col + kBoxCols) of the 32 rows of this thread's warp (its
  // lanes' keys, their units in the warp's row table `table`; `width`
  // columns in the tensor) into rows warp_row0 + 0..31 of the 1024-byte
  // aligned box at `box` (128-byte rows): chunk c of box row r at chunk
  // c ^ (r % 8). A copy reads whole lines: lane l copies chunk l % 8 of rows
  // l / 8 + 4 i (i = 0..7). Row l / 8 + 4 i is at box + 128 (l / 8) + 512 i,
  // its swizzle (l / 8 + 4 i) % 8 is l / 8, or l / 8 + 4 for odd i: bit 6 of
  // the address flipped. The eight rows come from the table in two loads,
  // then the eight copies issue back to back.
  __device__ __forceinline__ void copy_rows(uint32_t box, int warp_row0, const void* tensor, uint32_t table, int col,
                                            int width) const {
    constexpr int kRowsPerCopy = 32 / kRowChunks, kCopies = 32 / kRowsPerCopy;
    static_assert(kCopies == 8, "two 16-byte loads of the row table");
    const int lane = opaque(thread) % 32, chunk = lane % kRowChunks, first = lane / kRowChunks;
    uint32_t rows[kCopies];
    ld_shared_v4(table + 32 * first, *reinterpret_cast<uint32_t(*)[4]>(&rows[0]));
    ld_shared_v4(table + 32 * first + 16, *reinterpret_cast<uint32_t(*)[4]>(&rows[4]));
    const uint32_t dst = (box + (warp_row0 + first) * kSwizzleRowBytes + 16 * chunk) ^ (first << 4);
    const uint32_t col_units = static_cast<uint32_t>(col * kElementBytes / 16 + chunk);
    const bool whole = col + kBoxCols <= width;  // uniform: the box's columns all exist
    const uint32_t chunk_bytes =
        whole ? 16u : static_cast<uint32_t>(min(max((width - col) * kElementBytes - 16 * chunk, 0), 16));
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const bool none = rows[i] == kNoKeyRow;
      const uint32_t src_units = none ? col_units : rows[i] + col_units;  // < 2^32 - 1: gather_units_fit
      cp_async_16(((i % 2) ? dst ^ 64u : dst) + i * kRowsPerCopy * kSwizzleRowBytes,
                  static_cast<const char*>(tensor) + 16 * static_cast<uint64_t>(src_units), none ? 0u : chunk_bytes);
    }
  }

  // K_j (on `page`): its kKStages stages, this warp's 32 rows of each box.
  __device__ __forceinline__ void load_k(int j) {
    publish_row(0, row_units(cta.p.k_stride, page, j));
#pragma unroll 1
    for (int ks = 0; ks < kKStages; ++ks) {
      constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
      const int stage = acquire();
      // At D 1024 the CTA's first column, hoisted out of the KV loop, would
      // not fit the 24 registers (as in producer.cuh).
      const int col0 = Traits::kSplit == 2 ? opaque(cta.qk_col0()) : cta.qk_col0();
#pragma unroll
      for (int b = 0; b < (ks + 1 < kKStages ? 2 : kLast); ++b)
        copy_rows(cta.ring() + stage * Traits::kStageBytes + b * Traits::kKBoxBytes, thread / 32 * 32,
                  cta.p.k, row_table(0), col0 + (2 * ks + b) * kBoxCols, static_cast<int>(cta.p.head_dim));
      cp_async_arrive_noinc(cta.full(position - 1));
    }
  }

  // V_j (this thread's key on `block_page`): a stage per (key half,
  // consumer), copied by the two warps whose keys are in the half.
  __device__ __forceinline__ void load_v(int j, int block_page) {
    publish_row(1, row_units(cta.p.v_stride, block_page, j));
#pragma unroll 1
    for (int key_half = 0; key_half < 2; ++key_half)
#pragma unroll 1
      for (int w = 0; w < 2; ++w) {
        const int stage = acquire();
        if (thread / 64 == key_half) {  // whole warps
          const int col0 = (Traits::kSplit == 2 ? opaque(cta.vo_col0()) : cta.vo_col0()) + w * Traits::kHalfCols;
#pragma unroll
          for (int box = 0; box < Traits::kHalfCols / kBoxCols; ++box)
            copy_rows(cta.ring() + stage * Traits::kStageBytes + box * Traits::kTileBytes, thread % 64 / 32 * 32,
                      cta.p.v, row_table(1), col0 + box * kBoxCols, static_cast<int>(cta.p.dv()));
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
