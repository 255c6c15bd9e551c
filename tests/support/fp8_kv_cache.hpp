// FP8 KV caches for the tests: host tensors of the library's cache layout
// (ffpa::fp8_kv_cache_layout), poisoned, and the CPU model's K/V bytes in the
// GPU layout (K rows padded with zeros to 16 bytes, V transposed per head with
// each channel's row padded), computed here from the model's plain [Nkv][D]
// codes and independently of the library's cache writer. Header-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "reference/fp8_quantization.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

// The six tensors of a cache in host memory (16-byte aligned).
struct HostKvCache {
  HostTensor k_codes, k_scales, k_mean, v_codes, v_scales, v_mean;
  bool with_k_mean = true, with_v_mean = true;

  // The cache over these buffers; a mean left out is absent (data null).
  Fp8KvCache view() const {
    Fp8KvCache c;
    c.k_codes = k_codes.tensor, c.k_scales = k_scales.tensor, c.k_mean = k_mean.tensor;
    c.v_codes = v_codes.tensor, c.v_scales = v_scales.tensor, c.v_mean = v_mean.tensor;
    if (!with_k_mean) c.k_mean.data = nullptr;
    if (!with_v_mean) c.v_mean.data = nullptr;
    return c;
  }

  // Each tensor's bytes (its dense extent, from its data).
  std::vector<std::vector<unsigned char>> bytes() const {
    std::vector<std::vector<unsigned char>> out;
    for (const HostTensor* t : {&k_codes, &k_scales, &k_mean, &v_codes, &v_scales, &v_mean}) {
      const auto* data = static_cast<const unsigned char*>(t->tensor.data);
      out.emplace_back(data, data == nullptr ? data : data + t->bytes());
    }
    return out;
  }

  void poison(unsigned char byte) {
    for (HostTensor* t : {&k_codes, &k_scales, &k_mean, &v_codes, &v_scales, &v_mean}) {
      std::fill(t->storage.begin(), t->storage.end(), byte);
    }
  }
};

// A host tensor of the layout's dtype, shape and (dense) strides.
inline HostTensor host_tensor_like(const Tensor& layout) {
  return host_tensor_detail::allocate(layout.dtype, layout.rank, layout.shape);
}

// Host buffers for the cache of K [batch, heads_kv, seq_kv, dim] under `fp8`
// (the library's layout query), poisoned with 0xA5.
inline HostKvCache make_host_kv_cache(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t dim,
                                      const Fp8Options& fp8, bool with_means = true) {
  Fp8KvCache layout;
  const Status status = fp8_kv_cache_layout(batch, heads_kv, seq_kv, dim, fp8, &layout);
  if (!status.ok()) return {};
  HostKvCache c;
  c.k_codes = host_tensor_like(layout.k_codes);
  c.k_scales = host_tensor_like(layout.k_scales);
  c.k_mean = host_tensor_like(layout.k_mean);
  c.v_codes = host_tensor_like(layout.v_codes);
  c.v_scales = host_tensor_like(layout.v_scales);
  c.v_mean = host_tensor_like(layout.v_mean);
  c.with_k_mean = c.with_v_mean = with_means;
  c.poison(0xA5);
  return c;
}

// Bytes of `rows` rows of `dim` codes, each padded with zeros to `pitch` bytes.
inline std::vector<uint8_t> padded_code_rows(const std::vector<uint8_t>& codes, size_t rows, size_t dim,
                                             size_t pitch) {
  std::vector<uint8_t> out(rows * pitch, 0);
  for (size_t r = 0; r < rows; ++r) std::copy_n(codes.data() + r * dim, dim, out.data() + r * pitch);
  return out;
}

// The model's V codes ([heads][Nkv][D]) as the GPU keeps them: per head V^T
// [D][pitch], each channel's row padded with zeros.
inline std::vector<uint8_t> transposed_v_codes(const detail::QuantizedInputs& model, size_t pitch) {
  const size_t heads = static_cast<size_t>(model.batch * model.heads_kv), dim = static_cast<size_t>(model.head_dim);
  const size_t nkv = static_cast<size_t>(model.seq_kv);
  std::vector<uint8_t> out(heads * dim * pitch, 0);
  for (size_t head = 0; head < heads; ++head)
    for (size_t j = 0; j < nkv; ++j)
      for (size_t d = 0; d < dim; ++d) out[(head * dim + d) * pitch + j] = model.v_codes[(head * nkv + j) * dim + d];
  return out;
}

// The first `count` elements of a host tensor's buffer as T.
template <typename T>
std::vector<T> host_values(const HostTensor& t, size_t count) {
  std::vector<T> out(count);
  if (count > 0) std::memcpy(out.data(), t.tensor.data, count * sizeof(T));
  return out;
}

}  // namespace ffpa::testing
