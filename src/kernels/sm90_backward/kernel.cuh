// The sm90 backward kernels (sm_90a: TMA + wgmma, warp-specialized): dQ, dK
// and dV, each the forward's schedule (sm90_wgmma/kernel.cuh) with its own
// stationary and streamed operands (arguments.hpp's roles).
//
// One CTA: 64 stationary rows (query rows of a head for dQ, keys of a KV head
// for dK and dV) and all of their gradient's columns (above D 512 a cluster of
// two, each with half of the columns, adding each other's partial S and dP). Three warpgroups:
//   - a producer (one thread issues the TMA loads: producer.cuh);
//   - two consumers; consumer w owns gradient columns [w * kHalfCols, (w + 1) * kHalfCols).
// Streamed blocks of 64 rows (keys for dQ; query rows of every head of the
// GQA group for dK and dV) alternate between the consumers: consumer j % 2
// computes S_j (and dP_j) over the whole head dims, forms W_j and publishes
// it (w_full); both consumers then add W_j (dQ) or W_j^T (dK, dV) times the
// block's rows to their half. Consumer w computes the scores of its next
// block before it applies the other's W_{j-1}, so one consumer's elementwise
// work runs while the other's GEMMs keep the tensor cores busy. No atomics:
// every gradient is a register accumulation over the CTA's blocks in order
// (GQA's sum over the group's query heads included), so it is bit-reproducible.
#pragma once

#include <cuda.h>

#include "kernels/sm90_backward/consumer.cuh"
#include "kernels/sm90_backward/cta.cuh"
#include "kernels/sm90_backward/producer.cuh"
#include "kernels/sm90_backward/traits.cuh"

namespace ffpa::detail::sm90_backward {

// Consumer w's blocks are j = w, w + 2, ...; before publishing W_j it adds the
// other consumer's W_{j-1}, after its last block the other's last one.
template <class Traits>
__device__ __forceinline__ void run_consumer(Consumer<Traits>& consumer) {
  for (int j = consumer.w;; j += 2) {
    const bool own = j < consumer.cta.plan()->blocks;
    float s[32], dp[32];  // dp: unused by dv (its compute_scores leaves it alone)
    if (own) consumer.compute_scores(j, s, dp);  // kSplit = 2: sends the last partial
    if (j >= 1 && j - 1 < consumer.cta.plan()->blocks) consumer.accumulate(j - 1, false);
    if (!own) break;
    consumer.add_last_partial(j, s, dp);  // kSplit = 2
    consumer.publish_w(j, s, dp);
    consumer.accumulate(j, true);
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    backward_kernel(const __grid_constant__ Args args, const __grid_constant__ CUtensorMap q_map,
                    const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                    const __grid_constant__ CUtensorMap do_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The next role's kernel (launch.cuh) may take the SMs this grid's last CTAs leave idle.
  sm90_wgmma::launch_dependent_grid();
  const Cta<Traits> cta(args);
  cta.setup();
  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  if (warpgroup == 0) {
    sm90_wgmma::setmaxnreg_decrease<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) {
      const CUtensorMap* const maps[4] = {&q_map, &k_map, &v_map, &do_map};
      Producer<Traits>{cta}.run(maps);
    }
    if constexpr (Traits::kSplit == 2) sm90_wgmma::cluster_sync();  // every thread of the cluster
    // Complete after the role's kernel launched before this one: the three
    // complete in stream order, so what follows them on the stream sees all
    // three gradients (it waits for the last).
    if (threadIdx.x == 0) sm90_wgmma::wait_prerequisite_grid();
    return;
  }
  sm90_wgmma::setmaxnreg_increase<Traits::kConsumerRegisters>();
  if (!cta.plan()->idle) {  // a sequence batch's CTA past its plan's tiles: nothing loaded, nothing to store
    Consumer<Traits> consumer(cta, warpgroup - 1);
    sm90_wgmma::mbarrier_wait(cta.stationary_full(), 0);
    run_consumer(consumer);
    consumer.store();
  }
  if constexpr (Traits::kSplit == 2) sm90_wgmma::cluster_sync();  // the peer may still arrive on our barriers
#endif
}

}  // namespace ffpa::detail::sm90_backward
