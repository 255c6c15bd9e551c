// What every role of an sm90 backward CTA shares: the shared-memory layout
// (Traits), the barriers and the block plan (thread 0 computes it into shared
// memory; the roles read it where used): which stationary rows the CTA holds
// and, for each streamed block, its rows and the tile the masking pieces see.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/score_gradients.cuh"
#include "kernels/common/shared_memory.cuh"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm80_backward/sequence_plans.hpp"
#include "kernels/sm90_backward/traits.cuh"
#include "kernels/sm90_wgmma/partial_exchange.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_backward {

using sm90_wgmma::cta_shared_memory;

struct BlockPlan {
  // dq: the stationary query rows' tile (tile_schedule.hpp: its KV blocks are
  // the streamed ones); dk, dv: batch (the sequence) and kv_head.
  TileCoordinates tile;
  TileSequence seq;  // the block's sequence: its lengths, where its rows lie
  int key0;  // dk, dv: the first stationary key
  int blocks;  // streamed blocks
  // dk, dv: streamed block j is row block first_row_block + j % row_blocks of
  // query head kv_head x group + j / row_blocks (the row blocks that attend a
  // stationary key, for each query head of the group).
  int first_row_block, row_blocks;
  // Streamed block 0's first row in its tensor (its sequence's first row
  // plus the block's): the producer's TMA coordinate, read from here so that
  // the producer's 24 registers hold no more than a dense call's.
  int streamed_row0;
  int idle;  // a sequence batch's CTA past its plan's tiles: nothing to load, compute or store
};

template <class Traits>
struct Cta {
  static constexpr int kStages = Traits::kStages, kFull = Traits::kFullBarriers, kSplit = Traits::kSplit;
  static_assert(sizeof(BlockPlan) <= Traits::kBarrierOffset - Traits::kPlanOffset, "the plan before the barriers");

  const Args& args;
  const AttentionProblem& p;

  __device__ __forceinline__ explicit Cta(const Args& args_) : args(args_), p(args_.p) {}

  __device__ __forceinline__ static unsigned char* smem() { return cta_shared_memory(); }
  // Stationary tile c: Q's or K's chunk c, then (kWithDp) dO's or V's.
  __device__ __forceinline__ uint32_t stationary() const { return smem_address(smem() + Traits::kStationaryOffset); }
  __device__ __forceinline__ unsigned char* w_tile(int buffer) const {
    return smem() + Traits::kWOffset + buffer * Traits::kTileBytes;
  }
  __device__ __forceinline__ uint32_t ring() const { return smem_address(smem() + Traits::kRingOffset); }
  __device__ __forceinline__ BlockPlan* plan() const { return reinterpret_cast<BlockPlan*>(smem() + Traits::kPlanOffset); }

  // This CTA's columns of every operand and of the gradient start at col0()
  // (kSplit = 2: rank r holds [r kCtaDim, (r + 1) kCtaDim)).
  __device__ __forceinline__ static int rank() { return sm90_wgmma::split_rank<kSplit>(); }
  __device__ __forceinline__ static int col0() { return rank() * Traits::kCtaDim; }
  // kSplit = 2: the partial S and dP to and from the peer, a phase per streamed block.
  __device__ __forceinline__ sm90_wgmma::PartialExchange exchange(int thread) const {
    return {smem() + Traits::kExchangeOffset, x_full(), x_empty(), static_cast<uint32_t>(1 - rank()), thread};
  }

  // Streamed block j: the tile of its query rows (the masking pieces' view)
  // and its first key, for S_j = Q K^T of the pair.
  __device__ __forceinline__ TileCoordinates block_tile(int j) const {
    const BlockPlan* plan_ = plan();
    if constexpr (Traits::kQueryStationary) {
      return plan_->tile;
    } else {
      const int group = static_cast<int>(p.group_size());
      return block_pair_tile((plan_->first_row_block + j % plan_->row_blocks) * Traits::kBlockN,
                             plan_->tile.kv_head * group + j / plan_->row_blocks, plan_->tile.batch,
                             plan_->tile.kv_head, Traits::kBlockN);
    }
  }
  __device__ __forceinline__ int block_key0(int j) const {
    if constexpr (Traits::kQueryStationary) {
      return (plan()->tile.kv_first + j) * Traits::kBlockN;
    } else {
      return plan()->key0;
    }
  }
  // The rows of streamed block j that belong to its sequence (keys for dq,
  // query rows for dk and dv), at most kBlockN.
  __device__ __forceinline__ int streamed_rows(int j) const {
    const BlockPlan* plan_ = plan();
    const int rows = Traits::kQueryStationary ? plan_->seq.seq_kv - block_key0(j) : plan_->seq.seq_q - block_tile(j).q0;
    return rows < Traits::kBlockN ? rows : Traits::kBlockN;
  }

  // --- barriers -------------------------------------------------------------
  __device__ __forceinline__ uint32_t barriers() const { return smem_address(smem() + Traits::kBarrierOffset); }
  __device__ __forceinline__ uint32_t stationary_full() const { return barriers(); }
  __device__ __forceinline__ uint32_t full(int position) const { return barriers() + 8 * (1 + position % kFull); }
  __device__ __forceinline__ static uint32_t full_parity(int position) {
    return static_cast<uint32_t>((position / kFull) & 1);
  }
  __device__ __forceinline__ uint32_t empty(int stage) const { return barriers() + 8 * (1 + kFull + stage); }
  // W_j written (every thread of its owner) / read by the other consumer (a warp each).
  __device__ __forceinline__ uint32_t w_full(int buffer) const { return barriers() + 8 * (1 + kFull + kStages + buffer); }
  __device__ __forceinline__ uint32_t w_empty(int buffer) const { return barriers() + 8 * (3 + kFull + kStages + buffer); }
  __device__ __forceinline__ uint32_t x_full() const { return barriers() + 8 * (5 + kFull + kStages); }
  __device__ __forceinline__ uint32_t x_empty() const { return x_full() + 8; }
  // A phase per block: its owner has sent (x_sent) or read (x_read) its
  // partials (consumer.cuh: the other consumer's exchanges of the next block wait for them).
  __device__ __forceinline__ uint32_t x_sent() const { return x_full() + 16; }
  __device__ __forceinline__ uint32_t x_read() const { return x_full() + 24; }

  // Thread 0: the plan (stationary block fastest, then head, then batch; a
  // sequence batch's from its plan, the same order within each sequence; the
  // CTAs of a cluster share it) and the barriers.
  __device__ __forceinline__ void setup() const {
    if (threadIdx.x == 0) {
      BlockPlan* const plan_ = plan();
      const int cta = static_cast<int>(blockIdx.x) / kSplit;
      plan_->idle = 0;
      plan_->blocks = 0;
      const auto* const header = static_cast<const SequenceScheduleHeader*>(args.plan);
      const int32_t* const first_tile = p.sequences.active ? reinterpret_cast<const int32_t*>(header + 1) : nullptr;
      if (p.sequences.active && cta >= header->tiles) {  // a faulty plan has none
        plan_->idle = 1;
      } else if constexpr (Traits::kQueryStationary) {
        if (p.sequences.active) {
          plan_->tile = sequence_tile_coordinates(p, args.plan, cta, sm80_backward::query_tiling(), &plan_->seq);
        } else {
          plan_->tile = tile_coordinates<int>(p, cta, args.stationary_blocks, Traits::kBlockM, Traits::kBlockN);
          plan_->seq = tile_sequence(p, plan_->tile.batch);
        }
        plan_->blocks = plan_->tile.kv_blocks;
        plan_->streamed_row0 = plan_->seq.kv_begin + plan_->tile.kv_first * Traits::kBlockN;
      } else {
        int key_block = 0, kv_head = 0, batch = 0;
        if (p.sequences.active) {
          batch = sequence_holding(first_tile, static_cast<int>(p.batch), cta);
          plan_->seq = tile_sequence(p, batch);
          const int local = cta - first_tile[batch];
          const int key_blocks = (plan_->seq.seq_kv + Traits::kBlockM - 1) / Traits::kBlockM;
          key_block = local % key_blocks;
          kv_head = local / key_blocks;
        } else {
          const int kv_heads = static_cast<int>(p.heads_kv);
          const int rest = cta / args.stationary_blocks;
          key_block = cta % args.stationary_blocks;
          kv_head = rest % kv_heads;
          batch = rest / kv_heads;
          plan_->seq = tile_sequence(p, batch);
        }
        plan_->tile = TileCoordinates{};
        plan_->tile.kv_head = kv_head;
        plan_->tile.batch = batch;
        plan_->key0 = key_block * Traits::kBlockM;
        const KeyRange rows = attending_row_range(p, plan_->seq, plan_->key0, Traits::kBlockM);
        plan_->first_row_block = static_cast<int>(rows.first) / Traits::kBlockN;
        plan_->row_blocks =
            rows.end > rows.first ? static_cast<int>((rows.end + Traits::kBlockN - 1) / Traits::kBlockN) - plan_->first_row_block
                                  : 0;
        plan_->blocks = static_cast<int>(p.group_size()) * plan_->row_blocks;
        plan_->streamed_row0 = plan_->seq.q_begin + plan_->first_row_block * Traits::kBlockN;
      }
      sm90_wgmma::mbarrier_init(stationary_full(), 1);
      for (int f = 0; f < kFull; ++f) sm90_wgmma::mbarrier_init(full(f), 1);
      for (int s = 0; s < kStages; ++s) sm90_wgmma::mbarrier_init(empty(s), 4);  // a warp of the consumer each
      for (int b = 0; b < 2; ++b) {
        sm90_wgmma::mbarrier_init(w_full(b), 128);
        sm90_wgmma::mbarrier_init(w_empty(b), 4);
      }
      if constexpr (kSplit == 2) {
        sm90_wgmma::mbarrier_init(x_full(), 1);     // the receiver's announcement of the slot's bytes
        sm90_wgmma::mbarrier_init(x_empty(), 128);  // the peer's owner has read our partials
        sm90_wgmma::mbarrier_arrive_expect_tx(x_full(), Traits::kExchangeBytes);  // phase 0 (consumer.cuh)
        sm90_wgmma::mbarrier_init(x_sent(), 128);
        sm90_wgmma::mbarrier_init(x_read(), 128);
      }
      sm90_wgmma::fence_barrier_init();
    }
    if constexpr (kSplit == 1) {
      __syncthreads();
    } else {
      sm90_wgmma::cluster_sync();  // the peer's barriers exist before anyone arrives on them
    }
  }
};

}  // namespace ffpa::detail::sm90_backward
