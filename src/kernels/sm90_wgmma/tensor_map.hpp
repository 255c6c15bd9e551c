// TMA descriptors for the attention tensors: a logical [B, H, N, D] tensor with
// element strides (b, h, n) and a contiguous last dimension, boxes of
// [box_heads][box_rows][128 bytes] with the 128-byte swizzle. Elements are the
// call's bf16 / fp16, or bytes (the FP8 path's codes in its workspace).
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
  int element_bytes = 2;  // 2: dtype; 1: 8-bit codes (UINT8 to TMA)
};

// The call's q, k, v and o, in that order.
std::array<TensorMapShape, 4> attention_tensor_shapes(const AttentionProblem& problem);

// True when TMA can address the tensor: 16-byte aligned base and strides.
bool tensor_map_addressable(const TensorMapShape& shape);

// Encodes the descriptor through the driver (looked up once per process).
Status encode_tensor_map(const TensorMapShape& shape, int box_rows, int box_heads, CUtensorMap* map);

// The four maps of a launch (q, k, v, o), box rows and heads for each.
Status encode_tensor_maps(const std::array<TensorMapShape, 4>& shapes, const int (&box_rows)[4],
                          const int (&box_heads)[4], CUtensorMap (&maps)[4]);

}  // namespace ffpa::detail::sm90_wgmma
