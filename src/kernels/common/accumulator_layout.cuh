// Which row and column of a tile each accumulator register of a thread holds.
// mma.sync m16n8 (sm80) and wgmma m64nN (sm90) share one layout per warp: in
// each 16-row slab and 8-column block a thread holds 4 values, rows g and
// g + 8 and columns 2t and 2t + 1 (g = lane / 4, t = lane % 4). A thread's
// registers are one flat array, slab-major, then column block, then
// (row half, column): element 4 * (slab * kColBlocks + block) + 2 * half + e.
// The attention pieces (score_mask.cuh, dropout.cuh, online_softmax.cuh) are
// written against this layout, so every family shares them. Which tile rows a
// thread holds is the family's: a Coordinates object whose row(r) gives the
// tile row of thread row r, computed where used from whatever the family keeps
// (registers are scarce); columns are passed as the key of the thread's first
// column, key0 (column 2t of block 0), block b adding col_offset(b).
#pragma once

namespace ffpa::detail {

template <int kSlabs_, int kColBlocks_>
struct AccumulatorLayout {
  static constexpr int kSlabs = kSlabs_;
  static constexpr int kColBlocks = kColBlocks_;  // column pairs a thread holds per row
  static constexpr int kRows = 2 * kSlabs;        // thread rows r = 2 * slab + half
  static constexpr int kElements = 4 * kSlabs * kColBlocks;

  // The register holding column 2t + e of block `block` in thread row r.
  __device__ __forceinline__ static constexpr int index(int r, int block, int e) {
    return 4 * ((r / 2) * kColBlocks + block) + 2 * (r % 2) + e;
  }
  // Tile row of thread row r, relative to the thread's first row (warp rows + g).
  __device__ __forceinline__ static constexpr int row_offset(int r) { return (r / 2) * 16 + (r % 2) * 8; }
  // Column of block `block`, relative to the thread's first column (warp columns + 2t).
  __device__ __forceinline__ static constexpr int col_offset(int block) { return 8 * block; }
};

// The flat view of a [slabs][blocks][4] accumulator array.
template <int kSlabs, int kColBlocks>
__device__ __forceinline__ float (&flat(float (&a)[kSlabs][kColBlocks][4]))[4 * kSlabs * kColBlocks] {
  return reinterpret_cast<float(&)[4 * kSlabs * kColBlocks]>(a);
}

}  // namespace ffpa::detail
