// One CTA of the split-D kernel: its shared memory, its tile and thread
// coordinates, and the roles it plays, each defined in its own file:
//   producer.cuh  copies of ring steps (cp.async, zero-filling) and the ring;
//   mainloop.cuh  S = Q K^T over the head dim, O += P V over the keys;
//   softmax.cuh   the online softmax of a KV tile and P for P V;
//   epilogue.cuh  normalize, LSE, O through shared memory to global.
// kernel.cuh runs them in order.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/attention_problem.hpp"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm80_split_d/traits.cuh"

namespace ffpa::detail::sm80_split_d {

// The CTA's dynamic shared memory, named here rather than passed around: the
// compiler keeps its alignment and address space only when it sees the symbol.
extern __shared__ __align__(128) unsigned char cta_smem[];

template <class Traits>
struct Cta {
  using Element = typename Traits::Element;
  static constexpr int kMTiles = Traits::kMTiles, kSTiles = Traits::kSTiles, kOTiles = Traits::kOTiles;
  static constexpr int kRows = Traits::kRows;
  // O fragments of a thread: [m16 tile][n8 tile], 4 fp32 or 2 half2 registers each.
  using OFrag = std::conditional_t<Traits::kAccumF16, uint32_t[2], float[4]>;
  using OAccumulator = OFrag[kMTiles][kOTiles];
  using SAccumulator = float[kMTiles][kSTiles][4];
  // P, the A operand of P V, as k16 fragments of each m16 tile.
  static constexpr int kPFrags = Traits::kSharedP ? Traits::kPVKeys / 16 : Traits::kBlockN / 16;
  using PFragments = uint32_t[kMTiles][kPFrags][4];

  // Shared memory: the ring of stages (the O staging of the epilogue), P
  // (warps_n > 1: the warps of a row split its keys), row statistics.
  __device__ __forceinline__ static unsigned char* ring() { return cta_smem; }
  __device__ __forceinline__ static unsigned char* p_tile() { return cta_smem + Traits::kRingOrEpilogueBytes; }
  __device__ __forceinline__ static float* row_stat() {
    return reinterpret_cast<float*>(cta_smem + Traits::kRingOrEpilogueBytes + Traits::kPBytes);
  }

  const Args& args;  // the kernel's parameters (split-KV's partial rows)
  const AttentionProblem& p;
  float scale_log2;  // scale * log2(e), times an e4m3 cache's k_descale of the tile's (sequence, KV head)
  float v_factor;    // an e4m3 cache's v_descale of the tile's (sequence, KV head); 1 otherwise
  // The thread index through opaque(): derived addresses are recomputed where
  // used (a few integer ops) instead of re-reading SR_TID or pinning registers.
  const unsigned tid;
  const int warp_m, warp_n, g, t;

  int split;  // which slice of Dv (value split)
  TileCoordinates tile;
  TileSequence seq;  // the tile's sequence: its lengths, where its rows lie
  TileKeyBounds key_bounds;  // its first row's key bounds (causal limit, window)
  bool idle;         // a serving call's CTA past the plan's tiles: nothing to do
  // Sequence positions fit in 32 bits (routing checks); addresses use 64.
  int seq_q, seq_kv;
  const int head_dim;
  int dv0;             // first column of the O slice (of Dv, V's and O's head dim)
  int n_qk;            // 64-column chunks of D, Q's and K's head dim
  int out_cols;        // valid columns of the O slice
  int steps_per_tile;  // ring steps per KV tile: n_qk chunks of Q/K, then the P V steps

  // Ring state: the next step to copy (tile, step within it) and the stage
  // the current step reads.
  int load_tile = 0, load_r = 0, slot = 0;

  __device__ __forceinline__ explicit Cta(const Args& args)
      : args(args),
        p(args.p),
        scale_log2(args.scale_log2),
        v_factor(1.0f),
        tid(opaque(static_cast<unsigned>(threadIdx.x))),
        warp_m(static_cast<int>(tid / 32) / Traits::kWarpsN),
        warp_n(static_cast<int>(tid / 32) % Traits::kWarpsN),
        g(static_cast<int>(tid % 32) / 4),
        t(static_cast<int>(tid % 32) % 4),
        head_dim(static_cast<int>(args.p.head_dim)) {
    // Which CTA: value split fastest, then the tile (row block, head, batch;
    // a serving call's from its plan, kernels/common/sequence_schedule.hpp).
    int64_t block = args.block_offset + blockIdx.x;
    split = static_cast<int>(block % args.value_splits);
    block /= args.value_splits;
    idle = false;
    if (p.sequences.active) {
      const auto* header = static_cast<const SequenceScheduleHeader*>(p.sequences.plan);
      const SequenceTiling tiling = args_sequence_tiling<Traits>(args);
      idle = block >= planned_tiles(*header, tiling);
      if (!idle) tile = sequence_tile_coordinates(p, p.sequences.plan, static_cast<int>(block), tiling, &seq);
    } else {
      tile = tile_coordinates<int64_t>(p, block, args.row_blocks, Traits::kBlockM, Traits::kBlockN, args.kv_splits,
                                       args.split_blocks, args.heads_per_tile);
      seq = tile_sequence(p, tile.batch);
    }
    seq_q = seq.seq_q;
    seq_kv = seq.seq_kv;
    if (!idle) key_bounds = tile_key_bounds(p, tile, seq);
    if (p.kv_e4m3 && !idle) {
      const KvDescales descales = kv_descales(p, tile.batch, tile.kv_head);
      scale_log2 *= descales.k;
      v_factor = descales.v;
    }
    dv0 = split * Traits::kOutCols;
    n_qk = (head_dim + Traits::kChunk - 1) / Traits::kChunk;
    out_cols = min(Traits::kOutCols, static_cast<int>(p.dv()) - dv0);
    steps_per_tile = n_qk + Traits::kPVSteps;
  }

  // Whether the tile writes split-KV's partial rows instead of O and LSE (a
  // sequence batch: where its plan split the keys).
  __device__ __forceinline__ bool writes_partials() const { return writes_split_partials(p, args.kv_splits); }

  // Tile row of thread row r (r = 2 * mt + h: row 16 * mt + g + 8 * h of the warp).
  __device__ __forceinline__ int local_row(int r) const {
    return warp_m * Traits::kWarpRows + (r / 2) * 16 + g + (r % 2) * 8;
  }

  // The tile rows of this thread's S registers (accumulator_layout.cuh).
  struct SCoordinates {
    const Cta& cta;
    __device__ __forceinline__ int row(int r) const { return cta.local_row(r); }
  };

  // producer.cuh
  __device__ __forceinline__ int64_t key_row(const int64_t (&stride)[3], int key) const;
  __device__ __forceinline__ void convert_codes(uint32_t rows, int passes) const;
  __device__ __forceinline__ void issue_next_step(int into_slot);
  __device__ __forceinline__ void prime_ring();
  __device__ __forceinline__ void advance_ring(bool qk_step);
  __device__ __forceinline__ void release_slot();
  // mainloop.cuh
  __device__ __forceinline__ void compute_s(SAccumulator& s_acc);
  __device__ __forceinline__ void accumulate_pv(PFragments& p_frag, OAccumulator& o_acc, int step);
  // softmax.cuh
  template <class Op>
  __device__ __forceinline__ void reduce_across_warps(float (&values)[kRows], Op op);
  __device__ __forceinline__ void softmax(int kv0, SAccumulator& s_acc, float (&row_max)[kRows], float (&row_sum)[kRows],
                          float (&alpha)[kRows]);
  __device__ __forceinline__ void rescale_o(OAccumulator& o_acc, const float (&alpha)[kRows]);
  __device__ __forceinline__ void write_p(const SAccumulator& s_acc, PFragments& p_frag);
  // epilogue.cuh
  __device__ __forceinline__ void store_output(const OAccumulator& o_acc, const float (&row_max)[kRows],
                               float (&row_sum)[kRows]);
  __device__ __forceinline__ void store_partial(const OAccumulator& o_acc, const float (&row_max)[kRows],
                                                const float (&row_sum)[kRows]);
};

}  // namespace ffpa::detail::sm80_split_d
