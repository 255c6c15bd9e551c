// TMA descriptors for the attention tensors: a logical [B, H, N, D] tensor with
// element strides (b, h, n) and a contiguous last dimension, boxes of
// [box_heads][box_rows][64] elements with the 128-byte swizzle.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::sm90_wgmma {

struct TensorMapShape {
  const void* base;
  DType dtype;
  int64_t batch, heads, seq, head_dim;
  const int64_t* stride;  // elements: b, h, n
};

// The call's q, k, v and o, in that order.
std::array<TensorMapShape, 4> attention_tensor_shapes(const AttentionProblem& problem);

// True when TMA can address the tensor: 16-byte aligned base and strides.
bool tensor_map_addressable(const TensorMapShape& shape);

// Encodes the descriptor through the driver (looked up once per process).
Status encode_tensor_map(const TensorMapShape& shape, int box_rows, int box_heads, CUtensorMap* map);

}  // namespace ffpa::detail::sm90_wgmma
