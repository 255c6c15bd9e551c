#include "kernels/sm90_wgmma/tensor_map.hpp"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime_api.h>

#include <string>

namespace ffpa::detail::sm90_wgmma {
namespace {

// The stride TMA is given for a dimension: its own when it has more than one
// index (then it is used), else any valid value (it is multiplied by zero).
uint64_t dimension_stride_bytes(int64_t extent, int64_t stride_elements, int element_bytes) {
  return extent > 1 ? static_cast<uint64_t>(stride_elements * element_bytes) : 16u;
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

Status encode_tensor_map(const TensorMapShape& shape, int box_rows, int box_heads, CUtensorMap* map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    return {StatusCode::impl_unavailable,
            "impl sm90_wgmma: the CUDA driver has no cuTensorMapEncodeTiled"};
  }
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(shape.head_dim), static_cast<cuuint64_t>(shape.seq),
                              static_cast<cuuint64_t>(shape.heads), static_cast<cuuint64_t>(shape.batch)};
  const int bytes = shape.element_bytes;
  const cuuint64_t strides[3] = {dimension_stride_bytes(shape.seq, shape.stride[2], bytes),
                                 dimension_stride_bytes(shape.heads, shape.stride[1], bytes),
                                 dimension_stride_bytes(shape.batch, shape.stride[0], bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(128 / bytes), static_cast<cuuint32_t>(box_rows),
                             static_cast<cuuint32_t>(box_heads), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type = bytes == 1                 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : shape.dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const CUresult result = encode(
      map, type,
      4, const_cast<void*>(shape.base), dims, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return {StatusCode::cuda_error,
            "impl sm90_wgmma: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(result)};
  }
  return {};
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
