// Quantization scales of the FP8 attention path, host and device: which
// elements share one scale (the granularities, numbered as the GPU pre-pass
// writes them and the main loop reads them) and how a scale follows from its
// group's largest magnitude. The CPU model (reference/fp8_quantization.hpp)
// and the kernels call these same functions; docs/kernels/fp8_model.md has
// the scheme.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/ceil_div.hpp"
#include "common/fp8_e4m3.hpp"
#include "common/host_device.hpp"

namespace ffpa::detail {

// Q rows of one scale block: the sm90 tile's query rows (kBlockM).
inline constexpr int64_t kQuantQueryBlock = 64;
// Keys of one K (or per-block V) scale block: the sm90 KV block (kBlockN).
inline constexpr int64_t kQuantKeyBlock = 128;
// Scale groups of one block at thread-group granularity (see below).
inline constexpr int64_t kQueryGroupsPerBlock = 32;
inline constexpr int64_t kKeyGroupsPerBlock = 4;

// Q and K scales.
//   per_block: one scale per kQuantQueryBlock Q rows, per kQuantKeyBlock keys.
//   per_thread_group: the rows and keys whose S elements one thread of the
//     wgmma accumulator holds (m64nN: warp w, lane l holds rows 16w + l/4 and
//     16w + l/4 + 8, and columns 8c + 2(l%4) + {0, 1}). A Q group is the two
//     rows {16w + g, 16w + g + 8} of a 64-row block (32 groups); a K group is
//     the 32 keys j of a 128-key block with equal (j % 8) / 2 (4 groups). All
//     of a thread's S elements of a KV block then share one Q group and one K
//     group: one scale product per thread and block, as per block costs
//     (SageAttention2's per-thread quantization).
enum class QkScaleGranularity : int32_t { per_block, per_thread_group };

// V scales. per_channel: one scale per channel over every key of a (batch,
// kv head) (applied in the epilogue); per_block: one per kQuantKeyBlock keys
// (applied to each block's P V before it is added to O).
enum class VScaleGranularity : int32_t { per_channel, per_block };

// Scales of `rows` quantized Q rows of one (batch, head); rows are counted
// from the first quantized row (hybrid rows are not quantized).
FFPA_HOST_DEVICE int64_t q_scale_count(int64_t rows, QkScaleGranularity g) {
  const int64_t blocks = ceil_div(rows, kQuantQueryBlock);
  return g == QkScaleGranularity::per_block ? blocks : blocks * kQueryGroupsPerBlock;
}

FFPA_HOST_DEVICE int64_t q_scale_index(int64_t row, QkScaleGranularity g) {
  const int64_t block = row / kQuantQueryBlock;
  if (g == QkScaleGranularity::per_block) return block;
  const int64_t in_block = row % kQuantQueryBlock;
  return block * kQueryGroupsPerBlock + (in_block / 16) * 8 + in_block % 8;
}

// Scales of `keys` keys of one (batch, kv head).
FFPA_HOST_DEVICE int64_t k_scale_count(int64_t keys, QkScaleGranularity g) {
  const int64_t blocks = ceil_div(keys, kQuantKeyBlock);
  return g == QkScaleGranularity::per_block ? blocks : blocks * kKeyGroupsPerBlock;
}

FFPA_HOST_DEVICE int64_t k_scale_index(int64_t key, QkScaleGranularity g) {
  const int64_t block = key / kQuantKeyBlock;
  if (g == QkScaleGranularity::per_block) return block;
  return block * kKeyGroupsPerBlock + (key % 8) / 2;
}

// Scales of V [keys][dim] of one (batch, kv head).
FFPA_HOST_DEVICE int64_t v_scale_count(int64_t keys, int64_t dim, VScaleGranularity g) {
  return g == VScaleGranularity::per_channel ? dim : ceil_div(keys, kQuantKeyBlock);
}

FFPA_HOST_DEVICE int64_t v_scale_index(int64_t key, int64_t channel, VScaleGranularity g) {
  return g == VScaleGranularity::per_channel ? channel : key / kQuantKeyBlock;
}

// The scale of a group whose largest magnitude is amax, for a format whose
// largest code is format_max (kE4m3Max or kInt8Max): amax / format_max in
// fp32 (IEEE division, round to nearest), so that the largest element maps to
// the largest code. A group of zeros, or one so small that the scale is not a
// normal fp32 number, gets scale 1 (every code 0 then, or a code that is a
// negligible fraction of an ulp of the rest): nothing divides by zero or by a
// subnormal (which flush-to-zero code would read as zero).
FFPA_HOST_DEVICE float quantization_scale(float amax, float format_max) {
  const float scale = amax / format_max;
  constexpr float kSmallestNormal = 1.17549435e-38f;  // 2^-126
  return scale >= kSmallestNormal ? scale : 1.0f;
}

// What a group's elements are multiplied by before rounding: 1 / scale in
// fp32 (IEEE division, once per group). One multiply per element, on the GPU
// as here (a division per element made the pre-pass compute-bound: ncu, H200,
// 2026-12-01); the largest element lands within an ulp of the largest code,
// which rounding or saturation takes exactly to it.
FFPA_HOST_DEVICE float quantization_inverse(float scale) { return 1.0f / scale; }

// --- Non-finite inputs ------------------------------------------------------
// A NaN or infinite value to quantize (the input, less its mean) must reach
// exactly the rows the input reaches (spec.md, "Non-finite inputs"), and no
// other element's code: it is left out of the means and of its group's
// amax, and coded as a NaN. e4m3 has one (kE4m3NaN), which the tensor cores
// carry into S or O; int8 has none, so such a value gets code -128
// (kInt8NonFinite: outside the symmetric range, never a value's code), its
// K group's stored scale is negated (flag_nonfinite: the main loop reads the
// magnitude) and the pre-pass tells each query row whether a non-finite Q or K
// element reaches it (row_nan, reference/fp8_quantization.hpp).
inline constexpr uint8_t kInt8NonFinite = 0x80;

FFPA_HOST_DEVICE bool finite_value(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// What x adds to a mean's sum, and |x| to its group's amax.
FFPA_HOST_DEVICE float mean_term(float x) { return finite_value(x) ? x : 0.0f; }
FFPA_HOST_DEVICE float amax_term(float x) { return finite_value(x) ? fabsf(x) : 0.0f; }

// A K group's stored scale: negated when the group holds a non-finite value
// (int8 codes); what the main loop multiplies by is its magnitude.
FFPA_HOST_DEVICE float flag_nonfinite(float scale, bool nonfinite) { return nonfinite ? -scale : scale; }
FFPA_HOST_DEVICE bool flags_nonfinite(float stored_scale) { return stored_scale < 0.0f; }
FFPA_HOST_DEVICE float scale_magnitude(float stored_scale) { return fabsf(stored_scale); }

// The code of x in a group whose quantization_inverse is `inverse`: x *
// inverse in fp32 (a lone multiply: nothing to contract), then the format's
// rounding; a non-finite x gets the format's NaN code.
FFPA_HOST_DEVICE uint8_t quantize_e4m3(float x, float inverse) {
  return finite_value(x) ? float_to_e4m3_bits(x * inverse) : kE4m3NaN;
}
FFPA_HOST_DEVICE uint8_t quantize_int8(float x, float inverse) {
  return finite_value(x) ? static_cast<uint8_t>(float_to_int8_symmetric(x * inverse)) : kInt8NonFinite;
}

}  // namespace ffpa::detail
