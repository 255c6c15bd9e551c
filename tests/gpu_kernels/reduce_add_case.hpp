// Host side of reduce_add.cuh's adds: the boxes' shared-memory image
// (128-byte swizzled rows, as TMA reads them; built here, copied verbatim by
// the GPU test's kernel or handed to the emulator), the tensor before and
// after, and its map.
// Every value is a multiple of 1/16 below 2^10: the sums are exact in any
// order, so the check is exact.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "gpu_kernels/reduce_add.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::testing::reduce_add {

inline float term(int b, int r, int c) { return 0.25f * static_cast<float>(b + 1) + 0.5f * r + 0.0625f * c; }
inline float initial(int r, int c) { return static_cast<float>(r * kTensorCols + c) / 16.0f; }

// The boxes as shared memory holds them, box b at b x kBoxBytes.
inline std::vector<unsigned char> shared_image() {
  std::vector<unsigned char> image(static_cast<size_t>(kBoxes * kBoxBytes));
  for (int b = 0; b < kBoxes; ++b)
    for (int r = 0; r < kBoxRows; ++r)
      for (int c = 0; c < kBoxCols; ++c) {
        const float v = term(b, r, c);
        std::memcpy(image.data() + b * kBoxBytes + detail::swizzle128<4>(r, c), &v, 4);
      }
  return image;
}

inline std::vector<float> initial_tensor() {
  std::vector<float> t(static_cast<size_t>(kTensorRows * kTensorCols));
  for (int r = 0; r < kTensorRows; ++r)
    for (int c = 0; c < kTensorCols; ++c) t[static_cast<size_t>(r * kTensorCols + c)] = initial(r, c);
  return t;
}

inline std::vector<float> expected_tensor() {
  std::vector<float> t = initial_tensor();
  for (int b = 0; b < kBoxes; ++b)
    for (int r = 0; r < kBoxRows; ++r)
      for (int c = 0; c < kBoxCols; ++c) {
        const int row = origin(b).row + r, col = origin(b).col + c;
        if (row < kTensorRows && col < kTensorCols) t[static_cast<size_t>(row * kTensorCols + col)] += term(b, r, c);
      }
  return t;
}

// The tensor's map: [kTensorRows][kTensorCols] fp32 as the attention maps'
// 4-d shape (one batch, one head), boxes of 64 rows.
inline detail::sm90_wgmma::TensorMapSpec tensor_spec(const float* tensor) {
  static const int64_t strides[3] = {kTensorRows * kTensorCols, kTensorRows * kTensorCols, kTensorCols};
  detail::sm90_wgmma::TensorMapShape shape{tensor, DType::f32, 1, 1, kTensorRows, kTensorCols, strides, 4};
  return detail::sm90_wgmma::tensor_map_spec(shape, kBoxRows, 1);
}

}  // namespace ffpa::testing::reduce_add
