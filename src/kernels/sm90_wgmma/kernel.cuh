// The sm90_wgmma attention forward kernel (sm_90a: TMA + wgmma, warp-specialized).
// Two CTA layouts: the row-split kernel (row_split/; family.hpp's
// runs_row_split: instances up to D 256, calls without dropout, a paged or
// an e4m3 cache) splits the tile's rows between the consumers; the others
// split O's columns, as this comment describes.
//
// One CTA: 64 query rows of one (batch, head), all of O. Three warpgroups:
//   - a producer (one thread issues TMA loads into a ring of shared-memory stages;
//     with dropout, its warps 1-3 draw the keep bits: dropout_warps.cuh; a
//     paged cache of small pages is gathered by all 128: producer_gather.cuh,
//     and an e4m3 cache copied and widened by all 128: producer_codes.cuh);
//   - two consumers; consumer w owns columns [w * kHalfCols, (w + 1) * kHalfCols)
//     of O (fp32 in registers: 64 x 512 does not fit one warpgroup).
// KV blocks of 128 keys alternate between the consumers: consumer
// j % 2 computes S_j = Q K_j^T (wgmma over the head dim), runs the online
// softmax (bounds, causal, mask, dropout), writes P_j and the row statistics
// to shared memory and signals p_full; both consumers then rescale their half
// of O and add P_j V_j. Consumer w computes S_j for its next block before it
// applies the other's P_{j-1}, so one consumer's softmax runs while the other
// consumer's GEMMs keep the tensor cores busy.
//
// The ring carries, in order, K_0, K_1, V_0, K_2, V_1, ..., K_{n-1}, V_{n-2},
// V_{n-1}: K runs one block ahead of V, so S_{j+1} never waits for P_j. A K
// block is ceil(chunks / 2) stages of [128 keys][2 x 64 columns]; a V block is
// 4 stages of [64 keys][kHalfCols columns], one per (key half, consumer).
// Every stage has exactly one consumer warpgroup, which frees it (empty
// barrier, one arrival per warp) once its wgmmas have read it.
//
// D > 512 (kSplit = 2): a cluster of two CTAs per tile. CTA r holds columns
// [r * D / 2, (r + 1) * D / 2) of Q and K and of O, so each computes a
// partial S over its half of D; the S owner of each CTA sends its partial to
// the peer through distributed shared memory and adds the peer's (x_full,
// x_empty: one phase per KV block), and both run the same softmax on the same
// sum (a + b == b + a). The ring drops to 3 stages to make room for the
// 32 KB exchange slot.
//
// Why more full barriers than stages: the consumers take positions out of
// order (consumer 1 waits for K_1 while consumer 0 has not received K_0), so a
// consumer may wait for position p before the position that last used p's
// barrier has landed; a parity wait would then see that phase's predecessor
// as complete and read early. Position p completes on barrier p % kFull, and
// p - kFull has always landed when p is waited for: the consumer's previous
// position q has been issued, so every position up to q - kStages has been
// released (the producer refills a stage only then), and p - q is at most
// kKStages + 2 (from its part of V_{j-1} to its part of V_j). Hence
// kFull >= kKStages + 2 + kStages (16).
//
// Launch: one CTA per tile, row block fastest, so the CTAs the hardware runs
// at once are neighbouring row blocks of one head and share its K/V in L2;
// causal row blocks are enumerated longest first. (Persistent variants were
// measured slower: docs/kernels/sm90_wgmma.md.)
#pragma once

#include <cuda.h>

#include "kernels/sm90_wgmma/cluster_exchange.cuh"
#include "kernels/sm90_wgmma/consumer.cuh"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/dropout_warps.cuh"
#include "kernels/sm90_wgmma/epilogue.cuh"
#include "kernels/sm90_wgmma/mainloop.cuh"
#include "kernels/sm90_wgmma/producer.cuh"
#include "kernels/sm90_wgmma/producer_codes.cuh"
#include "kernels/sm90_wgmma/producer_gather.cuh"
#include "kernels/sm90_wgmma/q_operand.cuh"
#include "kernels/sm90_wgmma/row_split/kernel.cuh"
#include "kernels/sm90_wgmma/softmax.cuh"
#include "kernels/sm90_wgmma/traits.cuh"

namespace ffpa::detail::sm90_wgmma {

// The S array of a block: the loop's fresh one, or (kMaskInS) the one carried
// across blocks.
template <class Traits, int kCarried>
__device__ __forceinline__ float (*select_s(float (*fresh)[64], float (*carried)[kCarried]))[64] {
  if constexpr (Traits::kMaskInS) {
    return carried;
  } else {
    return fresh;
  }
}

// Consumer w's blocks are j = w, w + 2, ...; before the softmax of each it
// applies the other consumer's block j - 1 (consumer 0's first block has
// none), and after its last block the other's last one.
template <class Traits>
__device__ __forceinline__ void run_consumer(Consumer<Traits>& consumer) {
  // The block count is read from shared memory where used, never held.
  // Without kMaskInS, S is a fresh array per block: the wgmma's read-write
  // operands would otherwise keep it live across P V. With it, S carries the
  // next block's mask pairs from after P_j is written (preload_mask) to
  // S_{j+2}, their loads running under P_j V_j.
  [[maybe_unused]] float s_carried[Traits::kMaskInS ? 64 : 1];
  if constexpr (Traits::kMaskInS) consumer.preload_mask(consumer.w, s_carried);
  if constexpr (Traits::kSplit == 1 && Traits::kFp8) {
    // With 8-bit operands the other consumer's P_{j-1} V_{j-1} runs on the
    // tensor cores while this one's softmax of S_j, which does not need O,
    // runs; O takes S_j's factor once it is in. Issue and finish stay inside
    // one branch (see below). A/B on the H200 (2026-12-01, B1 H32 N8192):
    // FP8 D320 1.10x, D512 1.03x, causal 1.05x; the 16-bit kernels lose
    // (D512 0.83x: their consumers spill), so they keep the loop after this.
    int j = consumer.w;
    for (; j < consumer.cta.tile()->kv_blocks; j += 2) {
      float s[64];
      consumer.compute_s(j, s);
      float own_scale[2];
      if (j >= 1) {
        const int first = consumer.issue_pv(j - 1, false);
        consumer.softmax_publish(j, s, own_scale);
        consumer.finish_pv(first, j - 1, false);
      } else {
        consumer.softmax_publish(j, s, own_scale);
      }
      consumer.rescale_own_o(j, own_scale);
      consumer.accumulate_pv(j, true);
    }
    if (j >= 1 && j - 1 < consumer.cta.tile()->kv_blocks) consumer.accumulate_pv(j - 1, false);
  } else if constexpr (Traits::kSplit == 1) {
    for (int j = consumer.w;; j += 2) {
      const bool own = j < consumer.cta.tile()->kv_blocks;
      float s_fresh[64];
      float(&s)[64] = *select_s<Traits>(&s_fresh, &s_carried);
      if (own) consumer.compute_s(j, s);
      if (j >= 1 && j - 1 < consumer.cta.tile()->kv_blocks) consumer.accumulate_pv(j - 1, false);
      if (!own) break;
      float own_scale[2];
      consumer.softmax_publish(j, s, own_scale);
      consumer.rescale_own_o(j, own_scale);
      if constexpr (Traits::kMaskInS) consumer.preload_mask(j + 2, s);
      consumer.accumulate_pv(j, true);
    }
  } else {
    // The partial S goes to the peer while P_{j-1} V_{j-1} runs. Issue and
    // finish stay inside one branch: a wgmma group in flight across a branch
    // makes ptxas serialize every wgmma (C7518). (The kSplit = 1 loop in this
    // shape measured 3 % slower, hence two loops.)
    int j = consumer.w;
    for (; j < consumer.cta.tile()->kv_blocks; j += 2) {
      float s_fresh[64];
      float(&s)[64] = *select_s<Traits>(&s_fresh, &s_carried);
      consumer.compute_s(j, s);
      if (j >= 1) {
        const int first = consumer.issue_pv(j - 1, false);
        consumer.send_s(j, s);
        consumer.finish_pv(first, j - 1, false);
      } else {
        consumer.send_s(j, s);
      }
      consumer.receive_s(j, s);
      float own_scale[2];
      consumer.softmax_publish(j, s, own_scale);
      consumer.rescale_own_o(j, own_scale);
      if constexpr (Traits::kMaskInS) consumer.preload_mask(j + 2, s);
      consumer.accumulate_pv(j, true);
    }
    if (j >= 1 && j - 1 < consumer.cta.tile()->kv_blocks) consumer.accumulate_pv(j - 1, false);
  }
}

// The column-split CTA (the header's comment): one 64-row tile, O's columns
// split between two consumers, D > 512 in a cluster of two.
template <class Traits>
__device__ __forceinline__ void run_column_split_cta(const Args& args, const CUtensorMap* q_map,
                                                     const CUtensorMap* k_map, const CUtensorMap* v_map,
                                                     const CUtensorMap* o_map) {
  const Cta<Traits> cta(args);
  cta.setup();
  if (cta.idle()) return;  // the whole cluster: its CTAs share the tile index

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    setmaxnreg_decrease<Traits::kProducerRegisters>();
    // Thread 0 issues every TMA load; with a paged cache its whole warp runs
    // the producer, each lane looking up a page of a block (producer.cuh),
    // or the whole warpgroup gathers the pages (producer_gather.cuh).
    const bool gather = Traits::kGathersPages && args.gather_pages;
    const bool paged = !Traits::kFp8 && args.p.sequences.paged() && !gather;
    if constexpr (Traits::kCacheCodes) {
      // An e4m3 cache, dense or paged: the whole warpgroup copies and widens it.
      CodeProducer<Traits>{cta, static_cast<int>(threadIdx.x)}.run(q_map);
    } else if (gather) {
      if constexpr (Traits::kGathersPages) GatherProducer<Traits>{cta, static_cast<int>(threadIdx.x)}.run(q_map);
    } else if (paged && threadIdx.x < 32) {
      if constexpr (!Traits::kFp8) Producer<Traits, true>{cta, static_cast<int>(threadIdx.x)}.run(q_map, k_map, v_map);
    } else if (!paged && threadIdx.x == 0) {
      if constexpr (!Traits::kPageGroups) Producer<Traits, false>{cta, 0}.run(q_map, k_map, v_map);
    }
    if constexpr (Traits::kDropoutWarps) {
      if (threadIdx.x >= 32) DropoutWarps<Traits>{cta}.run(threadIdx.x - 32);
    }
    if constexpr (Traits::kSplit == 2) cluster_sync();  // every thread of the cluster, producers too
    return;
  }

  setmaxnreg_increase<Traits::kConsumerRegisters>();
  Consumer<Traits> consumer(cta, warpgroup - 1);
  mbarrier_wait(cta.q_full(), 0);
  if constexpr (!std::is_same_v<typename Traits::Operand, typename Traits::Element>) {
    q_to_operand(cta, static_cast<int>(threadIdx.x) - 128);
  }
  run_consumer(consumer);
  if (cta.writes_partials()) {
    consumer.store_partial();
  } else {
    consumer.store_output(o_map);
  }
  if constexpr (Traits::kSplit == 2) cluster_sync();  // the peer may still arrive on our barriers
}

template <class Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    forward_kernel(const __grid_constant__ Args args, const __grid_constant__ CUtensorMap q_map,
                   const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                   const __grid_constant__ CUtensorMap o_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The split-KV combine (a programmatic dependent) may take the SMs this
  // grid's last CTAs leave idle and find its rows there.
  launch_dependent_grid();
  // A serving call's kernel is itself the programmatic dependent of the
  // kernel before it (its plan, or whatever the caller ran): every global
  // read, the plan's and the inputs', follows this wait.
  wait_prerequisite_grid();
  if constexpr (Traits::kRowSplit) {
    run_row_split_cta<Traits>(args, &q_map, &k_map, &v_map, &o_map);
  } else {
    run_column_split_cta<Traits>(args, &q_map, &k_map, &v_map, &o_map);
  }
#endif
}

}  // namespace ffpa::detail::sm90_wgmma
