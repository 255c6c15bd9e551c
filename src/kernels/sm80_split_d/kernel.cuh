// The sm80 split-D attention forward kernel (portable: sm80 .. sm120).
//
// One CTA: kBlockM query rows of one (batch, head), one slice of kOutCols
// columns of O. For every KV tile of kBlockN keys:
//   1. S = Q K^T, streaming Q and K through the shared-memory ring in 64-column
//      chunks of the head dim (any D: partial chunks are zero-filled);
//   2. online softmax in the log2 domain (bounds, causal, mask, dropout); P
//      stays in registers (warps_n == 1) or goes to shared memory (warps_n > 1:
//      the warps of one row split the keys and need each other's P);
//   3. O += P V, streaming V in slices of kPVKeys keys x kOutCols columns.
// Columns of the O slice beyond D are zero-filled by the copies and never
// stored. The roles are members of Cta (cta.cuh), one file each.
//
// A warp owns kWarpRows (16 or 32) rows: with 32, every K or V fragment read
// from shared memory feeds two m16 MMAs, halving shared-memory traffic per MMA.
#pragma once

#include <cmath>

#include "kernels/sm80_split_d/cta.cuh"
#include "kernels/sm80_split_d/epilogue.cuh"
#include "kernels/sm80_split_d/mainloop.cuh"
#include "kernels/sm80_split_d/producer.cuh"
#include "kernels/sm80_split_d/softmax.cuh"
#include "kernels/sm80_split_d/traits.cuh"

namespace ffpa::detail::sm80_split_d {

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1) forward_kernel(const Args args) {
  Cta<Traits> cta(args);
  using CtaT = Cta<Traits>;
  if (cta.idle) return;

  typename CtaT::OAccumulator o_acc;
#pragma unroll
  for (int mt = 0; mt < CtaT::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < CtaT::kOTiles; ++nt) {
      if constexpr (Traits::kAccumF16) {
        o_acc[mt][nt][0] = o_acc[mt][nt][1] = 0u;
      } else {
        o_acc[mt][nt][0] = o_acc[mt][nt][1] = o_acc[mt][nt][2] = o_acc[mt][nt][3] = 0.0f;
      }
    }
  float row_max[CtaT::kRows], row_sum[CtaT::kRows];  // row_sum: this thread's partial sums
#pragma unroll
  for (int r = 0; r < CtaT::kRows; ++r) row_max[r] = -INFINITY, row_sum[r] = 0.0f;

  cta.prime_ring();
  for (int block = 0; block < cta.tile.kv_blocks; ++block) {
    typename CtaT::SAccumulator s_acc;
    cta.compute_s(s_acc);
    float alpha[CtaT::kRows];
    cta.softmax((cta.tile.kv_first + block) * Traits::kBlockN, s_acc, row_max, row_sum, alpha);
    cta.rescale_o(o_acc, alpha);
    typename CtaT::PFragments p_frag;
    cta.write_p(s_acc, p_frag);
    // Unrolled only when P lives in registers (indexed by the step).
#pragma unroll(Traits::kSharedP ? 1 : Traits::kPVSteps)
    for (int step = 0; step < Traits::kPVSteps; ++step) cta.accumulate_pv(p_frag, o_acc, step);
  }
  cta.store_output(o_acc, row_max, row_sum);
}

}  // namespace ffpa::detail::sm80_split_d
