// The dropout keep-mask: the stream PyTorch's memory-efficient SDPA kernel
// draws (docs/kernels/sdpa_dropout.md, checked bit for bit against SDPA on an
// H200), shared by the CPU reference and both kernel families, so that
// dropout results compare exactly and a patched model drops what SDPA drops.
//
// Element (bh = b * Hq + h, query row i, key j) of a [B, Hq, Nq, Nkv] call is
// 32-bit word
//   W = offset + u32(bh * Nq * Nkv) + (i * Nkv + j)          (a 64-bit sum)
// of the Philox4x32-10 stream keyed by the seed: word W % 4 of the block at
// counter {lo32(W / 4), hi32(W / 4), 0, 0}, key {lo32(seed), hi32(seed)}.
// u32 wraps as the kernel's 32-bit arithmetic does; i * Nkv + j < 2^32
// (validation asks Nq * Nkv <= 2^32 of a call with dropout). The element is
// kept when its word is >= the threshold: the smallest x with
// float(x) * 2^-32 + 2^-33 > p in fp32, SDPA's test. Kept values are scaled by
// 1 / (1 - p) rounded to the inputs' dtype (SDPA's factor). A call draws
// ceil4(B * Hq * Nq * Nkv) words: the next call's offset.
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

// The word of element (bh, 0, 0): u32(bh * Nq * Nkv) past the offset.
FFPA_HOST_DEVICE uint64_t dropout_head_word(uint64_t offset, uint64_t bh, uint64_t seq_q, uint64_t seq_kv) {
  return offset + static_cast<uint32_t>(bh * seq_q * seq_kv);
}

// The word of element (i, j) of a head whose first word is head_word.
FFPA_HOST_DEVICE uint64_t dropout_word(uint64_t head_word, uint32_t i, uint32_t seq_kv, uint32_t j) {
  return head_word + (i * seq_kv + j);
}

// The four words of the Philox block `counter` (words 4 counter .. 4 counter + 3).
FFPA_HOST_DEVICE Philox4 dropout_block(uint64_t seed, uint64_t counter) {
  return philox4x32_10(Philox4{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Word `index` (0..3) of a block, by selects rather than an indexed load (a
// runtime index into registers would put the block in local memory).
FFPA_HOST_DEVICE uint32_t philox_word(const Philox4& block, uint32_t index) {
  return index == 0 ? block.x[0] : index == 1 ? block.x[1] : index == 2 ? block.x[2] : block.x[3];
}

// The random word `word` of seed's stream.
FFPA_HOST_DEVICE uint32_t dropout_draw(uint64_t seed, uint64_t word) {
  return philox_word(dropout_block(seed, word >> 2), static_cast<uint32_t>(word & 3));
}

// SDPA keeps an element when u = float(x) * 2^-32 + 2^-33 (fp32; u in (0, 1])
// is > float(p); u grows with x, so that is x >= the smallest such x.
inline uint32_t dropout_threshold(float p) {
  auto uniform = [](uint64_t x) { return static_cast<float>(static_cast<uint32_t>(x)) * 0x1p-32f + 0x1p-33f; };
  uint64_t low = 0, high = 0xFFFFFFFFull;  // uniform(2^32 - 1) = 1 > p for every p < 1
  while (low < high) {
    const uint64_t mid = (low + high) / 2;
    if (uniform(mid) > p) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return static_cast<uint32_t>(low);
}

// Whether element (bh, i, j) is kept.
FFPA_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t bh, uint64_t seq_q, uint64_t seq_kv,
                                   uint64_t i, uint64_t j, uint32_t threshold) {
  const uint64_t word = dropout_word(dropout_head_word(offset, bh, seq_q, seq_kv), static_cast<uint32_t>(i),
                                     static_cast<uint32_t>(seq_kv), static_cast<uint32_t>(j));
  return dropout_draw(seed, word) >= threshold;
}

}  // namespace ffpa::detail
