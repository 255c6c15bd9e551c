// The row-split CTA (row_split/traits.cuh): a producer warpgroup (thread 0
// issues the TMA loads: row_split/producer.cuh) and kConsumers consumer
// warpgroups, each running the KV blocks over its own 64 rows
// (row_split/consumer.cuh). forward_kernel (kernel.cuh) runs it for the
// calls family.hpp's runs_row_split gives it.
#pragma once

#include <cuda.h>

#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/row_split/consumer.cuh"
#include "kernels/sm90_wgmma/row_split/producer.cuh"

namespace ffpa::detail::sm90_wgmma {

// Turns between the consumers (RowSchedule::ping_pong, FA3's warp
// scheduler barriers), round robin: consumer w issues its products after
// waiting at barrier kTurnBarrier + w, then arrives at its successor's. The
// last consumer arrives once at the start (consumer 0 goes first) and not
// after its last block, so that every barrier's waits and arrivals pair up:
// barrier w sees kv_blocks waits of consumer w and kv_blocks arrivals of its
// predecessor (every consumer runs the tile's kv_blocks). Each barrier
// counts its waiter's and its arriver's 128 threads.
template <class Traits>
struct Turns {
  static constexpr int kLast = Traits::kConsumers - 1;
  const int w;
  __device__ __forceinline__ void start() const {
    if constexpr (Traits::kSchedule == RowSchedule::ping_pong) {
      if (w == kLast) named_barrier_arrive(Traits::kTurnBarrier, 256);
    }
  }
  __device__ __forceinline__ void wait() const {
    if constexpr (Traits::kSchedule == RowSchedule::ping_pong) named_barrier_sync(Traits::kTurnBarrier + w, 256);
  }
  __device__ __forceinline__ void pass(bool last) const {
    if constexpr (Traits::kSchedule == RowSchedule::ping_pong) {
      if (!(w == kLast && last)) named_barrier_arrive(Traits::kTurnBarrier + (w == kLast ? 0 : w + 1), 256);
    }
  }
};

// The blocks one after another: S_j, its softmax, P_j V_j.
template <class Traits>
__device__ __forceinline__ void run_blocks_serially(RowSplitConsumer<Traits>& consumer) {
  for (int j = 0; j < consumer.cta.tile()->kv_blocks; ++j) {
    float s[Traits::kBlockN / 2];
    float scale[2];
    uint32_t p[Traits::kBlockN / 16][4];
    consumer.compute_s(j, s);
    consumer.softmax(j, s, scale);
    consumer.pack_p(s, p);
    consumer.rescale_o(scale);
    if (j + 1 == consumer.cta.tile()->kv_blocks) consumer.clear_last_v_block(j);
    consumer.issue_pv(j, p);
    consumer.finish_pv(j);
  }
}

// S_{j+1} and P_j V_j issued together; the softmax of S_{j+1} runs while
// P_j V_j does. O takes block j's factor between the two issues, under
// S_{j+1} on the tensor cores (FA3's order), not on the way to the next
// turn. The issues and their waits stay within one iteration (a wgmma group
// in flight across a branch makes ptxas serialize every wgmma: kernel.cuh).
template <class Traits>
__device__ __forceinline__ void run_blocks_overlapped(RowSplitConsumer<Traits>& consumer) {
  const Turns<Traits> turns{consumer.w};
  if (consumer.cta.tile()->kv_blocks == 0) return;
  uint32_t p[Traits::kBlockN / 16][4];
  float scale[2];  // the factor O takes before the next P V: the last softmax's
  turns.start();
  {
    float s[Traits::kBlockN / 2];
    turns.wait();
    consumer.issue_s(0, s);
    turns.pass(consumer.cta.tile()->kv_blocks == 1);
    wgmma_wait<0>();
    fence_operands(s);
    consumer.release(consumer.k_position(0));
    consumer.softmax(0, s, scale);
    consumer.pack_p(s, p);
  }
  for (int j = 1; j < opaque(consumer.cta.tile())->kv_blocks; ++j) {
    float s[Traits::kBlockN / 2];
    turns.wait();
    consumer.issue_s(j, s);
    consumer.rescale_o(scale);
    consumer.issue_pv(j - 1, p);
    turns.pass(j + 1 == opaque(consumer.cta.tile())->kv_blocks);
    consumer.finish_s_under_pv(j, s);
    consumer.softmax(j, s, scale);
    consumer.finish_pv(j - 1);
    consumer.pack_p(s, p);
  }
  const int last = consumer.cta.tile()->kv_blocks - 1;
  consumer.clear_last_v_block(last);
  consumer.rescale_o(scale);
  consumer.issue_pv(last, p);
  consumer.finish_pv(last);
}

template <class Traits>
__device__ __forceinline__ void run_row_split_cta(const Args& args, const CUtensorMap* q_map, const CUtensorMap* k_map,
                                                  const CUtensorMap* v_map, const CUtensorMap* o_map) {
  const Cta<Traits> cta(args);
  cta.setup();
  if (cta.idle()) return;
  const int warpgroup = static_cast<int>(threadIdx.x) / 128;
  if (warpgroup == 0) {
    setmaxnreg_decrease<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) RowSplitProducer<Traits>{cta}.run(q_map, k_map, v_map);
    return;
  }
  setmaxnreg_increase<Traits::kConsumerRegisters>();
  RowSplitConsumer<Traits> consumer(cta, warpgroup - 1);
  mbarrier_wait(cta.q_full(), 0);
  if constexpr (Traits::kSchedule == RowSchedule::serial) {
    run_blocks_serially(consumer);
  } else {
    run_blocks_overlapped(consumer);
  }
  if (cta.writes_partials()) {
    consumer.store_partial();
  } else {
    consumer.store_output(o_map);
  }
}

}  // namespace ffpa::detail::sm90_wgmma
