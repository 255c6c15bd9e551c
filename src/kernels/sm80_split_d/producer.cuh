// The split-D producer: every thread copies its share of each ring step with
// cp.async (16 bytes at a time, zero-filling what lies past Nq, Nkv or D),
// kStages - 1 steps ahead of the step being computed, so loads run across
// phase and tile boundaries. Steps of a KV tile: n_qk chunks of 64 head-dim
// columns of Q and K, then kPVSteps slices of kPVKeys keys of V.
#pragma once

#include "common/fp8_e4m3.hpp"
#include "kernels/common/element.cuh"
#include "kernels/common/shared_memory.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm80_split_d/cta.cuh"
#include "kernels/sm80_split_d/ptx.cuh"

namespace ffpa::detail::sm80_split_d {

// The element offset of key `key`'s row of k or v (kv head tile.kv_head,
// column 0): of the sequence's rows, or of its page (paged caches; a key past
// the sequence's Nkv reads no table entry and is never copied).
template <class Traits>
__device__ __forceinline__ int64_t Cta<Traits>::key_row(const int64_t (&stride)[3], int key) const {
  const int64_t head = tile.kv_head * stride[1];
  const SequenceLayout& s = p.sequences;
  if (s.paged()) {
    if (key >= seq_kv) return head;
    const int page_size = static_cast<int>(s.page_size);
    const int64_t page = s.block_table[tile.batch * s.block_table_stride[0] + (key / page_size) * s.block_table_stride[1]];
    return head + page * stride[0] + (key % page_size) * stride[2];
  }
  return head + seq.kv_batch * stride[0] + static_cast<int64_t>(seq.kv_begin + key) * stride[2];
}

// An e4m3 cache (the serving engines' FP8 format) is copied 16 codes at a
// time, so that its loads stay 16-byte cp.async.cg like the 16-bit path's
// (below 16 bytes cp.async has only .ca, through an L1 that the shared memory
// leaves small): four threads a row, thread t copying columns 16 (t % 4) ..
// + 15 of stacked rows t / 4 + k kCodeRowsPerPass into the place of the row's
// 16-bit segment 2 (t % 4). Once the step is waited for, the same thread
// converts them in place into segments 2 (t % 4) and 2 (t % 4) + 1
// (convert_codes), exactly (every e4m3 value is an f16 and a bf16 value; the
// descales act on the scores and the output instead): the codes take no
// shared memory of their own and no thread reads another's places.
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::convert_codes(uint32_t rows, int passes) const {
  constexpr int kCodeRowsPerPass = Traits::kThreads / 4;
  const unsigned thread = opaque(tid);
  const int pair = thread % 4, row = thread / 4;
  const uint32_t first = rows + swizzle128<Traits::kElementBytes>(row, 16 * pair);
  const uint32_t second = rows + swizzle128<Traits::kElementBytes>(row, 16 * pair + 8);
#pragma unroll 4
  for (int k = 0; k < passes; ++k) {
    const uint4 codes = ld_shared_16(first + k * kCodeRowsPerPass * 128);
    const uint32_t low[4] = {unpack_e4m3x2<Element>(codes.x), unpack_e4m3x2<Element>(codes.x >> 16),
                             unpack_e4m3x2<Element>(codes.y), unpack_e4m3x2<Element>(codes.y >> 16)};
    const uint32_t high[4] = {unpack_e4m3x2<Element>(codes.z), unpack_e4m3x2<Element>(codes.z >> 16),
                              unpack_e4m3x2<Element>(codes.w), unpack_e4m3x2<Element>(codes.w >> 16)};
    st_shared_16(first + k * kCodeRowsPerPass * 128, low);
    st_shared_16(second + k * kCodeRowsPerPass * 128, high);
  }
}

// A stage is a stack of 128-byte rows. Thread tid copies 16-byte segment
// tid % 8 of stacked rows tid / 8 + k * kRowsPerPass, for a fixed number of k:
// row offsets are compile-time multiples of the row stride, and the swizzled
// segment is the same for all k (kRowsPerPass is a multiple of 8).
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::issue_next_step(int into_slot) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPVKeys = Traits::kPVKeys;
  constexpr int kRowsPerPass = Traits::kThreads / 8, kCodeRowsPerPass = Traits::kThreads / 4;
  static_assert(kBlockN % kCodeRowsPerPass == 0 && (Traits::kVStageBytes / 128) % kCodeRowsPerPass == 0 &&
                    (kPVKeys % kCodeRowsPerPass == 0 || kCodeRowsPerPass % kPVKeys == 0),
                "an e4m3 cache's K and V rows fill whole passes of four threads a row");
  if (load_tile < tile.kv_blocks) {
    const unsigned thread = opaque(tid);
    const int seg = thread % 8, first_row = thread / 8;
    const uint32_t seg_offset = swizzle128<Traits::kElementBytes>(first_row, seg * 8);
    const int64_t k_stride = p.k_stride[2], v_stride = p.v_stride[2];
    const Element* const q_batch =
        static_cast<const Element*>(p.q) + seq.q_batch * p.q_stride[0] + seq.q_begin * p.q_stride[2] + seg * 8;
    const bool paged = p.sequences.paged();
    const int kv0 = (tile.kv_first + load_tile) * kBlockN;  // tiles of a KV split start at its first block
    const uint32_t stage = smem_address(ring() + into_slot * Traits::kStageBytes) + seg_offset;
    if (load_r < n_qk) {  // kBlockM rows of Q, then kBlockN rows of K, one 64-column chunk
      const int col = load_r * Traits::kChunk;
      const bool valid_col = col + seg * 8 < head_dim;
      constexpr int kQPasses = kBlockM / kRowsPerPass;
#pragma unroll
      for (int k = 0; k < kQPasses; ++k) {
        // Tile row -> (head, query row): the same head and q0 + row unless the tile packs heads.
        const int row = first_row + k * kRowsPerPass, i = tile.query_row(row);
        const Element* const q_src = q_batch + tile.row_head(row) * p.q_stride[1] + i * p.q_stride[2];
        cp_async_16(stage + k * kRowsPerPass * 128, q_src + col, valid_col && i < seq_q);
      }
      if (!p.kv_e4m3) {
        const int64_t k_src = key_row(p.k_stride, kv0 + first_row) + seg * 8;
#pragma unroll
        for (int k = 0; k < kBlockN / kRowsPerPass; ++k) {
          const int row = k * kRowsPerPass;
          const bool valid = valid_col && kv0 + first_row + row < seq_kv;
          const int64_t src = paged ? key_row(p.k_stride, kv0 + first_row + row) + seg * 8 : k_src + row * k_stride;
          cp_async_16(stage + (kQPasses + k) * kRowsPerPass * 128, static_cast<const Element*>(p.k) + src + col, valid);
        }
      } else {  // codes, four threads a row (convert_codes)
        const int pair = thread % 4, code_row = thread / 4;
        const uint32_t rows = smem_address(ring() + into_slot * Traits::kStageBytes) + kBlockM * 128 +
                              swizzle128<Traits::kElementBytes>(code_row, 16 * pair);
        const bool valid_codes = col + 16 * pair < head_dim;
        const int64_t k_src = key_row(p.k_stride, kv0 + code_row) + col + 16 * pair;
#pragma unroll
        for (int k = 0; k < kBlockN / kCodeRowsPerPass; ++k) {
          const int key = kv0 + code_row + k * kCodeRowsPerPass;
          const int64_t src = paged ? key_row(p.k_stride, key) + col + 16 * pair : k_src + k * kCodeRowsPerPass * k_stride;
          cp_async_16(rows + k * kCodeRowsPerPass * 128, static_cast<const uint8_t*>(p.k) + src,
                      valid_codes && key < seq_kv);
        }
      }
    } else {  // kPVKeys keys of V, every 64-column subtile of the O slice
      if (!p.kv_e4m3) {
        // This thread's first row and subtile in the stack of subtiles.
        const int v_row0 = first_row % kPVKeys, v_sub0 = first_row / kPVKeys;
        const int key0 = kv0 + (load_r - n_qk) * kPVKeys + v_row0;
        const int64_t v_src = key_row(p.v_stride, key0) + dv0 + v_sub0 * 64 + seg * 8;
#pragma unroll
        for (int k = 0; k < Traits::kVStageBytes / 128 / kRowsPerPass; ++k) {
          const int row = (k * kRowsPerPass) % kPVKeys, sub = (k * kRowsPerPass) / kPVKeys;
          const bool valid = (v_sub0 + sub) * 64 + seg * 8 < out_cols && key0 + row < seq_kv;
          const int64_t src =
              paged ? key_row(p.v_stride, key0 + row) + dv0 + v_sub0 * 64 + seg * 8 : v_src + row * v_stride;
          cp_async_16(stage + k * kRowsPerPass * 128, static_cast<const Element*>(p.v) + src + sub * 64, valid);
        }
      } else {  // codes, four threads a stacked row (convert_codes)
        const int pair = thread % 4, code_row = thread / 4;
        const int v_row0 = code_row % kPVKeys, v_sub0 = code_row / kPVKeys;
        const int key0 = kv0 + (load_r - n_qk) * kPVKeys + v_row0;
        const uint32_t rows = smem_address(ring() + into_slot * Traits::kStageBytes) +
                              swizzle128<Traits::kElementBytes>(code_row, 16 * pair);
        const int64_t v_src = key_row(p.v_stride, key0) + dv0 + v_sub0 * 64 + 16 * pair;
#pragma unroll
        for (int k = 0; k < Traits::kVStageBytes / 128 / kCodeRowsPerPass; ++k) {
          const int row = (k * kCodeRowsPerPass) % kPVKeys, sub = (k * kCodeRowsPerPass) / kPVKeys;
          const bool valid = (v_sub0 + sub) * 64 + 16 * pair < out_cols && key0 + row < seq_kv;
          const int64_t src =
              paged ? key_row(p.v_stride, key0 + row) + dv0 + v_sub0 * 64 + 16 * pair : v_src + row * v_stride;
          cp_async_16(rows + k * kCodeRowsPerPass * 128, static_cast<const uint8_t*>(p.v) + src + sub * 64, valid);
        }
      }
    }
    if (++load_r == steps_per_tile) load_r = 0, ++load_tile;
  }
  cp_async_commit();
}

template <class Traits>
__device__ __forceinline__ void Cta<Traits>::prime_ring() {
  for (int s = 0; s < Traits::kStages - 1; ++s) issue_next_step(s);
}

// Waits for the buffer of the current step (a Q/K step or a V step; an e4m3
// cache's codes converted by the threads that copied them) and refills the
// one freed by the previous step (every thread has passed the barrier, so it
// is unused).
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::advance_ring(bool qk_step) {
  cp_async_wait<Traits::kStages - 2>();
  if (p.kv_e4m3) {
    constexpr int kCodeRowsPerPass = Traits::kThreads / 4;
    const uint32_t stage = smem_address(ring() + slot * Traits::kStageBytes);
    if (qk_step) {
      convert_codes(stage + Traits::kBlockM * 128, Traits::kBlockN / kCodeRowsPerPass);
    } else {
      convert_codes(stage, Traits::kVStageBytes / 128 / kCodeRowsPerPass);
    }
  }
  __syncthreads();
  issue_next_step(slot == 0 ? Traits::kStages - 1 : slot - 1);
}

template <class Traits>
__device__ __forceinline__ void Cta<Traits>::release_slot() {
  slot = slot + 1 == Traits::kStages ? 0 : slot + 1;
}

}  // namespace ffpa::detail::sm80_split_d
