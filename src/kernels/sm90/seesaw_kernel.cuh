// The sm90 seesaw attention forward kernel (sm_90a: TMA + wgmma, warp-specialized).
//
// One CTA: 64 query rows of one (batch, head), all of O. Three warpgroups:
//   - a producer (one thread issues TMA loads into a ring of shared-memory stages);
//   - two consumers; consumer w owns columns [w * kHalfCols, (w + 1) * kHalfCols)
//     of O (fp32 in registers: 64 x 512 does not fit one warpgroup).
// KV blocks of 128 keys alternate between the consumers ("seesaw"): consumer
// j % 2 computes S_j = Q K_j^T (wgmma over the head dim), runs the online
// softmax (bounds, causal, mask, dropout), writes P_j and the row statistics
// to shared memory and signals p_full; both consumers then rescale their half
// of O and add P_j V_j. Consumer w computes S_j for its next block before it
// applies the other's P_{j-1}, so one consumer's softmax runs while the other
// consumer's GEMMs keep the tensor cores busy.
//
// The ring carries, in order, K_0, K_1, V_0, K_2, V_1, ..., K_{n-1}, V_{n-2},
// V_{n-1}: K runs one block ahead of V, so S_{j+1} never waits for P_j. A K
// block is ceil(chunks / 2) stages of [128 keys][2 x 64 columns]; a V block is
// 4 stages of [64 keys][kHalfCols columns], one per (key half, consumer).
// Every stage has exactly one consumer warpgroup, which frees it (empty
// barrier, one arrival per warp) once its wgmmas have read it.
//
// D > 512 (kSplit = 2): a cluster of two CTAs per tile. CTA r holds columns
// [r * D / 2, (r + 1) * D / 2) of Q and K and of O, so each computes a
// partial S over its half of D; the S owner of each CTA sends its partial to
// the peer through distributed shared memory and adds the peer's (x_full,
// x_empty: one phase per KV block), and both run the same softmax on the same
// sum (a + b == b + a). The ring drops to 3 stages to make room for the
// 32 KB exchange slot.
//
// Why more full barriers than stages: the consumers take positions out of
// order (consumer 1 waits for K_1 while consumer 0 has not received K_0), so a
// consumer may wait for position p before the position that last used p's
// barrier has landed; a parity wait would then see that phase's predecessor
// as complete and read early. Position p completes on barrier p % kFull, and
// p - kFull has always landed when p is waited for: the consumer's previous
// position q has been issued, so every position up to q - kStages has been
// released (the producer refills a stage only then), and p - q is at most
// kKStages + 2 (from its part of V_{j-1} to its part of V_j). Hence
// kFull >= kKStages + 2 + kStages (16).
//
// Launch: one CTA per tile, row block fastest, so the CTAs the hardware runs
// at once are neighbouring row blocks of one head and share its K/V in L2;
// causal row blocks are enumerated longest first. (Persistent variants were
// measured slower: docs/kernels/sm90_wgmma.md.)
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/attention_problem.hpp"
#include "common/philox.hpp"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/tile_elementwise.cuh"
#include "kernels/sm90/ptx.cuh"
#include "kernels/sm90/seesaw_ring.hpp"
#include "kernels/sm90/wgmma.cuh"

namespace ffpa::detail::sm90 {

template <typename Element_, int kQKChunks_, int kHalfCols_, int kSplit_>
struct SeesawTraits {
  using Element = Element_;
  static constexpr int kQKChunks = kQKChunks_;  // 64-column chunks of this CTA's part of S = Q K^T
  static constexpr int kHalfCols = kHalfCols_;  // columns of O per consumer warpgroup
  static constexpr int kSplit = kSplit_;        // CTAs of a cluster sharing one tile (1 or 2)
  static constexpr int kOutCols = 2 * kHalfCols;  // columns of O per CTA
  static constexpr int kBlockM = 64;   // query rows: one wgmma M
  static constexpr int kBlockN = 128;  // keys per KV block: the N of S
  static constexpr int kThreads = 384;
  static constexpr int kStages = seesaw_ring_stages(kSplit);
  static constexpr int kKStages = (kQKChunks + 1) / 2;  // ring stages per K block
  static constexpr int kVStages = kSeesawVStages;       // ring stages per V block

  static constexpr int kTileBytes = 64 * 128;        // [64 rows][64 columns]: Q, P, O, V boxes
  static constexpr int kKBoxBytes = kBlockN * 128;   // [128 keys][64 columns]
  static constexpr int kVStageBytes = (kHalfCols / 64) * kTileBytes;
  static constexpr int kStageBytes = 2 * kKBoxBytes > kVStageBytes ? 2 * kKBoxBytes : kVStageBytes;
  // Q, then (after the last S) the O staging of the TMA stores.
  static constexpr int kQTiles = kQKChunks > kOutCols / 64 ? kQKChunks : kOutCols / 64;
  static constexpr int kPBytes = (kBlockN / 64) * kTileBytes;  // one P buffer

  static constexpr int kQOffset = 0;
  static constexpr int kPOffset = kQOffset + kQTiles * kTileBytes;                 // 2 buffers
  static constexpr int kRingOffset = kPOffset + 2 * kPBytes;
  // The peer's partial S: float4 [16][128 threads] (kSplit = 2).
  static constexpr int kExchangeBytes = kSplit == 1 ? 0 : 64 * 128 * 4;
  static constexpr int kExchangeOffset = kRingOffset + kStages * kStageBytes;
  static constexpr int kStatsOffset = kExchangeOffset + kExchangeBytes;          // float [2][2][64]
  static constexpr int kRowSumOffset = kStatsOffset + 2 * 2 * kBlockM * 4;        // float [2][64]
  static constexpr int kTileOffset = kRowSumOffset + 2 * kBlockM * 4;  // TileCoordinates
  static constexpr int kBarrierOffset = kTileOffset + 32;
  // q_full, full[kFullBarriers], empty[kStages], p_full[2], p_empty[2]. See
  // "Why more full barriers than stages" for the count.
  static constexpr int kFullBarriers = 16;  // >= kKStages + 2 + kStages; a power of two: cheap p % 16
  static_assert(kFullBarriers >= kKStages + 2 + kStages, "see Why more full barriers than stages");
  static constexpr int kBarriers = 1 + kFullBarriers + kStages + 4 + (kSplit == 1 ? 0 : 2);
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;

  static_assert(kHalfCols % 64 == 0 && kHalfCols >= 128 && kHalfCols <= 256,
                "O halves are whole 64-column boxes, N = 128..256");
  static_assert(kQKChunks >= 1 && kQKChunks <= 8, "a CTA's part of S covers up to 512 columns");
  static_assert(kSplit == 1 || kSplit == 2, "one CTA per tile, or a cluster of two");
  static_assert(kSmemBytes <= 232448, "fits the 227 KB a Hopper block may opt into");
};

struct SeesawArgs {
  AttentionProblem p;
  int row_blocks;    // ceil(Nq / 64); the grid is row_blocks x Hq x B CTAs (< 2^31)
  float scale_log2;  // scale * log2(e)
};

struct TileCoordinates {
  int q0, head, batch, kv_head;
  int n_blocks;  // KV blocks this row block attends (causal: up to the diagonal)
};

// This CTA's rank in its cluster (0 without a cluster).
template <int kSplit>
__device__ __forceinline__ int split_rank() {
  if constexpr (kSplit == 1) {
    return 0;
  } else {
    return static_cast<int>(cluster_cta_rank());
  }
}

// This thread's index within its quad (the column pair of the wgmma
// accumulator layout), re-read at every use: an asm volatile read is not
// merged across the KV loop, so it never occupies a register there.
__device__ __forceinline__ int quad_lane() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane % 4;
}

// Byte offset of (row, col) in a [64][64] tile of 16-bit elements with the
// 128-byte swizzle that TMA and wgmma use (16-byte segments XORed by row % 8).
__device__ __forceinline__ uint32_t swizzle128(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2;
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    seesaw_forward_kernel(const __grid_constant__ SeesawArgs args,
                          const __grid_constant__ CUtensorMap q_map,
                          const __grid_constant__ CUtensorMap k_map,
                          const __grid_constant__ CUtensorMap v_map,
                          const __grid_constant__ CUtensorMap o_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Element = typename Traits::Element;
  constexpr int kStages = Traits::kStages, kKStages = Traits::kKStages;
  constexpr int kHalfCols = Traits::kHalfCols, kBlockN = Traits::kBlockN;
  constexpr int kTileBytes = Traits::kTileBytes, kStageBytes = Traits::kStageBytes;

  // wgmma and TMA swizzle atoms need 1024-byte alignment. Dynamic shared memory
  // starts the block's window (there is no static shared memory), so the
  // declared alignment holds, and every offset below is an immediate.
  extern __shared__ __align__(1024) unsigned char smem[];
  const uint32_t q_tiles = smem_address(smem + Traits::kQOffset);
  const uint32_t p_tiles = smem_address(smem + Traits::kPOffset);
  const uint32_t ring = smem_address(smem + Traits::kRingOffset);
  float* const stats = reinterpret_cast<float*>(smem + Traits::kStatsOffset);  // [buffer][max|scale][row]
  // Running softmax denominators, [consumer][row]: each consumer sums the P of
  // its own blocks. In shared memory, not registers: S and O fill those.
  float* const row_sums = reinterpret_cast<float*>(smem + Traits::kRowSumOffset);
  const uint32_t barriers = smem_address(smem + Traits::kBarrierOffset);
  const uint32_t q_full = barriers;
  // Ring position p lives in stage p % kStages and completes on full barrier
  // p % kFullBarriers: see "Why more full barriers than stages" above.
  constexpr int kFull = Traits::kFullBarriers;
  auto full = [&](int position) { return barriers + 8 * (1 + position % kFull); };
  auto full_parity = [&](int position) { return static_cast<uint32_t>((position / kFull) & 1); };
  auto empty = [&](int stage) { return barriers + 8 * (1 + kFull + stage); };
  auto p_full = [&](int buffer) { return barriers + 8 * (1 + kFull + kStages + buffer); };
  auto p_empty = [&](int buffer) { return barriers + 8 * (3 + kFull + kStages + buffer); };
  // kSplit = 2: the peer's partial S has landed here / this CTA's has been read there.
  const uint32_t x_full = barriers + 8 * (5 + kFull + kStages);
  const uint32_t x_empty = x_full + 8;
  // Column offsets of this CTA's part of Q/K (S) and of V/O.
  constexpr int kSplit = Traits::kSplit;
  auto qk_col0 = [&]() { return split_rank<kSplit>() * Traits::kQKChunks * 64; };
  auto vo_col0 = [&]() { return split_rank<kSplit>() * Traits::kOutCols; };
  auto peer_rank = [&]() { return static_cast<uint32_t>(1 - split_rank<kSplit>()); };  // kSplit = 2

  const AttentionProblem& p = args.p;
  // --- which tile: row block fastest (CTAs of one head run together and share
  // its K/V in L2), then head, batch. Computed once into shared memory and read
  // where used, so the consumers do not carry it in registers. -------------------
  TileCoordinates* const tile = reinterpret_cast<TileCoordinates*>(smem + Traits::kTileOffset);
  if (threadIdx.x == 0) {
    int block = blockIdx.x / kSplit;  // the CTAs of a cluster share the tile
    int row_block = block % args.row_blocks;
    block /= args.row_blocks;
    tile->head = block % static_cast<int>(p.heads_q);
    tile->batch = block / static_cast<int>(p.heads_q);
    tile->kv_head = tile->head / static_cast<int>(p.heads_q / p.heads_kv);
    if (p.causal != Causal::none) row_block = args.row_blocks - 1 - row_block;  // longest first
    tile->q0 = row_block * Traits::kBlockM;
    const int last_row = min(tile->q0 + Traits::kBlockM, static_cast<int>(p.seq_q)) - 1;
    const int kv_end = p.causal == Causal::none
                           ? static_cast<int>(p.seq_kv)
                           : max(0, min(static_cast<int>(p.seq_kv),
                                        last_row + static_cast<int>(p.causal_shift()) + 1));
    tile->n_blocks = (kv_end + kBlockN - 1) / kBlockN;
  }

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int f = 0; f < kFull; ++f) mbarrier_init(full(f), 1);
    for (int s = 0; s < kStages; ++s) mbarrier_init(empty(s), 4);  // a warp of the consumer each
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(p_full(b), 128);  // every thread of the owner writes part of P
      mbarrier_init(p_empty(b), 4);   // the other consumer's warps have read P
    }
    if constexpr (kSplit == 2) {
      mbarrier_init(x_full, 128);   // every thread of the peer's S owner
      mbarrier_init(x_empty, 128);
    }
    fence_barrier_init();
  }
  if constexpr (kSplit == 1) {
    __syncthreads();
  } else {
    cluster_sync();  // the peer's barriers exist before anyone arrives on them
  }

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    // ================================ producer ======================================
    setmaxnreg_decrease<24>();
    if (threadIdx.x == 0) {
      // Tile coordinates are read from shared memory where used: the producer
      // runs in 24 registers.
      prefetch_tensor_map(&q_map);
      prefetch_tensor_map(&k_map);
      prefetch_tensor_map(&v_map);
      mbarrier_arrive_expect_tx(q_full, Traits::kQKChunks * kTileBytes);
#pragma unroll 1
      for (int c = 0; c < Traits::kQKChunks; ++c)
        tma_load_4d(q_tiles + c * kTileBytes, &q_map, q_full, qk_col0() + c * 64, tile->q0, tile->head,
                    tile->batch);
      int position = 0;
      auto acquire = [&](uint32_t bytes) {
        const int stage = position % kStages;
        mbarrier_wait(empty(stage), ((position / kStages) & 1) ^ 1);
        mbarrier_arrive_expect_tx(full(position), bytes);
        ++position;
        return stage;
      };
      auto load_k = [&](int j) {
#pragma unroll
        for (int ks = 0; ks < kKStages; ++ks) {
          constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
          const int boxes = ks + 1 < kKStages ? 2 : kLast;
          const int stage = acquire(boxes * Traits::kKBoxBytes);
          // At D = 1024 the columns of every box, hoisted out of the KV loop,
          // would not fit the producer's 24 registers.
          for (int b = 0; b < boxes; ++b) {
            const int col = (kSplit == 2 ? opaque(qk_col0()) : qk_col0()) + (2 * ks + b) * 64;
            tma_load_4d(ring + stage * kStageBytes + b * Traits::kKBoxBytes, &k_map, full(position - 1), col,
                        j * kBlockN, tile->kv_head, tile->batch);
          }
        }
      };
      auto load_v = [&](int j) {
        for (int key_half = 0; key_half < 2; ++key_half)
          for (int w = 0; w < 2; ++w) {
            const int stage = acquire(Traits::kVStageBytes);
            for (int box = 0; box < kHalfCols / 64; ++box)
              tma_load_4d(ring + stage * kStageBytes + box * kTileBytes, &v_map, full(position - 1),
                          vo_col0() + w * kHalfCols + box * 64, j * kBlockN + key_half * 64,
                          tile->kv_head, tile->batch);
          }
      };
      if (tile->n_blocks > 0) {
        load_k(0);
        for (int j = 1; j < tile->n_blocks; ++j) {
          load_k(j);
          load_v(j - 1);
        }
        load_v(tile->n_blocks - 1);
      }
    }
    if constexpr (kSplit == 2) cluster_sync();  // every thread of the cluster, producers too
    return;
  }

  // ================================ consumers ========================================
  setmaxnreg_increase<240>();
  const int w = warpgroup - 1;  // which half of O, and which KV blocks (j % 2 == w)
  // Thread coordinates are re-read where used (lane_id() is not CSE'd): kept
  // in registers across the KV loop they would spill next to S and O.
  const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32;
  const int g = lane / 4;
  // Problem scalars live in the kernel's parameter bank: naming them costs no registers.
  const int seq_q = static_cast<int>(p.seq_q), seq_kv = static_cast<int>(p.seq_kv);
  const int shift = static_cast<int>(p.causal_shift());
  // A thread holds rows row(0) and row(1) of S and O (wgmma accumulator layout):
  // element 4 * i + 2 * h + e is row row(h), column 8 * i + 2 * t + e, where
  // t = quad_lane() is read afresh in each phase.
  auto row = [&](int h) { return warp * 16 + g + 8 * h; };

  float o_acc[kHalfCols / 2];
#pragma unroll
  for (int i = 0; i < kHalfCols / 2; ++i) o_acc[i] = 0.0f;
  // The running row maxima are not kept in registers: after block j they are
  // the ones published with P_j (stats), which stay until P_{j+2} is written,
  // and that needs this consumer's P_{j+1} first.
  auto running_max = [&](int j, int h) {
    return j < 0 ? -INFINITY : stats[opaque((j & 1) * 128 + row(h))];
  };
  if (quad_lane() == 0) row_sums[w * 64 + row(0)] = row_sums[w * 64 + row(1)] = 0.0f;

  auto release = [&](int position) {
    if (lane == 0) mbarrier_arrive(empty(position % kStages));
  };

  // S_j = Q K_j^T (fp32, 64 x 128), streaming K through the ring.
  auto compute_s = [&](int j, float (&s)[64]) {
    const int first = seesaw_k_position(j, kKStages);
    fence_operands(s);
#pragma unroll
    for (int ks = 0; ks < kKStages; ++ks) {
      const int position = first + ks;
      const int stage = position % kStages;
      mbarrier_wait(full(position), full_parity(position));
      wgmma_fence();
      constexpr int kLast = Traits::kQKChunks - 2 * (kKStages - 1);
#pragma unroll
      for (int b = 0; b < (ks + 1 < kKStages ? 2 : kLast); ++b)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint64_t a = smem_descriptor(q_tiles + (2 * ks + b) * kTileBytes + kk * 32, 16, 1024);
          const uint64_t k = smem_descriptor(
              ring + stage * kStageBytes + b * Traits::kKBoxBytes + kk * 32, 16, 1024);
          wgmma_ss<Element, 128, false>(s, a, k, (ks | b | kk) != 0);
        }
      wgmma_commit();
      if (ks > 0) {
        wgmma_wait<1>();
        release(position - 1);
      }
    }
    wgmma_wait<0>();
    fence_operands(s);
    release(first + kKStages - 1);
  };

  // O_w += P_j V_j[:, half w], issued (wgmma groups in flight) and finished
  // apart, so that kSplit = 2 sends its partial S while the tensor cores run
  // P_{j-1} V_{j-1}. The owner has already rescaled O; the other consumer
  // rescales by the owner's published factors first.
  auto issue_pv = [&](int j, bool own) {  // returns the ring position finish_pv frees
    const int buffer = j & 1;
    mbarrier_wait(p_full(buffer), (j >> 1) & 1);
    if (!own) {
      const int t = quad_lane();
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float scale = stats[buffer * 128 + 64 + row(h)];
        if (t == 0) row_sums[w * 64 + row(h)] *= scale;
#pragma unroll
        for (int i = 0; i < kHalfCols / 8; ++i) {
          o_acc[4 * i + 2 * h] *= scale;
          o_acc[4 * i + 2 * h + 1] *= scale;
        }
      }
    }
    // This consumer's part of key half h of V_j is at position first + 2 * h.
    const int first = seesaw_v_part_position(j, tile->n_blocks, kKStages, 0, w);
    fence_operands(o_acc);
#pragma unroll
    for (int key_half = 0; key_half < 2; ++key_half) {
      const int position = first + 2 * key_half;
      const int stage = position % kStages;
      mbarrier_wait(full(position), full_parity(position));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint64_t a = smem_descriptor(
            p_tiles + buffer * Traits::kPBytes + key_half * kTileBytes + kk * 32, 16, 1024);
        const uint64_t v = smem_descriptor(ring + stage * kStageBytes + kk * 16 * 128, kTileBytes, 1024);
        wgmma_ss<Element, kHalfCols, true>(o_acc, a, v, 1);
      }
      wgmma_commit();
    }
    return first;
  };
  auto finish_pv = [&](int first, int j, bool own) {
    wgmma_wait<0>();
    fence_operands(o_acc);
    release(first);
    release(first + 2);
    if (!own && lane == 0) mbarrier_arrive(p_empty(j & 1));
  };
  auto accumulate_pv = [&](int j, bool own) { finish_pv(issue_pv(j, own), j, own); };

  // kSplit = 2: S_j += the peer CTA's partial S_j. Thread i sends its 64
  // accumulators to slot [q][i] of the peer (float4 q of 16: conflict-free)
  // and adds what the peer's thread i sent it. The S owner sends after it has
  // waited for P_{j-1}, so the other consumer's exchange of block j-1 is
  // complete and the barriers are at most one phase behind.
  auto send_s = [&](int j, const float (&s)[64]) {
    if constexpr (kSplit == 2) {
      if (j >= 1) mbarrier_wait_cluster(x_empty, (j - 1) & 1);  // the peer has read our S_{j-1}
      const uint32_t remote =
          peer_address(smem_address(smem + Traits::kExchangeOffset) + thread * 16, peer_rank());
#pragma unroll
      for (int q = 0; q < 16; ++q)
        store_cluster_f32x4(remote + q * 128 * 16, s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3]);
      mbarrier_arrive_cluster(peer_address(x_full, peer_rank()));
    }
  };
  auto receive_s = [&](int j, float (&s)[64]) {
    if constexpr (kSplit == 2) {
      mbarrier_wait_cluster(x_full, j & 1);
      const float4* const mine = reinterpret_cast<const float4*>(smem + Traits::kExchangeOffset) + thread;
      // Two loads in flight at a time: all sixteen at once would spill S or O.
#pragma unroll
      for (int q0 = 0; q0 < 16; q0 += 2) {
#pragma unroll
        for (int q = q0; q < q0 + 2; ++q) {
          const float4 v = mine[q * 128];
          s[4 * q] += v.x, s[4 * q + 1] += v.y, s[4 * q + 2] += v.z, s[4 * q + 3] += v.w;
        }
        asm volatile("" ::: "memory");
      }
      mbarrier_arrive_cluster(peer_address(x_empty, peer_rank()));  // our slot may take S_{j+1}
    }
  };

  // Online softmax of S_j (log2 domain), P_j and the row statistics to shared
  // memory, then this consumer's rescale of O.
  auto softmax_publish = [&](int j, float (&s)[64]) {
    const int t = quad_lane();
    const int kv0 = j * kBlockN;
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] *= args.scale_log2;
    // Key c is visible to row r when c < Nkv and (causal) c <= r + shift.
    const int first_limit = tile->q0 + shift;  // the limit of the tile's first row
    const bool needs_bounds = kv0 + kBlockN > seq_kv ||
                              (p.causal != Causal::none && kv0 + kBlockN - 1 > first_limit);
    if (needs_bounds) {
      const int causal = p.causal != Causal::none;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int c = kv0 + 8 * (i / 4) + 2 * t + i % 2;
        if (c >= seq_kv || (causal && c > first_limit + row((i / 2) % 2))) s[i] = -INFINITY;
      }
    }
    if (p.mask_kind != MaskKind::none) {
      const int64_t mask_bh = tile->batch * p.mask_stride[0] + tile->head * p.mask_stride[1];
      auto apply_mask = [&](auto element_tag) {
        using T = decltype(element_tag);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = tile->q0 + row(h);
          if (r >= seq_q) continue;
          const T* const mask_row =
              opaque(static_cast<const T*>(p.mask) + mask_bh + r * p.mask_stride[2]);
          // Eight loads in flight at a time: all 32 at once would spill S or O.
#pragma unroll
          for (int i0 = 0; i0 < 16; i0 += 4) {
#pragma unroll
            for (int i = i0; i < i0 + 4; ++i)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int c = kv0 + 8 * i + 2 * t + e;
                if (c < seq_kv) s[4 * i + 2 * h + e] += mask_term<T>(mask_row, c * p.mask_stride[3]);
              }
            asm volatile("" ::: "memory");
          }
        }
      };
      switch (p.mask_kind) {
        case MaskKind::boolean: apply_mask(uint8_t{}); break;
        case MaskKind::additive_f16: apply_mask(__half{}); break;
        case MaskKind::additive_bf16: apply_mask(__nv_bfloat16{}); break;
        default: apply_mask(float{}); break;
      }
    }

    float scale[2], new_max[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 16; ++i) tile_max = fmaxf(tile_max, fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float old_max = running_max(j - 1, h);
      new_max[h] = fmaxf(old_max, tile_max);
      // Nothing attended yet: base 0, so that exp2(-inf - 0) = 0.
      const float base = new_max[h] == -INFINITY ? 0.0f : new_max[h];
      scale[h] = exp2f(old_max - base);
      float tile_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * i + 2 * h + e];
          x = exp2f(x - base);
          tile_sum += x;
        }
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
      tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 2);
      if (t == 0) row_sums[w * 64 + row(h)] = row_sums[w * 64 + row(h)] * scale[h] + tile_sum;
    }
    const int buffer = j & 1;
    if (j >= 2) mbarrier_wait(p_empty(buffer), ((j >> 1) - 1) & 1);
    unsigned char* const p_tile = smem + Traits::kPOffset + buffer * Traits::kPBytes;
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 8 * i + 2 * t;
        *reinterpret_cast<uint32_t*>(p_tile + (col / 64) * kTileBytes + swizzle128(row(h), col % 64)) =
            pack2<Element>(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]);
      }
    if (p.dropout_p > 0.0f) {
      // Dropped elements are zeroed in shared memory, after S is dead: the
      // Philox rounds then cost no registers next to S and O. The row sums
      // above are the undropped ones (dropout scales the normalized P).
      const int64_t bh = opaque(static_cast<int64_t>(tile->batch) * p.heads_q + tile->head);
#pragma unroll 1
      for (int i = 0; i < 16; ++i) {
        const int col = 8 * i + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Philox4 bits =
              dropout_bits(p.dropout_seed, p.dropout_offset, bh, tile->q0 + row(h), kv0 + col);
          // Keys c and c + 1 are words c % 4 and c % 4 + 1, and c % 4 = 2 * (t % 2).
          const uint32_t keep_mask = ((t & 1 ? bits.x[2] : bits.x[0]) < p.dropout_threshold ? 0u : 0xFFFFu) |
                                     ((t & 1 ? bits.x[3] : bits.x[1]) < p.dropout_threshold ? 0u : 0xFFFF0000u);
          uint32_t* const pair = reinterpret_cast<uint32_t*>(
              p_tile + (col / 64) * kTileBytes + swizzle128(row(h), col % 64));
          *pair &= keep_mask;
        }
      }
    }
    if (t == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        stats[buffer * 128 + row(h)] = new_max[h];
        stats[buffer * 128 + 64 + row(h)] = scale[h];
      }
    }
    fence_proxy_async();
    mbarrier_arrive(p_full(buffer));
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < kHalfCols / 8; ++i) {
        o_acc[4 * i + 2 * h] *= scale[h];
        o_acc[4 * i + 2 * h + 1] *= scale[h];
      }
  };

  mbarrier_wait(q_full, 0);
  // Consumer w's blocks are j = w, w + 2, ...; before the softmax of each it
  // applies the other consumer's block j - 1 (consumer 0's first block has
  // none), and after its last block the other's last one.
  if constexpr (kSplit == 1) {
    for (int j = w;; j += 2) {
      const bool own = j < tile->n_blocks;
      float s[64];
      if (own) compute_s(j, s);
      if (j >= 1 && j - 1 < tile->n_blocks) accumulate_pv(j - 1, false);
      if (!own) break;
      softmax_publish(j, s);
      accumulate_pv(j, true);
    }
  } else {
    // The partial S goes to the peer while P_{j-1} V_{j-1} runs. Issue and
    // finish stay inside one branch: a wgmma group in flight across a branch
    // makes ptxas serialize every wgmma (C7518). (The kSplit = 1 loop in this
    // shape measured 3 % slower, hence two loops.)
    int j = w;
    for (; j < tile->n_blocks; j += 2) {
      float s[64];
      compute_s(j, s);
      if (j >= 1) {
        const int first = issue_pv(j - 1, false);
        send_s(j, s);
        finish_pv(first, j - 1, false);
      } else {
        send_s(j, s);
      }
      receive_s(j, s);
      softmax_publish(j, s);
      accumulate_pv(j, true);
    }
    if (j >= 1 && j - 1 < tile->n_blocks) accumulate_pv(j - 1, false);
  }

  // ---- epilogue: combine the row sums, normalize, LSE, O through TMA stores --------
  named_barrier_sync(1, 256);  // both consumers: every wgmma has retired, Q is free
  const int t = quad_lane();
  const float keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  float out_scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float total = row_sums[row(h)] + row_sums[64 + row(h)];
    out_scale[h] = total > 0.0f ? keep_scale / total : 0.0f;
    const int r = tile->q0 + row(h);
    if (p.lse != nullptr && split_rank<kSplit>() == 0 && w == 0 && t == 0 && r < seq_q) {
      p.lse[tile->batch * p.lse_stride[0] + tile->head * p.lse_stride[1] + r * p.lse_stride[2]] =
          total > 0.0f ? running_max(tile->n_blocks - 1, h) * 0.6931471805599453f + logf(total)
                       : -INFINITY;
    }
  }
  unsigned char* const o_tiles = smem + Traits::kQOffset;
#pragma unroll
  for (int i = 0; i < kHalfCols / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = w * kHalfCols + 8 * i + 2 * t;
      *reinterpret_cast<uint32_t*>(o_tiles + (col / 64) * kTileBytes + swizzle128(row(h), col % 64)) =
          pack2<Element>(o_acc[4 * i + 2 * h] * out_scale[h], o_acc[4 * i + 2 * h + 1] * out_scale[h]);
    }
  fence_proxy_async();
  named_barrier_sync(2 + w, 128);
  if (thread == 0) {
    const int head_dim = static_cast<int>(p.head_dim);
    for (int box = 0; box < kHalfCols / 64; ++box) {
      const int col = w * kHalfCols + box * 64;  // within this CTA's part of O
      if (vo_col0() + col < head_dim)
        tma_store_4d(&o_map, smem_address(o_tiles + (col / 64) * kTileBytes), vo_col0() + col,
                     tile->q0, tile->head, tile->batch);
    }
    tma_store_commit();
    tma_store_wait_read();
  }
  if constexpr (kSplit == 2) cluster_sync();  // the peer may still arrive on our barriers
#endif
}

}  // namespace ffpa::detail::sm90
