// The portable backward kernels (sm80 .. sm120), after the preprocess:
//
// dkdv_kernel: one CTA per (batch, KV head, block of kBlockK keys, slice of
//   kSliceCols gradient columns; a sequence batch: per tile of its key plan,
//   a sequence's key block of a KV head, and slice). For every query head of
//   the KV head's group and every query block that attends the keys (causal:
//   from the diagonal; a window: up to its reach):
//     S = Q K^T and dP = dO V^T over the whole head dims (ring steps of 64
//     columns), P, Pd and dS (kernels/common/score_gradients.cuh) into shared memory, then
//     dV += Pd^T dO and dK += dS^T Q on the slice's columns.
//   GQA: the group's query heads are summed in the CTA's registers, in a fixed
//   order: no atomics, deterministic.
// dq_kernel: one CTA per (batch, query head, block of kBlockQ rows, slice;
//   a sequence batch: per tile of its query plan, and slice): for every KV
//   block the rows attend, S, dP, dS as above, dQ += dS K.
// A sequence's rows are its own: rows and keys past its lengths are
// zero-filled, never another sequence's.
// Each CTA recomputes S and dP over the whole head dim for its slice: the
// price of D up to 1024 without atomics on a portable path (the sm90 kernels
// of docs/kernels/backward_plan.md avoid it).
#pragma once

#include <cstdint>

#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/shared_memory.cuh"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm80_backward/epilogue.cuh"
#include "kernels/sm80_backward/mma_steps.cuh"
#include "kernels/sm80_backward/producer.cuh"
#include "kernels/common/score_gradients.cuh"
#include "kernels/sm80_backward/traits.cuh"

namespace ffpa::detail::sm80_backward {

extern __shared__ __align__(128) unsigned char backward_smem[];

template <class Traits>
struct SharedTiles {
  __device__ __forceinline__ static uint32_t stage(int slot) {
    return smem_address(backward_smem) + static_cast<uint32_t>(slot * Traits::kStageBytes);
  }
  __device__ __forceinline__ static unsigned char* pd_tile() { return backward_smem + Traits::kRingBytes; }
  __device__ __forceinline__ static unsigned char* ds_tile() {
    return backward_smem + Traits::kRingBytes + Traits::kTileBytes;
  }
};

// The 64-column chunks of a slice that hold columns of the gradient (the
// last slice of a head dim that is not a multiple of kSliceCols has fewer):
// chunks past them are neither loaded nor multiplied.
template <class Traits>
__device__ __forceinline__ int slice_chunk_count(int col0, int columns) {
  return max(0, min(Traits::kSliceChunks, (columns - col0 + Traits::kChunk - 1) / Traits::kChunk));
}

// Row 0 of a sequence's rows of one head: its queries (q, dO, dQ) or keys (k, v, dK, dV).
template <class Element>
__device__ __forceinline__ Element* query_rows(const void* base, const int64_t (&stride)[3], const TileSequence& seq,
                                               int head) {
  return static_cast<Element*>(const_cast<void*>(base)) + seq.q_batch * stride[0] + head * stride[1] +
         static_cast<int64_t>(seq.q_begin) * stride[2];
}
template <class Element>
__device__ __forceinline__ Element* key_rows(const void* base, const int64_t (&stride)[3], const TileSequence& seq,
                                             int head) {
  return static_cast<Element*>(const_cast<void*>(base)) + seq.kv_batch * stride[0] + head * stride[1] +
         static_cast<int64_t>(seq.kv_begin) * stride[2];
}

// A CTA's place in its grid: slice fastest, then block (of keys or query
// rows), head, and the sequence the block belongs to (a dense call's batch
// entry). idle: a sequence batch's CTA past its plan's tiles.
struct CtaPlace {
  int slice, block, head;
  TileSequence seq;
  int batch;  // the sequence's index
  bool idle;
};

// Dense calls: blocks of block_rows rows (keys: key_side) per head, heads,
// batch entries. A sequence batch: the plan's tiles, each a block of one
// head of one sequence (row block fastest: common/sequence_schedule.hpp).
__device__ __forceinline__ CtaPlace cta_place(const Args& args, int slices, int block_rows, bool key_side,
                                              const void* plan) {
  const AttentionProblem& p = args.p;
  int64_t linear = args.block_offset + blockIdx.x;
  CtaPlace place;
  place.slice = static_cast<int>(linear % slices);
  linear /= slices;
  place.idle = false;
  const int64_t heads = key_side ? p.heads_kv : p.heads_q;
  if (!p.sequences.active) {
    const int blocks = static_cast<int>(((key_side ? p.seq_kv : p.seq_q) + block_rows - 1) / block_rows);
    place.block = static_cast<int>(linear % blocks);
    linear /= blocks;
    place.head = static_cast<int>(linear % heads);
    place.batch = static_cast<int>(linear / heads);
    place.seq = tile_sequence(p, place.batch);
    return place;
  }
  const auto* header = static_cast<const SequenceScheduleHeader*>(plan);
  place.idle = linear >= header->tiles;  // a faulty plan has none
  if (place.idle) return place;
  const int tile = static_cast<int>(linear);
  place.batch = sequence_holding(reinterpret_cast<const int32_t*>(header + 1), static_cast<int>(p.batch), tile);
  place.seq = tile_sequence(p, place.batch);
  const int local = tile - reinterpret_cast<const int32_t*>(header + 1)[place.batch];
  const int blocks = ((key_side ? place.seq.seq_kv : place.seq.seq_q) + block_rows - 1) / block_rows;
  place.block = local % blocks;
  place.head = local / blocks;
  return place;
}

// One block pair's operands for S and dP: the query rows' Q and dO, the
// keys' K and V (each its sequence's row 0 of its head), where the pair
// starts and the sequence's lengths (rows past them are zero-filled).
template <class Element>
struct PairRows {
  const Element *q, *d_o, *k, *v;
  int q0, k0;
  int seq_q, seq_kv;
};

// The first n_d + n_dv steps of a block pair's program, both kernels':
// 64-column chunks of (Q, K) over D, then of (dO, V) over Dv.
template <class Traits>
__device__ __forceinline__ void copy_score_step(uint32_t stage, int step, int n_d, const Args& args,
                                                const PairRows<typename Traits::Element>& rows, unsigned tid) {
  const AttentionProblem& p = args.p;
  const int seq_q = rows.seq_q, seq_kv = rows.seq_kv;
  if (step < n_d) {
    const int c = step * Traits::kChunk, dim = static_cast<int>(p.head_dim);
    copy_block<Traits>(stage, {rows.q, p.q_stride[2], rows.q0, seq_q, c, dim}, tid);
    copy_block<Traits>(stage + Traits::kHalfBytes, {rows.k, p.k_stride[2], rows.k0, seq_kv, c, dim}, tid);
  } else {
    const int c = (step - n_d) * Traits::kChunk, value_dim = static_cast<int>(p.dv());
    copy_block<Traits>(stage, {rows.d_o, args.d_o_stride[2], rows.q0, seq_q, c, value_dim}, tid);
    copy_block<Traits>(stage + Traits::kHalfBytes, {rows.v, p.v_stride[2], rows.k0, seq_kv, c, value_dim}, tid);
  }
}

// S = Q K^T and dP = dO V^T of a block pair: its first n_d + n_dv ring steps.
template <class Traits, class Issue>
__device__ __forceinline__ void accumulate_pair_scores(Ring<Traits>& ring, Issue& issue, int n_d, int n_dv,
                                                       float (&s)[Traits::ScoreLayout::kElements],
                                                       float (&dp)[Traits::ScoreLayout::kElements], unsigned tid) {
#pragma unroll 1
  for (int c = 0; c < n_d; ++c) {
    ring.advance(issue);
    accumulate_scores<Traits>(s, SharedTiles<Traits>::stage(ring.slot), tid);
    ring.release();
  }
#pragma unroll 1
  for (int c = 0; c < n_dv; ++c) {
    ring.advance(issue);
    accumulate_scores<Traits>(dp, SharedTiles<Traits>::stage(ring.slot), tid);
    ring.release();
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) dkdv_kernel(const Args args) {
  using Element = typename Traits::Element;
  using Tiles = SharedTiles<Traits>;
  const AttentionProblem& p = args.p;
  const unsigned tid = opaque(static_cast<unsigned>(threadIdx.x));
  const int dim = static_cast<int>(p.head_dim), value_dim = static_cast<int>(p.dv());

  // Which CTA: a slice of max(D, Dv), a block of keys, a KV head, a sequence.
  const CtaPlace place = cta_place(args, args.slices, Traits::kBlockK, true, args.key_plan);
  if (place.idle) return;
  const TileSequence& seq = place.seq;
  const int seq_q = seq.seq_q, seq_kv = seq.seq_kv;
  const int k0 = place.block * Traits::kBlockK, kv_head = place.head, batch = place.batch;
  const int col0 = place.slice * Traits::kSliceCols;

  // The query blocks that attend a key of the block.
  const KeyRange rows = attending_row_range(p, seq, k0, Traits::kBlockK);
  const int first_q_block = static_cast<int>(rows.first) / Traits::kBlockQ;
  const int blocks_per_head =
      rows.end > rows.first ? static_cast<int>((rows.end + Traits::kBlockQ - 1) / Traits::kBlockQ) - first_q_block : 0;
  const int group = static_cast<int>(p.group_size());
  const int pairs = group * blocks_per_head;
  const int n_d = (dim + Traits::kChunk - 1) / Traits::kChunk, n_dv = (value_dim + Traits::kChunk - 1) / Traits::kChunk;
  const int slice_chunks = slice_chunk_count<Traits>(col0, max(dim, value_dim));
  const int steps_per_pair = n_d + n_dv + slice_chunks;

  const Element* const k_rows = key_rows<const Element>(p.k, p.k_stride, seq, kv_head);
  const Element* const v_rows = key_rows<const Element>(p.v, p.v_stride, seq, kv_head);
  auto pair_head = [&](int pair) { return kv_head * group + pair / blocks_per_head; };
  auto pair_q0 = [&](int pair) { return (first_q_block + pair % blocks_per_head) * Traits::kBlockQ; };

  // The step program: per pair, n_d chunks of (Q, K), n_dv of (dO, V), then
  // the slice's chunks of (dO, Q).
  int load_pair = 0, load_step = 0;
  auto issue = [&](int into_slot) {
    if (load_pair < pairs) {
      const int head = pair_head(load_pair);
      const PairRows<Element> rows{query_rows<const Element>(p.q, p.q_stride, seq, head),
                                   query_rows<const Element>(args.d_o, args.d_o_stride, seq, head),
                                   k_rows,
                                   v_rows,
                                   pair_q0(load_pair),
                                   k0,
                                   seq_q,
                                   seq_kv};
      const uint32_t stage = Tiles::stage(into_slot);
      if (load_step < n_d + n_dv) {
        copy_score_step<Traits>(stage, load_step, n_d, args, rows, tid);
      } else {
        const int c = col0 + (load_step - n_d - n_dv) * Traits::kChunk;
        copy_block<Traits>(stage, {rows.d_o, args.d_o_stride[2], rows.q0, seq_q, c, value_dim}, tid);
        copy_block<Traits>(stage + Traits::kHalfBytes, {rows.q, p.q_stride[2], rows.q0, seq_q, c, dim}, tid);
      }
      if (++load_step == steps_per_pair) load_step = 0, ++load_pair;
    }
    cp_async_commit();
  };

  Ring<Traits> ring;
  ring.prime(issue);
  float d_k[Traits::SliceLayout::kElements] = {}, d_v[Traits::SliceLayout::kElements] = {};
#pragma unroll 1
  for (int pair = 0; pair < pairs; ++pair) {
    float s[Traits::ScoreLayout::kElements] = {}, dp[Traits::ScoreLayout::kElements] = {};
    accumulate_pair_scores(ring, issue, n_d, n_dv, s, dp, tid);
    const TileCoordinates tile = block_pair_tile(pair_q0(pair), pair_head(pair), batch, kv_head, Traits::kBlockQ);
    write_score_gradients<Traits>(s, dp, p, args.delta, tile, seq, k0, args.scale_log2, Tiles::pd_tile(),
                                  Tiles::ds_tile(), tid);
#pragma unroll
    for (int j = 0; j < Traits::kSliceChunks; ++j) {
      if (j >= slice_chunks) break;
      ring.advance(issue);  // its barrier also publishes the Pd and dS tiles
      const uint32_t stage = Tiles::stage(ring.slot);
      accumulate_tn<Traits>(d_v, j, smem_address(Tiles::pd_tile()), stage, tid);
      accumulate_tn<Traits>(d_k, j, smem_address(Tiles::ds_tile()), stage + Traits::kHalfBytes, tid);
      ring.release();
    }
  }
  cp_async_wait<0>();

  store_slice<Traits>(d_k, p.scale, key_rows<Element>(args.d_k, args.d_k_stride, seq, kv_head), args.d_k_stride[2], k0,
                      seq_kv, col0, dim, tid);
  store_slice<Traits>(d_v, 1.0f, key_rows<Element>(args.d_v, args.d_v_stride, seq, kv_head), args.d_v_stride[2], k0,
                      seq_kv, col0, value_dim, tid);
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) dq_kernel(const Args args) {
  using Element = typename Traits::Element;
  using Tiles = SharedTiles<Traits>;
  const AttentionProblem& p = args.p;
  const unsigned tid = opaque(static_cast<unsigned>(threadIdx.x));
  const int dim = static_cast<int>(p.head_dim), value_dim = static_cast<int>(p.dv());

  // Which CTA: a slice of D, a block of query rows, a query head, a sequence.
  const CtaPlace place = cta_place(args, args.dq_slices, Traits::kBlockQ, false, args.query_plan);
  if (place.idle) return;
  const TileSequence& seq = place.seq;
  const int seq_q = seq.seq_q, seq_kv = seq.seq_kv;
  const int slice = place.slice, q0 = place.block * Traits::kBlockQ, head = place.head, batch = place.batch;
  const int kv_head = head / static_cast<int>(p.group_size());
  const int col0 = slice * Traits::kSliceCols;
  // The KV blocks the rows attend (causal: up to the diagonal; a window: from its left reach).
  const KeyRange keys = attended_key_range(p, seq, q0, Traits::kBlockQ);
  const int kv_first = static_cast<int>(keys.first) / Traits::kBlockK;
  const int kv_blocks =
      keys.end > keys.first ? static_cast<int>((keys.end + Traits::kBlockK - 1) / Traits::kBlockK) - kv_first : 0;
  const int n_d = (dim + Traits::kChunk - 1) / Traits::kChunk, n_dv = (value_dim + Traits::kChunk - 1) / Traits::kChunk;
  const int slice_chunks = slice_chunk_count<Traits>(col0, dim);
  const int steps_per_pair = n_d + n_dv + slice_chunks;

  const Element* const q_rows = query_rows<const Element>(p.q, p.q_stride, seq, head);
  const Element* const d_o_rows = query_rows<const Element>(args.d_o, args.d_o_stride, seq, head);
  const Element* const k_rows = key_rows<const Element>(p.k, p.k_stride, seq, kv_head);
  const Element* const v_rows = key_rows<const Element>(p.v, p.v_stride, seq, kv_head);

  // The step program: per KV block, n_d chunks of (Q, K), n_dv of (dO, V),
  // then the slice's chunks of K.
  int load_block = 0, load_step = 0;
  auto issue = [&](int into_slot) {
    if (load_block < kv_blocks) {
      const int k0 = (kv_first + load_block) * Traits::kBlockK;
      const uint32_t stage = Tiles::stage(into_slot);
      if (load_step < n_d + n_dv) {
        copy_score_step<Traits>(stage, load_step, n_d, args, {q_rows, d_o_rows, k_rows, v_rows, q0, k0, seq_q, seq_kv},
                                tid);
      } else {
        const int c = col0 + (load_step - n_d - n_dv) * Traits::kChunk;
        copy_block<Traits>(stage, {k_rows, p.k_stride[2], k0, seq_kv, c, dim}, tid);
      }
      if (++load_step == steps_per_pair) load_step = 0, ++load_block;
    }
    cp_async_commit();
  };

  Ring<Traits> ring;
  ring.prime(issue);
  float d_q[Traits::SliceLayout::kElements] = {};
  const TileCoordinates tile = block_pair_tile(q0, head, batch, kv_head, Traits::kBlockQ);
#pragma unroll 1
  for (int block = 0; block < kv_blocks; ++block) {
    float s[Traits::ScoreLayout::kElements] = {}, dp[Traits::ScoreLayout::kElements] = {};
    accumulate_pair_scores(ring, issue, n_d, n_dv, s, dp, tid);
    // Every slice computes the same dS: the first adds it to the mask's gradient.
    write_score_gradients<Traits>(s, dp, p, args.delta, tile, seq, (kv_first + block) * Traits::kBlockK,
                                  args.scale_log2, nullptr, Tiles::ds_tile(), tid,
                                  slice == 0 ? args.d_mask_sum : nullptr, args.mask_shape);
#pragma unroll
    for (int j = 0; j < Traits::kSliceChunks; ++j) {
      if (j >= slice_chunks) break;
      ring.advance(issue);  // its barrier also publishes the dS tile
      accumulate_nn<Traits>(d_q, j, smem_address(Tiles::ds_tile()), Tiles::stage(ring.slot), tid);
      ring.release();
    }
  }
  cp_async_wait<0>();

  store_slice<Traits>(d_q, p.scale, query_rows<Element>(args.d_q, args.d_q_stride, seq, head), args.d_q_stride[2], q0,
                      seq_q, col0, dim, tid);
}

}  // namespace ffpa::detail::sm80_backward
