#include "kernels/sm90_wgmma/tensor_map.hpp"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime_api.h>

#include <optional>
#include <string>

namespace ffpa::detail::sm90_wgmma {
namespace {

// The stride TMA is given for a dimension: its own when it has more than one
// index (then it is used), else any valid value (it is multiplied by zero).
uint64_t dimension_stride_bytes(int64_t extent, int64_t stride_elements, int element_bytes) {
  return extent > 1 ? static_cast<uint64_t>(stride_elements * element_bytes) : 16u;
}

// How a grouped page map folds the KV head of one paged tensor (K or V):
// page_group_steps, for each of the two.
std::optional<PageMapSteps> page_map_steps(const TensorMapShape& shape) {
  if (shape.heads == 1) return PageMapSteps{0, 1, 0};
  if (shape.stride[0] == shape.heads * shape.stride[1]) return PageMapSteps{0, static_cast<int>(shape.heads), 1};
  if (shape.stride[1] == shape.head_dim && shape.head_dim % 64 == 0) {
    return PageMapSteps{static_cast<int>(shape.head_dim / 64), 1, 0};
  }
  return std::nullopt;
}

// The driver's encoder, through the runtime's entry-point query (no libcuda
// link). A lookup, not state: every call gets the same function.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult result{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &result) != cudaSuccess ||
        result != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      function = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encoder;
}

}  // namespace

std::array<TensorMapShape, 4> attention_tensor_shapes(const AttentionProblem& p) {
  // A serving call's tensors as they are: packed rows of one batch entry, a
  // batch entry per sequence, or a paged cache's pages (docs/serving.md).
  const SequenceLayout& s = p.sequences;
  const int64_t q_batch = s.packed_q() ? 1 : p.batch, q_rows = s.packed_q() ? s.packed_rows_q : p.seq_q;
  int64_t kv_batch = p.batch, kv_rows = p.seq_kv;
  if (s.paged()) {
    kv_batch = s.num_blocks, kv_rows = s.page_size;
  } else if (s.packed_k()) {
    kv_batch = 1, kv_rows = s.packed_rows_k;
  } else if (s.active) {
    kv_rows = s.keys_per_sequence;
  }
  // An e4m3 cache's k and v: bytes (their maps go unused: producer_codes.cuh
  // copies them; the alignment checks read them).
  const int kv_bytes = p.kv_e4m3 ? 1 : 2;
  return {TensorMapShape{p.q, p.dtype, q_batch, p.heads_q, q_rows, p.head_dim, p.q_stride},
          TensorMapShape{p.k, p.dtype, kv_batch, p.heads_kv, kv_rows, p.head_dim, p.k_stride, kv_bytes},
          TensorMapShape{p.v, p.dtype, kv_batch, p.heads_kv, kv_rows, p.dv(), p.v_stride, kv_bytes},
          TensorMapShape{p.o, p.dtype, q_batch, p.heads_q, q_rows, p.dv(), p.o_stride}};
}

bool tensor_map_addressable(const TensorMapShape& shape) {
  if (reinterpret_cast<uintptr_t>(shape.base) % 16 != 0) return false;
  const int64_t extents[3] = {shape.batch, shape.heads, shape.seq};
  for (int i = 0; i < 3; ++i) {
    const uint64_t stride = dimension_stride_bytes(extents[i], shape.stride[i], shape.element_bytes);
    if (stride % 16 != 0 || stride >= (uint64_t{1} << 40)) return false;
  }
  return true;
}

TensorMapSpec tensor_map_spec(const TensorMapShape& shape, int box_rows, int box_heads) {
  TensorMapSpec spec;
  spec.base = shape.base;
  spec.dtype = shape.dtype;
  spec.element_bytes = shape.element_bytes;
  spec.rank = 4;
  const int64_t dims[4] = {shape.head_dim, shape.seq, shape.heads, shape.batch};
  for (int i = 0; i < 4; ++i) spec.dims[i] = static_cast<uint64_t>(dims[i]);
  for (int i = 0; i < 3; ++i) spec.strides[i] = dimension_stride_bytes(dims[i + 1], shape.stride[2 - i], shape.element_bytes);
  const int box[4] = {128 / shape.element_bytes, box_rows, box_heads, 1};
  for (int i = 0; i < 4; ++i) spec.box[i] = static_cast<uint32_t>(box[i]);
  return spec;
}

std::optional<PageMapSteps> page_group_steps(const AttentionProblem& problem) {
  const std::array<TensorMapShape, 4> shapes = attention_tensor_shapes(problem);
  const std::optional<PageMapSteps> k = page_map_steps(shapes[1]), v = page_map_steps(shapes[2]);
  if (!k || !v || !(*k == *v)) return std::nullopt;
  return k;
}

TensorMapSpec page_group_spec(const TensorMapShape& shape, const PageMapSteps& steps, int box_chunks, int box_rows) {
  TensorMapSpec spec;
  spec.base = shape.base;
  spec.dtype = shape.dtype;
  spec.element_bytes = shape.element_bytes;
  spec.rank = 5;
  const int64_t chunk_cols = 128 / shape.element_bytes;
  const int64_t chunks = (shape.head_dim + chunk_cols - 1) / chunk_cols * (steps.head_chunks > 0 ? shape.heads : 1);
  const int64_t pages = shape.batch * (steps.head_step > 0 ? shape.heads : 1);
  const int64_t dims[5] = {chunk_cols, 8, chunks, shape.seq / 8, pages};
  const int64_t strides[4] = {shape.stride[2], chunk_cols, 8 * shape.stride[2],
                              steps.head_step > 0 ? shape.stride[1] : shape.stride[0]};
  for (int i = 0; i < 5; ++i) spec.dims[i] = static_cast<uint64_t>(dims[i]);
  for (int i = 0; i < 4; ++i) spec.strides[i] = dimension_stride_bytes(dims[i + 1], strides[i], shape.element_bytes);
  const int box[5] = {static_cast<int>(chunk_cols), 8, box_chunks, box_rows / 8, 1};
  for (int i = 0; i < 5; ++i) spec.box[i] = static_cast<uint32_t>(box[i]);
  return spec;
}

Status encode_tensor_map(const TensorMapSpec& spec, CUtensorMap* map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    return {StatusCode::impl_unavailable,
            "impl sm90_wgmma: the CUDA driver has no cuTensorMapEncodeTiled"};
  }
  cuuint64_t dims[5];
  cuuint64_t strides[4];
  cuuint32_t box[5];
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < 5; ++i) dims[i] = spec.dims[i], box[i] = spec.box[i];
  for (int i = 0; i < 4; ++i) strides[i] = spec.strides[i];
  const CUtensorMapDataType type = spec.element_bytes == 1      ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : spec.element_bytes == 4   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : spec.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult result = encode(
      map, type, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return {StatusCode::cuda_error,
            "impl sm90_wgmma: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(result)};
  }
  return {};
}

Status encode_tensor_map(const TensorMapShape& shape, int box_rows, int box_heads, CUtensorMap* map) {
  return encode_tensor_map(tensor_map_spec(shape, box_rows, box_heads), map);
}

Status encode_tensor_maps(const std::array<TensorMapShape, 4>& shapes, const int (&box_rows)[4],
                          const int (&box_heads)[4], CUtensorMap (&maps)[4]) {
  for (int i = 0; i < 4; ++i) {
    if (Status status = encode_tensor_map(shapes[i], box_rows[i], box_heads[i], &maps[i]); !status.ok()) {
      return status;
    }
  }
  return {};
}

}  // namespace ffpa::detail::sm90_wgmma
