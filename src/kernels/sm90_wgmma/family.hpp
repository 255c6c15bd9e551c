// Host-side interface of the sm90 family (TMA + wgmma, sm_90a): the compiled
// instances (one per instantiated head dim, listed by CMake), what the family
// does not serve and why, and running an instance.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "common/attention_problem.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "common/quantization_options.hpp"
#include "kernels/fp8_prepass/workspace.hpp"
#include "kernels/common/softmax_state.hpp"
#include "kernels/common/split_kv.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::sm90_wgmma {

// How a call's tiles are formed (kernels/common/split_kv.hpp): GQA packing
// (heads_per_tile query heads of one KV head in a tile) and split-KV (each
// tile one of `splits` ranges of split_blocks KV blocks, writing partial rows
// into the workspace: Args).
struct TileLaunch {
  int heads_per_tile = 1;
  int splits = 1;
  int split_blocks = 0;
  float* partial_o = nullptr;
  RowSoftmaxState* partial_states = nullptr;
  // Row blocks [first_row_block, first_row_block + row_block_count) of each
  // head, or all of them (0): the FP8 path's hybrid rows.
  int first_row_block = 0;
  int row_block_count = 0;
  // A sequence batch with the KV split on: the CTA slots its plan splits for
  // (Args::split_slots); 0: unsplit.
  int split_slots = 0;
  // A sequence batch: the sequences of the pass its plan was made for (the
  // launch's size; every sequence by default).
  PassRows pass = PassRows{};
};

using Launcher = Status (*)(const AttentionProblem&, const TileLaunch&, cudaStream_t);
using RunnableCheck = Status (*)(DType, int device);

// Defined in launch.cuh, explicitly instantiated per head dim in the
// generated sm90_wgmma_d<D>.cu translation units (compiled for sm_90a only).
template <int kHeadDim>
Status launch_instance(const AttentionProblem& problem, const TileLaunch& tiles, cudaStream_t stream);
// Whether the instance's kernel for the dtype runs on the current device,
// `device` (host/kernel_image.hpp): impl_unavailable when it does not.
template <int kHeadDim>
Status instance_runnable(DType dtype, int device);

// The tile of the column-split kernels (kernel.cuh), for host code (which
// cannot include traits.cuh; launch.cuh asserts that Traits agrees): query
// rows, and keys of a KV block.
constexpr int kTileRows = 64;
constexpr int kTileKeys = 128;

// Whether the instance for head_dim carries the row-split kernel
// (row_split/: the tile's rows split between the consumers, each warpgroup
// 64 rows with all of S and O, P in registers; FA3's structure,
// docs/kernels/sm90_small_d_plan.md) beside its column-split ones: D <= 256
// (H100, N 8192: D 256 662 TFLOP/s against the column split's 435).
constexpr bool has_row_split(int head_dim) { return head_dim <= 256; }
// Whether a call's scores take neither the user's mask nor a softcap, with a
// positive scale: the row split's plain kernels (RowSplitTraits'
// kMaskAndSoftcap false) serve it.
inline bool scores_plain(const AttentionProblem& problem) {
  return problem.mask_kind == MaskKind::none && !(problem.softcap > 0.0f) && problem.scale > 0.0f;
}

// The row-split kernel's consumer warpgroups, 64 tile rows each: three at
// D <= 64 for a dense call of plain scores whose rows pack no heads (FA3's
// 192-row tile there: a consumer's softmax, as long as its products at this
// D, hides under two others' products; TileCoordinates' row shift needs a
// power of two rows a head where heads are packed), else two.
inline int row_split_consumers(const AttentionProblem& problem, int head_dim) {
  const bool three = head_dim <= 64 && !problem.sequences.active && scores_plain(problem) &&
                     packed_heads(problem.group_size(), problem.seq_q, 3 * 64) == 1;
  return three ? 3 : 2;
}
// The row-split kernel's KV block, the fastest measured (H100, N 8192,
// TFLOP/s, docs/perf/row-split-tiles): D 64 192 keys (437 against 128's
// 385, 256's 314: 248 bytes of spills); D 128 128 (626 against 144's 625 and
// 176's 350: 1.3 KB of spills); D 256 80 (673 against 64's 662, though
// ptxas spills 92 bytes: O takes 128 registers a thread). Three consumers
// (160 registers each) hold S, P and O of 128 keys (FA3's RS tile at D 64).
constexpr int row_split_keys(int head_dim, int consumers) {
  return consumers == 3 ? 128 : head_dim > 128 ? 80 : head_dim > 64 ? 128 : 192;
}

// Whether the row-split kernel serves the call: dense inputs or a sequence
// batch of packed or batched keys (no paged cache: its producer loads whole
// blocks, not pages), no dropout (its consumers draw no keep bits), no e4m3
// cache; defined in routing.cpp.
// The instance's column-split kernels serve the others.
bool row_split_serves(const AttentionProblem& problem);
inline bool runs_row_split(const AttentionProblem& problem, int head_dim) {
  return has_row_split(head_dim) && row_split_serves(problem);
}

// The tile a call runs at instance head_dim: query rows and keys of a KV block.
struct TileShape {
  int rows, keys;
};
inline TileShape tile_shape(const AttentionProblem& problem, int head_dim) {
  if (!runs_row_split(problem, head_dim)) return {kTileRows, kTileKeys};
  const int consumers = row_split_consumers(problem, head_dim);
  return {64 * consumers, row_split_keys(head_dim, consumers)};
}

// A serving call's tiling by the kernel of tile shape `tile` (its plan cuts
// the sequences so).
inline SequenceTiling sequence_tiling(TileShape tile, const TileLaunch& tiles) {
  return {tile.rows, tile.keys, tiles.heads_per_tile, tiles.split_slots};
}

// How a paged cache's K and V reach shared memory, by page size: gathered by
// the producer warpgroup with cp.async (producer_gather.cuh; any page size),
// or by TMA, a box per page (paged_box_rows; page sizes that are multiples of
// 16: the 128-byte swizzle repeats every 8 rows, so a box of fewer than 8
// would land inside a swizzle atom, and boxes of 8 rows ran slower than the
// gather). The threshold and its measurements: routing.cpp
// (defined there, so that tuning it rebuilds no kernel).
bool gathers_pages(int64_t page_size);

// Whether the call's K and V come from a paged cache the producer gathers
// (an e4m3 cache's converters copy every cache themselves: producer_codes.cuh).
inline bool gathers_pages(const AttentionProblem& problem) {
  return problem.sequences.paged() && !problem.kv_e4m3 && gathers_pages(problem.sequences.page_size);
}

// Whether a gathered cache's rows (or an e4m3 cache's, which its converters
// copy the same way) all end within 2^32 - 1 16-byte units of the tensor's
// base (the gather keeps a row's offset in one 32-bit word of its row table
// and adds its column's there): false for a cache of 64 GiB or more, which
// the sm90 family then leaves to sm80_split_d.
bool gather_units_fit(const AttentionProblem& problem);

// A paged cache's rows in one TMA load of a box of `rows` keys: the largest
// power of two dividing both the page size and the box (a load never crosses
// a page): at least 16 where !gathers_pages (and a 128-key block stays within
// 16 loads: the producer warp's lanes look up one page-box each).
inline int paged_box_rows(int64_t page_size, int rows) {
  int box = rows;
  while (page_size % box != 0) box /= 2;
  return box;
}

// CTAs per tile of the instance for head_dim: one up to 512, above a cluster
// of two, each with half of D (two warpgroups hold O of 64 x 512 at most).
// The head dim an instance must hold: the wider of D (Q, K) and Dv (V, O).
inline int64_t instance_width(const AttentionProblem& problem) {
  return problem.dv() > problem.head_dim ? problem.dv() : problem.head_dim;
}

constexpr int cluster_size(int head_dim) { return head_dim > 512 ? 2 : 1; }

// Whether the instance for head_dim carries the e4m3-cache variant
// (Traits::kCacheCodes, producer_codes.cuh): Gemma 4's head dims, 256 and
// 512, each a kernel a dtype (an instance for every D would add eight to the
// build); a cache of another D <= 512 takes the next of them up.
constexpr bool takes_cache_codes(int head_dim) { return head_dim == 256 || head_dim == 512; }

// Whether the instance for head_dim carries the page-group variant
// (Traits::kPageGroups: a paged cache's page-boxes one TMA load for all the
// chunks of a stage): Gemma 4's head dims again, a kernel a dtype each.
constexpr bool takes_page_groups(int head_dim) { return head_dim == 256 || head_dim == 512; }

// Whether the call runs instance head_dim's page-group variant: a 16-bit
// paged cache loaded by TMA (!gathers_pages), D = Dv = head_dim (the variant
// loads exactly the instance's chunks: a folded head's next chunk is another
// head's, not TMA's zero fill), and K's and V's maps fold the KV head alike
// (tensor_map.hpp's page_group_steps). Defined in routing.cpp.
bool loads_page_groups(const AttentionProblem& problem, int head_dim);

// Whether a call without dropout runs the instance for head_dim that starts S
// at the mask (Traits::kMaskInS): a mask read by key pairs, 1 / scale finite
// and non-zero, and a mask whose rows differ, or any such mask in a cluster;
// never with GQA packing (decode: the softmax adds the mask there).
// A/B on the H200 (2026-12-01, B1 H32 N8192, docs/perf/h200-2026-12-01b/):
// row and full masks 1.14-1.33x at D = 320/512, every mask 1.34-1.71x at
// D = 1024; a [B,1,1,Nkv] key mask no faster at D = 320/512 (0.99: it is read
// from L1 in the softmax there).
bool starts_s_at_mask(const AttentionProblem& problem, int head_dim);

struct Instance {
  int head_dim;  // a multiple of 64; serves every D up to it
  Launcher launch;
  RunnableCheck runnable;
};

// Generated from FFPA_SM90_HEAD_DIMS (registry.cpp.in), ascending head_dim;
// empty when the build has no sm_90a target.
extern const Instance kInstances[];
extern const int kInstanceCount;

// The compiled instance that serves the call (the smallest head_dim >= D), or
// nullptr when the family does not serve it; then *reason says why. Every
// call this family declines is decided here.
const Instance* route(const AttentionProblem& problem, std::string* reason);

// Runs the instance for head_dim (a planned call's padded_head_dim).
Status run(const AttentionProblem& problem, int head_dim, const TileLaunch& tiles, cudaStream_t stream);

// How the call's tiles are formed on a device with `sm_count` SMs (one CTA
// each, a cluster of cluster_size(head_dim) per tile): the GQA heads a tile
// packs (split_kv.hpp's packed_heads) and the KV splits of its tiles
// (choose_kv_splits; one split, no partials, when the tiles fill the device).
// A sequence batch whose bound on Nq_b packs fewer heads than one row would
// (decode rows beside a prefill chunk) runs in two passes: first its
// sequences of at most short_rows query rows, short_heads_per_tile heads a
// tile, split for short_split_slots CTA slots; then the rest as the fields
// above say. short_rows 0: one pass.
struct TilePlan {
  TileShape tile{};  // tile_shape(problem, head_dim)
  int heads_per_tile = 1;
  KvSplits splits;
  int split_slots = 0;  // a sequence batch that may split its keys: the plan chooses for these slots
  int short_rows = 0, short_heads_per_tile = 1, short_split_slots = 0;
};
TilePlan plan_tiles(const AttentionProblem& problem, int head_dim, int sm_count);

// The FP8 path's instances (Traits::kFp8, launch.cuh: launch_fp8), listed by
// CMake from FFPA_SM90_FP8_HEAD_DIMS: the kernel after the pre-pass has
// quantized the call into `buffers` (kernels/fp8_prepass/).
using Fp8Launcher = Status (*)(const AttentionProblem&, const QuantizationOptions&,
                               const fp8_prepass::QuantizedBuffers&, cudaStream_t);
template <int kHeadDim>
Status launch_fp8_instance(const AttentionProblem& problem, const QuantizationOptions& options,
                           const fp8_prepass::QuantizedBuffers& buffers, cudaStream_t stream);

struct Fp8Instance {
  int head_dim;  // serves every D up to it
  Fp8Launcher launch;
};
extern const Fp8Instance kFp8Instances[];
extern const int kFp8InstanceCount;

// The FP8 instance that serves the call, or nullptr with the reason.
const Fp8Instance* route_fp8(const AttentionProblem& problem, std::string* reason);

// Human-readable name of the FP8 path's kernel, e.g.
// "sm90_wgmma<bf16,d512,m64,n128,s4,fp8,qk-int8,early256>".
std::string fp8_kernel_name(const AttentionProblem& problem, int head_dim);

// Human-readable name of an instance, e.g. "sm90_wgmma<bf16,d512,m64,n128,s4>".
std::string kernel_name(const AttentionProblem& problem, const Instance& instance);

}  // namespace ffpa::detail::sm90_wgmma
