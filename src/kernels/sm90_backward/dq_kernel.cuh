// The sm90 backward's dQ kernel (sm_90a: TMA + wgmma, warp-specialized),
// option B's Q-stationary half (docs/kernels/backward_plan.md): the forward's
// schedule (sm90_wgmma/kernel.cuh) with dO beside Q and dS K in place of P V.
//
// One CTA: 64 query rows of one (batch, head), all of dQ. Three warpgroups:
//   - a producer (one thread issues the TMA loads: dq_producer.cuh);
//   - two consumers; consumer w owns dQ columns [w * kHalfCols, (w + 1) * kHalfCols).
// KV blocks of 64 keys alternate between the consumers: consumer j % 2
// computes S_j = Q K_j^T and dP_j = dO V_j^T (over the whole head dims),
// forms dS_j and publishes it (ds_full); both consumers then add dS_j K_j to
// their half of dQ. Consumer w computes S and dP of its next block before it
// applies the other's dS_{j-1}, so one consumer's elementwise work runs
// while the other's GEMMs keep the tensor cores busy. No atomics: dQ is a
// register accumulation over the row's KV blocks, in order.
#pragma once

#include <cuda.h>

#include "kernels/sm90_backward/dq_consumer.cuh"
#include "kernels/sm90_backward/dq_cta.cuh"
#include "kernels/sm90_backward/dq_producer.cuh"
#include "kernels/sm90_backward/dq_traits.cuh"

namespace ffpa::detail::sm90_backward {

// Consumer w's blocks are j = w, w + 2, ...; before publishing dS_j it adds
// the other consumer's dS_{j-1}, after its last block the other's last one.
template <class Traits>
__device__ __forceinline__ void run_dq_consumer(DqConsumer<Traits>& consumer) {
  for (int j = consumer.w;; j += 2) {
    const bool own = j < consumer.cta.tile()->kv_blocks;
    float s[32], dp[32];
    if (own) consumer.compute_scores(j, s, dp);
    if (j >= 1 && j - 1 < consumer.cta.tile()->kv_blocks) consumer.accumulate_dq(j - 1, false);
    if (!own) break;
    consumer.publish_ds(j, s, dp);
    consumer.accumulate_dq(j, true);
  }
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    dq_kernel(const __grid_constant__ DqArgs args, const __grid_constant__ CUtensorMap q_map,
              const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
              const __grid_constant__ CUtensorMap do_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const DqCta<Traits> cta(args);
  cta.setup();
  const int warpgroup = static_cast<int>(threadIdx.x / 128);
  if (warpgroup == 0) {
    sm90_wgmma::setmaxnreg_decrease<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) DqProducer<Traits>{cta}.run(&q_map, &k_map, &v_map, &do_map);
    return;
  }
  sm90_wgmma::setmaxnreg_increase<Traits::kConsumerRegisters>();
  DqConsumer<Traits> consumer(cta, warpgroup - 1);
  sm90_wgmma::mbarrier_wait(cta.q_full(), 0);
  run_dq_consumer(consumer);
  consumer.store_dq();
#endif
}

}  // namespace ffpa::detail::sm90_backward
