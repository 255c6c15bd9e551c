// The backward kernels' epilogue: a slice accumulator (64 rows x the slice's
// columns, SliceLayout) times a factor, rounded to the gradient's dtype and
// stored through its strides, rows below row_end and columns below col_end.
// Each thread stores its column pairs as 32-bit words (the gradients are
// written once per element; their traffic is small next to the recomputed
// products).
#pragma once

#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/sm80_backward/traits.cuh"

namespace ffpa::detail::sm80_backward {

// rows: the tensor's row 0 of this slice's (batch, head); the CTA's rows
// start at row0, its columns at col0.
template <class Traits>
__device__ __forceinline__ void store_slice(const float (&acc)[Traits::SliceLayout::kElements], float factor,
                                            typename Traits::Element* rows, int64_t row_stride, int row0, int row_end,
                                            int col0, int col_end, unsigned tid) {
  using Layout = typename Traits::SliceLayout;
  using Element = typename Traits::Element;
  const int lane = static_cast<int>(tid % 32), warp = static_cast<int>(tid / 32);
  const int g = lane / 4, t = lane % 4;
  const int first_row = row0 + (warp % Traits::kProductWarpsM) * 16 + g;
  const int warp_col = col0 + (warp / Traits::kProductWarpsM) * Traits::kProductWarpCols + 2 * t;
#pragma unroll
  for (int b = 0; b < Layout::kColBlocks; ++b) {
    const int chunk = b / (Traits::kProductWarpCols / 8), nt = b % (Traits::kProductWarpCols / 8);
    const int col = warp_col + chunk * Traits::kChunk + 8 * nt;
    if (col >= col_end) continue;  // col_end is a multiple of 8: both columns of the pair, or neither
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = first_row + 8 * r;
      if (row >= row_end) continue;
      *reinterpret_cast<uint32_t*>(rows + static_cast<int64_t>(row) * row_stride + col) =
          pack2<Element>(acc[Layout::index(r, b, 0)] * factor, acc[Layout::index(r, b, 1)] * factor);
    }
  }
}

}  // namespace ffpa::detail::sm80_backward
