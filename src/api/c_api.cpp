// The C ABI of <ffpa/ffpa.h>: converts the plain structs to the C++ ones and
// calls the C++ API. Integer enum values are passed through unchanged, so an
// out-of-range value reaches validation and is rejected there. No exception
// leaves these functions: std::bad_alloc becomes FFPA_OUT_OF_MEMORY, anything
// else thrown below FFPA_CUDA_ERROR with a message starting "internal error: ".
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"

namespace {

using ffpa::StatusCode;

#define FFPA_SAME_VALUE(c_value, cpp_value)                                       \
  static_assert(static_cast<int32_t>(c_value) == static_cast<int32_t>(cpp_value), \
                #c_value " differs from " #cpp_value)

FFPA_SAME_VALUE(FFPA_DTYPE_F16, ffpa::DType::f16);
FFPA_SAME_VALUE(FFPA_DTYPE_BF16, ffpa::DType::bf16);
FFPA_SAME_VALUE(FFPA_DTYPE_F32, ffpa::DType::f32);
FFPA_SAME_VALUE(FFPA_DTYPE_BOOL, ffpa::DType::boolean);
FFPA_SAME_VALUE(FFPA_DTYPE_F64, ffpa::DType::f64);
FFPA_SAME_VALUE(FFPA_DTYPE_U8, ffpa::DType::u8);
FFPA_SAME_VALUE(FFPA_DTYPE_E4M3, ffpa::DType::e4m3);
FFPA_SAME_VALUE(FFPA_DTYPE_I32, ffpa::DType::i32);
FFPA_SAME_VALUE(FFPA_CAUSAL_NONE, ffpa::Causal::none);
FFPA_SAME_VALUE(FFPA_CAUSAL_TOP_LEFT, ffpa::Causal::top_left);
FFPA_SAME_VALUE(FFPA_CAUSAL_BOTTOM_RIGHT, ffpa::Causal::bottom_right);
FFPA_SAME_VALUE(FFPA_ACCUM_F32, ffpa::Accumulation::f32);
FFPA_SAME_VALUE(FFPA_ACCUM_F16, ffpa::Accumulation::f16);
FFPA_SAME_VALUE(FFPA_IMPL_AUTO, ffpa::Impl::automatic);
FFPA_SAME_VALUE(FFPA_IMPL_CPU_REFERENCE, ffpa::Impl::cpu_reference);
FFPA_SAME_VALUE(FFPA_IMPL_SM80_SPLIT_D, ffpa::Impl::sm80_split_d);
FFPA_SAME_VALUE(FFPA_IMPL_SM90_WGMMA, ffpa::Impl::sm90_wgmma);
FFPA_SAME_VALUE(FFPA_PRECISION_INPUT, ffpa::Precision::input);
FFPA_SAME_VALUE(FFPA_PRECISION_FP8, ffpa::Precision::fp8);
FFPA_SAME_VALUE(FFPA_FP8_QK_INT8, ffpa::Fp8QkFormat::int8);
FFPA_SAME_VALUE(FFPA_FP8_QK_E4M3, ffpa::Fp8QkFormat::e4m3);
FFPA_SAME_VALUE(FFPA_FP8_QK_SCALES_PER_THREAD_GROUP, ffpa::Fp8QkScales::per_thread_group);
FFPA_SAME_VALUE(FFPA_FP8_QK_SCALES_PER_BLOCK, ffpa::Fp8QkScales::per_block);
FFPA_SAME_VALUE(FFPA_FP8_V_SCALES_PER_CHANNEL, ffpa::Fp8VScales::per_channel);
FFPA_SAME_VALUE(FFPA_FP8_V_SCALES_PER_BLOCK, ffpa::Fp8VScales::per_block);
FFPA_SAME_VALUE(FFPA_OK, StatusCode::ok);
FFPA_SAME_VALUE(FFPA_NULL_POINTER, StatusCode::null_pointer);
FFPA_SAME_VALUE(FFPA_INVALID_RANK, StatusCode::invalid_rank);
FFPA_SAME_VALUE(FFPA_UNSUPPORTED_DTYPE, StatusCode::unsupported_dtype);
FFPA_SAME_VALUE(FFPA_DTYPE_MISMATCH, StatusCode::dtype_mismatch);
FFPA_SAME_VALUE(FFPA_SHAPE_MISMATCH, StatusCode::shape_mismatch);
FFPA_SAME_VALUE(FFPA_VALUE_HEAD_DIM_MISMATCH, StatusCode::value_head_dim_mismatch);
FFPA_SAME_VALUE(FFPA_UNSUPPORTED_HEAD_DIM, StatusCode::unsupported_head_dim);
FFPA_SAME_VALUE(FFPA_INVALID_GQA_RATIO, StatusCode::invalid_gqa_ratio);
FFPA_SAME_VALUE(FFPA_NONCONTIGUOUS_LAST_DIM, StatusCode::noncontiguous_last_dim);
FFPA_SAME_VALUE(FFPA_MISALIGNED, StatusCode::misaligned);
FFPA_SAME_VALUE(FFPA_INVALID_STRIDE, StatusCode::invalid_stride);
FFPA_SAME_VALUE(FFPA_INVALID_MASK_LAYOUT, StatusCode::invalid_mask_layout);
FFPA_SAME_VALUE(FFPA_INVALID_DROPOUT, StatusCode::invalid_dropout);
FFPA_SAME_VALUE(FFPA_UNSUPPORTED_ACCUMULATION, StatusCode::unsupported_accumulation);
FFPA_SAME_VALUE(FFPA_IMPL_UNAVAILABLE, StatusCode::impl_unavailable);
FFPA_SAME_VALUE(FFPA_OUTPUT_OVERLAPS_INPUT, StatusCode::output_overlaps_input);
FFPA_SAME_VALUE(FFPA_INVALID_OPTION, StatusCode::invalid_option);
FFPA_SAME_VALUE(FFPA_WORKSPACE_TOO_SMALL, StatusCode::workspace_too_small);
FFPA_SAME_VALUE(FFPA_WRONG_MEMORY_SPACE, StatusCode::wrong_memory_space);
FFPA_SAME_VALUE(FFPA_CUDA_ERROR, StatusCode::cuda_error);
FFPA_SAME_VALUE(FFPA_OUT_OF_MEMORY, StatusCode::out_of_memory);
FFPA_SAME_VALUE(FFPA_INVALID_SEQUENCE_LENGTHS, StatusCode::invalid_sequence_lengths);
FFPA_SAME_VALUE(FFPA_INVALID_BLOCK_TABLE, StatusCode::invalid_block_table);
FFPA_SAME_VALUE(FFPA_INVALID_WINDOW, StatusCode::invalid_window);

#undef FFPA_SAME_VALUE

// Writes `prefix` then `text` into message, truncated and NUL-terminated.
// Allocates nothing, so it is safe while handling std::bad_alloc.
void write_message(char* message, size_t message_size, const char* prefix, const char* text) {
  if (!message || message_size == 0) return;
  size_t used = 0;
  for (const char* part : {prefix, text}) {
    const size_t length = std::strlen(part);
    const size_t room = message_size - 1 - used;
    const size_t copied = length < room ? length : room;
    std::memcpy(message + used, part, copied);
    used += copied;
  }
  message[used] = '\0';
}

ffpa_status to_c(const ffpa::Status& status, char* message, size_t message_size) {
  write_message(message, message_size, "", status.message.c_str());
  return static_cast<ffpa_status>(status.code);
}

ffpa::Tensor to_cpp(const ffpa_tensor& c) {
  ffpa::Tensor t;
  t.data = c.data;
  t.dtype = static_cast<ffpa::DType>(c.dtype);
  t.rank = c.rank;
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = c.shape[i];
    t.stride[i] = c.stride[i];
  }
  return t;
}

// Zero means each FP8 knob's default (ffpa::Fp8Options' initializers).
ffpa::Fp8Options to_cpp(const ffpa_fp8_options& fp8) {
  ffpa::Fp8Options o;
  o.qk_format = static_cast<ffpa::Fp8QkFormat>(fp8.qk_format);
  o.qk_scales = static_cast<ffpa::Fp8QkScales>(fp8.qk_scales);
  o.smooth_k = fp8.no_smooth_k == 0;
  if (fp8.has_early_rows) o.early_rows = fp8.early_rows;
  o.v_scales = static_cast<ffpa::Fp8VScales>(fp8.v_scales);
  o.smooth_v = fp8.smooth_v != 0;
  return o;
}

ffpa::Fp8KvCache to_cpp(const ffpa_fp8_kv_cache& c) {
  ffpa::Fp8KvCache cache;
  cache.k_codes = to_cpp(c.k_codes);
  cache.k_scales = to_cpp(c.k_scales);
  cache.k_mean = to_cpp(c.k_mean);
  cache.v_codes = to_cpp(c.v_codes);
  cache.v_scales = to_cpp(c.v_scales);
  cache.v_mean = to_cpp(c.v_mean);
  return cache;
}

ffpa_tensor to_c(const ffpa::Tensor& t) {
  ffpa_tensor c;
  std::memset(&c, 0, sizeof c);
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.rank = t.rank;
  for (int i = 0; i < 4; ++i) {
    c.shape[i] = t.shape[i];
    c.stride[i] = t.stride[i];
  }
  return c;
}

ffpa::Options to_cpp(const ffpa_options& opt) {
  ffpa::ForwardParams p;
  if (opt.has_scale) p.options.scale = opt.scale;
  p.options.causal = static_cast<ffpa::Causal>(opt.causal);
  p.options.dropout_p = opt.dropout_p;
  p.options.dropout_seed = opt.dropout_seed;
  p.options.dropout_offset = opt.dropout_offset;
  p.options.accumulation = static_cast<ffpa::Accumulation>(opt.accumulation);
  p.options.impl = static_cast<ffpa::Impl>(opt.impl);
  p.options.precision = static_cast<ffpa::Precision>(opt.precision);
  p.options.fp8 = to_cpp(opt.fp8);
  if (opt.has_window) {
    p.options.window_left = opt.window_left;
    p.options.window_right = opt.window_right;
  }
  p.options.softcap = opt.softcap;
  return p.options;
}

ffpa::SequenceBatch to_cpp(const ffpa_sequence_batch& c) {
  ffpa::SequenceBatch batch;
  batch.cu_seqlens_q = to_cpp(c.cu_seqlens_q);
  batch.cu_seqlens_k = to_cpp(c.cu_seqlens_k);
  batch.block_table = to_cpp(c.block_table);
  batch.seqused_k = to_cpp(c.seqused_k);
  batch.max_seqlen_q = c.max_seqlen_q;
  batch.max_seqlen_k = c.max_seqlen_k;
  return batch;
}

// What a forward call's C++ parameters point at: the C structs' C++ forms,
// alive while the parameters are used.
struct ForwardReferents {
  ffpa::Fp8KvCache cache;
  ffpa::SequenceBatch sequences;
};

ffpa::ForwardParams to_cpp(const ffpa_forward_params& c, ForwardReferents* referents) {
  ffpa::ForwardParams p;
  p.q = to_cpp(c.q);
  p.k = to_cpp(c.k);
  p.v = to_cpp(c.v);
  p.o = to_cpp(c.o);
  p.mask = to_cpp(c.mask);
  p.lse = to_cpp(c.lse);
  p.options = to_cpp(c.options);
  p.stream = static_cast<cudaStream_t>(c.stream);
  p.workspace = c.workspace;
  p.workspace_bytes = c.workspace_bytes;
  if (c.fp8_kv_cache != nullptr) {
    referents->cache = to_cpp(*c.fp8_kv_cache);
    p.fp8_kv_cache = &referents->cache;
  }
  p.sinks = to_cpp(c.sinks);
  p.k_descale = to_cpp(c.k_descale);
  p.v_descale = to_cpp(c.v_descale);
  if (c.sequences != nullptr) {
    referents->sequences = to_cpp(*c.sequences);
    p.sequences = &referents->sequences;
  }
  p.sequence_plan = c.sequence_plan;
  return p;
}

ffpa::Fp8QuantizeKvParams to_cpp(const ffpa_fp8_quantize_kv_params& c) {
  ffpa::Fp8QuantizeKvParams p;
  p.k = to_cpp(c.k);
  p.v = to_cpp(c.v);
  p.cache = to_cpp(c.cache);
  p.fp8 = to_cpp(c.fp8);
  p.stream = static_cast<cudaStream_t>(c.stream);
  p.workspace = c.workspace;
  p.workspace_bytes = c.workspace_bytes;
  return p;
}

ffpa::BackwardParams to_cpp(const ffpa_backward_params& c, ffpa::SequenceBatch* sequences) {
  ffpa::BackwardParams p;
  p.q = to_cpp(c.q);
  p.k = to_cpp(c.k);
  p.v = to_cpp(c.v);
  p.o = to_cpp(c.o);
  p.lse = to_cpp(c.lse);
  p.mask = to_cpp(c.mask);
  p.d_o = to_cpp(c.d_o);
  p.d_q = to_cpp(c.d_q);
  p.d_k = to_cpp(c.d_k);
  p.d_v = to_cpp(c.d_v);
  p.d_mask = to_cpp(c.d_mask);
  p.d_lse = to_cpp(c.d_lse);
  p.options = to_cpp(c.options);
  p.stream = static_cast<cudaStream_t>(c.stream);
  p.workspace = c.workspace;
  p.workspace_bytes = c.workspace_bytes;
  if (c.sequences != nullptr) {
    *sequences = to_cpp(*c.sequences);
    p.sequences = sequences;
  }
  p.sinks = to_cpp(c.sinks);
  p.d_sinks = to_cpp(c.d_sinks);
  return p;
}

// Copies values into a fixed-capacity C list; false when they do not fit.
template <size_t kCapacity>
bool to_c_list(const std::vector<int32_t>& values, int32_t (&list)[kCapacity], int32_t* count) {
  if (values.size() > kCapacity) return false;
  std::fill(std::begin(list), std::end(list), 0);
  std::copy(values.begin(), values.end(), list);
  *count = static_cast<int32_t>(values.size());
  return true;
}

// Runs `call` (returning ffpa_status), turning any exception into a status.
template <typename Call>
ffpa_status guarded(char* message, size_t message_size, Call&& call) {
  try {
    return call();
  } catch (const std::bad_alloc&) {
    write_message(message, message_size, "", "out of host memory");
    return FFPA_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    write_message(message, message_size, "internal error: ", e.what());
  } catch (...) {
    write_message(message, message_size, "internal error: ", "unknown exception");
  }
  return FFPA_CUDA_ERROR;
}

}  // namespace

extern "C" {

ffpa_status ffpa_forward(const ffpa_forward_params* params, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params) {
      write_message(message, message_size, "", "params is null");
      return FFPA_NULL_POINTER;
    }
    ForwardReferents referents;
    return to_c(ffpa::forward(to_cpp(*params, &referents)), message, message_size);
  });
}

ffpa_status ffpa_workspace_size(const ffpa_forward_params* params, size_t* bytes, char* message,
                                size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params || !bytes) {
      write_message(message, message_size, "", params ? "bytes is null" : "params is null");
      return FFPA_NULL_POINTER;
    }
    ForwardReferents referents;
    return to_c(ffpa::workspace_size(to_cpp(*params, &referents), bytes), message, message_size);
  });
}

ffpa_status ffpa_sequence_plan_size(const ffpa_forward_params* params, size_t* bytes, char* message,
                                    size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params || !bytes) {
      write_message(message, message_size, "", params ? "bytes is null" : "params is null");
      return FFPA_NULL_POINTER;
    }
    ForwardReferents referents;
    return to_c(ffpa::sequence_plan_size(to_cpp(*params, &referents), bytes), message, message_size);
  });
}

ffpa_status ffpa_plan_sequences(const ffpa_forward_params* params, void* plan, size_t plan_bytes, char* message,
                                size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params) {
      write_message(message, message_size, "", "params is null");
      return FFPA_NULL_POINTER;
    }
    ForwardReferents referents;
    return to_c(ffpa::plan_sequences(to_cpp(*params, &referents), plan, plan_bytes), message, message_size);
  });
}

ffpa_status ffpa_check_sequences(const ffpa_forward_params* params, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params) {
      write_message(message, message_size, "", "params is null");
      return FFPA_NULL_POINTER;
    }
    ForwardReferents referents;
    return to_c(ffpa::check_sequences(to_cpp(*params, &referents)), message, message_size);
  });
}

ffpa_status ffpa_backward(const ffpa_backward_params* params, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params) {
      write_message(message, message_size, "", "params is null");
      return FFPA_NULL_POINTER;
    }
    ffpa::SequenceBatch sequences;
    return to_c(ffpa::backward(to_cpp(*params, &sequences)), message, message_size);
  });
}

ffpa_status ffpa_backward_workspace_size(const ffpa_backward_params* params, size_t* bytes, char* message,
                                         size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params || !bytes) {
      write_message(message, message_size, "", params ? "bytes is null" : "params is null");
      return FFPA_NULL_POINTER;
    }
    ffpa::SequenceBatch sequences;
    return to_c(ffpa::backward_workspace_size(to_cpp(*params, &sequences), bytes), message, message_size);
  });
}

ffpa_status ffpa_fp8_kv_cache_layout(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t head_dim,
                                     const ffpa_fp8_options* fp8, ffpa_fp8_kv_cache* layout, char* message,
                                     size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!layout) {
      write_message(message, message_size, "", "layout is null");
      return FFPA_NULL_POINTER;
    }
    ffpa_fp8_options defaults;
    std::memset(&defaults, 0, sizeof defaults);
    ffpa::Fp8KvCache cpp;
    const ffpa::Status status = ffpa::fp8_kv_cache_layout(batch, heads_kv, seq_kv, head_dim, to_cpp(fp8 ? *fp8 : defaults), &cpp);
    if (status.ok()) {
      layout->k_codes = to_c(cpp.k_codes);
      layout->k_scales = to_c(cpp.k_scales);
      layout->k_mean = to_c(cpp.k_mean);
      layout->v_codes = to_c(cpp.v_codes);
      layout->v_scales = to_c(cpp.v_scales);
      layout->v_mean = to_c(cpp.v_mean);
    }
    return to_c(status, message, message_size);
  });
}

ffpa_status ffpa_fp8_quantize_kv(const ffpa_fp8_quantize_kv_params* params, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params) {
      write_message(message, message_size, "", "params is null");
      return FFPA_NULL_POINTER;
    }
    return to_c(ffpa::fp8_quantize_kv(to_cpp(*params)), message, message_size);
  });
}

ffpa_status ffpa_fp8_quantize_kv_workspace_size(const ffpa_fp8_quantize_kv_params* params, size_t* bytes,
                                                char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!params || !bytes) {
      write_message(message, message_size, "", params ? "bytes is null" : "params is null");
      return FFPA_NULL_POINTER;
    }
    return to_c(ffpa::fp8_quantize_kv_workspace_size(to_cpp(*params), bytes), message, message_size);
  });
}

ffpa_status ffpa_device_support(int32_t device, int32_t impl, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    return to_c(ffpa::device_support(device, static_cast<ffpa::Impl>(impl)), message, message_size);
  });
}

ffpa_status ffpa_backward_route(int32_t device, int32_t dtype, int64_t head_dim, int64_t value_dim,
                                int32_t requested_impl, int32_t* impl, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!impl) {
      write_message(message, message_size, "", "impl is null");
      return FFPA_NULL_POINTER;
    }
    ffpa::Impl chosen = ffpa::Impl::automatic;
    const ffpa_status status =
        to_c(ffpa::backward_route(device, static_cast<ffpa::DType>(dtype), head_dim, value_dim,
                                  static_cast<ffpa::Impl>(requested_impl), &chosen),
             message, message_size);
    if (status == FFPA_OK) *impl = static_cast<int32_t>(chosen);
    return status;
  });
}

const char* ffpa_status_name(ffpa_status status) {
  return ffpa::status_name(static_cast<StatusCode>(status));
}

const char* ffpa_version(void) { return ffpa::version(); }

ffpa_status ffpa_library_info_get(ffpa_library_info* info, char* message, size_t message_size) {
  return guarded(message, message_size, [&] {
    if (!info) {
      write_message(message, message_size, "", "info is null");
      return FFPA_NULL_POINTER;
    }
    if (info->struct_size < sizeof(ffpa_library_info)) {
      const std::string text = "info->struct_size = " + std::to_string(info->struct_size) +
                               " is smaller than sizeof(ffpa_library_info) = " +
                               std::to_string(sizeof(ffpa_library_info));
      write_message(message, message_size, "", text.c_str());
      return FFPA_INVALID_OPTION;
    }
    const ffpa::LibraryInfo cpp = ffpa::library_info();
    ffpa_library_info c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = info->struct_size;
    c.version = ffpa::version();  // static: the pointer outlives the call
    c.version_major = cpp.version_major;
    c.version_minor = cpp.version_minor;
    c.version_patch = cpp.version_patch;
    c.min_head_dim = cpp.min_head_dim;
    c.max_head_dim = cpp.max_head_dim;
    c.head_dim_multiple = cpp.head_dim_multiple;
    c.max_sequence_length = cpp.max_sequence_length;
    // CMake bounds the lists (FFPA_LIBRARY_INFO_MAX_*): a list that does not fit
    // is a build that got past those checks, reported rather than cut short.
    if (!to_c_list(cpp.cuda_architectures, c.cuda_architectures, &c.cuda_architecture_count) ||
        !to_c_list(cpp.split_d_head_dims, c.split_d_head_dims, &c.split_d_head_dim_count) ||
        !to_c_list(cpp.sm90_wgmma_head_dims, c.sm90_wgmma_head_dims,
                   &c.sm90_wgmma_head_dim_count) ||
        !to_c_list(cpp.sm90_fp8_head_dims, c.sm90_fp8_head_dims, &c.sm90_fp8_head_dim_count) ||
        !to_c_list(cpp.sm90_backward_head_dims, c.sm90_backward_head_dims,
                   &c.sm90_backward_head_dim_count)) {
      write_message(message, message_size, "internal error: ",
                    "a list of this build does not fit in ffpa_library_info");
      return FFPA_CUDA_ERROR;
    }
    // This version's fields only: bytes past them belong to a newer header's struct.
    std::memcpy(info, &c, sizeof c);
    return FFPA_OK;
  });
}

}  // extern "C"
