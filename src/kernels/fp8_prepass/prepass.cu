// The FP8 pre-pass kernels (prepass.hpp). Each step is the CPU model's
// (reference/fp8_quantization.cpp) in the same fp32 operations, so that codes
// and scales agree bit for bit: block sums in key order and block totals in
// block order for the means, x - mean, fmaxf of |x| for a group's amax (the
// max of non-negative floats is order-free, so threads combine theirs with an
// integer atomicMax on the bits), amax / format_max and 1 / scale as IEEE
// divisions (nvcc's default -prec-div=true), x times that (no multiply-add
// anywhere to contract), then the format's rounding (common/fp8_e4m3.hpp;
// e4m3 two values per instruction). Non-finite values stay out of the means
// and amaxes and get NaN codes; with int8 codes their K groups' scales are
// negated and quantize_q marks the rows they reach (row_nan):
// common/quantization_scales.hpp, "Non-finite inputs".
//
// The steps, in stream order (a mean or a per-channel scale reduces over all
// keys before any code can use it):
//   column_partials   per (kv head, 128-key block): K block sums (smooth-K), V
//                     block sums (smooth-V) or block amax (V per channel)
//   finalize_columns  per kv head: the means, the per-channel V scales
//   (smooth-V with per-channel V: column_partials and finalize_columns once
//   more, for the amax of V - mean)
//   quantize_kv       per (kv head, 128-key block): K codes with their block's
//                     or thread groups' scales; V^T codes through shared memory
//   quantize_q        per (query head, 64 quantized rows): Q codes and scales,
//                     each row's LSE term scale * (q . k_mean) (smooth-K) and,
//                     int8, its row_nan from Q and from K's flagged groups
// The forward's pre-pass runs them all; fp8_quantize_kv the K/V steps into an
// FP8 KV cache; a forward with a cache quantize_q alone (k_mean the cache's).
// Every thread reads 8 channels (16 bytes) per load. Rows of codes are padded
// to 16 bytes (workspace.hpp), the padding written with zeros.
#include "kernels/fp8_prepass/prepass.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/fp8_e4m3.hpp"
#include "common/quantization_scales.hpp"
#include "host/cuda_status.hpp"

namespace ffpa::detail::fp8_prepass {
namespace {

constexpr int kChunk = 8;  // channels per 16-byte load

// What column_partials reduces of V.
enum class VPartial : int { none, sum, amax, centered_amax };

// Eight channels of one row, as fp32 (exact for fp16 and bf16).
template <typename Element>
__device__ __forceinline__ void load_chunk(const Element* row, int64_t channel, float (&x)[kChunk]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(row + channel));
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
      x[2 * w] = __uint_as_float(words[w] << 16);
      x[2 * w + 1] = __uint_as_float(words[w] & 0xFFFF0000u);
    } else {
      const __half2 pair = *reinterpret_cast<const __half2*>(&words[w]);
      const float2 f = __half22float2(pair);
      x[2 * w] = f.x;
      x[2 * w + 1] = f.y;
    }
  }
}

template <typename Element>
__device__ __forceinline__ const Element* row_of(const void* base, const int64_t (&stride)[3], int64_t b, int64_t h,
                                                 int64_t n) {
  return static_cast<const Element*>(base) + b * stride[0] + h * stride[1] + n * stride[2];
}

// quantize_int8 in five instructions: the non-finite marker, else saturate to
// [-127, 127], round half to even (exact: the same code).
__device__ __forceinline__ uint32_t int8_code(float value, float inverse) {
  const float clamped = fminf(fmaxf(value * inverse, -kInt8Max), kInt8Max);
  return finite_value(value) ? static_cast<uint32_t>(__float2int_rn(clamped)) & 0xFFu : kInt8NonFinite;
}

// What an e4m3 conversion takes for `value` (quantize_e4m3): value * inverse,
// a NaN for a non-finite value (saturation would turn an infinity into 448).
__device__ __forceinline__ float e4m3_input(float value, float inverse) {
  return finite_value(value) ? value * inverse : __int_as_float(0x7FFFFFFF);
}

// Eight codes of x - mean in a group whose quantization_inverse is `inverse`,
// byte e of the pair of words holding element e.
__device__ __forceinline__ void codes_of(const float (&x)[kChunk], const float (&mean)[kChunk], float inverse,
                                         bool int8_codes, uint32_t (&packed)[2]) {
#pragma unroll
  for (int e = 0; e < kChunk; e += 2) {
    const float lo = x[e] - mean[e], hi = x[e + 1] - mean[e + 1];
    const uint32_t pair = int8_codes ? int8_code(lo, inverse) | int8_code(hi, inverse) << 8
                                     : float2_to_e4m3x2_bits(e4m3_input(lo, inverse), e4m3_input(hi, inverse));
    packed[e / 4] |= pair << (8 * (e % 4));
  }
}

// Whether any of eight values is non-finite.
__device__ __forceinline__ bool any_nonfinite(const float (&x)[kChunk], const float (&mean)[kChunk]) {
  bool any = false;
#pragma unroll
  for (int e = 0; e < kChunk; ++e) any |= !finite_value(x[e] - mean[e]);
  return any;
}

// The per-channel means of a chunk (zeros where not smoothing: x - 0 = x).
__device__ __forceinline__ void load_mean(const float* mean, int64_t c, float (&m)[kChunk]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(mean + c)), b = __ldg(reinterpret_cast<const float4*>(mean + c + 4));
  m[0] = a.x, m[1] = a.y, m[2] = a.z, m[3] = a.w, m[4] = b.x, m[5] = b.y, m[6] = b.z, m[7] = b.w;
}

// Eight codes at channel c of a row of `pitch` bytes; the chunk that ends
// the row's D channels also zeroes the padding (8 bytes when D % 16 == 8).
__device__ __forceinline__ void store_codes(uint8_t* row, int64_t c, int64_t dim, int64_t pitch,
                                            const uint32_t (&packed)[2]) {
  *reinterpret_cast<uint2*>(row + c) = make_uint2(packed[0], packed[1]);
  if (c + kChunk == dim && pitch > dim) *reinterpret_cast<uint2*>(row + dim) = make_uint2(0u, 0u);
}

// fmaxf of a group's |x| into shared memory: the bits of non-negative floats
// order as the floats do (a non-finite value never gets here: amax_term).
__device__ __forceinline__ void group_max(unsigned* group_amax, float amax) {
  atomicMax(group_amax, __float_as_uint(amax));
}

// The warp's fmaxf, in every lane.
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, offset));
  return x;
}

// The row-parallel kernels (quantize_kv's K, quantize_q): a warp per row,
// its lanes over the row's 8-channel chunks, so that a row's group is the
// warp's (one shared-memory atomic a warp and row) and no thread divides by
// the chunk count.
constexpr int kRowWarps = 8;

// ---- column_partials ---------------------------------------------------------

template <typename Element>
__global__ void column_partials(AttentionProblem p, QuantizedBuffers z, bool k_sums, VPartial v_partial) {
  const int64_t block = blockIdx.x, head = blockIdx.y;  // head: b x Hkv + kv head
  const int64_t b = head / p.heads_kv, h = head % p.heads_kv, dim = p.head_dim;
  const int64_t first = block * kQuantKeyBlock;
  const int64_t last = first + kQuantKeyBlock < p.seq_kv ? first + kQuantKeyBlock : p.seq_kv;
  const float* v_mean = z.v_mean + head * dim;
  float* k_out = z.k_partials + (head * z.key_blocks + block) * dim;
  float* v_out = z.v_partials + (head * z.key_blocks + block) * dim;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * kChunk; c < dim; c += blockDim.x * kChunk) {
    float k_sum[kChunk] = {}, v_acc[kChunk] = {}, mean[kChunk] = {};
    if (v_partial == VPartial::centered_amax) {
#pragma unroll
      for (int e = 0; e < kChunk; ++e) mean[e] = v_mean[c + e];
    }
#pragma unroll 8
    for (int64_t j = first; j < last; ++j) {  // unrolled: 8 keys' loads in flight
      float x[kChunk];
      if (k_sums) {
        load_chunk(row_of<Element>(p.k, p.k_stride, b, h, j), c, x);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) k_sum[e] += mean_term(x[e]);
      }
      if (v_partial != VPartial::none) {
        load_chunk(row_of<Element>(p.v, p.v_stride, b, h, j), c, x);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) {
          v_acc[e] = v_partial == VPartial::sum ? v_acc[e] + mean_term(x[e]) : fmaxf(v_acc[e], amax_term(x[e] - mean[e]));
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kChunk; ++e) {
      if (k_sums) k_out[c + e] = k_sum[e];
      if (v_partial != VPartial::none) v_out[c + e] = v_acc[e];
    }
  }
}

// ---- finalize_columns --------------------------------------------------------

// The mean over n keys from the block sums, in block order (0 without keys).
__device__ __forceinline__ float mean_of(const float* partials, int64_t blocks, int64_t dim, int64_t c, int64_t n) {
  if (n == 0) return 0.0f;
  float total = 0.0f;
  for (int64_t k = 0; k < blocks; ++k) total += partials[k * dim + c];
  return total / static_cast<float>(n);
}

// What finalize_columns writes of a mean.
enum class MeanStep : int { keep, zero, compute };

__global__ void finalize_columns(AttentionProblem p, QuantizedBuffers z, MeanStep k_step, MeanStep v_step,
                                 bool v_scales) {
  const int64_t head = blockIdx.x, dim = p.head_dim, blocks = z.key_blocks;
  const float* k_partials = z.k_partials + head * blocks * dim;
  const float* v_partials = z.v_partials + head * blocks * dim;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    if (k_step != MeanStep::keep) {
      z.k_mean[head * dim + c] = k_step == MeanStep::zero ? 0.0f : mean_of(k_partials, blocks, dim, c, p.seq_kv);
    }
    if (v_step != MeanStep::keep) {
      z.v_mean[head * dim + c] = v_step == MeanStep::zero ? 0.0f : mean_of(v_partials, blocks, dim, c, p.seq_kv);
    }
    if (v_scales) {
      float amax = 0.0f;
      for (int64_t k = 0; k < blocks; ++k) amax = fmaxf(amax, v_partials[k * dim + c]);
      z.v_scales[head * dim + c] = quantization_scale(amax, kE4m3Max);
    }
  }
}

// ---- quantize_kv -------------------------------------------------------------

constexpr int kKvThreads = 256;
// V^T through shared memory: 64 channels x 128 keys of codes a pass, rows of
// 33 words (one word of padding: the 4-key words a warp writes for 8 channels
// then fall in distinct banks but for pairs, and a row reads conflict-free).
constexpr int kTransposeChannels = 64;
constexpr int kTransposeRowWords = kQuantKeyBlock / 4 + 1;

template <typename Element>
__global__ void __launch_bounds__(kKvThreads) quantize_kv(AttentionProblem p, QuantizedBuffers z, QuantizationOptions o) {
  __shared__ unsigned k_amax[kKeyGroupsPerBlock];
  __shared__ unsigned k_nonfinite[kKeyGroupsPerBlock];  // int8: the group's scale is flagged
  __shared__ float k_inverse[kKeyGroupsPerBlock];
  __shared__ unsigned v_amax;
  __shared__ uint32_t transpose[kTransposeChannels][kTransposeRowWords];
  const int64_t block = blockIdx.x, head = blockIdx.y;
  const int64_t b = head / p.heads_kv, h = head % p.heads_kv, dim = p.head_dim, nkv = p.seq_kv;
  const int64_t first = block * kQuantKeyBlock;
  const int keys = static_cast<int>(first + kQuantKeyBlock < nkv ? kQuantKeyBlock : nkv - first);
  const int tid = static_cast<int>(threadIdx.x);
  const float* k_mean = z.k_mean + head * dim;
  const float* v_mean = z.v_mean + head * dim;
  const bool int8_qk = o.qk_format == QkFormat::int8;
  const bool k_per_block = o.qk_granularity == QkScaleGranularity::per_block;
  const bool v_per_block = o.v_granularity == VScaleGranularity::per_block;
  if (tid < kKeyGroupsPerBlock) k_amax[tid] = k_nonfinite[tid] = 0u;
  if (tid == 0) v_amax = 0u;
  __syncthreads();

  // K's group amax (and V's block amax when V is scaled per block): a warp per key.
  const int warp = tid / 32, lane = tid % 32;
  for (int key = warp; key < keys; key += kRowWarps) {
    const Element* k_row = row_of<Element>(p.k, p.k_stride, b, h, first + key);
    const Element* v_row = row_of<Element>(p.v, p.v_stride, b, h, first + key);
    float k_max = 0.0f, v_max = 0.0f;
    bool k_bad = false;
    for (int64_t c = static_cast<int64_t>(lane) * kChunk; c < dim; c += 32 * kChunk) {
      float x[kChunk], mean[kChunk];
      load_chunk(k_row, c, x);
      load_mean(k_mean, c, mean);
      k_bad |= any_nonfinite(x, mean);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) k_max = fmaxf(k_max, amax_term(x[e] - mean[e]));
      if (v_per_block) {
        load_chunk(v_row, c, x);
        load_mean(v_mean, c, mean);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) v_max = fmaxf(v_max, amax_term(x[e] - mean[e]));
      }
    }
    k_max = warp_max(k_max);
    k_bad = __any_sync(0xFFFFFFFFu, k_bad);
    const int group = k_per_block ? 0 : static_cast<int>(k_scale_index(key, o.qk_granularity));
    if (lane == 0) group_max(&k_amax[group], k_max);
    if (lane == 0 && k_bad) k_nonfinite[group] = 1u;
    if (v_per_block) {
      v_max = warp_max(v_max);
      if (lane == 0) group_max(&v_amax, v_max);
    }
  }
  __syncthreads();
  const int k_groups = k_per_block ? 1 : static_cast<int>(kKeyGroupsPerBlock);
  const int64_t k_scale_base = head * k_scale_count(nkv, o.qk_granularity) + block * k_groups;
  if (tid < k_groups) {
    const float scale = quantization_scale(__uint_as_float(k_amax[tid]), int8_qk ? kInt8Max : kE4m3Max);
    k_inverse[tid] = quantization_inverse(scale);
    z.k_scales[k_scale_base + tid] = flag_nonfinite(scale, int8_qk && k_nonfinite[tid] != 0u);
  }
  float v_block_inverse = 1.0f;
  if (v_per_block) {
    const float scale = quantization_scale(__uint_as_float(v_amax), kE4m3Max);
    v_block_inverse = quantization_inverse(scale);
    if (tid == 0) z.v_scales[head * v_scale_count(nkv, dim, o.v_granularity) + block] = scale;
  }
  __syncthreads();

  // K codes, [key][code_pitch]: a warp per key, 8 bytes a lane and chunk.
  for (int key = warp; key < keys; key += kRowWarps) {
    const Element* k_row = row_of<Element>(p.k, p.k_stride, b, h, first + key);
    uint8_t* codes = z.k_codes + (head * nkv + first + key) * z.code_pitch;
    const float inverse = k_inverse[k_per_block ? 0 : k_scale_index(key, o.qk_granularity)];
    for (int64_t c = static_cast<int64_t>(lane) * kChunk; c < dim; c += 32 * kChunk) {
      float x[kChunk], mean[kChunk];
      load_chunk(k_row, c, x);
      load_mean(k_mean, c, mean);
      uint32_t packed[2] = {0u, 0u};
      codes_of(x, mean, inverse, int8_qk, packed);
      store_codes(codes, c, dim, z.code_pitch, packed);
    }
  }

  // V^T codes, [D][v_pitch]: per 64 channels, each thread codes 4 keys x 8
  // channels into words of 4 keys (zeros past Nkv), then rows of 128 keys
  // leave as 32 words a warp.
  const float* v_scales = z.v_scales + head * v_scale_count(nkv, dim, o.v_granularity);
  constexpr int kKeyQuads = kQuantKeyBlock / 4;
  for (int64_t c0 = 0; c0 < dim; c0 += kTransposeChannels) {
    const int chunk = tid % (kTransposeChannels / kChunk), quad = tid / (kTransposeChannels / kChunk);
    static_assert(kKvThreads == kKeyQuads * (kTransposeChannels / kChunk), "one thread per (4 keys, 8 channels)");
    const int64_t c = c0 + chunk * kChunk;
    if (c < dim) {
      uint32_t words[kChunk] = {};
      float mean[kChunk], inverse[kChunk];
      load_mean(v_mean, c, mean);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) inverse[e] = v_per_block ? v_block_inverse : quantization_inverse(v_scales[c + e]);
      for (int k = 0; k < 4; ++k) {
        const int key = quad * 4 + k;
        if (key >= keys) break;
        float x[kChunk];
        load_chunk(row_of<Element>(p.v, p.v_stride, b, h, first + key), c, x);
#pragma unroll
        for (int e = 0; e < kChunk; e += 2) {
          const uint32_t pair = float2_to_e4m3x2_bits(e4m3_input(x[e] - mean[e], inverse[e]),
                                                      e4m3_input(x[e + 1] - mean[e + 1], inverse[e + 1]));
          words[e] |= (pair & 0xFFu) << (8 * k);
          words[e + 1] |= (pair >> 8) << (8 * k);
        }
      }
#pragma unroll
      for (int e = 0; e < kChunk; ++e) transpose[chunk * kChunk + e][quad] = words[e];
    }
    __syncthreads();
    // Row r of the pass: keys [first, first + 128) of channel c0 + r, up to
    // the padded pitch (TMA's stride), so the padding is written with zeros.
    const int64_t row_bytes = z.v_pitch - first < kQuantKeyBlock ? z.v_pitch - first : kQuantKeyBlock;
    for (int item = tid; item < kTransposeChannels * kKeyQuads; item += kKvThreads) {
      const int r = item / kKeyQuads, word = item % kKeyQuads;
      if (c0 + r >= dim || 4 * word >= row_bytes) continue;
      uint8_t* row = z.v_codes + (head * dim + c0 + r) * z.v_pitch + first;
      *reinterpret_cast<uint32_t*>(row + 4 * word) = transpose[r][word];
    }
    __syncthreads();
  }
}

// ---- quantize_q --------------------------------------------------------------

constexpr int kQThreads = 256;
static_assert(kQThreads == 32 * kRowWarps && kKvThreads == 32 * kRowWarps, "a warp per row, kRowWarps rows at once");

// int8 Q/K: the first key of kv head `kv_head` (b x Hkv + h) holding a
// non-finite value, or Nkv: the first 128-key block with a flagged K scale,
// then the least key of it with a non-finite code. A CTA's threads together
// (barriers inside); every thread gets the key.
__device__ int64_t first_nonfinite_key(const AttentionProblem& p, const QuantizedBuffers& z,
                                       const QuantizationOptions& o, int64_t kv_head) {
  __shared__ int first_group, first_key;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t groups = k_scale_count(p.seq_kv, o.qk_granularity);
  const float* scales = z.k_scales + kv_head * groups;
  if (tid == 0) first_group = first_key = INT_MAX;
  __syncthreads();
  for (int64_t g = tid; g < groups; g += blockDim.x) {
    if (flags_nonfinite(scales[g])) {  // a thread's groups ascend: its first is its least
      atomicMin(&first_group, static_cast<int>(g));
      break;
    }
  }
  __syncthreads();
  if (first_group == INT_MAX) return p.seq_kv;
  const int64_t groups_per_block = o.qk_granularity == QkScaleGranularity::per_block ? 1 : kKeyGroupsPerBlock;
  const int64_t first = first_group / groups_per_block * kQuantKeyBlock;
  const int64_t keys = first + kQuantKeyBlock < p.seq_kv ? kQuantKeyBlock : p.seq_kv - first;
  const int64_t words = p.head_dim / 4;  // the codes of a key, 4 to a word
  for (int64_t item = tid; item < keys * words; item += blockDim.x) {
    const int64_t key = first + item / words;
    const uint32_t word =
        *reinterpret_cast<const uint32_t*>(z.k_codes + (kv_head * p.seq_kv + key) * z.code_pitch + 4 * (item % words));
    if (__vcmpeq4(word, 0x01010101u * kInt8NonFinite) != 0u) atomicMin(&first_key, static_cast<int>(key));
  }
  __syncthreads();
  return first_key;
}

template <typename Element>
__global__ void __launch_bounds__(kQThreads) quantize_q(AttentionProblem p, QuantizedBuffers z, QuantizationOptions o) {
  __shared__ unsigned amax_of[kQueryGroupsPerBlock];
  __shared__ float inverse_of[kQueryGroupsPerBlock];
  const int64_t block = blockIdx.x, head = blockIdx.y;  // head: b x Hq + h
  const int64_t b = head / p.heads_q, h = head % p.heads_q, dim = p.head_dim;
  const int64_t first = block * kQuantQueryBlock;  // quantized row numbers (query row first_row + r)
  const int rows = static_cast<int>(first + kQuantQueryBlock < z.rows ? kQuantQueryBlock : z.rows - first);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const bool int8_qk = o.qk_format == QkFormat::int8;
  const bool per_block = o.qk_granularity == QkScaleGranularity::per_block;
  const int groups = per_block ? 1 : static_cast<int>(kQueryGroupsPerBlock);
  const int64_t kv_head = b * p.heads_kv + h / p.group_size();
  const float* k_mean = z.k_mean + kv_head * dim;
  const int64_t first_bad_key = int8_qk ? first_nonfinite_key(p, z, o, kv_head) : p.seq_kv;
  if (tid < groups) amax_of[tid] = 0u;
  __syncthreads();
  constexpr float kNoMean[kChunk] = {};
  // A warp per row: its group's amax and, with smooth-K, the row's LSE term
  // scale * (q . k_mean) over its finite values, the lanes' sums combined in
  // a fixed order (the same bits every run); int8, the row's row_nan.
  for (int r = warp; r < rows; r += kRowWarps) {
    const int64_t i = z.first_row + first + r;
    const Element* q = row_of<Element>(p.q, p.q_stride, b, h, i);
    float amax = 0.0f, dot = 0.0f;
    bool q_bad = false;
    for (int64_t c = static_cast<int64_t>(lane) * kChunk; c < dim; c += 32 * kChunk) {
      float x[kChunk], mean[kChunk];
      load_chunk(q, c, x);
      q_bad |= any_nonfinite(x, kNoMean);
#pragma unroll
      for (int e = 0; e < kChunk; ++e) amax = fmaxf(amax, amax_term(x[e]));
      if (o.smooth_k) {
        load_mean(k_mean, c, mean);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) dot = fmaf(mean_term(x[e]), mean[e], dot);
      }
    }
    amax = warp_max(amax);
    q_bad = __any_sync(0xFFFFFFFFu, q_bad);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, offset);
    if (lane == 0) {
      group_max(&amax_of[q_scale_index(r, o.qk_granularity)], amax);  // r < 64: the block's own group
      z.lse_shift[head * z.rows + first + r] = p.scale * dot;
      if (int8_qk) {
        // A window's left bound is not looked at: a row whose window starts
        // past the first bad key is marked too (the model does the same).
        const KeyRange keys = attended_keys(p, i, p.seq_q, p.seq_kv);
        const bool reached = (q_bad && keys.end > keys.first) || keys.end > first_bad_key;
        z.row_nan[head * z.rows + first + r] = reached ? __int_as_float(0x7FFFFFFF) : 0.0f;
      }
    }
  }
  __syncthreads();
  if (tid < groups) {
    const float scale = quantization_scale(__uint_as_float(amax_of[tid]), int8_qk ? kInt8Max : kE4m3Max);
    inverse_of[tid] = quantization_inverse(scale);
    z.q_scales[head * q_scale_count(z.rows, o.qk_granularity) + block * groups + tid] = scale;
  }
  __syncthreads();
  for (int r = warp; r < rows; r += kRowWarps) {
    const Element* q = row_of<Element>(p.q, p.q_stride, b, h, z.first_row + first + r);
    uint8_t* codes = z.q_codes + (head * z.rows + first + r) * z.code_pitch;
    const float inverse = inverse_of[q_scale_index(r, o.qk_granularity)];
    for (int64_t c = static_cast<int64_t>(lane) * kChunk; c < dim; c += 32 * kChunk) {
      float x[kChunk];
      load_chunk(q, c, x);
      uint32_t packed[2] = {0u, 0u};
      codes_of(x, kNoMean, inverse, int8_qk, packed);
      store_codes(codes, c, dim, z.code_pitch, packed);
    }
  }
}

// ---- launch ------------------------------------------------------------------

// A null tensor is never read (K and V from an FP8 KV cache; Q when only K
// and V are quantized).
bool rows_aligned(const void* base, const int64_t (&stride)[3]) {
  return base == nullptr || (reinterpret_cast<uintptr_t>(base) % 16 == 0 && stride[0] % kChunk == 0 &&
                             stride[1] % kChunk == 0 && stride[2] % kChunk == 0);
}

// K and V: the means and per-channel V scales (reductions over all keys),
// then the codes.
template <typename Element>
Status launch_key_value_steps(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z,
                              cudaStream_t stream) {
  const unsigned kv_heads = static_cast<unsigned>(p.batch * p.heads_kv);
  const unsigned key_blocks = static_cast<unsigned>(z.key_blocks);
  const bool v_per_channel = o.v_granularity == VScaleGranularity::per_channel;
  const VPartial first_v = o.smooth_v ? VPartial::sum : v_per_channel ? VPartial::amax : VPartial::none;
  if (kv_heads == 0) return {};
  // A thread per 8 channels (at most 128 a CTA: D up to 1024).
  const unsigned column_threads = static_cast<unsigned>(ceil_div(p.head_dim / kChunk, 32) * 32);
  if (key_blocks > 0 && (o.smooth_k || first_v != VPartial::none)) {
    column_partials<Element><<<dim3(key_blocks, kv_heads), column_threads, 0, stream>>>(p, z, o.smooth_k, first_v);
    FFPA_RETURN_IF_DEVICE_ERROR("fp8_prepass", cudaGetLastError());
  }
  // Means are written as zeros without smoothing (the model's), and the
  // per-channel V scales without smooth-V come from the block amax.
  finalize_columns<<<kv_heads, 128, 0, stream>>>(p, z, o.smooth_k ? MeanStep::compute : MeanStep::zero,
                                                 o.smooth_v ? MeanStep::compute : MeanStep::zero,
                                                 v_per_channel && !o.smooth_v);
  FFPA_RETURN_IF_DEVICE_ERROR("fp8_prepass", cudaGetLastError());
  if (v_per_channel && o.smooth_v && key_blocks > 0) {
    column_partials<Element><<<dim3(key_blocks, kv_heads), column_threads, 0, stream>>>(p, z, false,
                                                                                       VPartial::centered_amax);
    FFPA_RETURN_IF_DEVICE_ERROR("fp8_prepass", cudaGetLastError());
  }
  if (v_per_channel && o.smooth_v) {
    finalize_columns<<<kv_heads, 128, 0, stream>>>(p, z, MeanStep::keep, MeanStep::keep, true);
    FFPA_RETURN_IF_DEVICE_ERROR("fp8_prepass", cudaGetLastError());
  }
  if (key_blocks > 0) {
    quantize_kv<Element><<<dim3(key_blocks, kv_heads), kKvThreads, 0, stream>>>(p, z, o);
    FFPA_RETURN_IF_DEVICE_ERROR("fp8_prepass", cudaGetLastError());
  }
  return {};
}

// Q's codes and scales, and the LSE terms from z.k_mean (smooth-K).
template <typename Element>
Status launch_query_step(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z,
                         cudaStream_t stream) {
  const unsigned q_heads = static_cast<unsigned>(p.batch * p.heads_q);
  const int64_t q_blocks = ceil_div(z.rows, kQuantQueryBlock);
  if (q_heads > 0 && q_blocks > 0) {
    quantize_q<Element><<<dim3(static_cast<unsigned>(q_blocks), q_heads), kQThreads, 0, stream>>>(p, z, o);
    FFPA_RETURN_IF_DEVICE_ERROR("fp8_prepass", cudaGetLastError());
  }
  return {};
}

enum class Steps { all, key_values, queries };

template <typename Element>
Status launch_steps(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z,
                    Steps steps, cudaStream_t stream) {
  if (steps != Steps::queries) {
    if (Status status = launch_key_value_steps<Element>(p, o, z, stream); !status.ok()) return status;
  }
  if (steps != Steps::key_values) return launch_query_step<Element>(p, o, z, stream);
  return {};
}

Status launch(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z, Steps steps,
              cudaStream_t stream) {
  Status checked = check_prepass(p, o);
  if (!checked.ok()) return checked;
  return p.dtype == DType::bf16 ? launch_steps<__nv_bfloat16>(p, o, z, steps, stream)
                                : launch_steps<__half>(p, o, z, steps, stream);
}

}  // namespace

Status check_prepass(const AttentionProblem& p, const QuantizationOptions& o) {
  if (o.qk_format == QkFormat::unquantized || o.pv_format == PvFormat::unquantized) {
    return {StatusCode::invalid_option, "fp8 pre-pass: unquantized Q K or P V exists in the CPU model only"};
  }
  if (o.n_early < 0) return {StatusCode::invalid_option, "fp8 pre-pass: n_early is negative"};
  if (o.smooth_v && p.has_dropout()) {
    return {StatusCode::invalid_option,
            "fp8 pre-pass: smooth_v with dropout (the kept weights do not sum to 1: adding V's mean back is wrong)"};
  }
  if (p.head_dim % kChunk != 0 || !rows_aligned(p.q, p.q_stride) || !rows_aligned(p.k, p.k_stride) ||
      !rows_aligned(p.v, p.v_stride)) {
    return {StatusCode::misaligned, "fp8 pre-pass: q, k and v rows must start on 16-byte boundaries"};
  }
  const int64_t kv_heads = p.batch * p.heads_kv, q_heads = p.batch * p.heads_q;
  if (kv_heads > 65535 || q_heads > 65535 || ceil_div(p.seq_kv, kQuantKeyBlock) > INT_MAX ||
      ceil_div(p.seq_q, kQuantQueryBlock) > INT_MAX) {
    return {StatusCode::impl_unavailable, "fp8 pre-pass: more than 65535 heads x batch, or too long a sequence"};
  }
  return {};
}

Status launch_prepass(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z,
                      cudaStream_t stream) {
  return launch(p, o, z, Steps::all, stream);
}

Status launch_quantize_kv(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z,
                          cudaStream_t stream) {
  return launch(p, o, z, Steps::key_values, stream);
}

Status launch_quantize_q(const AttentionProblem& p, const QuantizationOptions& o, const QuantizedBuffers& z,
                         cudaStream_t stream) {
  return launch(p, o, z, Steps::queries, stream);
}

}  // namespace ffpa::detail::fp8_prepass
