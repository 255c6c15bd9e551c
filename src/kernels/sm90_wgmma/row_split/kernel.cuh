// The row-split CTA (row_split/traits.cuh): a producer warpgroup (thread 0
// issues the TMA loads: row_split/producer.cuh) and kConsumers consumer
// warpgroups, each running the KV blocks over its own 64 rows
// (row_split/consumer.cuh). forward_kernel (kernel.cuh) runs it for the
// row-split instances.
#pragma once

#include <cuda.h>

#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/row_split/consumer.cuh"
#include "kernels/sm90_wgmma/row_split/producer.cuh"

namespace ffpa::detail::sm90_wgmma {

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
  // The block count is read from shared memory where used, never held.
  for (int j = 0; j < cta.tile()->kv_blocks; ++j) {
    float s[Traits::kBlockN / 2];
    float scale[2];
    consumer.compute_s(j, s);
    consumer.softmax(j, s, scale);
    consumer.accumulate_pv(j, s, scale);
  }
  if (cta.writes_partials()) {
    consumer.store_partial();
  } else {
    consumer.store_output(o_map);
  }
}

}  // namespace ffpa::detail::sm90_wgmma
