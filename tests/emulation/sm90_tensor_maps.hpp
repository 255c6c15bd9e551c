// The emulator's tensor map of one of a launch's tensors (tensor_map.cpp's
// shapes and boxes, encoded for the emulated TMA instead of the driver): the
// sm90 forward and backward emulated tests' one encoder.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "emulation/sm90_emulator.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::testing {

inline CUtensorMap emulated_map(const detail::sm90_wgmma::TensorMapShape& shape, int box_rows, int box_heads) {
  emulation::sm90::TensorMapInfo info;
  info.base = static_cast<const unsigned char*>(shape.base);
  info.element_bytes = shape.element_bytes;
  const int64_t dims[4] = {shape.head_dim, shape.seq, shape.heads, shape.batch};
  for (int i = 0; i < 4; ++i) info.dims[i] = dims[i];
  for (int i = 0; i < 3; ++i) info.strides[i] = shape.stride[2 - i] * shape.element_bytes;
  const int box[4] = {128 / shape.element_bytes, box_rows, box_heads, 1};
  for (int i = 0; i < 4; ++i) info.box[i] = box[i];
  CUtensorMap map;
  emulation::sm90::encode_tensor_map(info, &map);
  return map;
}

}  // namespace ffpa::testing
