// The dense layout of quantized K and V, per (batch, kv head): rows of codes
// padded to 16 bytes (TMA's stride unit), V's codes transposed ([D][Nkv]: the
// K-major B operand 8-bit wgmma needs for P V), and how many scales each has.
// One definition for the pre-pass's workspace regions
// (kernels/fp8_prepass/workspace.hpp), the FP8 KV cache (ffpa::Fp8KvCache,
// host/fp8_kv_cache.hpp) and the CPU model's cache writer
// (reference/fp8_kv_cache.hpp).
#pragma once

#include <cstdint>

#include "common/ceil_div.hpp"
#include "common/quantization_options.hpp"
#include "common/quantization_scales.hpp"

namespace ffpa::detail {

// Bytes of a row of `count` one-byte codes: count rounded up to 16, the
// padding written with zeros.
inline constexpr int64_t code_row_pitch(int64_t count) { return ceil_div(count, int64_t{16}) * 16; }

struct QuantizedKvLayout {
  int64_t k_pitch = 0;   // bytes of a key's row of codes: [Nkv][k_pitch]
  int64_t v_pitch = 0;   // bytes of a channel's row of V^T codes: [D][v_pitch]
  int64_t k_scales = 0;  // k_scale_count(Nkv)
  int64_t v_scales = 0;  // v_scale_count(Nkv, D)
};

inline QuantizedKvLayout quantized_kv_layout(int64_t seq_kv, int64_t head_dim, const QuantizationOptions& o) {
  QuantizedKvLayout l;
  l.k_pitch = code_row_pitch(head_dim);
  l.v_pitch = code_row_pitch(seq_kv);
  l.k_scales = k_scale_count(seq_kv, o.qk_granularity);
  l.v_scales = v_scale_count(seq_kv, head_dim, o.v_granularity);
  return l;
}

}  // namespace ffpa::detail
