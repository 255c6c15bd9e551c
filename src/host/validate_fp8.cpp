// Validation of the FP8 knobs, of an FP8 KV cache (the library's own
// format) beside a forward call, and of fp8_quantize_kv calls.
#include "host/validate_fp8.hpp"

#include <string>

#include "host/fp8_kv_cache.hpp"
#include "host/validate_checks.hpp"
#include "host/validate.hpp"

namespace ffpa::detail {

int64_t early_rows(const Options& opt) {
  return opt.fp8.early_rows ? *opt.fp8.early_rows : opt.causal != Causal::none ? kDefaultCausalEarlyRows : 0;
}

namespace {

// A cache's tensors in a fixed order, with what each must be.
struct CacheField {
  const char* name;
  Tensor Fp8KvCache::*member;
  uintptr_t alignment;    // bytes
  const char* why_aligned;
};
constexpr CacheField kCacheFields[kCacheTensors] = {
    {"k_codes", &Fp8KvCache::k_codes, 16, "TMA reads the codes"},
    {"k_scales", &Fp8KvCache::k_scales, 4, "f32 scales"},
    {"k_mean", &Fp8KvCache::k_mean, 16, "the pre-pass reads a mean 4 floats at a time"},
    {"v_codes", &Fp8KvCache::v_codes, 16, "TMA reads the codes"},
    {"v_scales", &Fp8KvCache::v_scales, 8, "the epilogue reads per-channel V scales 2 at a time"},
    {"v_mean", &Fp8KvCache::v_mean, 16, "the pre-pass reads a mean 4 floats at a time"},
};

// Checks `cache` against the dense layout the kernels read (`expected`, from
// fp8_kv_cache_layout), in validate_forward's order (ranks, sizes, dtypes,
// shapes, pointers, strides, extents, alignment), and fills the byte ranges of
// its tensors. A mean whose knob is off may be absent (data null: not
// checked); every other tensor needs data unless it is empty.
Status check_kv_cache(const Fp8KvCache& cache, const Fp8KvCache& expected, const QuantizationOptions& o,
                      const char* prefix, ByteRange (&ranges)[kCacheTensors]) {
  std::string names[kCacheTensors];
  bool present[kCacheTensors];
  for (int i = 0; i < kCacheTensors; ++i) {
    names[i] = std::string(prefix) + kCacheFields[i].name;
    const bool optional = (i == 2 && !o.smooth_k) || (i == 5 && !o.smooth_v);
    present[i] = !(optional && (cache.*kCacheFields[i].member).data == nullptr);
    ranges[i] = {};
  }
  auto given = [&](int i) { return Arg{cache.*kCacheFields[i].member, names[i].c_str()}; };
  auto want = [&](int i) -> const Tensor& { return expected.*kCacheFields[i].member; };
  for (int i = 0; i < kCacheTensors; ++i)
    if (present[i]) FFPA_RETURN_IF_ERROR(check_rank(given(i), want(i).rank, "the FP8 KV cache's layout"));
  for (int i = 0; i < kCacheTensors; ++i)
    if (present[i]) FFPA_RETURN_IF_ERROR(check_sizes(given(i)));
  for (int i = 0; i < kCacheTensors; ++i) {
    const Arg a = given(i);
    if (present[i] && a.t.dtype != want(i).dtype)
      return fail(StatusCode::unsupported_dtype, a.name, ".dtype = ", dtype_name(a.t.dtype), "; the cache's ",
                  kCacheFields[i].name, " are ", dtype_name(want(i).dtype));
  }
  for (int i = 0; i < kCacheTensors; ++i) {
    const Arg a = given(i);
    if (!present[i]) continue;
    for (int32_t d = 0; d < a.t.rank; ++d)
      if (a.t.shape[d] != want(i).shape[d])
        return fail(StatusCode::shape_mismatch, a.name, ".shape = ", list_text(a.t.shape, a.t.rank),
                    " differs from ", list_text(want(i).shape, want(i).rank),
                    ", the FP8 KV cache's layout for k's shape and these FP8 options (ffpa::fp8_kv_cache_layout)");
  }
  for (int i = 0; i < kCacheTensors; ++i) {
    const Arg a = given(i);
    if (present[i] && !a.t.data && !is_empty(a.t))
      return fail(StatusCode::null_pointer, a.name, ".data is null (", a.name, ".shape = ", list_text(a.t.shape, a.t.rank),
                  ")", i == 2 ? "; smooth_k needs K's mean" : i == 5 ? "; smooth_v needs V's mean" : "");
  }
  for (int i = 0; i < kCacheTensors; ++i) {
    const Arg a = given(i);
    if (!present[i]) continue;
    for (int32_t d = 0; d < a.t.rank; ++d)
      if (a.t.shape[d] > 1 && a.t.stride[d] != want(i).stride[d])
        return fail(StatusCode::invalid_stride, a.name, ".stride = ", list_text(a.t.stride, a.t.rank),
                    " is not the dense layout ", list_text(want(i).stride, want(i).rank),
                    " the FP8 kernels read (shape ", list_text(a.t.shape, a.t.rank), ")");
  }
  for (int i = 0; i < kCacheTensors; ++i)
    if (present[i]) FFPA_RETURN_IF_ERROR(byte_range(given(i), &ranges[i]));
  for (int i = 0; i < kCacheTensors; ++i) {
    const Arg a = given(i);
    if (present[i] && !is_empty(a.t) && !aligned(a.t.data, kCacheFields[i].alignment))
      return fail(StatusCode::misaligned, a.name, ".data = ", a.t.data, " is not ", kCacheFields[i].alignment,
                  "-byte aligned (", kCacheFields[i].why_aligned, ")");
  }
  return {};
}

// ForwardParams::fp8_kv_cache: precision fp8, k and v where hybrid rows read
// them, the cache in the layout of k's shape and the call's FP8 knobs.
}  // namespace

const char* kv_cache_tensor_name(int i) { return kCacheFields[i].name; }

Status check_forward_kv_cache(const ForwardParams& p, ByteRange (&ranges)[kCacheTensors]) {
  if (p.options.precision != Precision::fp8)
    return fail(StatusCode::invalid_option, "fp8_kv_cache is given but options.precision = ",
                static_cast<int32_t>(p.options.precision), " (input); an FP8 KV cache is read with precision fp8 only");
  const int64_t early = early_rows(p.options);
  for (Arg a : {Arg{p.k, "k"}, Arg{p.v, "v"}})
    if (early > 0 && !a.t.data && !is_empty(a.t))
      return fail(StatusCode::null_pointer, a.name, ".data is null; beside an FP8 KV cache k and v may be null only "
                  "without hybrid rows, and options.fp8.early_rows ", p.options.fp8.early_rows ? "is " : "defaults to ",
                  early, p.options.fp8.early_rows ? "" : " (with a causal mask)",
                  ": those query rows run the 16-bit kernel on k and v (set early_rows = 0, or give k and v)");
  const QuantizationOptions o = quantization_options(p.options.fp8, early);
  Fp8KvCache expected;
  if (!fp8_kv_cache_layout(p.k.shape[0], p.k.shape[1], p.k.shape[2], p.k.shape[3], p.v.shape[3], o, &expected))
    return fail(StatusCode::invalid_option, "fp8_kv_cache: the cache of k.shape = ", list_text(p.k.shape, 4),
                " would have 2^63 elements or more");
  return check_kv_cache(*p.fp8_kv_cache, expected, o, "fp8_kv_cache.", ranges);
}

Status validate_fp8_knobs(const Fp8Options& fp8, const char* name) {
  const auto qk_format = static_cast<int32_t>(fp8.qk_format), qk_scales = static_cast<int32_t>(fp8.qk_scales);
  if (qk_format < 0 || qk_format > static_cast<int32_t>(Fp8QkFormat::e4m3))
    return fail(StatusCode::invalid_option, name, ".qk_format = ", qk_format,
                " is not an Fp8QkFormat value (0 int8, 1 e4m3)");
  if (qk_scales < 0 || qk_scales > static_cast<int32_t>(Fp8QkScales::per_block))
    return fail(StatusCode::invalid_option, name, ".qk_scales = ", qk_scales,
                " is not an Fp8QkScales value (0 per_thread_group, 1 per_block)");
  const auto v_scales = static_cast<int32_t>(fp8.v_scales);
  if (v_scales < 0 || v_scales > static_cast<int32_t>(Fp8VScales::per_block))
    return fail(StatusCode::invalid_option, name, ".v_scales = ", v_scales,
                " is not an Fp8VScales value (0 per_channel, 1 per_block)");
  return {};
}

QuantizationOptions quantization_options(const Fp8Options& fp8, int64_t n_early) {
  QuantizationOptions q;
  q.qk_format = fp8.qk_format == Fp8QkFormat::int8 ? QkFormat::int8 : QkFormat::e4m3;
  q.qk_granularity =
      fp8.qk_scales == Fp8QkScales::per_block ? QkScaleGranularity::per_block : QkScaleGranularity::per_thread_group;
  q.smooth_k = fp8.smooth_k;
  q.v_granularity = fp8.v_scales == Fp8VScales::per_block ? VScaleGranularity::per_block : VScaleGranularity::per_channel;
  q.smooth_v = fp8.smooth_v;
  q.n_early = n_early;
  return q;
}

Status validate_fp8_quantize_kv(const Fp8QuantizeKvParams& p, AttentionProblem* problem) {
  const Arg k{p.k, "k"}, v{p.v, "v"};
  FFPA_RETURN_IF_ERROR(check_rank(k, 4, "[B, Hkv, Nkv, D]"));
  FFPA_RETURN_IF_ERROR(check_rank(v, 4, "[B, Hkv, Nkv, D]"));
  FFPA_RETURN_IF_ERROR(check_sizes(k));
  FFPA_RETURN_IF_ERROR(check_sizes(v));
  if (p.k.dtype != DType::f16 && p.k.dtype != DType::bf16)
    return fail(StatusCode::unsupported_dtype, "k.dtype = ", dtype_name(p.k.dtype),
                "; fp8_quantize_kv quantizes f16 or bf16 k and v, as the FP8 forward does");
  if (p.v.dtype != p.k.dtype)
    return fail(StatusCode::dtype_mismatch, "v.dtype = ", dtype_name(p.v.dtype), " differs from k.dtype = ",
                dtype_name(p.k.dtype));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 0, k, 0, "B"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 1, k, 1, "Hkv"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 2, k, 2, "Nkv"));
  const int64_t d = p.k.shape[3];
  if (d < kMinHeadDim || d > kMaxHeadDim || d % kHeadDimMultiple != 0)
    return fail(StatusCode::unsupported_head_dim, "k.shape[3] (D) = ", d, " is not supported; D must be a multiple of ",
                kHeadDimMultiple, " in [", kMinHeadDim, ", ", kMaxHeadDim, "]");
  if (p.v.shape[3] != d)
    return fail(StatusCode::impl_unavailable, "v.shape[3] (Dv) = ", p.v.shape[3], " differs from k.shape[3] (D) = ", d,
                "; the FP8 format is built for Dv == D (D_qk != D_v is issue 14)");
  for (Arg a : {k, v})
    if (!a.t.data && !is_empty(a.t))
      return fail(StatusCode::null_pointer, a.name, ".data is null (", a.name, ".shape = ", list_text(a.t.shape, 4), ")");
  for (Arg a : {k, v}) {
    if (a.t.stride[3] != 1)
      return fail(StatusCode::noncontiguous_last_dim, a.name, ".stride[3] = ", a.t.stride[3],
                  "; the last dimension must be contiguous (stride 1)");
    for (int32_t i = 0; i < 3; ++i)
      if (a.t.stride[i] < 0)
        return fail(StatusCode::invalid_stride, a.name, ".stride[", i, "] = ", a.t.stride[i], " is negative");
  }
  FFPA_RETURN_IF_ERROR(validate_fp8_knobs(p.fp8, "fp8"));
  const QuantizationOptions o = quantization_options(p.fp8, 0);
  ByteRange cache_ranges[kCacheTensors];
  Fp8KvCache expected;
  if (!fp8_kv_cache_layout(p.k.shape[0], p.k.shape[1], p.k.shape[2], d, d, o, &expected))
    return fail(StatusCode::invalid_option, "cache: the FP8 KV cache of k.shape = ", list_text(p.k.shape, 4),
                " would have 2^63 elements or more");
  FFPA_RETURN_IF_ERROR(check_kv_cache(p.cache, expected, o, "cache.", cache_ranges));
  ByteRange range_k, range_v;
  FFPA_RETURN_IF_ERROR(byte_range(k, &range_k));
  FFPA_RETURN_IF_ERROR(byte_range(v, &range_v));
  for (Arg a : {k, v})
    if (!is_empty(a.t)) FFPA_RETURN_IF_ERROR(check_vector_alignment(a));
  if (p.workspace_bytes > 0 && !p.workspace)
    return fail(StatusCode::null_pointer, "workspace is null but workspace_bytes = ", p.workspace_bytes);
  // The cache is the output: it overlaps neither k, v nor itself.
  for (int i = 0; i < kCacheTensors; ++i) {
    const std::string name = std::string("cache.") + kCacheFields[i].name;
    FFPA_RETURN_IF_ERROR(check_overlap(name.c_str(), cache_ranges[i], "k", range_k));
    FFPA_RETURN_IF_ERROR(check_overlap(name.c_str(), cache_ranges[i], "v", range_v));
    for (int j = i + 1; j < kCacheTensors; ++j) {
      const std::string other = std::string("cache.") + kCacheFields[j].name;
      FFPA_RETURN_IF_ERROR(check_overlap(name.c_str(), cache_ranges[i], other.c_str(), cache_ranges[j]));
    }
  }

  AttentionProblem q;  // K and V, no queries
  q.batch = p.k.shape[0];
  q.heads_q = q.heads_kv = p.k.shape[1];
  q.seq_kv = p.k.shape[2];
  q.head_dim = q.value_dim = d;
  q.dtype = p.k.dtype;
  q.k = p.k.data;
  q.v = p.v.data;
  copy_strides(p.k, q.k_stride);
  copy_strides(p.v, q.v_stride);
  q.fp8 = true;
  q.quantization = o;
  *problem = q;
  return {};
}

}  // namespace ffpa::detail
