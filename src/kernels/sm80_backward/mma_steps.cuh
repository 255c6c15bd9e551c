// The backward kernels' tensor-core work on one ring stage, mma.sync m16n8k16
// on ldmatrix fragments (fragment layouts: sm80_split_d/ptx.cuh):
//   accumulate_scores:  S or dP [64 x 64] += A B^T over one 64-column chunk
//                       (A rows: Q or dO; B rows: K or V), score warps;
//   accumulate_tn:      X [64 x chunk] += T^T C (T a [64][64] tile in shared
//                       memory: P or dS, rows = queries; C the chunk of dO or
//                       Q, rows = queries): dV and dK, rows = keys;
//   accumulate_nn:      X [64 x chunk] += T C (T: dS; C: the chunk of K,
//                       rows = keys): dQ, rows = queries.
// Every operand lives in 128-byte swizzled rows (swizzle.hpp): the address of
// row r, 16-byte segment s is base + 128 r + ((s ^ r % 8) << 4).
#pragma once

#include <cstdint>

#include "kernels/common/compiler_hints.cuh"
#include "kernels/sm80_backward/traits.cuh"
#include "kernels/sm80_split_d/ptx.cuh"

namespace ffpa::detail::sm80_backward {

using sm80_split_d::ldmatrix_x4;
using sm80_split_d::ldmatrix_x4_trans;
using sm80_split_d::mma_f32;

__device__ __forceinline__ uint32_t swizzled(uint32_t base, int row, int segment) {
  return base + static_cast<uint32_t>(row * 128 + (((segment ^ row) & 7) << 4));
}

// ldmatrix.x4 lane addresses. An A fragment (16 rows x k16) read as stored:
// lanes 0-15 rows 0-15 at k 0-7, lanes 16-31 rows 0-15 at k 8-15.
__device__ __forceinline__ int a_row(int lane) { return lane % 16; }
__device__ __forceinline__ int a_segment(int lane) { return lane / 16; }
// Two B fragments (n 0-7 and 8-15) of rows stored n-major (K, V: B = rows^T):
// matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
__device__ __forceinline__ int bt_row(int lane) { return lane % 8 + 8 * (lane / 16); }
__device__ __forceinline__ int bt_segment(int lane) { return (lane / 8) % 2; }
// Two B fragments of rows stored k-major (dO, Q, K chunks in the products),
// read with .trans: matrices (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15),
// (k 8-15, n 8-15).
__device__ __forceinline__ int bk_row(int lane) { return lane % 8 + 8 * ((lane / 8) % 2); }
__device__ __forceinline__ int bk_segment(int lane) { return lane / 16; }
// An A fragment of the transpose of a tile stored k-major (T^T, T's rows = k),
// read with .trans: matrices (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7),
// (k 8-15, m 8-15) give a0..a3.
__device__ __forceinline__ int at_row(int lane) { return lane % 8 + 8 * (lane / 16); }
__device__ __forceinline__ int at_segment(int lane) { return (lane / 8) % 2; }

// acc [16 rows x 32 keys of this warp] += A B^T over the stage's chunk.
template <class Traits>
__device__ __forceinline__ void accumulate_scores(float (&acc)[Traits::ScoreLayout::kElements], uint32_t stage,
                                                  unsigned tid) {
  using Element = typename Traits::Element;
  const unsigned thread = opaque(tid);
  const int lane = static_cast<int>(thread % 32), warp = static_cast<int>(thread / 32);
  const int rows = (warp / Traits::kScoreWarpsN) * 16, keys = (warp % Traits::kScoreWarpsN) * Traits::kScoreWarpKeys;
  const uint32_t a_half = stage, b_half = stage + Traits::kHalfBytes;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, swizzled(a_half, rows + a_row(lane), 2 * kk + a_segment(lane)));
#pragma unroll
    for (int nn = 0; nn < Traits::kScoreWarpKeys / 16; ++nn) {
      uint32_t b[4];
      ldmatrix_x4(b, swizzled(b_half, keys + 16 * nn + bt_row(lane), 2 * kk + bt_segment(lane)));
      mma_f32<Element>(*reinterpret_cast<float(*)[4]>(&acc[4 * (2 * nn)]), a, b[0], b[1]);
      mma_f32<Element>(*reinterpret_cast<float(*)[4]>(&acc[4 * (2 * nn + 1)]), a, b[2], b[3]);
    }
  }
}

// The 4 n8 tiles of chunk `chunk` in a slice accumulator.
template <class Traits>
__device__ __forceinline__ float (&chunk_tile(float (&acc)[Traits::SliceLayout::kElements], int chunk, int nt))[4] {
  return *reinterpret_cast<float(*)[4]>(&acc[4 * (chunk * (Traits::kProductWarpCols / 8) + nt)]);
}

// acc's chunk `chunk` [16 rows (keys) x 32 columns of this warp] += T^T C:
// T the [kBlockQ][kBlockK] tile at `tile` (rows = queries = the reduction),
// C the 64 query rows of the stage half `half`.
template <class Traits>
__device__ __forceinline__ void accumulate_tn(float (&acc)[Traits::SliceLayout::kElements], int chunk, uint32_t tile,
                                              uint32_t half, unsigned tid) {
  using Element = typename Traits::Element;
  const unsigned thread = opaque(tid);
  const int lane = static_cast<int>(thread % 32), warp = static_cast<int>(thread / 32);
  const int rows = (warp % Traits::kProductWarpsM) * 16;  // keys: columns of T
  const int cols = (warp / Traits::kProductWarpsM) * Traits::kProductWarpCols;
#pragma unroll
  for (int kq = 0; kq < Traits::kBlockQ / 16; ++kq) {
    uint32_t a[4];
    ldmatrix_x4_trans(a, swizzled(tile, 16 * kq + at_row(lane), rows / 8 + at_segment(lane)));
#pragma unroll
    for (int nn = 0; nn < Traits::kProductWarpCols / 16; ++nn) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, swizzled(half, 16 * kq + bk_row(lane), (cols + 16 * nn) / 8 + bk_segment(lane)));
      mma_f32<Element>(chunk_tile<Traits>(acc, chunk, 2 * nn), a, b[0], b[1]);
      mma_f32<Element>(chunk_tile<Traits>(acc, chunk, 2 * nn + 1), a, b[2], b[3]);
    }
  }
}

// acc's chunk `chunk` [16 rows (queries) x 32 columns of this warp] += T C:
// T the [kBlockQ][kBlockK] tile (rows = queries, columns = keys = the
// reduction), C the 64 key rows of the stage half `half`.
template <class Traits>
__device__ __forceinline__ void accumulate_nn(float (&acc)[Traits::SliceLayout::kElements], int chunk, uint32_t tile,
                                              uint32_t half, unsigned tid) {
  using Element = typename Traits::Element;
  const unsigned thread = opaque(tid);
  const int lane = static_cast<int>(thread % 32), warp = static_cast<int>(thread / 32);
  const int rows = (warp % Traits::kProductWarpsM) * 16;
  const int cols = (warp / Traits::kProductWarpsM) * Traits::kProductWarpCols;
#pragma unroll
  for (int kk = 0; kk < Traits::kBlockK / 16; ++kk) {
    uint32_t a[4];
    ldmatrix_x4(a, swizzled(tile, rows + a_row(lane), 2 * kk + a_segment(lane)));
#pragma unroll
    for (int nn = 0; nn < Traits::kProductWarpCols / 16; ++nn) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, swizzled(half, 16 * kk + bk_row(lane), (cols + 16 * nn) / 8 + bk_segment(lane)));
      mma_f32<Element>(chunk_tile<Traits>(acc, chunk, 2 * nn), a, b[0], b[1]);
      mma_f32<Element>(chunk_tile<Traits>(acc, chunk, 2 * nn + 1), a, b[2], b[3]);
    }
  }
}

}  // namespace ffpa::detail::sm80_backward
