// Validation of a forward call. The checks run in a fixed order (ranks, sizes,
// dtypes, shapes, pointers, strides, mask layout, extents, self-aliasing,
// alignment, options, workspace, overlap) so that a call with several faults
// always reports the same one. Nothing here dereferences a tensor pointer.
#include "host/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "host/fp8_kv_cache.hpp"
#include "host/self_aliasing.hpp"

namespace ffpa::detail {
namespace {

// Returns the Status of a failing check from the enclosing function.
#define FFPA_RETURN_IF_ERROR(expr)     \
  do {                                 \
    Status status_ = (expr);           \
    if (!status_.ok()) return status_; \
  } while (0)

template <typename... Parts>
Status fail(StatusCode code, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  return Status{code, message.str()};
}

// A tensor argument and the name its messages use.
struct Arg {
  const Tensor& t;
  const char* name;
};

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::boolean: return "boolean";
    case DType::f64: return "f64";
    case DType::u8: return "u8";
  }
  return "unknown (" + std::to_string(static_cast<int32_t>(dtype)) + ")";
}

int64_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32: return 4;
    case DType::boolean:
    case DType::u8: return 1;
    case DType::f64: return 8;
  }
  return 1;  // unreachable after the dtype checks
}

std::string list_text(const int64_t* values, int32_t count) {
  std::string text = "[";
  for (int32_t i = 0; i < count; ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// Number of elements; false when it does not fit in int64.
bool element_count(const Tensor& t, int64_t* count) {
  int64_t n = 1;
  for (int32_t i = 0; i < t.rank; ++i)
    if (__builtin_mul_overflow(n, t.shape[i], &n)) return false;
  *count = n;
  return true;
}

bool is_empty(const Tensor& t) {
  for (int32_t i = 0; i < t.rank; ++i)
    if (t.shape[i] == 0) return true;
  return false;
}

// --- ranks, sizes, dtypes, shapes ---------------------------------------------

Status check_rank(Arg a, int32_t expected, const char* logical_shape) {
  if (a.t.rank != expected)
    return fail(StatusCode::invalid_rank, a.name, ".rank = ", a.t.rank, ", expected ", expected,
                " (", a.name, " is ", logical_shape, ")");
  return {};
}

Status check_sizes(Arg a) {
  for (int32_t i = 0; i < a.t.rank; ++i)
    if (a.t.shape[i] < 0)
      return fail(StatusCode::invalid_option, a.name, ".shape[", i, "] = ", a.t.shape[i],
                  " is negative");
  int64_t count = 0;
  if (!element_count(a.t, &count))
    return fail(StatusCode::invalid_option, a.name, ".shape = ", list_text(a.t.shape, a.t.rank),
                " has more than 2^63 elements");
  return {};
}

Status check_dtypes(const ForwardParams& p) {
  const DType dtype = p.q.dtype;
  if (dtype != DType::f16 && dtype != DType::bf16 && dtype != DType::f32 && dtype != DType::f64)
    return fail(StatusCode::unsupported_dtype, "q.dtype = ", dtype_name(dtype),
                "; q, k, v and o must be f16 or bf16 (f32 and f64: the CPU reference only)");
  for (Arg a : {Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}})
    if (a.t.dtype == DType::u8)
      return fail(StatusCode::unsupported_dtype, a.name,
                  ".dtype = u8; 8-bit codes belong in an FP8 KV cache (ForwardParams::fp8_kv_cache), q, k, v and o "
                  "are f16 or bf16");
  for (Arg a : {Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}})
    if (a.t.dtype != dtype)
      return fail(StatusCode::dtype_mismatch, a.name, ".dtype = ", dtype_name(a.t.dtype),
                  " differs from q.dtype = ", dtype_name(dtype));
  if (p.mask.data) {
    const DType m = p.mask.dtype;
    if (m != DType::boolean && m != DType::f16 && m != DType::bf16 && m != DType::f32 && m != DType::f64)
      return fail(StatusCode::unsupported_dtype, "mask.dtype = ", dtype_name(m),
                  "; a mask must be boolean, f16, bf16 or f32 (f64: the CPU reference only)");
  }
  if (p.lse.data && p.lse.dtype != DType::f32)
    return fail(StatusCode::unsupported_dtype, "lse.dtype = ", dtype_name(p.lse.dtype),
                "; lse must be f32");
  return {};
}

// a.shape[ai] must equal ref.shape[ri]; `what` names the logical size.
Status check_same_size(Arg a, int32_t ai, Arg ref, int32_t ri, const char* what) {
  if (a.t.shape[ai] != ref.t.shape[ri])
    return fail(StatusCode::shape_mismatch, a.name, ".shape[", ai, "] (", what,
                ") = ", a.t.shape[ai], " differs from ", ref.name, ".shape[", ri,
                "] = ", ref.t.shape[ri]);
  return {};
}

Status check_shapes(const ForwardParams& p) {
  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"};
  for (Arg a : {k, v, o}) FFPA_RETURN_IF_ERROR(check_same_size(a, 0, q, 0, "B"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 1, q, 1, "Hq"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 1, k, 1, "Hkv"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 2, q, 2, "Nq"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 2, k, 2, "Nkv"));
  FFPA_RETURN_IF_ERROR(check_same_size(k, 3, q, 3, "D"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 3, v, 3, "Dv"));
  if (p.lse.data) {
    const Arg lse{p.lse, "lse"};
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 0, q, 0, "B"));
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 1, q, 1, "Hq"));
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 2, q, 2, "Nq"));
  }

  const int64_t heads_q = p.q.shape[1], heads_kv = p.k.shape[1];
  // Hkv = 0 is rejected even when Hq = 0: the ratio Hq / Hkv must exist.
  if (heads_kv == 0)
    return fail(StatusCode::invalid_gqa_ratio, "k.shape[1] (Hkv) = 0; Hkv must be at least 1");
  if (heads_q % heads_kv != 0)
    return fail(StatusCode::invalid_gqa_ratio, "q.shape[1] (Hq) = ", heads_q,
                " is not a multiple of k.shape[1] (Hkv) = ", heads_kv);

  // D (of q and k) and Dv (of v and o) each a multiple of kHeadDimMultiple in
  // range; they may differ (D_qk != D_v, e.g. absorbed MLA's 576 / 512).
  const int64_t d = p.q.shape[3], dv = p.v.shape[3];
  if (d < kMinHeadDim || d > kMaxHeadDim || d % kHeadDimMultiple != 0)
    return fail(StatusCode::unsupported_head_dim, "q.shape[3] (D) = ", d,
                " is not supported; D must be a multiple of ", kHeadDimMultiple, " in [",
                kMinHeadDim, ", ", kMaxHeadDim, "]");
  if (dv < kMinHeadDim || dv > kMaxHeadDim || dv % kHeadDimMultiple != 0)
    return fail(StatusCode::unsupported_head_dim, "v.shape[3] (Dv) = ", dv,
                " is not supported; Dv must be a multiple of ", kHeadDimMultiple, " in [",
                kMinHeadDim, ", ", kMaxHeadDim, "]");
  return {};
}

// With an FP8 KV cache, k's and v's data may be null (the cache holds them):
// whether they are needed is decided with the cache (check_forward_kv_cache);
// their strides are then not read either.
bool held_by_cache(const ForwardParams& p, const Tensor& t) {
  return p.fp8_kv_cache != nullptr && (&t == &p.k || &t == &p.v) && !t.data;
}

Status check_null_pointers(const ForwardParams& p) {
  for (Arg a : {Arg{p.q, "q"}, Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}})
    if (!a.t.data && !is_empty(a.t) && !held_by_cache(p, a.t))
      return fail(StatusCode::null_pointer, a.name, ".data is null (", a.name,
                  ".shape = ", list_text(a.t.shape, 4), ")");
  return {};
}

// --- strides, mask layout ---------------------------------------------------------

Status check_strides(const ForwardParams& p) {
  for (Arg a : {Arg{p.q, "q"}, Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}}) {
    if (held_by_cache(p, a.t)) continue;
    if (a.t.stride[3] != 1)
      return fail(StatusCode::noncontiguous_last_dim, a.name, ".stride[3] = ", a.t.stride[3],
                  "; the last dimension must be contiguous (stride 1)");
    for (int32_t i = 0; i < 3; ++i)
      if (a.t.stride[i] < 0)
        return fail(StatusCode::invalid_stride, a.name, ".stride[", i, "] = ", a.t.stride[i],
                    " is negative");
  }
  if (p.lse.data)
    for (int32_t i = 0; i < 3; ++i)
      if (p.lse.stride[i] < 0)
        return fail(StatusCode::invalid_stride, "lse.stride[", i, "] = ", p.lse.stride[i],
                    " is negative");
  return {};
}

Status check_mask_layout(const ForwardParams& p) {
  if (!p.mask.data) return {};
  const int64_t full[4] = {p.q.shape[0], p.q.shape[1], p.q.shape[2], p.k.shape[2]};
  const char* full_name[4] = {"B", "Hq", "Nq", "Nkv"};
  for (int32_t i = 0; i < 4; ++i) {
    if (p.mask.shape[i] != 1 && p.mask.shape[i] != full[i])
      return fail(StatusCode::invalid_mask_layout, "mask.shape[", i, "] = ", p.mask.shape[i],
                  " is neither 1 nor ", full_name[i], " = ", full[i],
                  "; the mask must broadcast to [B, Hq, Nq, Nkv] = ", list_text(full, 4));
    if (p.mask.stride[i] < 0)
      return fail(StatusCode::invalid_mask_layout, "mask.stride[", i, "] = ", p.mask.stride[i],
                  " is negative");
  }
  return {};
}

// --- extents ---------------------------------------------------------------------

// The bytes a tensor's elements occupy, first to last inclusive, as addresses.
struct ByteRange {
  bool empty = true;
  uintptr_t first = 0, last = 0;
};

// Needs non-negative strides. Fails when the extent does not fit the address space.
Status byte_range(Arg a, ByteRange* range) {
  *range = {};
  if (!a.t.data || is_empty(a.t)) return {};
  int64_t last_element = 0;
  for (int32_t i = 0; i < a.t.rank; ++i) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(a.t.stride[i], a.t.shape[i] - 1, &reach) ||
        __builtin_add_overflow(last_element, reach, &last_element))
      return fail(StatusCode::invalid_stride, a.name, ".stride = ", list_text(a.t.stride, a.t.rank),
                  " with shape ", list_text(a.t.shape, a.t.rank), " spans more than 2^63 elements");
  }
  const int64_t size = element_size(a.t.dtype);
  int64_t last_byte = 0;
  if (__builtin_mul_overflow(last_element, size, &last_byte) ||
      __builtin_add_overflow(last_byte, size - 1, &last_byte))
    return fail(StatusCode::invalid_stride, a.name, ".stride = ", list_text(a.t.stride, a.t.rank),
                " with shape ", list_text(a.t.shape, a.t.rank), " spans more than 2^63 bytes");
  const uintptr_t first = reinterpret_cast<uintptr_t>(a.t.data);
  if (static_cast<uint64_t>(last_byte) > UINTPTR_MAX - first)
    return fail(StatusCode::invalid_stride, a.name, " extends past the end of the address space (",
                a.name, ".data = ", a.t.data, ", last byte at offset ", last_byte, ")");
  *range = ByteRange{false, first, first + static_cast<uintptr_t>(last_byte)};
  return {};
}

// --- self-aliasing of outputs ------------------------------------------------------

Status check_self_aliasing(Arg a, int64_t width) {
  if (!a.t.data || is_empty(a.t)) return {};
  const Dim dims[3] = {
      {a.t.shape[0], a.t.stride[0]}, {a.t.shape[1], a.t.stride[1]}, {a.t.shape[2], a.t.stride[2]}};
  switch (find_self_aliasing(dims, width)) {
    case Aliasing::none: return {};
    case Aliasing::found:
      return fail(StatusCode::invalid_stride, a.name, ".stride = ", list_text(a.t.stride, a.t.rank),
                  " with shape ", list_text(a.t.shape, a.t.rank),
                  " maps different elements to the same memory; an output must not alias itself");
    case Aliasing::undecided: break;
  }
  return fail(StatusCode::invalid_stride, a.name, ".stride = ", list_text(a.t.stride, a.t.rank),
              " with shape ", list_text(a.t.shape, a.t.rank),
              " interleaves its rows too irregularly to prove, within 2^24 steps, that it does not"
              " alias itself (near-equal strides over thousands of rows each)");
}

// --- alignment -----------------------------------------------------------------------

bool aligned(const void* pointer, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0;
}

// The kernels move rows in 16-byte vectors: a row tensor's data and its
// strides over b, h and n must keep that alignment.
Status check_vector_alignment(Arg a) {
  if (!aligned(a.t.data, 16))
    return fail(StatusCode::misaligned, a.name, ".data = ", a.t.data, " is not 16-byte aligned");
  const int64_t vector_elements = 16 / element_size(a.t.dtype);
  for (int32_t i = 0; i < 3; ++i)
    if (a.t.shape[i] > 1 && a.t.stride[i] % vector_elements != 0)
      return fail(StatusCode::misaligned, a.name, ".stride[", i, "] = ", a.t.stride[i], " is not a multiple of ",
                  vector_elements, " elements (16 bytes)");
  return {};
}

Status check_alignment(const ForwardParams& p) {
  for (Arg a : {Arg{p.q, "q"}, Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}}) {
    if (is_empty(a.t) || held_by_cache(p, a.t)) continue;  // never accessed
    FFPA_RETURN_IF_ERROR(check_vector_alignment(a));
  }
  if (p.lse.data && !is_empty(p.lse) && !aligned(p.lse.data, 4))
    return fail(StatusCode::misaligned, "lse.data = ", p.lse.data, " is not 4-byte aligned");
  if (p.mask.data && !is_empty(p.mask)) {
    const int64_t size = element_size(p.mask.dtype);
    if (!aligned(p.mask.data, static_cast<uintptr_t>(size)))
      return fail(StatusCode::misaligned, "mask.data = ", p.mask.data, " is not ", size,
                  "-byte aligned (mask.dtype = ", dtype_name(p.mask.dtype), ")");
  }
  return {};
}

// --- options, workspace ---------------------------------------------------------------

Status check_options(const ForwardParams& p) {
  const Options& opt = p.options;
  const auto causal = static_cast<int32_t>(opt.causal);
  if (causal < 0 || causal > static_cast<int32_t>(Causal::bottom_right))
    return fail(StatusCode::invalid_option, "options.causal = ", causal,
                " is not a Causal value (0 none, 1 top_left, 2 bottom_right)");
  const auto accumulation = static_cast<int32_t>(opt.accumulation);
  if (accumulation < 0 || accumulation > static_cast<int32_t>(Accumulation::f16))
    return fail(StatusCode::invalid_option, "options.accumulation = ", accumulation,
                " is not an Accumulation value (0 f32, 1 f16)");
  const auto impl = static_cast<int32_t>(opt.impl);
  if (impl < 0 || impl > static_cast<int32_t>(Impl::sm90_wgmma))
    return fail(StatusCode::invalid_option, "options.impl = ", impl,
                " is not an Impl value (0 automatic, 1 cpu_reference, 2 sm80_split_d, 3 sm90_wgmma)");
  if (opt.scale && !std::isfinite(*opt.scale))
    return fail(StatusCode::invalid_option, "options.scale = ", *opt.scale, " is not finite");
  if (!std::isfinite(opt.dropout_p) || opt.dropout_p < 0.0f || opt.dropout_p >= 1.0f)
    return fail(StatusCode::invalid_dropout, "options.dropout_p = ", opt.dropout_p,
                " is outside [0, 1)");
  // The stream numbers a head's elements i * Nkv + j in 32 bits, as SDPA's
  // kernel does (common/philox.hpp); check_sizes has bounded both factors.
  if (opt.dropout_p > 0.0f && p.q.shape[2] * p.k.shape[2] > (int64_t{1} << 32))
    return fail(StatusCode::invalid_dropout, "dropout with Nq * Nkv = ", p.q.shape[2] * p.k.shape[2],
                " > 2^32: the dropout stream numbers a head's elements in 32 bits");
  if (opt.accumulation == Accumulation::f16 && p.q.dtype != DType::f16)
    return fail(StatusCode::unsupported_accumulation,
                "options.accumulation = f16 needs f16 inputs; q.dtype = ", dtype_name(p.q.dtype));
  const auto precision = static_cast<int32_t>(opt.precision);
  if (precision < 0 || precision > static_cast<int32_t>(Precision::fp8))
    return fail(StatusCode::invalid_option, "options.precision = ", precision,
                " is not a Precision value (0 input, 1 fp8)");
  if (opt.precision == Precision::fp8) {
    const Fp8Options& fp8 = opt.fp8;
    FFPA_RETURN_IF_ERROR(validate_fp8_knobs(fp8, "options.fp8"));
    if (fp8.smooth_v && opt.dropout_p > 0.0f)
      return fail(StatusCode::invalid_option,
                  "options.fp8.smooth_v with dropout: the kept weights do not sum to 1, so V's mean cannot be added back");
    if (fp8.early_rows && (*fp8.early_rows < 0 || *fp8.early_rows % kQuantQueryBlock != 0))
      return fail(StatusCode::invalid_option, "options.fp8.early_rows = ", *fp8.early_rows,
                  " is not a non-negative multiple of ", kQuantQueryBlock);
    if (opt.accumulation == Accumulation::f16)
      return fail(StatusCode::unsupported_accumulation,
                  "options.accumulation = f16 with precision fp8: the FP8 path accumulates in fp32");
  }
  return {};
}

Status check_workspace(const ForwardParams& p) {
  if (p.workspace_bytes > 0 && !p.workspace)
    return fail(StatusCode::null_pointer,
                "workspace is null but workspace_bytes = ", p.workspace_bytes);
  return {};
}

// --- overlap between outputs and inputs --------------------------------------------------

Status check_overlap(const char* output, const ByteRange& out, const char* input,
                     const ByteRange& in) {
  if (out.empty || in.empty || out.last < in.first || in.last < out.first) return {};
  return fail(StatusCode::output_overlaps_input, output, " (bytes ",
              reinterpret_cast<const void*>(out.first), " to ",
              reinterpret_cast<const void*>(out.last), ") overlaps ", input, " (bytes ",
              reinterpret_cast<const void*>(in.first), " to ",
              reinterpret_cast<const void*>(in.last), ")");
}

// --- an FP8 KV cache ------------------------------------------------------------------------

// Query rows [0, early_rows) computed in the inputs' precision (hybrid rows):
// the option, or its default (256 with a causal mask, else 0).
int64_t early_rows(const Options& opt) {
  return opt.fp8.early_rows ? *opt.fp8.early_rows : opt.causal != Causal::none ? kDefaultCausalEarlyRows : 0;
}

// A cache's tensors in a fixed order, with what each must be.
constexpr int kCacheTensors = 6;
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

// --- the normalized problem -------------------------------------------------------------

MaskKind mask_kind(const Tensor& mask) {
  if (!mask.data) return MaskKind::none;
  switch (mask.dtype) {
    case DType::boolean: return MaskKind::boolean;
    case DType::f16: return MaskKind::additive_f16;
    case DType::bf16: return MaskKind::additive_bf16;
    case DType::f32: return MaskKind::additive_f32;
    case DType::f64: return MaskKind::additive_f64;
    case DType::u8: break;
  }
  return MaskKind::none;  // unreachable after the dtype checks
}

void copy_strides(const Tensor& t, int64_t (&stride)[3]) {
  for (int32_t i = 0; i < 3; ++i) stride[i] = t.stride[i];
}

// The b, h, n strides of a contiguous [B, H, N, D] tensor of t's shape.
void dense_strides(const Tensor& t, int64_t (&stride)[3]) {
  stride[2] = t.shape[3];
  stride[1] = stride[2] * t.shape[2];
  stride[0] = stride[1] * t.shape[1];
}

AttentionProblem make_problem(const ForwardParams& p) {
  AttentionProblem problem;
  problem.batch = p.q.shape[0];
  problem.heads_q = p.q.shape[1];
  problem.heads_kv = p.k.shape[1];
  problem.seq_q = p.q.shape[2];
  problem.seq_kv = p.k.shape[2];
  problem.head_dim = p.q.shape[3];
  problem.value_dim = p.v.shape[3];
  problem.dtype = p.q.dtype;

  problem.q = p.q.data;
  problem.k = p.k.data;
  problem.v = p.v.data;
  problem.o = p.o.data;
  copy_strides(p.q, problem.q_stride);
  copy_strides(p.k, problem.k_stride);
  copy_strides(p.v, problem.v_stride);
  copy_strides(p.o, problem.o_stride);
  // k or v held by an FP8 KV cache: never read, strides unchecked; dense ones
  // keep every later check of them (TMA addressability, row alignment) quiet.
  if (held_by_cache(p, p.k)) dense_strides(p.k, problem.k_stride);
  if (held_by_cache(p, p.v)) dense_strides(p.v, problem.v_stride);

  problem.mask_kind = mask_kind(p.mask);
  if (problem.mask_kind != MaskKind::none) {
    problem.mask = p.mask.data;
    for (int32_t i = 0; i < 4; ++i)
      problem.mask_stride[i] = p.mask.shape[i] == 1 ? 0 : p.mask.stride[i];
    const int64_t* stride = problem.mask_stride;
    problem.mask_key_pairs = stride[3] == 1 && stride[0] % 2 == 0 && stride[1] % 2 == 0 && stride[2] % 2 == 0 &&
                             aligned(p.mask.data, static_cast<uintptr_t>(2 * element_size(p.mask.dtype)));
  }
  if (p.lse.data) {
    problem.lse = static_cast<float*>(p.lse.data);
    copy_strides(p.lse, problem.lse_stride);
  }

  const Options& opt = p.options;
  problem.scale = opt.scale
                      ? *opt.scale
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(problem.head_dim)));
  problem.causal = opt.causal;
  problem.dropout_p = opt.dropout_p;
  problem.dropout_threshold = dropout_threshold(opt.dropout_p);
  // SDPA scales kept values by 1 / (1 - p) in the inputs' dtype (common/philox.hpp).
  const float keep_scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(opt.dropout_p)));
  problem.dropout_scale = p.q.dtype == DType::bf16  ? bf16_bits_to_float(float_to_bf16_bits(keep_scale))
                          : p.q.dtype == DType::f16 ? half_bits_to_float(float_to_half_bits(keep_scale))
                                                    : keep_scale;
  problem.dropout_seed = opt.dropout_seed;
  problem.dropout_offset = opt.dropout_offset;
  problem.accumulation = opt.accumulation;
  problem.fp8 = opt.precision == Precision::fp8;
  if (problem.fp8) problem.quantization = quantization_options(opt.fp8, early_rows(opt));
  return problem;
}

}  // namespace

Status validate_forward(const ForwardParams& p, AttentionProblem* problem) {
  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"};
  const Arg mask{p.mask, "mask"}, lse{p.lse, "lse"};

  FFPA_RETURN_IF_ERROR(check_rank(q, 4, "[B, Hq, Nq, D]"));
  FFPA_RETURN_IF_ERROR(check_rank(k, 4, "[B, Hkv, Nkv, D]"));
  FFPA_RETURN_IF_ERROR(check_rank(v, 4, "[B, Hkv, Nkv, Dv]"));
  FFPA_RETURN_IF_ERROR(check_rank(o, 4, "[B, Hq, Nq, Dv]"));
  if (p.mask.data) FFPA_RETURN_IF_ERROR(check_rank(mask, 4, "broadcastable to [B, Hq, Nq, Nkv]"));
  if (p.lse.data) FFPA_RETURN_IF_ERROR(check_rank(lse, 3, "[B, Hq, Nq]"));

  for (Arg a : {q, k, v, o}) FFPA_RETURN_IF_ERROR(check_sizes(a));
  if (p.mask.data) FFPA_RETURN_IF_ERROR(check_sizes(mask));
  if (p.lse.data) FFPA_RETURN_IF_ERROR(check_sizes(lse));

  FFPA_RETURN_IF_ERROR(check_dtypes(p));
  FFPA_RETURN_IF_ERROR(check_shapes(p));
  FFPA_RETURN_IF_ERROR(check_null_pointers(p));
  FFPA_RETURN_IF_ERROR(check_strides(p));
  FFPA_RETURN_IF_ERROR(check_mask_layout(p));

  ByteRange range_q, range_k, range_v, range_o, range_mask, range_lse;
  FFPA_RETURN_IF_ERROR(byte_range(q, &range_q));
  FFPA_RETURN_IF_ERROR(byte_range(k, &range_k));
  FFPA_RETURN_IF_ERROR(byte_range(v, &range_v));
  FFPA_RETURN_IF_ERROR(byte_range(o, &range_o));
  FFPA_RETURN_IF_ERROR(byte_range(mask, &range_mask));
  FFPA_RETURN_IF_ERROR(byte_range(lse, &range_lse));

  FFPA_RETURN_IF_ERROR(check_self_aliasing(o, p.o.shape[3]));
  FFPA_RETURN_IF_ERROR(check_self_aliasing(lse, 1));
  FFPA_RETURN_IF_ERROR(check_alignment(p));
  FFPA_RETURN_IF_ERROR(check_options(p));
  ByteRange cache_ranges[kCacheTensors];
  if (p.fp8_kv_cache) FFPA_RETURN_IF_ERROR(check_forward_kv_cache(p, cache_ranges));
  FFPA_RETURN_IF_ERROR(check_workspace(p));

  for (auto [name, range] :
       {std::pair{"q", range_q}, std::pair{"k", range_k}, std::pair{"v", range_v},
        std::pair{"mask", range_mask}, std::pair{"lse", range_lse}})
    FFPA_RETURN_IF_ERROR(check_overlap("o", range_o, name, range));
  for (auto [name, range] : {std::pair{"q", range_q}, std::pair{"k", range_k},
                             std::pair{"v", range_v}, std::pair{"mask", range_mask}})
    FFPA_RETURN_IF_ERROR(check_overlap("lse", range_lse, name, range));
  if (p.fp8_kv_cache) {
    for (int i = 0; i < kCacheTensors; ++i) {
      const std::string name = std::string("fp8_kv_cache.") + kCacheFields[i].name;
      FFPA_RETURN_IF_ERROR(check_overlap("o", range_o, name.c_str(), cache_ranges[i]));
      FFPA_RETURN_IF_ERROR(check_overlap("lse", range_lse, name.c_str(), cache_ranges[i]));
    }
  }

  *problem = make_problem(p);
  return {};
}

namespace {

// grad must have ref's rank, sizes and dtype, a contiguous last dim,
// non-negative strides, 16-byte rows like the forward's tensors, and data.
Status check_like(Arg grad, Arg ref) {
  FFPA_RETURN_IF_ERROR(check_rank(grad, ref.t.rank, "the shape of the tensor it is the gradient of"));
  if (grad.t.dtype != ref.t.dtype)
    return fail(StatusCode::dtype_mismatch, grad.name, ".dtype = ", dtype_name(grad.t.dtype), " differs from ",
                ref.name, ".dtype = ", dtype_name(ref.t.dtype));
  for (int32_t i = 0; i < ref.t.rank; ++i)
    if (grad.t.shape[i] != ref.t.shape[i])
      return fail(StatusCode::shape_mismatch, grad.name, ".shape = ", list_text(grad.t.shape, grad.t.rank),
                  " differs from ", ref.name, ".shape = ", list_text(ref.t.shape, ref.t.rank));
  if (!grad.t.data && !is_empty(grad.t))
    return fail(StatusCode::null_pointer, grad.name, ".data is null (", grad.name, ".shape = ",
                list_text(grad.t.shape, grad.t.rank), ")");
  if (grad.t.stride[grad.t.rank - 1] != 1 && ref.t.rank == 4)
    return fail(StatusCode::noncontiguous_last_dim, grad.name, ".stride[3] = ", grad.t.stride[3],
                "; the last dimension must be contiguous (stride 1)");
  for (int32_t i = 0; i < grad.t.rank; ++i)
    if (grad.t.stride[i] < 0)
      return fail(StatusCode::invalid_stride, grad.name, ".stride[", i, "] = ", grad.t.stride[i], " is negative");
  if (ref.t.rank == 4 && !is_empty(grad.t)) FFPA_RETURN_IF_ERROR(check_vector_alignment(grad));
  return {};
}

}  // namespace

Status validate_backward(const BackwardParams& p, BackwardProblem* problem) {
  ForwardParams forward;
  forward.q = p.q;
  forward.k = p.k;
  forward.v = p.v;
  forward.o = p.o;
  forward.mask = p.mask;
  forward.lse = p.lse;
  forward.options = p.options;
  forward.stream = p.stream;
  forward.workspace = p.workspace;
  forward.workspace_bytes = p.workspace_bytes;
  if (!p.lse.data)
    return fail(StatusCode::null_pointer, "lse.data is null; the backward needs the forward's lse [B, Hq, Nq]");
  AttentionProblem forward_problem;
  FFPA_RETURN_IF_ERROR(validate_forward(forward, &forward_problem));
  if (p.options.precision != Precision::input)
    return fail(StatusCode::invalid_option, "options.precision = ", static_cast<int32_t>(p.options.precision),
                "; the backward runs in the inputs' precision only");
  if (p.options.accumulation != Accumulation::f32)
    return fail(StatusCode::unsupported_accumulation,
                "options.accumulation = f16; the backward accumulates in f32 (its default)");

  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"}, mask{p.mask, "mask"}, lse{p.lse, "lse"};
  const Arg d_o{p.d_o, "d_o"}, d_q{p.d_q, "d_q"}, d_k{p.d_k, "d_k"}, d_v{p.d_v, "d_v"}, d_mask{p.d_mask, "d_mask"};
  const Arg d_lse{p.d_lse, "d_lse"};
  FFPA_RETURN_IF_ERROR(check_like(d_o, o));
  if (p.d_lse.data) {
    FFPA_RETURN_IF_ERROR(check_like(d_lse, lse));
    if (!aligned(p.d_lse.data, 4))
      return fail(StatusCode::misaligned, "d_lse.data = ", p.d_lse.data, " is not 4-byte aligned");
  }
  FFPA_RETURN_IF_ERROR(check_like(d_q, q));
  FFPA_RETURN_IF_ERROR(check_like(d_k, k));
  FFPA_RETURN_IF_ERROR(check_like(d_v, v));
  if (p.d_mask.data) {
    if (!p.mask.data || p.mask.dtype == DType::boolean)
      return fail(StatusCode::invalid_mask_layout, "d_mask is given but the mask is ",
                  p.mask.data ? "boolean" : "absent", "; only an additive mask has a gradient");
    FFPA_RETURN_IF_ERROR(check_rank(d_mask, 4, "the mask's shape"));
    if (p.d_mask.dtype != p.mask.dtype)
      return fail(StatusCode::dtype_mismatch, "d_mask.dtype = ", dtype_name(p.d_mask.dtype),
                  " differs from mask.dtype = ", dtype_name(p.mask.dtype));
    if (p.d_mask.shape[3] > 1 && p.d_mask.stride[3] != 1)
      return fail(StatusCode::noncontiguous_last_dim, "d_mask.stride[3] = ", p.d_mask.stride[3],
                  "; the last dimension must be contiguous (stride 1)");
    for (int32_t i = 0; i < 4; ++i) {
      if (p.d_mask.shape[i] != p.mask.shape[i])
        return fail(StatusCode::shape_mismatch, "d_mask.shape = ", list_text(p.d_mask.shape, 4),
                    " differs from mask.shape = ", list_text(p.mask.shape, 4));
      if (p.d_mask.stride[i] < 0)
        return fail(StatusCode::invalid_stride, "d_mask.stride[", i, "] = ", p.d_mask.stride[i], " is negative");
    }
    if (!aligned(p.d_mask.data, static_cast<uintptr_t>(element_size(p.d_mask.dtype))))
      return fail(StatusCode::misaligned, "d_mask.data = ", p.d_mask.data, " is not aligned to its elements");
  }

  // Outputs: none aliases itself, and none overlaps another tensor of the call.
  for (Arg a : {d_q, d_k, d_v, d_mask}) FFPA_RETURN_IF_ERROR(check_self_aliasing(a, a.t.shape[3]));
  const Arg inputs[] = {q, k, v, o, mask, lse, d_o, d_lse};
  const Arg outputs[] = {d_q, d_k, d_v, d_mask};
  ByteRange in_ranges[8], out_ranges[4];
  for (int i = 0; i < 8; ++i) FFPA_RETURN_IF_ERROR(byte_range(inputs[i], &in_ranges[i]));
  for (int i = 0; i < 4; ++i) FFPA_RETURN_IF_ERROR(byte_range(outputs[i], &out_ranges[i]));
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 8; ++j) FFPA_RETURN_IF_ERROR(check_overlap(outputs[i].name, out_ranges[i], inputs[j].name, in_ranges[j]));
    for (int j = i + 1; j < 4; ++j)
      FFPA_RETURN_IF_ERROR(check_overlap(outputs[i].name, out_ranges[i], outputs[j].name, out_ranges[j]));
  }

  BackwardProblem b;
  b.forward = forward_problem;
  b.d_o = p.d_o.data;
  b.d_q = p.d_q.data;
  b.d_k = p.d_k.data;
  b.d_v = p.d_v.data;
  copy_strides(p.d_o, b.d_o_stride);
  copy_strides(p.d_q, b.d_q_stride);
  copy_strides(p.d_k, b.d_k_stride);
  copy_strides(p.d_v, b.d_v_stride);
  if (p.d_mask.data) {
    b.d_mask = p.d_mask.data;
    for (int32_t i = 0; i < 4; ++i) {
      b.d_mask_shape[i] = p.d_mask.shape[i];
      b.d_mask_stride[i] = p.d_mask.shape[i] == 1 ? 0 : p.d_mask.stride[i];
    }
  }
  if (p.d_lse.data) {
    b.d_lse = static_cast<const float*>(p.d_lse.data);
    copy_strides(p.d_lse, b.d_lse_stride);
  }
  *problem = b;
  return {};
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

#undef FFPA_RETURN_IF_ERROR

}  // namespace ffpa::detail
