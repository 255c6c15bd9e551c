// What every role of an sm90_wgmma CTA shares: the shared-memory layout
// (Traits), the barriers, the tile (computed once by thread 0 into shared
// memory and read where used, so the consumers do not carry it in registers)
// and this CTA's column ranges within a cluster.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/shared_memory.cuh"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm90_wgmma/partial_exchange.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/traits.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
struct Cta {
  static constexpr int kSplit = Traits::kSplit, kStages = Traits::kStages;
  static constexpr int kFull = Traits::kFullBarriers;

  const Args& args;
  const AttentionProblem& p;

  __device__ __forceinline__ explicit Cta(const Args& args_) : args(args_), p(args_.p) {}

  __device__ __forceinline__ static unsigned char* smem() { return cta_shared_memory(); }

  __device__ __forceinline__ uint32_t q_tiles() const { return smem_address(smem() + Traits::kQOffset); }
  __device__ __forceinline__ uint32_t p_tiles() const { return smem_address(smem() + Traits::kPOffset); }
  __device__ __forceinline__ uint32_t ring() const { return smem_address(smem() + Traits::kRingOffset); }
  // [buffer][max | scale][row]: the row statistics published with each P.
  __device__ __forceinline__ float* stats() const { return reinterpret_cast<float*>(smem() + Traits::kStatsOffset); }
  // Running softmax denominators, [consumer][row]: each consumer sums the P of
  // its own blocks. In shared memory, not registers: S and O fill those.
  __device__ __forceinline__ float* row_sums() const {
    return reinterpret_cast<float*>(smem() + Traits::kRowSumOffset);
  }
  __device__ __forceinline__ TileCoordinates* tile() const {
    return reinterpret_cast<TileCoordinates*>(smem() + Traits::kTileOffset);
  }
  // The tile's sequence (its lengths and where its rows lie), beside the tile.
  __device__ __forceinline__ TileSequence* sequence() const {
    return reinterpret_cast<TileSequence*>(smem() + Traits::kSequenceOffset);
  }
  // The tile's first row's key bounds (causal limit, window), beside its sequence.
  __device__ __forceinline__ TileKeyBounds* key_bounds() const {
    return reinterpret_cast<TileKeyBounds*>(smem() + Traits::kSequenceOffset + sizeof(TileSequence));
  }
  // A serving call's CTA past its plan's tiles (setup marks it): it does nothing.
  __device__ __forceinline__ bool idle() const { return sequence()->seq_q < 0; }
  // Whether the tile writes split-KV's partial rows (a sequence batch: where
  // its plan split the keys) instead of O and LSE.
  __device__ __forceinline__ bool writes_partials() const { return writes_split_partials(p, args.kv_splits); }
  // The first key of the tile's KV block j (blocks count from its split's first).
  __device__ __forceinline__ int block_key(int j) const { return (tile()->kv_first + j) * Traits::kBlockN; }

  // Traits::kCacheCodes: [0] the score factor (scale_log2 x the tile's
  // k_descale), [1] O's factor (its v_descale); read where used.
  __device__ __forceinline__ const float* code_factors() const {
    return reinterpret_cast<const float*>(smem() + Traits::kCodeFactorsOffset);
  }
  // The factor S is multiplied by before the softmax (log2 domain).
  __device__ __forceinline__ float score_scale() const {
    if constexpr (Traits::kCacheCodes) {
      return opaque(code_factors())[0];
    } else {
      return args.scale_log2;
    }
  }

  // --- barriers -------------------------------------------------------------
  __device__ __forceinline__ uint32_t barriers() const { return smem_address(smem() + Traits::kBarrierOffset); }
  __device__ __forceinline__ uint32_t q_full() const { return barriers(); }
  // Ring position p lives in stage p % kStages and completes on full barrier
  // p % kFull: see "Why more full barriers than stages" (kernel.cuh).
  __device__ __forceinline__ uint32_t full(int position) const { return barriers() + 8 * (1 + position % kFull); }
  __device__ __forceinline__ static uint32_t full_parity(int position) {
    return static_cast<uint32_t>((position / kFull) & 1);
  }
  __device__ __forceinline__ uint32_t empty(int stage) const { return barriers() + 8 * (1 + kFull + stage); }
  __device__ __forceinline__ uint32_t p_full(int buffer) const {
    return barriers() + 8 * (1 + kFull + kStages + buffer);
  }
  __device__ __forceinline__ uint32_t p_empty(int buffer) const {
    return barriers() + 8 * (3 + kFull + kStages + buffer);
  }
  // kSplit = 2: the peer's partial S has landed here / this CTA's has been read there.
  __device__ __forceinline__ uint32_t x_full() const { return barriers() + 8 * (5 + kFull + kStages); }
  __device__ __forceinline__ uint32_t x_empty() const { return x_full() + 8; }
  // kDropout: consumer w's next block's keep bits are written / the last
  // block's have been read (dropout_warps.cuh).
  __device__ __forceinline__ uint32_t keep_full(int w) const { return barriers() + 8 * (Traits::kKeepBarrier + w); }
  __device__ __forceinline__ uint32_t keep_empty() const { return barriers() + 8 * (Traits::kKeepBarrier + 2); }
  __device__ __forceinline__ uint32_t* keep_words() const {
    return reinterpret_cast<uint32_t*>(smem() + Traits::kKeepOffset);
  }

  // Column offsets of this CTA's part of Q/K (S) and of V/O.
  __device__ __forceinline__ static int qk_col0() { return split_rank<kSplit>() * Traits::kQKChunks * Traits::kBoxCols; }
  __device__ __forceinline__ static int vo_col0() { return split_rank<kSplit>() * Traits::kOutCols; }
  __device__ __forceinline__ static uint32_t peer_rank() { return static_cast<uint32_t>(1 - split_rank<kSplit>()); }

  // Thread 0: the tile of this CTA (the CTAs of a cluster share it) and the barriers.
  __device__ __forceinline__ void setup() const {
    if (threadIdx.x == 0) {
      const int index = static_cast<int>(blockIdx.x / kSplit);
      if (p.sequences.active) {
        // A serving call's tile from its plan (kernels/common/sequence_schedule.hpp).
        const auto* header = static_cast<const SequenceScheduleHeader*>(p.sequences.plan);
        const SequenceTiling tiling{Traits::kBlockM, Traits::kBlockN, args.heads_per_tile, args.split_slots};
        if (index < planned_tiles(*header, tiling)) {
          *tile() = sequence_tile_coordinates(p, p.sequences.plan, index, tiling, sequence());
        } else {
          sequence()->seq_q = -1;  // idle()
        }
      } else {
        *tile() = tile_coordinates<int>(p, index, args.row_blocks, Traits::kBlockM, Traits::kBlockN, args.kv_splits,
                                        args.split_blocks, args.heads_per_tile, args.first_row_block);
        *sequence() = tile_sequence(p, tile()->batch);
      }
      if (!idle()) *key_bounds() = tile_key_bounds(p, *tile(), *sequence());
      if constexpr (Traits::kCacheCodes) {
        const KvDescales descales = idle() ? KvDescales{1.0f, 1.0f} : kv_descales(p, tile()->batch, tile()->kv_head);
        float* const factors = reinterpret_cast<float*>(smem() + Traits::kCodeFactorsOffset);
        factors[0] = args.scale_log2 * descales.k;
        factors[1] = descales.v;
      }
      mbarrier_init(q_full(), 1);
      // A ring position completes on one TMA arrival with its bytes, or on
      // every producer thread's cp.async arrival (the paged gather).
      // (The e4m3 cache's converters arrive so too, once they have widened it.)
      const uint32_t full_arrivals = (Traits::kGathersPages && args.gather_pages) || Traits::kCacheCodes ? 128 : 1;
      for (int f = 0; f < kFull; ++f) mbarrier_init(full(f), full_arrivals);
      for (int s = 0; s < kStages; ++s) mbarrier_init(empty(s), Traits::kEmptyArrivals);  // a consumer warp each
      for (int b = 0; b < 2; ++b) {
        mbarrier_init(p_full(b), 128);  // every thread of the owner writes part of P
        mbarrier_init(p_empty(b), 4);   // the other consumer's warps have read P
      }
      if constexpr (kSplit == 2) {
        mbarrier_init(x_full(), 1);     // the receiver's announcement of the slot's bytes (st.async)
        mbarrier_init(x_empty(), 128);
      }
      if constexpr (Traits::kDropoutWarps) {
        for (int w = 0; w < 2; ++w) mbarrier_init(keep_full(w), Traits::kDropoutThreads);
        mbarrier_init(keep_empty(), 128);  // every thread of the block's S owner has read its words
      }
      fence_barrier_init();
    }
    if constexpr (kSplit == 1) {
      __syncthreads();
    } else {
      cluster_sync();  // the peer's barriers exist before anyone arrives on them
    }
  }
};

}  // namespace ffpa::detail::sm90_wgmma
