// TMA descriptors for the attention tensors: a logical [B, H, N, D] tensor with
// element strides (b, h, n) and a contiguous last dimension, boxes of
// [box_heads][box_rows][128 bytes] with the 128-byte swizzle. Elements are the
// call's bf16 / fp16, bytes (the FP8 path's codes in its workspace) or fp32.
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <optional>

#include "common/attention_problem.hpp"
#include "kernels/sm90_wgmma/page_map_steps.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::sm90_wgmma {

struct TensorMapShape {
  const void* base;
  DType dtype;
  int64_t batch, heads, seq, head_dim;
  const int64_t* stride;  // elements: b, h, n
  int element_bytes = 2;  // 2: dtype; 1: 8-bit codes (UINT8 to TMA); 4: fp32 (a gradient's accumulator)
};

// A map as the encoder takes it: rank 4 or 5, dims[0] contiguous (boxes of
// 128-byte rows, the 128-byte swizzle), byte strides of dims 1 .. rank - 1.
struct TensorMapSpec {
  const void* base = nullptr;
  DType dtype = DType::bf16;
  int element_bytes = 2;
  int rank = 4;
  uint64_t dims[5] = {1, 1, 1, 1, 1};
  uint64_t strides[4] = {16, 16, 16, 16};
  uint32_t box[5] = {1, 1, 1, 1, 1};
};

// The 4-d map of `shape` ([D][seq][heads][batch]) with boxes of
// [box_heads][box_rows][128 bytes].
TensorMapSpec tensor_map_spec(const TensorMapShape& shape, int box_rows, int box_heads);

// A paged cache's K or V (shape: batch = pages, seq = a page's rows) in key
// groups (Traits::kPageGroups): dims (64 columns, 8 rows of a group, 64-column
// chunks of the head dim, a page's groups, pages), the KV head folded into
// the chunks or the pages as `steps` says. A box of [box_rows / 8 groups]
// [box_chunks][8 rows][128 bytes]: one TMA load brings a page's rows for
// every chunk of a stage, where the 4-d map needs one per chunk.
TensorMapSpec page_group_spec(const TensorMapShape& shape, const PageMapSteps& steps, int box_chunks, int box_rows);

// How a paged call's K and V maps fold the KV head into another dimension,
// where both fold it alike (the producer looks a page up once for the two):
// into the pages (their stride is Hkv x the head's: an HND cache) or into the
// chunks (the head's stride is D: an NHD cache); nothing otherwise (the 4-d
// map's page boxes serve it then).
std::optional<PageMapSteps> page_group_steps(const AttentionProblem& problem);

// The call's q, k, v and o, in that order.
std::array<TensorMapShape, 4> attention_tensor_shapes(const AttentionProblem& problem);

// True when TMA can address the tensor: 16-byte aligned base and strides.
bool tensor_map_addressable(const TensorMapShape& shape);

// Encodes the descriptor through the driver (looked up once per process).
Status encode_tensor_map(const TensorMapSpec& spec, CUtensorMap* map);
Status encode_tensor_map(const TensorMapShape& shape, int box_rows, int box_heads, CUtensorMap* map);

// The four maps of a launch (q, k, v, o), box rows and heads for each.
Status encode_tensor_maps(const std::array<TensorMapShape, 4>& shapes, const int (&box_rows)[4],
                          const int (&box_heads)[4], CUtensorMap (&maps)[4]);

}  // namespace ffpa::detail::sm90_wgmma
