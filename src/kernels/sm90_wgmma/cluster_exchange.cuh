// kSplit = 2: S_j += the peer CTA's partial S_j, through distributed shared
// memory. Thread i sends its 64 accumulators to slot [q][i] of the peer
// (float4 q of 16: conflict-free) and adds what the peer's thread i sent it.
// The stores are st.async: each completes 16 bytes on the peer's x_full, so
// the sender never waits for them (no release of remote stores on its path);
// the receiver's thread 0 announces the slot's bytes (x_full: one arrival
// with kExchangeBytes of transactions a phase; the peer's bytes may land
// before it, the count going negative until then). The S owner sends after it
// has waited for P_{j-1}, and after x_empty says the peer has read S_{j-1}, so
// the barriers are at most one phase behind. Both CTAs then run the same
// softmax on the same sum (a + b == b + a).
#pragma once

#include "kernels/sm90_wgmma/consumer.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::send_s(int j, const float (&s)[64]) {
  if constexpr (Traits::kSplit == 2) {
    if (j >= 1) mbarrier_wait_cluster(cta.x_empty(), (j - 1) & 1);  // the peer has read our S_{j-1}
    const uint32_t remote =
        peer_address(smem_address(cta.smem() + Traits::kExchangeOffset) + thread * 16, cta.peer_rank());
    const uint32_t remote_full = peer_address(cta.x_full(), cta.peer_rank());
#pragma unroll
    for (int q = 0; q < 16; ++q)
      store_async_cluster_f32x4(remote + q * 128 * 16, s[4 * q], s[4 * q + 1], s[4 * q + 2], s[4 * q + 3],
                                remote_full);
  }
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::receive_s(int j, float (&s)[64]) {
  if constexpr (Traits::kSplit == 2) {
    if (thread == 0) mbarrier_arrive_expect_tx(cta.x_full(), Traits::kExchangeBytes);
    mbarrier_wait_cluster(cta.x_full(), j & 1);
    const float4* const mine = reinterpret_cast<const float4*>(cta.smem() + Traits::kExchangeOffset) + thread;
    // Two loads in flight at a time: all sixteen at once would spill S or O.
#pragma unroll
    for (int q0 = 0; q0 < 16; q0 += 2) {
#pragma unroll
      for (int q = q0; q < q0 + 2; ++q) {
        const float4 v = mine[q * 128];
        s[4 * q] += v.x, s[4 * q + 1] += v.y, s[4 * q + 2] += v.z, s[4 * q + 3] += v.w;
      }
      asm volatile("" ::: "memory");
    }
    mbarrier_arrive_cluster(peer_address(cta.x_empty(), cta.peer_rank()));  // our slot may take S_{j+1}
  }
}

}  // namespace ffpa::detail::sm90_wgmma
