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

// Chunk i (a 16-byte place of 8 elements, kRowsPerPass rows after chunk
// i - 1) of a thread's run of K or V chunks at `run`, from `base` + `offset`
// elements: a cp.async of 16-bit elements, or (an e4m3 cache) of its 8 codes
// into the place of chunk i / 2, where convert_codes finds them once the step
// is waited for. The loads stay asynchronous, kStages - 1 steps ahead, and
// the codes take no shared memory of their own (a thread owns its run).
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::copy_kv_16(uint32_t run, int i, const void* base, int64_t offset,
                                                        bool valid) const {
  constexpr uint32_t kPlaceBytes = Traits::kThreads / 8 * 128;
  if (!p.kv_e4m3) {
    cp_async_16(run + i * kPlaceBytes, static_cast<const Element*>(base) + offset, valid);
    return;
  }
  cp_async_8(run + (i / 2) * kPlaceBytes + (i % 2) * 8, static_cast<const uint8_t*>(base) + offset, valid);
}

// An e4m3 cache: this thread's run of kChunks chunks at `run`, codes (as
// copy_kv_16 placed them) converted to 16-bit elements in place, exactly (the
// descales act on the scores and the output instead). Descending: chunk i
// overwrites the codes of chunks 2i and 2i + 1, converted before it (i > 0;
// chunk 0 reads its own first).
template <class Traits>
template <int kChunks>
__device__ __forceinline__ void Cta<Traits>::convert_codes(uint32_t run) const {
  constexpr uint32_t kPlaceBytes = Traits::kThreads / 8 * 128;
#pragma unroll
  for (int i = kChunks - 1; i >= 0; --i) {
    const uint2 codes = ld_shared_8(run + (i / 2) * kPlaceBytes + (i % 2) * 8);
    const uint32_t words[4] = {unpack_e4m3x2<Element>(codes.x), unpack_e4m3x2<Element>(codes.x >> 16),
                               unpack_e4m3x2<Element>(codes.y), unpack_e4m3x2<Element>(codes.y >> 16)};
    st_shared_16(run + i * kPlaceBytes, words);
  }
}

// A stage is a stack of 128-byte rows. Thread tid copies 16-byte segment
// tid % 8 of stacked rows tid / 8 + k * kRowsPerPass, for a fixed number of k:
// row offsets are compile-time multiples of the row stride, and the swizzled
// segment is the same for all k (kRowsPerPass is a multiple of 8).
template <class Traits>
__device__ __forceinline__ void Cta<Traits>::issue_next_step(int into_slot) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPVKeys = Traits::kPVKeys;
  constexpr int kRowsPerPass = Traits::kThreads / 8;
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
      const int64_t k_src = key_row(p.k_stride, kv0 + first_row) + seg * 8;
      const int col = load_r * Traits::kChunk;
      const bool valid_col = col + seg * 8 < head_dim;
      constexpr int kQPasses = kBlockM / kRowsPerPass;
#pragma unroll
      for (int k = 0; k < (kBlockM + kBlockN) / kRowsPerPass; ++k) {
        if (k < kQPasses) {
          // Tile row -> (head, query row): the same head and q0 + row unless the tile packs heads.
          const int row = first_row + k * kRowsPerPass, i = tile.query_row(row);
          const Element* const q_src = q_batch + tile.row_head(row) * p.q_stride[1] + i * p.q_stride[2];
          cp_async_16(stage + k * kRowsPerPass * 128, q_src + col, valid_col && i < seq_q);
        } else {
          const int row = (k - kQPasses) * kRowsPerPass;
          const bool valid = valid_col && kv0 + first_row + row < seq_kv;
          const int64_t src = paged ? key_row(p.k_stride, kv0 + first_row + row) + seg * 8 : k_src + row * k_stride;
          copy_kv_16(stage + kQPasses * kRowsPerPass * 128, k - kQPasses, p.k, src + col, valid);
        }
      }
    } else {  // kPVKeys keys of V, every 64-column subtile of the O slice
      // This thread's first row and subtile in the stack of subtiles.
      const int v_row0 = first_row % kPVKeys, v_sub0 = first_row / kPVKeys;
      const int key0 = kv0 + (load_r - n_qk) * kPVKeys + v_row0;
      const int64_t v_src = key_row(p.v_stride, key0) + dv0 + v_sub0 * 64 + seg * 8;
#pragma unroll
      for (int k = 0; k < Traits::kVStageBytes / 128 / kRowsPerPass; ++k) {
        const int row = (k * kRowsPerPass) % kPVKeys, sub = (k * kRowsPerPass) / kPVKeys;
        const bool valid = (v_sub0 + sub) * 64 + seg * 8 < out_cols && key0 + row < seq_kv;
        const int64_t src = paged ? key_row(p.v_stride, key0 + row) + dv0 + v_sub0 * 64 + seg * 8 : v_src + row * v_stride;
        copy_kv_16(stage, k, p.v, src + sub * 64, valid);
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
    constexpr int kRowsPerPass = Traits::kThreads / 8;
    const unsigned thread = opaque(tid);
    const uint32_t stage = smem_address(ring() + slot * Traits::kStageBytes) +
                           swizzle128<Traits::kElementBytes>(thread / 8, (thread % 8) * 8);
    if (qk_step) {
      convert_codes<Traits::kBlockN / kRowsPerPass>(stage + Traits::kBlockM / kRowsPerPass * kRowsPerPass * 128);
    } else {
      convert_codes<Traits::kVStageBytes / 128 / kRowsPerPass>(stage);
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
