// TMA's reduce-add of fp32 boxes (ptx.cuh's tma_reduce_add_4d, the backward's
// future dQ accumulation: docs/kernels/sm90_small_d_backward_plan.md):
// kBoxes boxes of [64 rows][32 fp32 columns] added into a [kTensorRows]
// [kTensorCols] fp32 tensor at overlapping origins, the last reaching past
// both edges (those elements are skipped). One source for the GPU test
// (test_tma_reduce_add.cu) and the emulated one (tests/emulation/
// test_sm90_tma_emulated.cpp), which compiles it as host code through the
// emulator's shims; reduce_add_case.hpp is the host side.
#pragma once

#include <cstdint>

#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::testing::reduce_add {

constexpr int kBoxRows = 64, kBoxCols = 32;  // a box row: 128 bytes of fp32
constexpr int kBoxBytes = kBoxRows * kBoxCols * 4;
constexpr int kBoxes = 3;
constexpr int kTensorRows = 100, kTensorCols = 40;

// Box b's origin (column, row) in the tensor: 0 and 1 overlap in rows 20..63,
// 2 starts at column 16 (columns 40.. outside) and row 70 (rows 100.. outside).
struct Origin {
  int col, row;
};
__host__ __device__ inline Origin origin(int b) {
  return b == 0 ? Origin{0, 0} : b == 1 ? Origin{0, 20} : Origin{16, 70};
}

// Thread 0 of the CTA: every box (box b at boxes + b x kBoxBytes in shared
// memory) added at its origin, then waits until they are read.
__device__ inline void add_boxes(uint32_t boxes, const CUtensorMap* map, int thread) {
  if (thread != 0) return;
  for (int b = 0; b < kBoxes; ++b) {
    detail::sm90_wgmma::tma_reduce_add_4d(map, boxes + static_cast<uint32_t>(b * kBoxBytes), origin(b).col,
                                          origin(b).row, 0, 0);
  }
  detail::sm90_wgmma::tma_store_commit();
  detail::sm90_wgmma::tma_store_wait_read();
}

}  // namespace ffpa::testing::reduce_add
