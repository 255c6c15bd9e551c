// The shared validation checks (validate_checks.hpp).
#include "host/validate_checks.hpp"

#include "host/self_aliasing.hpp"

namespace ffpa::detail {

std::string dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::boolean: return "boolean";
    case DType::f64: return "f64";
    case DType::u8: return "u8";
    case DType::e4m3: return "e4m3";
    case DType::i32: return "i32";
  }
  return "unknown (" + std::to_string(static_cast<int32_t>(dtype)) + ")";
}

int64_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32: return 4;
    case DType::boolean:
    case DType::u8:
    case DType::e4m3: return 1;
    case DType::i32: return 4;
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

Status check_same_size(Arg a, int32_t ai, Arg ref, int32_t ri, const char* what) {
  if (a.t.shape[ai] != ref.t.shape[ri])
    return fail(StatusCode::shape_mismatch, a.name, ".shape[", ai, "] (", what,
                ") = ", a.t.shape[ai], " differs from ", ref.name, ".shape[", ri,
                "] = ", ref.t.shape[ri]);
  return {};
}

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

Status check_overlap(const char* output, const ByteRange& out, const char* input,
                     const ByteRange& in) {
  if (out.empty || in.empty || out.last < in.first || in.last < out.first) return {};
  return fail(StatusCode::output_overlaps_input, output, " (bytes ",
              reinterpret_cast<const void*>(out.first), " to ",
              reinterpret_cast<const void*>(out.last), ") overlaps ", input, " (bytes ",
              reinterpret_cast<const void*>(in.first), " to ",
              reinterpret_cast<const void*>(in.last), ")");
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

}  // namespace ffpa::detail
