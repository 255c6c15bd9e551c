// A consumer warpgroup of the dQ kernel: its half of dQ (fp32 in registers)
// and its roles on the KV blocks:
//   compute_scores  S_j = Q K_j^T and dP_j = dO V_j^T (its own blocks, j % 2 == w),
//   publish_ds      P_j from the forward's LSE, dS_j = P_j (z dP_j - delta) as a
//                   16-bit tile (kernels/common/score_gradients.cuh: the
//                   limits, causal alignment, mask and dropout of the forward),
//   accumulate_dq   dQ_w += dS_j K_j[:, half w] (every block, both consumers),
//   store_dq        scale, convert, write its rows and columns.
#pragma once

#include <cstdint>

#include "kernels/common/element.cuh"
#include "kernels/common/score_gradients.cuh"
#include "kernels/sm90_backward/dq_cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/ring.hpp"
#include "kernels/sm90_wgmma/wgmma.cuh"

namespace ffpa::detail::sm90_backward {

template <class Traits>
struct DqConsumer {
  using Element = typename Traits::Element;
  static constexpr int kStages = Traits::kStages, kTileBytes = Traits::kTileBytes;
  static constexpr int kStageBytes = Traits::kStageBytes, kStageTiles = Traits::kStageTiles;
  static constexpr int kScoreStages = Traits::kScoreStages, kProductStages = Traits::kProductStages;
  static constexpr int kHalfCols = Traits::kHalfCols;

  const DqCta<Traits>& cta;
  const int w;  // which half of dQ, and which KV blocks (j % 2 == w)
  float dq[kHalfCols / 2];

  __device__ __forceinline__ DqConsumer(const DqCta<Traits>& cta_, int w_) : cta(cta_), w(w_) {
#pragma unroll
    for (int i = 0; i < kHalfCols / 2; ++i) dq[i] = 0.0f;
  }

  __device__ __forceinline__ static int thread() { return static_cast<int>(threadIdx.x % 128); }
  // Frees ring position `position`: one arrival per warp once its wgmmas have read it.
  __device__ __forceinline__ void release(int position) const {
    if (sm90_wgmma::lane_id() == 0) sm90_wgmma::mbarrier_arrive(cta.empty(position % kStages));
  }

  // One operand's product over the head dim: Traits::kChunks boxes of the
  // stationary tiles at `a_tiles` against the ring's stages from `first`
  // (kStageTiles boxes each), S or dP (64 x 64, fp32) accumulated from zero.
  // Each stage is freed once the wgmmas after it have been issued and the
  // ones reading it retired.
  __device__ __forceinline__ void score_product(float (&acc)[32], uint32_t a_tiles, int first) {
    constexpr int kPartStages = (Traits::kChunks + kStageTiles - 1) / kStageTiles;
#pragma unroll
    for (int ps = 0; ps < kPartStages; ++ps) {
      const int position = first + ps;
      const int stage = position % kStages;
      sm90_wgmma::mbarrier_wait(cta.full(position), cta.full_parity(position));
      sm90_wgmma::wgmma_fence();
      constexpr int kLast = Traits::kChunks - kStageTiles * (kPartStages - 1);
#pragma unroll
      for (int b = 0; b < (ps + 1 < kPartStages ? kStageTiles : kLast); ++b)
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {  // k16 steps: 32 bytes of a 128-byte row
          const int chunk = kStageTiles * ps + b;
          const uint64_t a = sm90_wgmma::smem_descriptor(a_tiles + chunk * kTileBytes + kk * 32, 16, 1024);
          const uint64_t k =
              sm90_wgmma::smem_descriptor(cta.ring() + stage * kStageBytes + b * kTileBytes + kk * 32, 16, 1024);
          sm90_wgmma::wgmma_ss<Element, 64, false>(acc, a, k, (ps | b | kk) != 0);
        }
      sm90_wgmma::wgmma_commit();
      if (ps > 0) {
        sm90_wgmma::wgmma_wait<1>();
        release(position - 1);
      }
    }
    sm90_wgmma::wgmma_wait<0>();
    release(first + kPartStages - 1);
  }

  // S_j and dP_j, streaming K_j and V_j through the ring.
  __device__ __forceinline__ void compute_scores(int j, float (&s)[32], float (&dp)[32]) {
    const int first = sm90_wgmma::ring_k_position(j, kScoreStages, kProductStages);
    sm90_wgmma::fence_operands(s);
    sm90_wgmma::fence_operands(dp);
    score_product(s, cta.q_tiles(), first);
    score_product(dp, cta.do_tiles(), first + Traits::kKStages);
    sm90_wgmma::fence_operands(s);
    sm90_wgmma::fence_operands(dp);
  }

  // dS_j into buffer j % 2 once the other consumer has read dS_{j-2} from it.
  __device__ __forceinline__ void publish_ds(int j, float (&s)[32], const float (&dp)[32]) {
    const int buffer = j & 1;
    if (j >= 2) sm90_wgmma::mbarrier_wait(cta.ds_empty(buffer), ((j >> 1) - 1) & 1);
    write_score_gradients<Traits>(s, dp, cta.p, cta.args.delta, *cta.tile(), cta.block_key(j), cta.args.scale_log2,
                                  nullptr, cta.ds_tile(buffer), static_cast<unsigned>(thread()), cta.args.d_mask_sum,
                                  cta.args.mask_shape);
    sm90_wgmma::fence_proxy_async();
    sm90_wgmma::mbarrier_arrive(cta.ds_full(buffer));
  }

  // dQ_w += dS_j K_j[:, half w]: A = dS_j ([64 rows][64 keys], K-major), B =
  // this consumer's product-part stage ([64 keys][kHalfCols], N-major).
  __device__ __forceinline__ void accumulate_dq(int j, bool own) {
    const int buffer = j & 1;
    sm90_wgmma::mbarrier_wait(cta.ds_full(buffer), (j >> 1) & 1);
    const int position =
        sm90_wgmma::ring_v_part_position(j, cta.tile()->kv_blocks, kScoreStages, 0, w, kProductStages);
    const int stage = position % kStages;
    sm90_wgmma::mbarrier_wait(cta.full(position), cta.full_parity(position));
    sm90_wgmma::fence_operands(dq);
    sm90_wgmma::wgmma_fence();
    const uint32_t ds = smem_address(cta.ds_tile(buffer));
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // k16 steps: 16 keys
      const uint64_t a = sm90_wgmma::smem_descriptor(ds + kk * 32, 16, 1024);
      const uint64_t b = sm90_wgmma::smem_descriptor(cta.ring() + stage * kStageBytes + kk * 16 * 128, kTileBytes, 1024);
      sm90_wgmma::wgmma_ss<Element, kHalfCols, true>(dq, a, b, 1);
    }
    sm90_wgmma::wgmma_commit();
    sm90_wgmma::wgmma_wait<0>();
    sm90_wgmma::fence_operands(dq);
    release(position);
    if (!own && sm90_wgmma::lane_id() == 0) sm90_wgmma::mbarrier_arrive(cta.ds_empty(buffer));
  }

  // dQ = scale x sum dS K, this consumer's columns of rows q0 .. q0 + 63
  // (rows past Nq and columns past D are not written).
  __device__ __forceinline__ void store_dq() const {
    const AttentionProblem& p = cta.p;
    const TileCoordinates* tile = cta.tile();
    const int warp = thread() / 32, lane = thread() % 32, g = lane / 4, t = lane % 4;
    auto* const base = static_cast<Element*>(cta.args.d_q) + tile->batch * cta.args.d_q_stride[0] +
                       static_cast<int64_t>(tile->head) * cta.args.d_q_stride[1];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = tile->q0 + warp * 16 + g + 8 * h;
      if (row >= p.seq_q) continue;
      Element* const out = base + row * cta.args.d_q_stride[2];
#pragma unroll
      for (int i = 0; i < kHalfCols / 8; ++i) {
        const int col = w * kHalfCols + 8 * i + 2 * t;
        if (col < p.head_dim)
          *reinterpret_cast<uint32_t*>(out + col) =
              pack2<Element>(dq[4 * i + 2 * h] * p.scale, dq[4 * i + 2 * h + 1] * p.scale);
      }
    }
  }
};

}  // namespace ffpa::detail::sm90_backward
