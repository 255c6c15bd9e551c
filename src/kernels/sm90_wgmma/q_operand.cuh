// Q as the tensor cores' operand type where it differs from the call's
// (Traits::Operand: an e4m3 cache's kernel multiplies f16, whose codes
// widen in one instruction a pair, also for a bf16 call). Both consumer
// warpgroups turn the tile's bf16 Q to f16 in place once it has landed,
// scaled by 2^k so that its largest |q| is in [2^14, 2^15) (f16's largest
// finite value is 65504; every bf16 value of a tile whose largest is M is
// then exact in f16 down to M x 2^-25, below which its products sit far
// under the row's largest); the tile's score scale takes 2^-k back.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

// `thread`: 0..255 over both consumer warpgroups; every one must call it.
template <class Traits>
__device__ __forceinline__ void q_to_operand(const Cta<Traits>& cta, int thread) {
  static_assert(Traits::kCacheCodes && Traits::kOperandBytes == 2, "a 16-bit Q turned to the f16 operand");
  constexpr int kWords = Traits::kQKChunks * Traits::kTileBytes / 16;  // 16-byte words of Q's tiles
  static_assert(kWords % 256 == 0, "every consumer thread the same words");
  uint4* const q = reinterpret_cast<uint4*>(cta.smem() + Traits::kQOffset);
  float largest = 0.0f;  // NaN ignored here (fmaxf); it stays NaN through the conversion
#pragma unroll 4
  for (int i = thread; i < kWords; i += 256) {
    const uint4 word = q[i];
    const uint32_t pairs[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[k]));
      largest = fmaxf(largest, fmaxf(fabsf(v.x), fabsf(v.y)));
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFFu, largest, offset));
  // The statistics buffer is free until the first softmax, which follows
  // the second barrier below.
  float* const scratch = cta.stats();
  if (thread % 32 == 0) scratch[thread / 32] = largest;
  named_barrier_sync(1, 256);
#pragma unroll
  for (int w = 0; w < 8; ++w) largest = fmaxf(largest, scratch[w]);
  // 2^k: k = 14 - the exponent of the largest (0 for a zero, an inf or a
  // NaN tile), within [-113, 30]: 2^k and the score scale's 2^-k are floats.
  const int exponent = static_cast<int>((__float_as_uint(largest) >> 23) & 0xFFu) - 127;
  const int wanted = 14 - exponent;
  const int k = largest > 0.0f && exponent < 128 ? (wanted < -113 ? -113 : wanted > 30 ? 30 : wanted) : 0;
  const float factor = __int_as_float((127 + k) << 23);
#pragma unroll 4
  for (int i = thread; i < kWords; i += 256) {
    const uint4 word = q[i];
    uint32_t pairs[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[j]));
      const __half2 h = __floats2half2_rn(v.x * factor, v.y * factor);
      pairs[j] = *reinterpret_cast<const uint32_t*>(&h);
    }
    q[i] = uint4{pairs[0], pairs[1], pairs[2], pairs[3]};
  }
  if (thread == 0) {
    float* const factors = reinterpret_cast<float*>(cta.smem() + Traits::kCodeFactorsOffset);
    factors[0] *= __int_as_float((127 - k) << 23);  // the score scale: 2^-k
  }
  fence_proxy_async();  // the generic proxy's writes, before the wgmmas read Q
  named_barrier_sync(1, 256);
}

}  // namespace ffpa::detail::sm90_wgmma
