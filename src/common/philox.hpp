// The dropout keep-mask: Philox4x32-10, shared bit for bit by the CPU
// reference and the GPU kernels so that dropout results compare exactly.
//
// For query head h of batch b (bh = b * Hq + h), row i and key j:
//   counter = {j / 4, i, bh, lo32(offset)}
//   key     = {lo32(seed), hi32(seed) ^ hi32(offset)}
//   bits    = Philox4x32-10(counter, key)[j % 4]
//   keep    = bits >= threshold,  threshold = round(p * 2^32) (saturated)
// Kept probabilities are scaled by 1 / (1 - p).
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace ffpa::detail {

struct Philox4 {
  uint32_t x[4];
};

FFPA_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  lo = a * b;
  hi = __umulhi(a, b);
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  lo = static_cast<uint32_t>(p);
  hi = static_cast<uint32_t>(p >> 32);
#endif
}

FFPA_HOST_DEVICE Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, c.x[0], hi0, lo0);
    philox_mulhilo(kMul1, c.x[2], hi1, lo1);
    c = Philox4{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

// Random bits for keys 4*(j/4) .. 4*(j/4)+3 of row i of head bh.
FFPA_HOST_DEVICE Philox4 dropout_bits(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t i,
                                      uint64_t j) {
  const Philox4 counter{{static_cast<uint32_t>(j >> 2), static_cast<uint32_t>(i),
                         static_cast<uint32_t>(bh), static_cast<uint32_t>(offset)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32));
}

// Bits below the threshold drop the element: P(drop) = threshold / 2^32.
inline uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0 + 0.5;
  return t >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(t);
}

FFPA_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t i,
                                   uint64_t j, uint32_t threshold) {
  return dropout_bits(seed, offset, bh, i, j).x[j & 3] >= threshold;
}

}  // namespace ffpa::detail
