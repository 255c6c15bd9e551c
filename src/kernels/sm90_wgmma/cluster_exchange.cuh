// kSplit = 2: S_j += the peer CTA's partial S_j, through distributed shared
// memory (partial_exchange.cuh: thread i's 64 accumulators to slot [q][i] of
// the peer by st.async, one phase per KV block). The S owner sends after it
// has waited for P_{j-1}. Both CTAs then run the same softmax on the same sum
// (a + b == b + a).
#pragma once

#include "kernels/sm90_wgmma/consumer.cuh"
#include "kernels/sm90_wgmma/partial_exchange.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
__device__ __forceinline__ PartialExchange Consumer<Traits>::exchange() const {
  static_assert(Traits::kSplit == 1 || Traits::kExchangeBytes == PartialExchange::kSlotBytes, "one slot layout");
  return PartialExchange{cta.smem() + Traits::kExchangeOffset, cta.x_full(), cta.x_empty(), cta.peer_rank(), thread};
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::send_s(int j, const float (&s)[64]) {
  if constexpr (Traits::kSplit == 2) {
    const PartialExchange x = exchange();
    x.wait_slot_free(j);  // the peer has read our S_{j-1}
    x.send(s, 0);
  }
}

template <class Traits>
__device__ __forceinline__ void Consumer<Traits>::receive_s(int j, float (&s)[64]) {
  if constexpr (Traits::kSplit == 2) {
    const PartialExchange x = exchange();
    x.wait_received(j);
    x.add(s, 0);
    x.release();  // our slot may take S_{j+1}
  }
}

}  // namespace ffpa::detail::sm90_wgmma
