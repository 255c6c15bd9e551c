// The sm80 split-D attention forward kernel (portable: sm80 .. sm120).
//
// One CTA: kBlockM query rows of one (batch, head), one slice of kOutCols
// columns of O. For every KV tile of kBlockN keys:
//   1. S = Q K^T, streaming Q and K through the shared-memory ring in 64-column
//      chunks of the head dim (any D: partial chunks are zero-filled);
//   2. online softmax in the log2 domain (bounds, causal, mask, dropout); P
//      stays in registers (warps_n == 1) or goes to shared memory (warps_n > 1:
//      the warps of one row split the keys and need each other's P);
//   3. O += P V, streaming V in slices of kPVKeys keys x kOutCols columns.
// Every ring step waits for its buffer, then issues the copy kStages - 1 steps
// ahead, so loads run across phase and tile boundaries. Columns of the O slice
// beyond D are zero-filled by the copies and never stored.
//
// A warp owns kWarpRows (16 or 32) rows: with 32, every K or V fragment read
// from shared memory feeds two m16 MMAs, halving shared-memory traffic per MMA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/attention_problem.hpp"
#include "common/philox.hpp"
#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/tile_elementwise.cuh"
#include "kernels/sm80/ptx.cuh"
#include "kernels/sm80/split_d_tiles.hpp"

namespace ffpa::detail::sm80 {

template <typename Element_, bool kAccumF16_, int kOutCols_, int kWarpRows_, int kWarpsM_,
          int kWarpsN_, int kBlockN_, int kPVKeys_, int kStages_>
struct SplitDTraits {
  using Element = Element_;
  static constexpr bool kAccumF16 = kAccumF16_;
  static constexpr int kOutCols = kOutCols_;
  static constexpr int kWarpRows = kWarpRows_;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 tiles per warp
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kBlockM = kWarpRows * kWarpsM;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kPVKeys = kPVKeys_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;

  static constexpr int kChunk = 64;  // head-dim columns per Q/K step: 128-byte rows
  static constexpr int kRowBytes = kChunk * 2;
  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys of S per warp
  static constexpr int kWarpCols = kOutCols / kWarpsN;  // columns of O per warp
  static constexpr int kPVSteps = kBlockN / kPVKeys;

  static constexpr SplitDSmemLayout kSmem = split_d_smem_layout(
      SplitDTile{kOutCols, kWarpRows, kWarpsM, kWarpsN, kBlockN, kPVKeys, kStages});
  static constexpr int kQTileBytes = kBlockM * kRowBytes;
  static constexpr int kVSubtileBytes = kPVKeys * kRowBytes;  // [kPVKeys][64] per 64 columns
  static constexpr int kVStageBytes = kVSubtileBytes * (kOutCols / 64);
  static constexpr int kStageBytes = kSmem.stage_bytes;
  static constexpr int kRingOrEpilogueBytes = kSmem.ring_bytes;
  static constexpr bool kSharedP = kWarpsN > 1;
  static constexpr int kPBytes = kSmem.p_bytes;
  static constexpr int kSmemBytes = kSmem.total_bytes;

  static_assert(kWarpRows == 16 || kWarpRows == 32, "a warp owns one or two m16 tiles");
  static_assert(kOutCols % 64 == 0, "O slices are whole 64-column subtiles");
  static_assert(kWarpCols % 64 == 0, "each warp's O columns are whole 64-column subtiles");
  static_assert(kWarpKeys % 16 == 0, "each warp's keys form whole k16 steps");
  static_assert(kBlockN % kPVKeys == 0 && kPVKeys % 16 == 0, "P V steps are whole k16 steps");
  static_assert(kBlockN % 64 == 0, "P rows are swizzled in 128-byte groups");
  static_assert(kThreads % 64 == 0, "copies assume the swizzle phase of a thread is fixed");
  static_assert(kBlockM % (kThreads / 8) == 0, "Q rows fill whole copy passes");
  static_assert((kBlockM + kBlockN) % (kThreads / 8) == 0 &&
                    (kVStageBytes / 128) % (kThreads / 8) == 0 && kPVKeys % 8 == 0,
                "every thread copies the same number of rows of a stage");
  static_assert(kPVKeys % (kThreads / 8) == 0 || (kThreads / 8) % kPVKeys == 0,
                "V rows map to copy passes with compile-time offsets");
  static_assert(!kAccumF16 || std::is_same_v<Element, __half>, "fp16 accumulation needs fp16");
};

// Byte offset of (row, col) in a [rows][64] tile of 16-bit elements whose
// 16-byte segments are XOR-swizzled by row, so that the 8 rows an ldmatrix or
// a copy phase touches hit distinct banks.
__device__ __forceinline__ uint32_t swizzle64(int row, int col) {
  return row * 128 + ((((col >> 3) ^ row) & 7) << 4) + (col & 7) * 2;
}

// The same swizzle for a [rows][cols] tile, cols a multiple of 64.
__device__ __forceinline__ uint32_t swizzle_wide(int row, int col, int cols) {
  return row * cols * 2 + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 16 + (col & 7) * 2;
}

struct SplitDArgs {
  AttentionProblem p;
  int value_splits;      // CTAs per row block, each one slice of Dv
  int row_blocks;        // ceil(Nq / kBlockM)
  int64_t block_offset;  // first linear CTA index of this launch
  float scale_log2;      // scale * log2(e)
};

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Combines per-row values (already reduced over the 4 threads of a quad) over
// the warps_n warps that share the rows, through row_stat in shared memory;
// a no-op when warps_n == 1. values[r] is row warp_m * kWarpRows + 16 * (r / 2)
// + g + 8 * (r % 2) of the CTA.
template <class Traits, class Op>
__device__ __forceinline__ void reduce_across_warps(float (&values)[2 * Traits::kMTiles],
                                                    float* row_stat, int warp_m, int warp_n, int g,
                                                    int t, Op op) {
  if constexpr (Traits::kSharedP) {
    constexpr int kRows = 2 * Traits::kMTiles;
    auto row = [&](int r) { return warp_m * Traits::kWarpRows + (r / 2) * 16 + g + (r % 2) * 8; };
    if (t == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) row_stat[warp_n * Traits::kBlockM + row(r)] = values[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      values[r] = row_stat[row(r)];
#pragma unroll
      for (int wn = 1; wn < Traits::kWarpsN; ++wn)
        values[r] = op(values[r], row_stat[wn * Traits::kBlockM + row(r)]);
    }
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) split_d_forward_kernel(const SplitDArgs args) {
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  constexpr int kMTiles = Traits::kMTiles, kWarpRows = Traits::kWarpRows;
  constexpr int kWarpsN = Traits::kWarpsN, kWarpKeys = Traits::kWarpKeys;
  constexpr int kWarpCols = Traits::kWarpCols, kPVKeys = Traits::kPVKeys;
  constexpr int kThreads = Traits::kThreads, kStages = Traits::kStages;
  constexpr int kSTiles = kWarpKeys / 8;  // n8 tiles of S per warp
  constexpr int kOTiles = kWarpCols / 8;  // n8 tiles of O per warp
  constexpr int kRows = 2 * kMTiles;      // rows a thread holds: g, g + 8 of each m16 tile

  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* const ring = smem;
  unsigned char* const p_tile = smem + Traits::kRingOrEpilogueBytes;
  float* const row_stat = reinterpret_cast<float*>(p_tile + Traits::kPBytes);

  const AttentionProblem& p = args.p;
  // The thread index through opaque(): derived addresses are recomputed where
  // used (a few integer ops) instead of re-reading SR_TID or pinning registers.
  const unsigned tid = opaque(static_cast<unsigned>(threadIdx.x));
  const int lane = tid % 32, warp = tid / 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
  const int g = lane / 4, t = lane % 4;

  // --- which CTA: value split fastest, then row block, head, batch ----------
  int64_t block = args.block_offset + blockIdx.x;
  const int split = static_cast<int>(block % args.value_splits);
  block /= args.value_splits;
  int row_block = static_cast<int>(block % args.row_blocks);
  block /= args.row_blocks;
  const int head = static_cast<int>(block % p.heads_q);
  const int batch = static_cast<int>(block / p.heads_q);
  const int kv_head = head / static_cast<int>(p.heads_q / p.heads_kv);
  if (p.causal != Causal::none) row_block = args.row_blocks - 1 - row_block;  // longest first

  // Sequence positions fit in 32 bits (dispatch checks); addresses use 64.
  const int seq_q = static_cast<int>(p.seq_q), seq_kv = static_cast<int>(p.seq_kv);
  const int head_dim = static_cast<int>(p.head_dim);
  const int q0 = row_block * kBlockM;
  const int dv0 = split * Traits::kOutCols;

  // --- the KV tiles this row block attends -----------------------------------
  const int shift = static_cast<int>(p.causal_shift());
  const int last_row = min(q0 + kBlockM, seq_q) - 1;
  const int kv_end = p.causal == Causal::none ? seq_kv : max(0, min(seq_kv, last_row + shift + 1));
  const int n_tiles = (kv_end + kBlockN - 1) / kBlockN;
  const int n_qk = (head_dim + Traits::kChunk - 1) / Traits::kChunk;
  const int out_cols = min(Traits::kOutCols, head_dim - dv0);  // valid columns of the O slice
  const int steps_per_tile = n_qk + Traits::kPVSteps;

  // --- producer: copies of ring steps ----------------------------------------
  // A stage is a stack of 128-byte rows. Thread tid copies 16-byte segment
  // tid % 8 of stacked rows tid / 8 + k * kRowsPerPass, for a fixed number of k:
  // row offsets are compile-time multiples of the row stride, and the swizzled
  // segment is the same for all k (kRowsPerPass is a multiple of 8).
  constexpr int kRowsPerPass = kThreads / 8;
  int load_tile = 0, load_r = 0;  // the next step to copy: tile, step within the tile

  auto issue_next_step = [&](int into_slot) {
    if (load_tile < n_tiles) {
      const unsigned thread = opaque(tid);
      const int seg = thread % 8, first_row = thread / 8;
      const uint32_t seg_offset = first_row * 128 + (((seg ^ first_row) & 7) << 4);
      const int64_t q_stride = p.q_stride[2], k_stride = p.k_stride[2], v_stride = p.v_stride[2];
      const Element* const q_src = static_cast<const Element*>(p.q) + batch * p.q_stride[0] +
                                   head * p.q_stride[1] + (q0 + first_row) * q_stride + seg * 8;
      const int kv0 = load_tile * kBlockN;
      const uint32_t stage = smem_address(ring + into_slot * Traits::kStageBytes) + seg_offset;
      if (load_r < n_qk) {  // kBlockM rows of Q, then kBlockN rows of K, one 64-column chunk
        const Element* const k_src = static_cast<const Element*>(p.k) + batch * p.k_stride[0] +
                                     kv_head * p.k_stride[1] + (kv0 + first_row) * k_stride + seg * 8;
        const int col = load_r * Traits::kChunk;
        const bool valid_col = col + seg * 8 < head_dim;
        constexpr int kQPasses = kBlockM / kRowsPerPass;
#pragma unroll
        for (int k = 0; k < (kBlockM + kBlockN) / kRowsPerPass; ++k) {
          if (k < kQPasses) {
            const bool valid = valid_col && q0 + first_row + k * kRowsPerPass < seq_q;
            cp_async_16(stage + k * kRowsPerPass * 128, q_src + k * kRowsPerPass * q_stride + col, valid);
          } else {
            const int row = (k - kQPasses) * kRowsPerPass;
            const bool valid = valid_col && kv0 + first_row + row < seq_kv;
            cp_async_16(stage + k * kRowsPerPass * 128, k_src + row * k_stride + col, valid);
          }
        }
      } else {  // kPVKeys keys of V, every 64-column subtile of the O slice
        // This thread's first row and subtile in the stack of subtiles.
        const int v_row0 = first_row % kPVKeys, v_sub0 = first_row / kPVKeys;
        const int key0 = kv0 + (load_r - n_qk) * kPVKeys + v_row0;
        const Element* const v_src = static_cast<const Element*>(p.v) + batch * p.v_stride[0] +
                                     kv_head * p.v_stride[1] + key0 * v_stride + dv0 +
                                     v_sub0 * 64 + seg * 8;
#pragma unroll
        for (int k = 0; k < Traits::kVStageBytes / 128 / kRowsPerPass; ++k) {
          const int row = (k * kRowsPerPass) % kPVKeys, sub = (k * kRowsPerPass) / kPVKeys;
          const bool valid = (v_sub0 + sub) * 64 + seg * 8 < out_cols && key0 + row < seq_kv;
          cp_async_16(stage + k * kRowsPerPass * 128, v_src + row * v_stride + sub * 64, valid);
        }
      }
      if (++load_r == steps_per_tile) load_r = 0, ++load_tile;
    }
    cp_async_commit();
  };

  // --- accumulators and row state ---------------------------------------------
  // Thread rows: r = 2 * mt + h is row warp_m * kWarpRows + 16 * mt + g + 8 * h.
  using OFrag = std::conditional_t<Traits::kAccumF16, uint32_t[2], float[4]>;
  OFrag o_acc[kMTiles][kOTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      if constexpr (Traits::kAccumF16) {
        o_acc[mt][nt][0] = o_acc[mt][nt][1] = 0u;
      } else {
        o_acc[mt][nt][0] = o_acc[mt][nt][1] = o_acc[mt][nt][2] = o_acc[mt][nt][3] = 0.0f;
      }
    }
  float row_max[kRows], row_sum[kRows];  // row_sum: this thread's partial sums
#pragma unroll
  for (int r = 0; r < kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;
  auto local_row = [&](int r) { return warp_m * kWarpRows + (r / 2) * 16 + g + (r % 2) * 8; };

  // ldmatrix addresses: a per-thread row offset and swizzled segment, XORed with
  // the (even) segment of the k16 step, plus compile-time offsets (rows that
  // differ by a multiple of 8 share a swizzle). Recomputed where used.
  struct LdmatrixOffsets {
    uint32_t q_row, k_row, v_row, p_row;
    int q_segment, k_segment, v_segment;
  };
  auto ldmatrix_offsets = [&]() {
    const unsigned thread = opaque(tid);
    const int l = thread % 32, w = thread / 32;
    const int segment_half = l / 16, segment_pair = (l / 8) % 2, row8 = l % 8;
    LdmatrixOffsets o;
    o.q_row = ((w / kWarpsN) * kWarpRows + l % 16) * 128;
    o.k_row = ((w % kWarpsN) * kWarpKeys + row8 + segment_half * 8) * 128;
    o.v_row = (row8 + segment_pair * 8) * 128;
    o.p_row = ((w / kWarpsN) * kWarpRows + l % 16) * (kBlockN * 2);
    o.q_segment = segment_half ^ row8;
    o.k_segment = segment_pair ^ row8;
    o.v_segment = segment_half ^ row8;
    return o;
  };

  for (int s = 0; s < kStages - 1; ++s) issue_next_step(s);
  int slot = 0;
  // Waits for the buffer of the current step and refills the one freed by the
  // previous step (every thread has passed the barrier, so it is unused).
  auto advance_ring = [&]() {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    issue_next_step(slot == 0 ? kStages - 1 : slot - 1);
  };
  auto release_slot = [&]() { slot = slot + 1 == kStages ? 0 : slot + 1; };

  for (int tile = 0; tile < n_tiles; ++tile) {
    const int kv0 = tile * kBlockN;

    // ---- 1. S = Q K^T over the head dim, chunk by chunk ----------------------
    float s_acc[kMTiles][kSTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
        s_acc[mt][nt][0] = s_acc[mt][nt][1] = s_acc[mt][nt][2] = s_acc[mt][nt][3] = 0.0f;
    for (int c = 0; c < n_qk; ++c) {
      advance_ring();
      const LdmatrixOffsets offsets = ldmatrix_offsets();
      const uint32_t q_tile = smem_address(ring + slot * Traits::kStageBytes) + offsets.q_row;
      const uint32_t k_tile = q_tile - offsets.q_row + Traits::kQTileBytes + offsets.k_row;
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
          ldmatrix_x4(a[mt], q_tile + mt * 16 * 128 + ((offsets.q_segment ^ (2 * kk)) << 4));
#pragma unroll
        for (int nn = 0; nn < kWarpKeys / 16; ++nn) {
          uint32_t b[4];
          ldmatrix_x4(b, k_tile + nn * 16 * 128 + ((offsets.k_segment ^ (2 * kk)) << 4));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_f32<Element>(s_acc[mt][2 * nn], a[mt], b[0], b[1]);
            mma_f32<Element>(s_acc[mt][2 * nn + 1], a[mt], b[2], b[3]);
          }
        }
      }
      release_slot();
    }

    // ---- 2. online softmax -----------------------------------------------------
    // s_acc[mt][nt][e] is row 2 * mt + e / 2 and key key0 + nt * 8 + (e & 1).
    const int key0 = kv0 + warp_n * kWarpKeys + 2 * t;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[mt][nt][e] *= args.scale_log2;
    const bool needs_bounds = kv0 + kBlockN > seq_kv ||
                              (p.causal != Causal::none && kv0 + kBlockN - 1 > q0 + shift);
    if (needs_bounds) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = q0 + local_row(2 * mt + e / 2), j = key0 + nt * 8 + (e & 1);
            if (j >= seq_kv || (p.causal != Causal::none && j > i + shift)) s_acc[mt][nt][e] = -INFINITY;
          }
    }
    if (p.mask_kind != MaskKind::none) {
      const int64_t mask_bh = batch * p.mask_stride[0] + head * p.mask_stride[1];
      auto apply_mask = [&](auto element_tag) {
        using T = decltype(element_tag);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int i = q0 + local_row(r);
          if (i >= seq_q) continue;
          const T* const mask_row =
              opaque(static_cast<const T*>(p.mask) + mask_bh + i * p.mask_stride[2]);
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int j = key0 + nt * 8 + e;
              if (j < seq_kv)
                s_acc[r / 2][nt][2 * (r % 2) + e] += mask_term<T>(mask_row, j * p.mask_stride[3]);
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

    float tile_max[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      tile_max[r] = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
        tile_max[r] = fmaxf(tile_max[r], fmaxf(s_acc[r / 2][nt][2 * (r % 2)], s_acc[r / 2][nt][2 * (r % 2) + 1]));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    }
    reduce_across_warps<Traits>(tile_max, row_stat, warp_m, warp_n, g, t, MaxOp{});
    float base[kRows], alpha[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float new_max = fmaxf(row_max[r], tile_max[r]);
      base[r] = new_max == -INFINITY ? 0.0f : new_max;  // nothing attended yet: exp2(-inf) = 0
      alpha[r] = exp2f(row_max[r] - base[r]);
      row_max[r] = new_max;
      row_sum[r] *= alpha[r];
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 2 * mt + e / 2;
          s_acc[mt][nt][e] = exp2f(s_acc[mt][nt][e] - base[r]);
          row_sum[r] += s_acc[mt][nt][e];
        }
    if (p.dropout_p > 0.0f) {
      // Bit 4 * nt + e of dropped[mt] says whether s_acc[mt][nt][e] is dropped.
      // The Philox rounds run in a rolled loop to keep register pressure flat.
      using DropBits = std::conditional_t<(kSTiles * 4 > 32), uint64_t, uint32_t>;
      const int64_t bh = static_cast<int64_t>(batch) * p.heads_q + head;
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        DropBits dropped = 0;
#pragma unroll 1
        for (int nt = 0; nt < kSTiles; ++nt) {
          const int j = key0 + nt * 8;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const Philox4 bits =
                dropout_bits(p.dropout_seed, p.dropout_offset, bh, q0 + local_row(2 * mt + h), j);
            // Keys j and j + 1 are words j % 4 and j % 4 + 1, and j % 4 = 2 * (t % 2).
            const uint32_t bits0 = (t & 1) ? bits.x[2] : bits.x[0];
            const uint32_t bits1 = (t & 1) ? bits.x[3] : bits.x[1];
            const DropBits pair = DropBits{bits0 < p.dropout_threshold} |
                                  (DropBits{bits1 < p.dropout_threshold} << 1);
            dropped |= pair << (4 * nt + 2 * h);
          }
        }
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if ((dropped >> (4 * nt + e)) & 1) s_acc[mt][nt][e] = 0.0f;
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kOTiles; ++nt) {
        if constexpr (Traits::kAccumF16) {
          __half2* o = reinterpret_cast<__half2*>(o_acc[mt][nt]);
          o[0] = __hmul2(o[0], __float2half2_rn(alpha[2 * mt]));
          o[1] = __hmul2(o[1], __float2half2_rn(alpha[2 * mt + 1]));
        } else {
          o_acc[mt][nt][0] *= alpha[2 * mt];
          o_acc[mt][nt][1] *= alpha[2 * mt];
          o_acc[mt][nt][2] *= alpha[2 * mt + 1];
          o_acc[mt][nt][3] *= alpha[2 * mt + 1];
        }
      }

    // P, the A operand of P V, as k16 fragments of each m16 tile.
    constexpr int kPFrags = Traits::kSharedP ? kPVKeys / 16 : kBlockN / 16;
    uint32_t p_frag[kMTiles][kPFrags][4];
    if constexpr (Traits::kSharedP) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt) {
          const int col = warp_n * kWarpKeys + nt * 8 + 2 * t, row = local_row(2 * mt);
          *reinterpret_cast<uint32_t*>(p_tile + swizzle_wide(row, col, kBlockN)) =
              pack2<Element>(s_acc[mt][nt][0], s_acc[mt][nt][1]);
          *reinterpret_cast<uint32_t*>(p_tile + swizzle_wide(row + 8, col, kBlockN)) =
              pack2<Element>(s_acc[mt][nt][2], s_acc[mt][nt][3]);
        }
      // Visible to the other warps after the barrier of the first P V step.
    } else {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int kk = 0; kk < kPFrags; ++kk) {
          p_frag[mt][kk][0] = pack2<Element>(s_acc[mt][2 * kk][0], s_acc[mt][2 * kk][1]);
          p_frag[mt][kk][1] = pack2<Element>(s_acc[mt][2 * kk][2], s_acc[mt][2 * kk][3]);
          p_frag[mt][kk][2] = pack2<Element>(s_acc[mt][2 * kk + 1][0], s_acc[mt][2 * kk + 1][1]);
          p_frag[mt][kk][3] = pack2<Element>(s_acc[mt][2 * kk + 1][2], s_acc[mt][2 * kk + 1][3]);
        }
    }

    // ---- 3. O += P V, kPVKeys keys at a time ----------------------------------
    // Unrolled only when P lives in registers (indexed by the step).
#pragma unroll(Traits::kSharedP ? 1 : Traits::kPVSteps)
    for (int ps = 0; ps < Traits::kPVSteps; ++ps) {
      advance_ring();
      const LdmatrixOffsets offsets = ldmatrix_offsets();
      constexpr int kStepFrags = kPVKeys / 16;
      const int frag0 = Traits::kSharedP ? 0 : ps * kStepFrags;
      if constexpr (Traits::kSharedP) {
        const uint32_t p_rows = smem_address(p_tile) + offsets.p_row;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int kk = 0; kk < kStepFrags; ++kk) {
            const int segment = ps * (kPVKeys / 8) + 2 * kk;  // even: its low bits XOR cleanly
            ldmatrix_x4(p_frag[mt][kk], p_rows + mt * 16 * kBlockN * 2 + (segment & ~7) * 16 +
                                            ((offsets.q_segment ^ (segment & 7)) << 4));
          }
      }
      const uint32_t v_slice = smem_address(ring + slot * Traits::kStageBytes) + offsets.v_row;
#pragma unroll
      for (int nn = 0; nn < kWarpCols / 16; ++nn) {
        // Columns past D are zero-filled: multiplied, never branched around, so
        // the loop stays one basic block the compiler can software-pipeline.
        const int col = warp_n * kWarpCols + nn * 16;
        const uint32_t v_sub = v_slice + (col / 64) * Traits::kVSubtileBytes +
                               ((offsets.v_segment ^ (2 * (nn % 4))) << 4);
#pragma unroll
        for (int kk = 0; kk < kStepFrags; ++kk) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_sub + kk * 16 * 128);
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            if constexpr (Traits::kAccumF16) {
              mma_f16(o_acc[mt][2 * nn], p_frag[mt][frag0 + kk], b[0], b[1]);
              mma_f16(o_acc[mt][2 * nn + 1], p_frag[mt][frag0 + kk], b[2], b[3]);
            } else {
              mma_f32<Element>(o_acc[mt][2 * nn], p_frag[mt][frag0 + kk], b[0], b[1]);
              mma_f32<Element>(o_acc[mt][2 * nn + 1], p_frag[mt][frag0 + kk], b[2], b[3]);
            }
          }
        }
      }
      release_slot();
    }
  }

  // ---- epilogue: normalize, stage O in shared memory, 16-byte stores ----------
  cp_async_wait<0>();
  __syncthreads();  // the ring and the row statistics are free
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 1);
    row_sum[r] += __shfl_xor_sync(0xffffffffu, row_sum[r], 2);
  }
  reduce_across_warps<Traits>(row_sum, row_stat, warp_m, warp_n, g, t, SumOp{});
  const float keep_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  float out_scale[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) out_scale[r] = row_sum[r] > 0.0f ? keep_scale / row_sum[r] : 0.0f;

  if (p.lse != nullptr && split == 0 && warp_n == 0 && t == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = q0 + local_row(r);
      if (i < seq_q) {
        const float lse = row_sum[r] > 0.0f
                              ? row_max[r] * 0.6931471805599453f + logf(row_sum[r])
                              : -INFINITY;
        p.lse[batch * p.lse_stride[0] + head * p.lse_stride[1] + i * p.lse_stride[2]] = lse;
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt) {
      float v[4];
      if constexpr (Traits::kAccumF16) {
        const float2 lo = unpack_half2(o_acc[mt][nt][0]), hi = unpack_half2(o_acc[mt][nt][1]);
        v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
      } else {
        v[0] = o_acc[mt][nt][0], v[1] = o_acc[mt][nt][1], v[2] = o_acc[mt][nt][2], v[3] = o_acc[mt][nt][3];
      }
      const int col = warp_n * kWarpCols + nt * 8 + 2 * t, row = local_row(2 * mt);
      unsigned char* const subtile = ring + (col / 64) * (kBlockM * Traits::kRowBytes);
      *reinterpret_cast<uint32_t*>(subtile + swizzle64(row, col % 64)) =
          pack2<Element>(v[0] * out_scale[2 * mt], v[1] * out_scale[2 * mt]);
      *reinterpret_cast<uint32_t*>(subtile + swizzle64(row + 8, col % 64)) =
          pack2<Element>(v[2] * out_scale[2 * mt + 1], v[3] * out_scale[2 * mt + 1]);
    }
  __syncthreads();
  Element* const o_base = static_cast<Element*>(p.o) + batch * p.o_stride[0] + head * p.o_stride[1];
  for (int s = tid; s < kBlockM * Traits::kOutCols / 8; s += kThreads) {
    const int subtile = s / (kBlockM * 8), row = (s / 8) % kBlockM, segment = s % 8;
    const int col = subtile * 64 + segment * 8;
    if (q0 + row < seq_q && col < out_cols) {
      const uint4 value = *reinterpret_cast<const uint4*>(
          ring + subtile * (kBlockM * Traits::kRowBytes) + swizzle64(row, segment * 8));
      *reinterpret_cast<uint4*>(o_base + static_cast<int64_t>(q0 + row) * p.o_stride[2] + dv0 + col) =
          value;
    }
  }
}

}  // namespace ffpa::detail::sm80
