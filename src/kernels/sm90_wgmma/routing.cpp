// Which calls the sm90 family serves, and naming its kernels.
#include <array>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernels/common/tile_schedule.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "kernels/sm90_wgmma/ring.hpp"
#include "kernels/sm90_wgmma/tensor_map.hpp"

namespace ffpa::detail::sm90_wgmma {

// Page sizes that are multiples of kTmaPageRows go by TMA boxes (issued a
// lane each; a box never crosses a page, so these are the page sizes whose
// boxes hold at least kTmaPageRows rows), the others are gathered. On the
// H200 (docs/kernels/serving.md, 2026-12-03, third session), for a decode
// batch whose batched cache took 562 us of kernel time, TMA ran pages 8 / 16
// / 32 / 64 at 861 / 628 / 592 / 568 us (its box rate bounds small boxes)
// and the gather (whole lines a warp) 718 / 712 us at pages 1 / 4, ~0.74 ms
// a call at pages 12 and 20: pages of 8 (and 24, 40, ...) gather faster.
constexpr int64_t kTmaPageRows = 16;
bool gathers_pages(int64_t page_size) { return page_size % kTmaPageRows != 0; }

bool loads_page_groups(const AttentionProblem& problem, int head_dim) {
  return takes_page_groups(head_dim) && problem.sequences.paged() && !problem.kv_e4m3 && !gathers_pages(problem) &&
         !problem.has_dropout() && problem.head_dim == head_dim && problem.dv() == head_dim &&
         page_group_steps(problem).has_value();
}

bool gather_units_fit(const AttentionProblem& problem) {
  // The last row's last unit, where a copy's row + column units end (the
  // instance's width: its boxes cover it); 0xFFFFFFFF marks "no row".
  const std::array<TensorMapShape, 4> shapes = attention_tensor_shapes(problem);
  for (const TensorMapShape& kv : {shapes[1], shapes[2]}) {
    const int64_t width_units = (instance_width(problem) + 63) / 64 * 64 * kv.element_bytes / 16;
    const int64_t last_row = ((kv.batch - 1) * std::abs(kv.stride[0]) + (kv.heads - 1) * std::abs(kv.stride[1]) +
                              (kv.seq - 1) * std::abs(kv.stride[2])) *
                             kv.element_bytes;
    if (last_row / 16 + width_units >= 0xFFFFFFFFll) return false;
  }
  return true;
}

// The instance whose e4m3-cache variant serves an e4m3 cache of `width`
// (takes_cache_codes), or nullptr with the reason.
const Instance* route_cache_codes(const AttentionProblem& problem, int64_t width, std::string* reason) {
  if (cluster_size(static_cast<int>(width)) > 1) {
    *reason = "an e4m3 KV cache above D 512: the cluster kernels take no codes (sm80_split_d serves it)";
    return nullptr;
  }
  if (problem.has_dropout()) {
    *reason = "an e4m3 KV cache with dropout: the e4m3-cache kernels carry no dropout (sm80_split_d serves it)";
    return nullptr;
  }
  if (!gather_units_fit(problem)) {
    *reason = "an e4m3 KV cache whose rows span 64 GiB or more: its converters count rows in 32-bit 16-byte units";
    return nullptr;
  }
  for (int i = 0; i < kInstanceCount; ++i) {
    if (kInstances[i].head_dim >= width && takes_cache_codes(kInstances[i].head_dim)) return &kInstances[i];
  }
  *reason = "an e4m3 KV cache of head dim " + std::to_string(width) +
            ": this build has no e4m3-cache kernel (instances 256 and 512 carry one) that holds it";
  return nullptr;
}

const Instance* route(const AttentionProblem& problem, std::string* reason) {
  if (kInstanceCount == 0) {
    *reason = "this build has no sm_90a kernels (CMAKE_CUDA_ARCHITECTURES without 90)";
    return nullptr;
  }
  if (problem.accumulation == Accumulation::f16) {
    *reason = "fp16 accumulation is served by sm80_split_d only";
    return nullptr;
  }
  // D_qk != D_v: the instance of the wider one (Q and K, or V and O, zero
  // beyond their own width, as any head dim between instances).
  const int64_t width = instance_width(problem);
  const int largest = kInstances[kInstanceCount - 1].head_dim;
  if (width > largest) {
    *reason = "head dim " + std::to_string(width) + " is above " +
              std::to_string(largest) +
              ", the largest this build compiles";
    return nullptr;
  }
  if (problem.seq_q > kMaxSequenceLength || problem.seq_kv > kMaxSequenceLength) {
    *reason = "sequence lengths above " + std::to_string(kMaxSequenceLength);
    return nullptr;
  }
  const int64_t row_blocks = (problem.seq_q + kTileRows - 1) / kTileRows;
  const int64_t tiles = problem.sequences.active ? serving::max_tiles(problem, SequenceTiling{kTileRows, kTileKeys, 1, 0})
                                                 : problem.batch * problem.heads_q * row_blocks;
  if (tiles > INT_MAX / 2) {
    *reason = "more than 2^30 tiles of 64 query rows (B x Hq x ceil(Nq / 64))";
    return nullptr;
  }
  if (problem.softcap > 0.0f && cluster_size(instance_width(problem)) > 1) {
    *reason = "a logit softcap above D 512: the cluster kernels carry no softcap (sm80_split_d serves it)";
    return nullptr;
  }
  if (gathers_pages(problem)) {
    if (cluster_size(instance_width(problem)) > 1) {
      *reason = "a paged cache of page size " + std::to_string(problem.sequences.page_size) +
                " above D 512: the cluster kernels do not gather pages (with the gather's code their dense D 1024"
                " ran 4 % slower: docs/kernels/serving.md; sm80_split_d serves it)";
      return nullptr;
    }
    if (!gather_units_fit(problem)) {
      *reason = "a gathered paged cache (page size " + std::to_string(problem.sequences.page_size) +
                ") whose rows span 64 GiB or more: the gather counts rows in 32-bit 16-byte units";
      return nullptr;
    }
  }
  // Any page size: small pages are gathered with cp.async (gathers_pages),
  // whose 16-byte copies need the alignment TMA needs.
  for (const TensorMapShape& tensor : attention_tensor_shapes(problem)) {
    if (!tensor_map_addressable(tensor)) {
      *reason = "TMA needs 16-byte aligned base addresses and strides";
      return nullptr;
    }
  }
  if (problem.kv_e4m3) return route_cache_codes(problem, width, reason);
  for (int i = 0; i < kInstanceCount; ++i) {
    if (kInstances[i].head_dim >= width) return &kInstances[i];
  }
  return nullptr;  // unreachable: width <= largest
}

bool row_split_serves(const AttentionProblem& problem) {
  return !problem.sequences.paged() && !problem.has_dropout() && !problem.kv_e4m3;
}

const Fp8Instance* route_fp8(const AttentionProblem& problem, std::string* reason) {
  if (kFp8InstanceCount == 0) {
    *reason = "this build has no sm_90a FP8 kernels (FFPA_SM90_FP8_HEAD_DIMS is empty, or no sm_90a target)";
    return nullptr;
  }
  if (problem.dv() != problem.head_dim) {
    *reason = "D_qk != D_v: the FP8 kernels are built for Dv == D";
    return nullptr;
  }
  if (problem.softcap > 0.0f) {
    *reason = "a logit softcap: the FP8 kernels carry no softcap (their scores stay codes until the exponentials)";
    return nullptr;
  }
  std::string why;
  if (route(problem, &why) == nullptr && why.rfind("head dim", 0) != 0) {  // the 16-bit family's other limits hold
    *reason = why;
    return nullptr;
  }
  for (int i = 0; i < kFp8InstanceCount; ++i) {
    if (kFp8Instances[i].head_dim >= problem.head_dim) return &kFp8Instances[i];
  }
  *reason = "head dim " + std::to_string(problem.head_dim) + " is above " +
            std::to_string(kFp8Instances[kFp8InstanceCount - 1].head_dim) + ", the largest FP8 instance of this build";
  return nullptr;
}

bool starts_s_at_mask(const AttentionProblem& problem, int head_dim) {
  if (problem.mask_kind == MaskKind::none || !problem.mask_key_pairs || problem.has_dropout()) return false;
  if (problem.softcap > 0.0f) return false;  // the softcap acts on the scores before the mask is added
  if (packed_heads(problem.group_size(), problem.seq_q, kTileRows) > 1) return false;  // load_mask_pairs: unpacked rows
  const float inverse_scale = 1.0f / problem.scale;
  if (!std::isfinite(inverse_scale) || inverse_scale == 0.0f) return false;
  return cluster_size(head_dim) > 1 || problem.mask_stride[2] != 0;
}

TilePlan plan_tiles(const AttentionProblem& problem, int head_dim, int sm_count) {
  TilePlan plan;
  plan.tile = tile_shape(problem, head_dim);
  const int rows = plan.tile.rows;
  plan.heads_per_tile = packed_heads(problem.group_size(), problem.seq_q, rows);
  if (problem.sequences.active) {
    // A sequence batch: its plan chooses the split on the device, from the
    // batch's lengths, where every sequence is one row block (decode).
    const int slots = sm_count / cluster_size(head_dim);
    if (serving::may_split(problem, rows, plan.heads_per_tile)) plan.split_slots = slots;
    // Decode rows beside longer sequences (a chunked-prefill batch): packed
    // by the batch's bound, each would be one row of a 64-row tile, unsplit,
    // reading its keys alone (GQA 8: 8x the K/V traffic). They run first, in
    // a pass of their own, packed for one row and split.
    const int one_row_heads = packed_heads(problem.group_size(), 1, rows);
    if (problem.batch > 1 && one_row_heads > plan.heads_per_tile) {
      plan.short_rows = rows_per_head(rows, one_row_heads);
      plan.short_heads_per_tile = one_row_heads;
      plan.short_split_slots = slots;
    }
    return plan;
  }
  const int64_t tiles = problem.batch * (problem.heads_q / plan.heads_per_tile) *
                        head_row_blocks(problem.seq_q, rows, plan.heads_per_tile);
  plan.splits = choose_kv_splits(tiles, problem.seq_kv, sm_count / cluster_size(head_dim), plan.tile.keys);
  return plan;
}

Status run(const AttentionProblem& problem, int head_dim, const TileLaunch& tiles, cudaStream_t stream) {
  for (int i = 0; i < kInstanceCount; ++i) {
    if (kInstances[i].head_dim == head_dim) return kInstances[i].launch(problem, tiles, stream);
  }
  return {StatusCode::impl_unavailable, "impl sm90_wgmma: no instance for head dim " +
                                            std::to_string(head_dim) + " in this build"};
}

std::string kernel_name(const AttentionProblem& problem, const Instance& instance) {
  if (runs_row_split(problem, instance.head_dim)) {
    const TileShape tile = tile_shape(problem, instance.head_dim);
    return std::string("sm90_wgmma<") + (problem.dtype == DType::bf16 ? "bf16" : "f16") + ",d" +
           std::to_string(instance.head_dim) + ",m" + std::to_string(tile.rows) + ",n" + std::to_string(tile.keys) +
           ",row-split>";
  }
  const int ctas = cluster_size(instance.head_dim);
  const bool gather = gathers_pages(problem);
  return std::string("sm90_wgmma<") + (problem.dtype == DType::bf16 ? "bf16" : "f16") + ",d" +
         std::to_string(instance.head_dim) + ",m64,n128,s" + std::to_string(ring_stages(ctas)) +
         (ctas == 1 ? "" : ",cluster" + std::to_string(ctas)) + (problem.kv_e4m3 ? ",e4m3-cache>"
          : problem.has_dropout()                             ? ",dropout>"
          : starts_s_at_mask(problem, instance.head_dim) ? ",mask-in-s>"
          : gather                                       ? ",paged-gather>"
          : loads_page_groups(problem, instance.head_dim) ? ",page-groups>"
                                                           : ">");
}

std::string fp8_kernel_name(const AttentionProblem& problem, int head_dim) {
  const QuantizationOptions& q = problem.quantization;
  const int64_t early = q.n_early < problem.seq_q ? q.n_early : problem.seq_q;
  return std::string("sm90_wgmma<") + (problem.dtype == DType::bf16 ? "bf16" : "f16") + ",d" +
         std::to_string(head_dim) + ",m64,n128,s" + std::to_string(ring_stages(cluster_size(head_dim))) +
         (cluster_size(head_dim) == 1 ? "" : ",cluster" + std::to_string(cluster_size(head_dim))) + ",fp8,qk-" +
         (q.qk_format == QkFormat::int8 ? "int8" : "e4m3") +
         (q.qk_granularity == QkScaleGranularity::per_block ? ",qk-per-block" : "") + (q.smooth_k ? "" : ",no-smooth-k") +
         (q.v_granularity == VScaleGranularity::per_block ? ",v-per-block" : "") + (q.smooth_v ? ",smooth-v" : "") +
         (problem.has_dropout() ? ",dropout" : "") + (early > 0 ? ",early" + std::to_string(early) : "") + ">";
}

}  // namespace ffpa::detail::sm90_wgmma
