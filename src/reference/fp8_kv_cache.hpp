// The CPU model's quantized K and V (reference/fp8_quantization.hpp) in the
// FP8 KV cache's dense layout (ffpa::Fp8KvCache; common/quantized_kv_layout.hpp):
// rows of K codes padded with zeros to 16 bytes, V's codes transposed per
// head with each channel's row padded with zeros, scales and means as the
// model has them. What ffpa::fp8_quantize_kv writes on host tensors, and
// byte for byte what the pre-pass writes on the GPU.
#pragma once

#include "ffpa/ffpa.hpp"
#include "reference/fp8_quantization.hpp"

namespace ffpa::detail {

// Writes the model's K/V into `cache` (host memory, dense, of the model's
// shape: validated by validate_fp8_quantize_kv); the means only where the
// cache has them. Allocates nothing.
void write_kv_cache(const QuantizedInputs& model, const Fp8KvCache& cache);

}  // namespace ffpa::detail
