// The FP8 KV cache's part of validate_forward (validate_fp8.cpp).
#pragma once

#include <cstdint>

#include "ffpa/ffpa.hpp"
#include "host/validate_checks.hpp"

namespace ffpa::detail {

// Query rows [0, early_rows) computed in the inputs' precision (hybrid rows):
// the option, or its default (256 with a causal mask, else 0).
int64_t early_rows(const Options& opt);

// The tensors of an Fp8KvCache, in a fixed order (k_codes, k_scales, k_mean,
// v_codes, v_scales, v_mean), and the name of each.
inline constexpr int kCacheTensors = 6;
const char* kv_cache_tensor_name(int i);

// ForwardParams::fp8_kv_cache: precision fp8, k and v where hybrid rows read
// them, the cache in the layout of k's shape and the call's FP8 knobs; fills
// the byte ranges of the cache's tensors.
Status check_forward_kv_cache(const ForwardParams& p, ByteRange (&ranges)[kCacheTensors]);

}  // namespace ffpa::detail
