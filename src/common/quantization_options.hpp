// The knobs of the FP8 attention path (issue 11): how Q, K, P and V are
// quantized. The CPU model (reference/fp8_quantization.hpp), the GPU pre-pass
// (kernels/fp8_prepass/) and the main loop read the same struct; the scheme
// and the measured accuracy of each setting: docs/kernels/fp8_model.md.
#pragma once

#include <cstdint>

#include "common/quantization_scales.hpp"

namespace ffpa::detail {

// How Q and K enter S = Q K^T.
enum class QkFormat : int32_t {
  e4m3,         // e4m3 codes, scale amax / 448 (wgmma e4m3, fp32 accumulation)
  int8,         // int8 codes, scale amax / 127 (wgmma s8, exact s32 accumulation)
  unquantized,  // the model only: the input values (error attribution, invariance checks)
};

// How P and V enter O += P V.
enum class PvFormat : int32_t {
  e4m3,         // P as e4m3(448 p), V as e4m3 codes with their scales
  unquantized,  // the model only: exact P and V
};

// The knobs of the quantized path. Defaults: the most accurate setting of
// the accuracy table (docs/kernels/fp8_model.md) that should cost nothing on
// Hopper (speed not measured yet): int8 QK (wgmma s8 has the e4m3 rate,
// accumulates exactly, and beats e4m3 on both input kinds) with
// per-thread-group scales (one scale product per thread and KV block, as per
// block).
struct QuantizationOptions {
  QkFormat qk_format = QkFormat::int8;
  QkScaleGranularity qk_granularity = QkScaleGranularity::per_thread_group;
  // Subtract the per-(batch, kv head) mean of K over its tokens, per channel,
  // before quantizing: softmax-invariant (q . mean is constant along a row);
  // it removes the per-channel offsets of real K that would otherwise spend
  // the 8-bit range. LSE gets scale * (q . mean) back.
  bool smooth_k = true;
  PvFormat pv_format = PvFormat::e4m3;
  VScaleGranularity v_granularity = VScaleGranularity::per_channel;
  // Subtract the per-channel mean of V over its tokens before quantizing and
  // add it to every output row that attends a key (the softmax weights sum to
  // 1). Not with dropout, where the kept weights do not sum to 1.
  bool smooth_v = false;
  // Hybrid rows: query rows [0, n_early) are computed unquantized (the
  // bf16/fp16 path); only rows [n_early, Nq) are quantized, their Q scale
  // blocks counted from row n_early (the FP8 tiles start there).
  int64_t n_early = 0;
};

// Hybrid rows by default with a causal mask (the seed's choice): the first
// rows attend the fewest keys, where 8-bit P loses the most accuracy.
inline constexpr int64_t kDefaultCausalEarlyRows = 256;

}  // namespace ffpa::detail
