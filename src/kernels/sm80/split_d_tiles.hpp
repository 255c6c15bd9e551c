// Tile shapes of the sm80 split-D family and the head-dim routing table.
// Shared by the kernel instantiations (compile time) and the host dispatch.
#pragma once

namespace ffpa::detail::sm80 {

// One CTA computes warp_rows * warps_m query rows and out_cols columns of O
// (a slice of Dv; a CTA never holds more than out_cols). Warps are laid out
// warps_m x warps_n ("M4N2" = 4 x 2): along M they own 16-row slices, along N
// they split the keys of S = Q K^T and the columns of O, exchanging P through
// shared memory when warps_n > 1. Q and K are streamed in 64-column chunks of
// the head dim, V in slices of pv_keys keys (x out_cols columns), through one
// ring of `stages` shared-memory buffers: shared memory is O(1) in D.
struct SplitDTile {
  int out_cols;
  int warp_rows;  // 16 or 32: query rows per warp (one or two m16 MMA tiles)
  int warps_m;
  int warps_n;
  int block_n;  // keys per KV tile
  int pv_keys;  // keys per P*V step
  int stages;
};

// The tile of each instantiated head dim. O costs out_cols / (2 * warps_n)
// fp32 registers per thread, so warps_n grows with out_cols to stay within
// the register file (ptxas -v reports no spills for these; docs/kernels/).
constexpr SplitDTile split_d_tile(int out_cols) {
  // Measured on the H200 with tools/tune_split_d (docs/kernels/sm80_split_d.md);
  // 32-row warps halve shared-memory reads per MMA wherever O still fits.
  if (out_cols <= 128) return {out_cols, 16, 4, 1, 64, 64, 4};
  if (out_cols <= 256) return {out_cols, 16, 4, 1, 64, 32, 4};
  if (out_cols <= 384) return {out_cols, 16, 4, 2, 128, 32, 4};
  if (out_cols <= 512) return {out_cols, 32, 2, 4, 128, 32, 3};
  if (out_cols <= 768) return {out_cols, 16, 2, 4, 128, 16, 4};
  return {out_cols, 32, 1, 8, 256, 16, 4};
}

// Routing: which instantiated head dim serves head dim D. The preferred
// instantiation is the smallest compiled out_cols >= D (zero padding inside the
// kernel). Above the largest compiled out_cols, Dv is split across CTAs
// (each recomputes S and produces one slice of O).
struct SplitDRoute {
  int out_cols;
  int value_splits;
};

}  // namespace ffpa::detail::sm80
