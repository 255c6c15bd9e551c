// Host tensors for tests and tools: owning buffers described by ffpa::Tensor,
// random fills rounded to the dtype, NaN poisoning, strided element access and
// stride-0 broadcast views. Header-only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/attention_problem.hpp"
#include "common/float16_bits.hpp"
#include "common/fp8_e4m3.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::testing {

// bhnd: contiguous [B, H, N, D]. bnhd: a contiguous [B, N, H, D] buffer viewed
// as logical [B, H, N, D] through permuted strides (the FlashAttention layout).
enum class Layout { bhnd, bnhd };

inline size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f16:
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64: return 8;
    case DType::boolean:
    case DType::u8:
    case DType::e4m3: return 1;
  }
  return 0;
}

// Owns host memory (16-byte aligned) and a Tensor describing it. Copies get
// their own storage and a tensor pointing into it.
struct HostTensor {
  static constexpr size_t kAlignment = 16;

  std::vector<unsigned char> storage;  // kAlignment - 1 bytes of slack for alignment
  Tensor tensor;

  HostTensor() = default;
  HostTensor(const HostTensor& other) { *this = other; }
  HostTensor(HostTensor&&) noexcept = default;  // the vector keeps its buffer
  HostTensor& operator=(HostTensor&&) noexcept = default;
  HostTensor& operator=(const HostTensor& other) {
    if (this == &other) return *this;
    storage.assign(other.storage.size(), 0);
    tensor = other.tensor;
    tensor.data = aligned_data();
    if (other.tensor.data != nullptr) std::memcpy(tensor.data, other.tensor.data, other.bytes());
    return *this;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int32_t d = 0; d < tensor.rank; ++d) n *= tensor.shape[d];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(tensor.dtype); }

  // The first kAlignment-aligned byte of storage.
  unsigned char* aligned_data() {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    return storage.data() + ((kAlignment - address % kAlignment) % kAlignment);
  }
};

namespace host_tensor_detail {

inline HostTensor allocate(DType dtype, int32_t rank, const int64_t* shape) {
  HostTensor t;
  t.tensor.dtype = dtype;
  t.tensor.rank = rank;
  for (int32_t d = 0; d < rank; ++d) t.tensor.shape[d] = shape[d];
  t.storage.assign(t.bytes() + HostTensor::kAlignment - 1, 0);
  t.tensor.data = t.aligned_data();
  int64_t stride = 1;  // row-major; callers permute for other layouts
  for (int32_t d = rank - 1; d >= 0; --d) {
    t.tensor.stride[d] = stride;
    stride *= shape[d];
  }
  return t;
}

// Address of the element at `index`; entries beyond the rank are ignored.
inline unsigned char* element_address(const Tensor& t, const std::array<int64_t, 4>& index) {
  int64_t offset = 0;
  for (int32_t d = 0; d < t.rank; ++d) offset += index[d] * t.stride[d];
  return static_cast<unsigned char*>(t.data) + offset * static_cast<int64_t>(dtype_size(t.dtype));
}

}  // namespace host_tensor_detail

// A rank-4 tensor of logical shape [B, H, N, D] in the given layout.
inline HostTensor make_host_tensor(DType dtype, std::array<int64_t, 4> shape,
                                   Layout layout = Layout::bhnd) {
  if (layout == Layout::bhnd) return host_tensor_detail::allocate(dtype, 4, shape.data());
  const int64_t bnhd[4] = {shape[0], shape[2], shape[1], shape[3]};
  HostTensor t = host_tensor_detail::allocate(dtype, 4, bnhd);
  const int64_t buffer_stride[4] = {t.tensor.stride[0], t.tensor.stride[1], t.tensor.stride[2],
                                    t.tensor.stride[3]};
  for (int d = 0; d < 4; ++d) t.tensor.shape[d] = shape[d];
  t.tensor.stride[1] = buffer_stride[2];  // h
  t.tensor.stride[2] = buffer_stride[1];  // n
  return t;
}

// The optional lse output: [B, H, N], fp32, contiguous.
inline HostTensor make_host_lse(int64_t batch, int64_t heads, int64_t seq) {
  const int64_t shape[3] = {batch, heads, seq};
  return host_tensor_detail::allocate(DType::f32, 3, shape);
}

// Reads the element at `index` (entries beyond the rank are ignored) as a double.
inline double element_as_double(const Tensor& t, std::array<int64_t, 4> index) {
  const unsigned char* bytes = host_tensor_detail::element_address(t, index);
  switch (t.dtype) {
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, bytes, sizeof h);
      return detail::half_bits_to_float(h);
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, bytes, sizeof h);
      return detail::bf16_bits_to_float(h);
    }
    case DType::f32: {
      float f;
      std::memcpy(&f, bytes, sizeof f);
      return f;
    }
    case DType::f64: {
      double d;
      std::memcpy(&d, bytes, sizeof d);
      return d;
    }
    case DType::boolean: return *bytes != 0 ? 1.0 : 0.0;
    case DType::u8: return *bytes;
    case DType::e4m3: return detail::e4m3_bits_to_float(*bytes);
    case DType::i32: {
      int32_t i;
      std::memcpy(&i, bytes, sizeof i);
      return i;
    }
  }
  return 0.0;
}

// Writes `value` rounded to the dtype (boolean: nonzero -> 1) at `index`.
inline void set_element(const Tensor& t, std::array<int64_t, 4> index, double value) {
  unsigned char* bytes = host_tensor_detail::element_address(t, index);
  switch (t.dtype) {
    case DType::f16: {
      const uint16_t h = detail::float_to_half_bits(static_cast<float>(value));
      std::memcpy(bytes, &h, sizeof h);
      return;
    }
    case DType::bf16: {
      const uint16_t h = detail::float_to_bf16_bits(static_cast<float>(value));
      std::memcpy(bytes, &h, sizeof h);
      return;
    }
    case DType::f32: {
      const float f = static_cast<float>(value);
      std::memcpy(bytes, &f, sizeof f);
      return;
    }
    case DType::f64: std::memcpy(bytes, &value, sizeof value); return;
    case DType::boolean: *bytes = value != 0.0 ? 1 : 0; return;
    case DType::u8: *bytes = static_cast<unsigned char>(value); return;
    case DType::e4m3: *bytes = detail::float_to_e4m3_bits(static_cast<float>(value)); return;
    case DType::i32: {
      const int32_t i = static_cast<int32_t>(value);
      std::memcpy(bytes, &i, sizeof i);
      return;
    }
  }
}

// Booleans: 1 with probability p_true, else 0, over the whole buffer.
inline void fill_bool(HostTensor& t, uint64_t seed, double p_true) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution draw(p_true);
  auto* bytes = static_cast<unsigned char*>(t.tensor.data);
  for (int64_t e = 0; e < t.numel(); ++e) bytes[e] = draw(rng) ? 1 : 0;
}

// Uniform values in [lo, hi) rounded to the dtype, over the whole buffer
// (every layout made here is a dense buffer). Booleans: fill_bool with p = 0.5.
inline void fill_uniform(HostTensor& t, uint64_t seed, float lo, float hi) {
  if (t.tensor.dtype == DType::boolean) {
    fill_bool(t, seed, 0.5);
    return;
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> draw(lo, hi);
  const size_t size = dtype_size(t.tensor.dtype);
  auto* bytes = static_cast<unsigned char*>(t.tensor.data);
  for (int64_t e = 0; e < t.numel(); ++e) {
    const float value = draw(rng);
    unsigned char* element = bytes + e * static_cast<int64_t>(size);
    if (t.tensor.dtype == DType::f16) {
      const uint16_t h = detail::float_to_half_bits(value);
      std::memcpy(element, &h, sizeof h);
    } else if (t.tensor.dtype == DType::bf16) {
      const uint16_t h = detail::float_to_bf16_bits(value);
      std::memcpy(element, &h, sizeof h);
    } else if (t.tensor.dtype == DType::f64) {
      const double d = value;
      std::memcpy(element, &d, sizeof d);
    } else if (t.tensor.dtype == DType::e4m3) {
      *element = detail::float_to_e4m3_bits(value);
    } else {
      std::memcpy(element, &value, size);
    }
  }
}

// Poisons the whole buffer: NaN for float dtypes, 0xFF bytes for booleans.
inline void fill_nan(HostTensor& t) {
  const size_t size = dtype_size(t.tensor.dtype);
  auto* bytes = static_cast<unsigned char*>(t.tensor.data);
  if (t.tensor.dtype == DType::boolean) {
    std::memset(bytes, 0xFF, t.bytes());
    return;
  }
  const uint16_t half_nan = 0x7E00u, bf16_nan = 0x7FC0u;
  const float f32_nan = std::numeric_limits<float>::quiet_NaN();
  const double f64_nan = std::numeric_limits<double>::quiet_NaN();
  const void* pattern = t.tensor.dtype == DType::f16    ? static_cast<const void*>(&half_nan)
                        : t.tensor.dtype == DType::bf16 ? static_cast<const void*>(&bf16_nan)
                        : t.tensor.dtype == DType::f64  ? static_cast<const void*>(&f64_nan)
                                                        : static_cast<const void*>(&f32_nan);
  for (int64_t e = 0; e < t.numel(); ++e) {
    std::memcpy(bytes + e * static_cast<int64_t>(size), pattern, size);
  }
}

// A view of `t` whose dims with broadcast[d] have stride 0 (the shape keeps the
// full size): every index along such a dim reads the elements at index 0.
inline Tensor broadcast_view(const HostTensor& t, std::array<bool, 4> broadcast) {
  Tensor view = t.tensor;
  for (int32_t d = 0; d < view.rank; ++d) {
    if (broadcast[d]) view.stride[d] = 0;
  }
  return view;
}

// The first three strides of a [B, H, N, D] tensor, as AttentionProblem keeps
// them (q_stride, k_stride, ...; the last dim has stride 1).
inline void set_problem_strides(const Tensor& t, int64_t (&stride)[3]) {
  for (int d = 0; d < 3; ++d) stride[d] = t.stride[d];
}

// The sizes and the dtype of a problem.
inline void set_problem_shape(detail::AttentionProblem& p, int64_t batch, int64_t heads_q, int64_t heads_kv,
                              int64_t seq_q, int64_t seq_kv, int64_t head_dim, DType dtype) {
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seq_q = seq_q;
  p.seq_kv = seq_kv;
  p.head_dim = head_dim;
  p.dtype = dtype;
}

// Q, K and V of a problem: their data and strides.
inline void set_problem_qkv(detail::AttentionProblem& p, const Tensor& q, const Tensor& k, const Tensor& v) {
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  set_problem_strides(q, p.q_stride);
  set_problem_strides(k, p.k_stride);
  set_problem_strides(v, p.v_stride);
}

}  // namespace ffpa::testing
