// Tile shapes of the sm80 split-D family and the head-dim routing table.
// Shared by the kernel instantiations (compile time) and the host dispatch.
#pragma once

namespace ffpa::detail::sm80_split_d {

// One CTA computes warp_rows * warps_m query rows and out_cols columns of O
// (a slice of Dv; a CTA never holds more than out_cols). Warps are laid out
// warps_m x warps_n ("M4N2" = 4 x 2): along M they own warp_rows rows, along N
// they split the keys of S = Q K^T and the columns of O, exchanging P through
// shared memory when warps_n > 1. Q and K are streamed in 64-column chunks of
// the head dim, V in slices of pv_keys keys (x out_cols columns), through one
// ring of `stages` shared-memory buffers: shared memory is O(1) in D.
struct TileShape {
  int out_cols;
  int warp_rows;  // 16 or 32: query rows per warp (one or two m16 MMA tiles)
  int warps_m;
  int warps_n;
  int block_n;  // keys per KV tile
  int pv_keys;  // keys per P*V step
  int stages;
};

// The tile of each instantiated head dim. O costs warp_rows * out_cols /
// (32 * warps_n) fp32 registers per thread, so warps_n grows with out_cols to
// stay within the register file (ptxas -v reports no spills for these;
// docs/kernels/sm80_split_d_ptxas.md).
constexpr TileShape tile_shape(int out_cols) {
  // Measured on the H200 with tools/tune_split_d (docs/kernels/sm80_split_d.md);
  // 32-row warps halve shared-memory reads per MMA wherever O still fits.
  if (out_cols <= 128) return {out_cols, 16, 4, 1, 64, 64, 4};
  if (out_cols <= 256) return {out_cols, 16, 4, 1, 64, 32, 4};
  if (out_cols <= 384) return {out_cols, 16, 4, 2, 128, 32, 4};
  if (out_cols <= 512) return {out_cols, 32, 2, 4, 128, 32, 3};
  if (out_cols <= 768) return {out_cols, 16, 2, 4, 128, 16, 4};
  return {out_cols, 32, 1, 8, 256, 16, 4};
}

// Shared memory of a tile, in the order the kernel lays it out: the ring of
// stages (reused to stage O in the epilogue), P (when warps_n > 1: the warps
// of a row exchange it), and one float per row and warp for row statistics.
struct SmemLayout {
  int stage_bytes;
  int ring_bytes;  // max(stages * stage_bytes, the O staging of the epilogue)
  int p_bytes;
  int row_stat_bytes;
  int total_bytes;
};

constexpr SmemLayout smem_layout(TileShape tile) {
  const int block_m = tile.warp_rows * tile.warps_m;
  const int qk_stage = (block_m + tile.block_n) * 128;  // 64 columns of Q and K rows
  const int v_stage = tile.pv_keys * tile.out_cols * 2;
  const int stage = qk_stage > v_stage ? qk_stage : v_stage;
  const int epilogue = block_m * tile.out_cols * 2;
  const int ring = tile.stages * stage > epilogue ? tile.stages * stage : epilogue;
  const int p = tile.warps_n > 1 ? block_m * tile.block_n * 2 : 0;
  const int row_stat = tile.warps_n > 1 ? tile.warps_n * block_m * 4 : 0;
  return {stage, ring, p, row_stat, ring + p + row_stat};
}

// Routing: the instance (out_cols) and value splits that serve head dim D.
// Among the compiled instances whose shared memory fits the device, the
// smallest out_cols >= D (zero padding inside the kernel); above the largest
// one, Dv is split across CTAs (each recomputes S, produces one slice of O).
// Which head dims get an instance is measured (docs/kernels/sm80_split_d.md).
struct Route {
  int out_cols;  // 0: no compiled instance fits the device
  int value_splits;
};

}  // namespace ffpa::detail::sm80_split_d
