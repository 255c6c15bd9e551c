// A cluster of two CTAs (kSplit = 2) adding each other's partial sums: each
// thread of a warpgroup sends 64 floats to the same thread of the peer, one
// exchange (a phase of the barriers) at a time, through a 32 KB slot in each
// CTA, float4 [16][128 threads] (conflict-free). The stores are st.async: each
// completes 16 bytes on the peer's x_full, so the sender never waits for them;
// the receiver's thread 0 announces the slot's bytes (x_full: one arrival with
// 32 KB of transactions a phase; the peer's bytes may land before it, the
// count going negative until then). The sender first waits on x_empty for the
// peer to have read the exchange before (the receiver arrives remotely once it
// has added it), so the barriers are at most one phase behind. The forward's
// partial S (cluster_exchange.cuh) and the backward's partial S and dP, one
// a phase in the slot's first 16 KB (kernels/sm90_backward/consumer.cuh,
// whose two consumers keep the phases in order), go through it. Barriers at CTA scope, as CUTLASS's
// ClusterBarrier: the data are in the receiver's own shared memory, and the
// release of the x_empty arrival orders the receiver's reads of its own slot
// (cluster scope cost CCTL.IVALL per wait and MEMBAR.GPU per arrival: ncu,
// docs/kernels/sm90_wgmma.md).
#pragma once

#include <cstdint>

#include "kernels/common/shared_memory.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

// This CTA's rank in its cluster (0 without a cluster).
template <int kSplit>
__device__ __forceinline__ int split_rank() {
  if constexpr (kSplit == 1) {
    return 0;
  } else {
    return static_cast<int>(cluster_cta_rank());
  }
}

struct PartialExchange {
  static constexpr int kQuads = 16;                     // float4 a thread and exchange
  static constexpr int kSlotBytes = kQuads * 128 * 16;  // 32 KB
  const unsigned char* slot;  // this CTA's slot
  uint32_t x_full, x_empty; // this CTA's barriers: x_full 1 arrival + kSlotBytes, x_empty 128 arrivals
  uint32_t peer;            // the peer's rank in the cluster
  int thread;               // 0 .. 127 within the warpgroup

  // Exchange `phase` may write the peer's slot: the peer has read phase - 1.
  __device__ __forceinline__ void wait_slot_free(int phase) const {
    if (phase >= 1) mbarrier_wait_cluster(x_empty, (phase - 1) & 1);
  }
  // v's quads into the peer's slot from quad first_quad on.
  template <int N>
  __device__ __forceinline__ void send(const float (&v)[N], int first_quad) const {
    static_assert(N % 4 == 0, "whole float4");
    const uint32_t remote = peer_address(smem_address(slot) + thread * 16, peer);
    const uint32_t remote_full = peer_address(x_full, peer);
#pragma unroll
    for (int q = 0; q < N / 4; ++q)
      store_async_cluster_f32x4(remote + (first_quad + q) * 128 * 16, v[4 * q], v[4 * q + 1], v[4 * q + 2],
                                v[4 * q + 3], remote_full);
  }
  // The peer's exchange `phase` (`bytes` of it: what the peer sends) has
  // landed in this CTA's slot.
  __device__ __forceinline__ void wait_received(int phase, uint32_t bytes = kSlotBytes) const {
    if (thread == 0) expect(bytes);
    wait_landed(phase);
  }
  // The two halves of wait_received, for a slot whose phases are read by more
  // than one warpgroup (the backward's consumers): the reader of a phase
  // announces the next one's bytes once it has read it (one arrival a phase
  // whoever reads next), the first announced at setup.
  __device__ __forceinline__ void expect(uint32_t bytes) const { mbarrier_arrive_expect_tx(x_full, bytes); }
  __device__ __forceinline__ void wait_landed(int phase) const { mbarrier_wait_cluster(x_full, phase & 1); }
  // v += the peer's quads from first_quad on, two loads in flight at a time
  // (all at once would spill the callers' accumulators).
  template <int N>
  __device__ __forceinline__ void add(float (&v)[N], int first_quad) const {
    const float4* const mine = reinterpret_cast<const float4*>(slot) + thread;
#pragma unroll
    for (int q0 = 0; q0 < N / 4; q0 += 2) {
#pragma unroll
      for (int q = q0; q < q0 + 2 && q < N / 4; ++q) {
        const float4 x = mine[(first_quad + q) * 128];
        v[4 * q] += x.x, v[4 * q + 1] += x.y, v[4 * q + 2] += x.z, v[4 * q + 3] += x.w;
      }
      asm volatile("" ::: "memory");
    }
  }
  // This CTA's slot may take the next exchange.
  __device__ __forceinline__ void release() const { mbarrier_arrive_cluster(peer_address(x_empty, peer)); }
};

}  // namespace ffpa::detail::sm90_wgmma
