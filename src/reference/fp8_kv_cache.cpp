#include "reference/fp8_kv_cache.hpp"

#include <algorithm>
#include <cstdint>

#include "common/quantized_kv_layout.hpp"

namespace ffpa::detail {

void write_kv_cache(const QuantizedInputs& z, const Fp8KvCache& cache) {
  const QuantizedKvLayout layout = quantized_kv_layout(z.seq_kv, z.head_dim, z.options);
  const int64_t heads = z.batch * z.heads_kv, nkv = z.seq_kv, dim = z.head_dim;
  auto* k_codes = static_cast<uint8_t*>(cache.k_codes.data);
  auto* v_codes = static_cast<uint8_t*>(cache.v_codes.data);
  for (int64_t head = 0; head < heads; ++head) {
    // K: [Nkv][k_pitch], each row's padding zeroed.
    for (int64_t j = 0; j < nkv; ++j) {
      uint8_t* row = k_codes + (head * nkv + j) * layout.k_pitch;
      std::copy_n(z.k_codes.data() + (head * nkv + j) * dim, dim, row);
      std::fill(row + dim, row + layout.k_pitch, uint8_t{0});
    }
    // V^T: [D][v_pitch], the model's [Nkv][D] codes transposed.
    for (int64_t c = 0; c < dim; ++c) {
      uint8_t* row = v_codes + (head * dim + c) * layout.v_pitch;
      for (int64_t j = 0; j < nkv; ++j) row[j] = z.v_codes[static_cast<size_t>((head * nkv + j) * dim + c)];
      std::fill(row + nkv, row + layout.v_pitch, uint8_t{0});
    }
  }
  std::copy(z.k_scales.begin(), z.k_scales.end(), static_cast<float*>(cache.k_scales.data));
  std::copy(z.v_scales.begin(), z.v_scales.end(), static_cast<float*>(cache.v_scales.data));
  if (cache.k_mean.data != nullptr) std::copy(z.k_mean.begin(), z.k_mean.end(), static_cast<float*>(cache.k_mean.data));
  if (cache.v_mean.data != nullptr) std::copy(z.v_mean.begin(), z.v_mean.end(), static_cast<float*>(cache.v_mean.data));
}

}  // namespace ffpa::detail
