// The emulator's tensor map of one of a launch's tensors (tensor_map.cpp's
// shapes and boxes, encoded for the emulated TMA instead of the driver): the
// sm90 forward and backward emulated tests' one encoder.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "emulation/sm90_emulator.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::testing {

inline CUtensorMap emulated_map(const detail::sm90_wgmma::TensorMapSpec& spec) {
  emulation::sm90::TensorMapInfo info;
  info.base = static_cast<const unsigned char*>(spec.base);
  info.element_bytes = spec.element_bytes;
  for (int i = 0; i < 5; ++i) {
    info.dims[i] = i < spec.rank ? static_cast<int64_t>(spec.dims[i]) : 1;
    info.box[i] = i < spec.rank ? static_cast<int>(spec.box[i]) : 1;
  }
  for (int i = 0; i < 4; ++i) info.strides[i] = i + 1 < spec.rank ? static_cast<int64_t>(spec.strides[i]) : 0;
  CUtensorMap map;
  emulation::sm90::encode_tensor_map(info, &map);
  return map;
}

inline CUtensorMap emulated_map(const detail::sm90_wgmma::TensorMapShape& shape, int box_rows, int box_heads) {
  return emulated_map(detail::sm90_wgmma::tensor_map_spec(shape, box_rows, box_heads));
}

}  // namespace ffpa::testing
