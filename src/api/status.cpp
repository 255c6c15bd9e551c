// Small API utilities: status names, contiguous tensor descriptions, version.
#include <algorithm>
#include <initializer_list>

#include "ffpa/ffpa.hpp"


namespace ffpa {

const char* status_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::null_pointer: return "null_pointer";
    case StatusCode::invalid_rank: return "invalid_rank";
    case StatusCode::unsupported_dtype: return "unsupported_dtype";
    case StatusCode::dtype_mismatch: return "dtype_mismatch";
    case StatusCode::shape_mismatch: return "shape_mismatch";
    case StatusCode::value_head_dim_mismatch: return "value_head_dim_mismatch";
    case StatusCode::unsupported_head_dim: return "unsupported_head_dim";
    case StatusCode::invalid_gqa_ratio: return "invalid_gqa_ratio";
    case StatusCode::noncontiguous_last_dim: return "noncontiguous_last_dim";
    case StatusCode::misaligned: return "misaligned";
    case StatusCode::invalid_stride: return "invalid_stride";
    case StatusCode::invalid_mask_layout: return "invalid_mask_layout";
    case StatusCode::invalid_dropout: return "invalid_dropout";
    case StatusCode::unsupported_accumulation: return "unsupported_accumulation";
    case StatusCode::impl_unavailable: return "impl_unavailable";
    case StatusCode::output_overlaps_input: return "output_overlaps_input";
    case StatusCode::invalid_option: return "invalid_option";
    case StatusCode::workspace_too_small: return "workspace_too_small";
    case StatusCode::wrong_memory_space: return "wrong_memory_space";
    case StatusCode::cuda_error: return "cuda_error";
    case StatusCode::out_of_memory: return "out_of_memory";
    case StatusCode::invalid_sequence_lengths: return "invalid_sequence_lengths";
    case StatusCode::invalid_block_table: return "invalid_block_table";
    case StatusCode::invalid_window: return "invalid_window";
  }
  return "unknown_status";
}

Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  // A rank above 4 is kept so that validation reports it; only 4 sizes fit.
  t.rank = static_cast<int32_t>(shape.size());
  const int32_t stored = std::min(t.rank, 4);
  std::copy_n(shape.begin(), stored, t.shape);
  // Row-major; a size-0 dim counts as 1 so that the other strides stay meaningful.
  int64_t stride = 1;
  for (int32_t i = stored - 1; i >= 0; --i) {
    t.stride[i] = stride;
    stride *= std::max<int64_t>(t.shape[i], 1);
  }
  return t;
}

const char* version() { return FFPA_VERSION_STRING; }

}  // namespace ffpa
