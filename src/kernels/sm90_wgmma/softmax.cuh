// The S owner's online softmax of S_j (log2 domain), from the shared attention
// pieces (kernels/common): mask, row maxima and sums over the quad, P_j and the
// row statistics (new maximum, rescale factor) published to shared memory for
// the other consumer, dropped elements zeroed as P_j is packed, then this
// consumer's rescale of O.
#pragma once

#include "common/fp8_e4m3.hpp"
#include "kernels/common/element.cuh"
#include "kernels/common/math_constants.hpp"
#include "kernels/common/online_softmax.cuh"
#include "kernels/common/score_mask.cuh"
#include "kernels/common/swizzle.hpp"
#include "kernels/sm90_wgmma/consumer.cuh"

namespace ffpa::detail::sm90_wgmma {

// S_j's keep bits (dropout_warps.cuh): this thread's two words, then the
// buffer is free for block j + 1.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::read_dropout_keep(int j) {
  mbarrier_wait(cta.keep_full(w), (j >> 1) & 1);  // consumer w's (j >> 1)-th block
  const uint32_t* const words = cta.keep_words();
  const int t = quad_lane();
#pragma unroll
  for (int h = 0; h < 2; ++h) dropout_keep[h] = words[row(h) * 4 + t];
  mbarrier_arrive(cta.keep_empty());
}

// Block j's mask pairs into s (loads_mask(j)), for compute_s(j) to start from.
template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::preload_mask(int j, float (&s)[64]) const {
  if (j < cta.tile()->kv_blocks && loads_mask(j)) load_mask_pairs<typename Traits::SLayout>(s, cta.p, *cta.tile(), SCoordinates{*this}, cta.block_key(j) + 2 * quad_lane());
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::softmax_publish(int j, float (&s)[64], float (&scale)[2]) {
  using Layout = typename Traits::SLayout;
  const AttentionProblem& p = cta.p;
  const TileCoordinates* tile = cta.tile();
  const int t = quad_lane();
  const int kv0 = cta.block_key(j);
  // The factor S still carries: 1 when scaled here, else (Traits::kFp8
  // without a mask, a positive scale) this thread's code-to-score factor,
  // which the maximum and the exponentials' FFMA take instead of a multiply
  // per element (the pre-pass's per-thread-group scales cover exactly this
  // thread's rows and keys: one factor per thread and block).
  float factor = 1.0f;
  if constexpr (Traits::kFp8) {
    const float code_factor = cta.args.scale_log2 * q_scale() * k_scale(j);
    const bool fold = p.mask_kind == MaskKind::none && cta.args.scale_log2 > 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const float code_score = Traits::kScoresAsInt ? static_cast<float>(__float_as_int(s[i])) : s[i];
      s[i] = fold ? code_score : code_score * code_factor;
    }
    if (fold) factor = code_factor;
  } else if (Traits::kSoftcap && p.softcap > 0.0f) {
    // Capped scores are in the log2 domain. Never with the mask in S (the
    // softcap acts before the mask: routing.cpp's starts_s_at_mask) nor in a
    // cluster (D > 512: route sends a softcap to sm80_split_d), whose
    // register-bound consumers would spill for the dead code.
    apply_softcap<Layout>(s, softcap_factors(p, cta.score_scale()));
  } else {
    const float score_scale = cta.score_scale();  // an e4m3 cache's k_descale rides in it
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] *= score_scale;
  }
  // Read where used (opaque addresses: not hoisted out of the KV loop, where
  // they would pin registers next to S and O).
  const KeyLimits limits(opaque(cta.sequence())->seq_kv, *opaque(cta.key_bounds()), *tile);
  const SCoordinates coords{*this};
  if (limits.block_needs_masking(kv0, kBlockN)) mask_outside_limits<Layout>(s, limits, coords, kv0 + 2 * t);  // -inf
  if (p.mask_kind != MaskKind::none && !mask_in_s(j)) add_mask<Layout, Traits::kMaskBlocksInFlight, Traits::kMaskPairLoads>(s, p, *tile, coords, kv0 + 2 * t);

  float new_max[2];
  float* const row_sums = cta.row_sums();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float block_max = quad_max(thread_row_max<Layout>(s, h) * factor);  // factor > 0: max commutes
    const RowRescale rescale = rescale_row(running_max(j - 1, h), block_max);
    new_max[h] = rescale.new_max;
    scale[h] = rescale.scale;
    float block_sum = 0.0f;
    // 8-bit P is e4m3(448 p): the factor rides in the exponent, and the row
    // sums count in the same units (the epilogue divides them out).
    exponentiate_row<Layout>(s, h, factor, Traits::kFp8 ? rescale.base - kLog2PScale : rescale.base, block_sum);
    block_sum = quad_sum(block_sum);
    if (t == 0) row_sums[w * 64 + row(h)] = row_sums[w * 64 + row(h)] * scale[h] + block_sum;
  }
  if constexpr (Traits::kDropoutWarps) read_dropout_keep(j);
  const int buffer = j & 1;
  if (j >= 2) mbarrier_wait(cta.p_empty(buffer), ((j >> 1) - 1) & 1);
  unsigned char* const p_tile = cta.smem() + Traits::kPOffset + buffer * Traits::kPBytes;
  auto p_pair = [&](int h, int col) {
    return p_tile + (col / kBoxCols) * kTileBytes + swizzle128<kOperandBytes>(row(h), col % kBoxCols);
  };
  // Dropped elements become 0 as P is packed (their keep bits were read just
  // above). The row sums above are the undropped ones (dropout scales the
  // normalized P).
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float first = s[4 * i + 2 * h], second = s[4 * i + 2 * h + 1];
      if constexpr (Traits::kDropout) {
        if (!(dropout_keep[h] >> (2 * i) & 1u)) first = 0.0f;
        if (!(dropout_keep[h] >> (2 * i + 1) & 1u)) second = 0.0f;
      }
      if constexpr (Traits::kFp8) {
        *reinterpret_cast<uint16_t*>(p_pair(h, 8 * i + 2 * t)) = float2_to_e4m3x2_bits(first, second);
      } else {
        *reinterpret_cast<uint32_t*>(p_pair(h, 8 * i + 2 * t)) = pack2<Operand>(first, second);
      }
    }
  if (t == 0) {
    float* const stats = cta.stats();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      stats[buffer * 128 + row(h)] = new_max[h];
      stats[buffer * 128 + 64 + row(h)] = scale[h];
    }
  }
  fence_proxy_async();
  mbarrier_arrive(cta.p_full(buffer));
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::rescale_own_o(int j, const float (&scale)[2]) {
  const float unit_change = v_unit_change(j);  // 1 but for per-block V scales
  const float factor[2] = {scale[0] * unit_change, scale[1] * unit_change};
  if (warp_rescales(factor[0], factor[1])) {
#pragma unroll
    for (int h = 0; h < 2; ++h) scale_row<typename Traits::OLayout>(o_acc, h, factor[h]);
  }
}

}  // namespace ffpa::detail::sm90_wgmma
