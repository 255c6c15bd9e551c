// The compile-time shape of an sm90_wgmma kernel instance, its shared-memory
// layout, and its launch arguments.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/attention_problem.hpp"
#include "kernels/common/accumulator_layout.cuh"
#include "kernels/common/element.cuh"
#include "kernels/common/softmax_state.hpp"
#include "kernels/common/swizzle.hpp"
#include "kernels/common/tile_schedule.hpp"
#include "kernels/sm90_wgmma/page_map_steps.hpp"
#include "kernels/sm90_wgmma/ring.hpp"

namespace ffpa::detail::sm90_wgmma {

// What the tensor cores multiply: the inputs themselves (bf16 or fp16), or
// the FP8 path's 8-bit codes written by its pre-pass (kernels/fp8_prepass/):
// Q K^T in e4m3 (fp32 accumulation) or int8 (s32), P V in e4m3 with V
// transposed (8-bit wgmma takes only K-major B). The attention pieces
// (masks, causal, dropout, the online softmax) are the same for all three.
enum class Operands : int { input, e4m3, int8_qk };

// How K and V reach the ring stages, a kernel variant each (the consumers'
// descriptors and the producer's code differ; a run-time choice cost the
// dense kernels 3-4 %, H200 2026-12-03):
// - boxes: TMA boxes of 128-byte rows, a box per 64-column chunk (dense K and
//   V, or a page's rows), or small pages gathered (kGathersPages);
// - page_groups: a paged cache whose pages are multiples of 16 rows, one TMA
//   load a page-box for all the chunks of a stage, the stage laid out in
//   8-key groups of all its chunks (kPageGroups below; family.hpp's
//   takes_page_groups);
// - cache_codes: an e4m3 cache copied and widened by the producer warpgroup
//   (kCacheCodes below; family.hpp's takes_cache_codes).
enum class KvLoad : int { boxes, page_groups, cache_codes };

template <typename Element_, int kQKChunks_, int kHalfCols_, int kSplit_, bool kDropout_ = false,
          bool kMaskInS_ = false, Operands kOperands_ = Operands::input, KvLoad kKvLoad_ = KvLoad::boxes>
struct Traits {
  using Element = Element_;  // q, k, v and o in memory (bf16 or fp16)
  static constexpr Operands kOperands = kOperands_;
  static constexpr bool kFp8 = kOperands != Operands::input;
  static constexpr bool kQkInt8 = kOperands == Operands::int8_qk;
  // Dropout is compiled in or out: with it, the S owners (D <= 512) or the
  // producer warpgroup's three idle warps (D > 512, dropout_warps.cuh) draw
  // each block's keep bits (kDropoutWarps below), and the kernel without it
  // carries no Philox code and no keep-bit barriers.
  static constexpr bool kDropout = kDropout_;
  // The mask as S's starting value (score_mask.cuh), compiled in or out: with
  // it, each consumer loads its next block's mask pairs into S's registers
  // after writing P, under P V, and the softmax does no mask work; S then
  // lives across the whole loop, which costs the kernels without a mask 7 %
  // at D = 512 (A/B, H200, 2026-12-01), so they do not carry it. Not with
  // dropout: its consumers spilled (ptxas, 232 registers beside the dropout
  // warps: 11 -> 127 at D = 512).
  static constexpr bool kMaskInS = kMaskInS_;
  static_assert(!(kDropout && kMaskInS), "dropout kernels add the mask in the softmax");
  // K and V arrive as e4m3 codes (a serving engine's FP8 KV cache): the
  // producer warpgroup copies them into the ring and widens them there to
  // Element (producer_codes.cuh); the descales act on the scores and on O.
  // A variant of the plain one-CTA kernel of a head dim (family.hpp's
  // takes_cache_codes).
  static constexpr KvLoad kKvLoad = kKvLoad_;
  static constexpr bool kCacheCodes = kKvLoad == KvLoad::cache_codes;
  // The 16-bit type the tensor cores multiply (Q, K, P, V in shared
  // memory): Element, or f16 for an e4m3 cache, whose codes widen to f16 in
  // one instruction a pair (to bf16 in four: a bf16 call's decode ran 1.04
  // ms against f16's 0.85 on the H200) and whose bf16 Q is turned to f16 at
  // the tile's start (q_operand.cuh).
  using Operand = std::conditional_t<kCacheCodes, __half, Element_>;
  static_assert(kKvLoad == KvLoad::boxes || (kOperands_ == Operands::input && !kDropout && !kMaskInS && kSplit_ == 1),
                "an e4m3 cache or page groups: a variant of the plain one-CTA kernel");
  // A paged cache in key groups: one TMA load brings a page-box's rows for
  // every chunk of a stage (tensor_map.hpp's page_group_spec; boxes 2 or
  // kHalfCols / 64 times larger than a chunk's, which TMA moves faster: page
  // 16 decode 0.653 -> 0.60 ms on the H200 with the layout's strides read at
  // run time, 0.92 of dense as this variant on an H100:
  // docs/kernels/serving.md), and the
  // stages hold 8-key groups of all their chunks, a group after a group: K
  // [16 groups][2 chunks][8 keys][128 bytes] (wgmma's 8-row groups 2 KB
  // apart), V [8 groups][kHalfCols / 64 chunks][8 keys][128 bytes] (chunks
  // 1 KB apart, 8-key groups kHalfCols x 16 bytes apart), not chunk after
  // chunk. A K stage is two whole chunks (kQKChunks even).
  static constexpr bool kPageGroups = kKvLoad == KvLoad::page_groups;
  static_assert(!kPageGroups || kQKChunks_ % 2 == 0, "a K stage of two chunks");
  static constexpr int kElementBytes = ElementTraits<Element>::kBytes;
  static constexpr int kOperandBytes = kFp8 ? 1 : kElementBytes;   // of Q, K, P and V in shared memory
  static constexpr int kBoxCols = kSwizzleCols<kOperandBytes>;     // operand columns of a 128-byte swizzle row
  static constexpr int kOutBoxCols = kSwizzleCols<kElementBytes>;  // O's columns of a 128-byte swizzle row
  static constexpr int kQKChunks = kQKChunks_;  // kBoxCols-column chunks of this CTA's part of S = Q K^T
  static constexpr int kHalfCols = kHalfCols_;  // columns of O per consumer warpgroup
  static constexpr int kSplit = kSplit_;        // CTAs of a cluster sharing one tile (1 or 2)
  // The int8 Q K^T's s32 scores reach the softmax as integers with one CTA;
  // in a cluster compute_s converts them before the exchange adds the peer's
  // (exact: a partial sum over 512 channels is below 2^23, the total below 2^24).
  static constexpr bool kScoresAsInt = kQkInt8 && kSplit == 1;
  static constexpr int kOutCols = 2 * kHalfCols;  // columns of O per CTA
  static constexpr bool kRowSplit = false;  // (row_split/traits.cuh: rows split between the consumers)
  static constexpr int kBlockM = 64;   // query rows: one wgmma M
  static constexpr int kBlockN = 128;  // keys per KV block: the N of S
  static constexpr int kThreads = 384;
  static constexpr int kDropoutThreads = 96;  // warps 1-3 of the producer warpgroup
  // Who draws dropout's keep bits. At D <= 512 each S owner draws its block's
  // while its S wgmmas run (Consumer::draw_keep), off the softmax's path and
  // with 240 registers: 1.15-1.27x the dropout warps at D = 320/512. In a
  // cluster (D > 512) the S wgmmas are half as long and the draws would
  // lengthen them: there warps 1-3 of the producer warpgroup draw a block
  // ahead (dropout_warps.cuh; owner draws measured 0.84x at D = 1024). A/B on
  // the H200, 2026-12-01: docs/kernels/sm90_wgmma.md.
  static constexpr bool kDropoutWarps = kDropout && kSplit == 2;
  // Registers per thread after setmaxnreg. The warpgroups trade within what
  // the launch gave the CTA (168 a thread: 64K / 384, a multiple of 8); a
  // consumer's setmaxnreg.inc waits until the producer's dec has freed enough,
  // so a split past the launch's pool hangs. Without dropout, 24 + 2 x 240 is
  // all of it. With dropout warps, their Philox throughput bounded the kernel
  // (ncu, 2026-12-01: they never wait; ~85 instructions a Philox block, one
  // dependent chain): 40 registers let them run two chains, and the consumers
  // fit 232 (+5-8 % at D = 320/512/1024, A/B on the H200).
  static constexpr int kLaunchRegisters = 168;
  // The code converters (kCacheCodes) hold a row table's eight entries and
  // chunks' codes and outputs, several in flight.
  static constexpr int kProducerRegisters = kCacheCodes ? 56 : kDropoutWarps ? 40 : 24;
  static constexpr int kConsumerRegisters = kCacheCodes ? 224 : kDropoutWarps ? 232 : 240;
  static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kLaunchRegisters,
                "setmaxnreg redistributes the launch's registers: more would never be granted");
  static constexpr int kStages = ring_stages(kSplit);
  static constexpr int kKStages = (kQKChunks + 1) / 2;  // ring stages per K block
  // Ring stages per V block: [64 keys][kHalfCols] per (key half, consumer),
  // or (kFp8) one V^T tile [kHalfCols][128 keys] per consumer.
  static constexpr int kVStages = kFp8 ? 2 : kRingVStages;
  // S of a consumer warp: one 16-row slab, kBlockN / 8 column blocks.
  using SLayout = AccumulatorLayout<1, kBlockN / 8>;
  // This consumer's half of O: one slab, kHalfCols / 8 column blocks.
  using OLayout = AccumulatorLayout<1, kHalfCols / 8>;
  // Whether the kernel carries the logit softcap (kernels that never get one
  // leave its code out: their consumers run at the register file's edge).
  static constexpr bool kSoftcap = !kMaskInS && kSplit == 1 && !kFp8;
  // Whether the kernel carries the paged gather (producer_gather.cuh: the
  // whole producer warpgroup loads K and V with cp.async). A sequence batch
  // takes no mask or dropout (docs/serving.md), so only the plain 16-bit
  // kernels meet a paged cache; the dropout warps would need the warpgroup.
  // Not the cluster kernels: with the gather's code in them, their dense
  // D = 1024 ran 4 % slower (A/B, H200, 2026-12-03; ptxas: the kernel's
  // spills 228/612 B with it, 28/44 B without); sm80_split_d serves their
  // gathered caches (routing.cpp).
  static constexpr bool kGathersPages = !kFp8 && !kDropout && !kMaskInS && kSplit == 1 && kKvLoad == KvLoad::boxes;
  // How the softmax reads the user's mask (score_mask.cuh): column blocks of
  // loads in flight, and whether a key pair is one load. The most that do not
  // spill: the cluster kernels' consumers hold more, and either the pair path
  // or 8 blocks in flight there spills 24 bytes (ptxas, 2026-11-30).
  static constexpr int kMaskBlocksInFlight = kSplit == 1 ? 8 : 4;
  static constexpr bool kMaskPairLoads = kSplit == 1;

  static constexpr int kTileBytes = 64 * kSwizzleRowBytes;      // [64 rows][128 bytes]: Q, P, O, V boxes
  static constexpr int kKBoxBytes = kBlockN * kSwizzleRowBytes;  // [128 keys][kBoxCols]
  static constexpr int kVBoxRows = 64;  // V's TMA box: a key half
  static constexpr int kVStageBytes = kFp8 ? kHalfCols * kSwizzleRowBytes : (kHalfCols / kBoxCols) * kTileBytes;
  static constexpr int kStageBytes = 2 * kKBoxBytes > kVStageBytes ? 2 * kKBoxBytes : kVStageBytes;
  // Q, then (after the last S) the O staging of the TMA stores.
  static constexpr int kQTiles = kQKChunks > kOutCols / kOutBoxCols ? kQKChunks : kOutCols / kOutBoxCols;
  static constexpr int kPBytes = (kBlockN / kBoxCols) * kTileBytes;  // one P buffer

  // Where a stage's chunks and 8-key groups lie: [chunks][keys] (a chunk a
  // box) or, kPageGroups, [groups][chunks] (wgmma's descriptors and the
  // clearing of V rows past a sequence read them).
  static constexpr int kKChunkBytes = kPageGroups ? kSwizzleAtomBytes : kKBoxBytes;
  static constexpr int kKGroupBytes = kPageGroups ? 2 * kSwizzleAtomBytes : kSwizzleAtomBytes;
  static constexpr int kVChunkBytes = kPageGroups ? kSwizzleAtomBytes : kTileBytes;
  static constexpr int kVGroupBytes = kPageGroups ? kHalfCols / kBoxCols * kSwizzleAtomBytes : kSwizzleAtomBytes;

  static constexpr int kQOffset = 0;
  static constexpr int kPOffset = kQOffset + kQTiles * kTileBytes;                 // 2 buffers
  static constexpr int kRingOffset = kPOffset + 2 * kPBytes;
  // The peer's partial S: float4 [16][128 threads] (kSplit = 2).
  static constexpr int kExchangeBytes = kSplit == 1 ? 0 : 64 * 128 * 4;
  static constexpr int kExchangeOffset = kRingOffset + kStages * kStageBytes;
  static constexpr int kStatsOffset = kExchangeOffset + kExchangeBytes;          // float [2][2][64]
  static constexpr int kRowSumOffset = kStatsOffset + 2 * 2 * kBlockM * 4;        // float [2][64]
  static constexpr int kTileOffset = kRowSumOffset + 2 * kBlockM * 4;  // TileCoordinates
  static constexpr int kSequenceOffset = kTileOffset + 32;              // TileSequence, TileKeyBounds
  // kDropout: one block's keep bits, uint32 [64 rows][4 quad lanes] (bit
  // 2 b + e of word [r][t]: key 8 b + 2t + e of row r). One buffer: the 1 KB
  // is what the 227 KB leave at D = 512 and 1024.
  static constexpr int kKeepOffset = kSequenceOffset + 32;
  static_assert(sizeof(TileCoordinates) <= 32 && sizeof(TileSequence) + sizeof(TileKeyBounds) <= 32,
                "the tile's and its sequence's 32 bytes of shared memory each");
  static constexpr int kKeepBytes = kDropoutWarps ? kBlockM * 4 * 4 : 0;
  // kGathersPages: the gather's row tables, uint32 [K, V][4 warps][32 keys]
  // (producer_gather.cuh), in the keep bits' place: no kernel has both.
  // The code converters (kCacheCodes) copy by the same tables.
  static constexpr int kRowTableOffset = kKeepOffset;
  static constexpr int kRowTableBytes = kGathersPages || kCacheCodes ? 2 * 128 * 4 : 0;
  // kCacheCodes: the tile's score factor (scale_log2 x its k_descale) and O
  // factor (its v_descale), float [2], written at setup.
  static constexpr int kCodeFactorsOffset = kKeepOffset + (kKeepBytes > kRowTableBytes ? kKeepBytes : kRowTableBytes);
  static constexpr int kCodeFactorsBytes = kCacheCodes ? 16 : 0;
  static constexpr int kBarrierOffset = kCodeFactorsOffset + kCodeFactorsBytes;
  // q_full, full[kFullBarriers], empty[kStages], p_full[2], p_empty[2]
  // (kSplit = 2: x_full, x_empty; kDropoutWarps: keep_full[2], keep_empty). See
  // "Why more full barriers than stages" (kernel.cuh) for the count.
  static constexpr int kFullBarriers = 16;  // >= kKStages + 2 + kStages; a power of two: cheap p % 16
  static constexpr int kEmptyArrivals = 4;  // a stage has one consumer warpgroup: a warp of it each
  static_assert(kFullBarriers >= kKStages + 2 + kStages, "see Why more full barriers than stages");
  static constexpr int kKeepBarrier = 1 + kFullBarriers + kStages + 4 + (kSplit == 1 ? 0 : 2);
  static constexpr int kBarriers = kKeepBarrier + (kDropoutWarps ? 3 : 0);
  static constexpr int kSmemBytes = kBarrierOffset + kBarriers * 8;

  static_assert(kElementBytes == 2, "q, k, v and o are bf16 or fp16");
  static_assert(!kFp8 || !kMaskInS, "the FP8 operands: the mask is added in the softmax");
  static_assert(kHalfCols % kOutBoxCols == 0 && kHalfCols >= 128 && kHalfCols <= 256,
                "O halves are whole boxes, N = 128..256");
  static_assert(kQKChunks >= 1 && kQKChunks <= 8, "a CTA's part of S covers up to 8 boxes");
  static_assert(kSplit == 1 || kSplit == 2, "one CTA per tile, or a cluster of two");
  static_assert(kSmemBytes <= 232448, "fits the 227 KB a Hopper block may opt into");
};

struct Args {
  AttentionProblem p;
  // GQA packing (split_kv.hpp's packed_heads): a tile holds heads_per_tile
  // query heads of one KV head, 64 / heads_per_tile rows each.
  int heads_per_tile = 1;
  // Tiles along a head's Nq rows; the grid is row_blocks x kv_splits x
  // (Hq / heads_per_tile) x B tiles (< 2^31): row blocks [first_row_block,
  // first_row_block + row_blocks) of each head (hybrid rows split a call's).
  int row_blocks;
  int first_row_block = 0;
  float scale_log2;  // scale * log2(e)
  float inverse_scale;  // 1 / scale: Traits::kMaskInS starts S at mask / scale
  // Split-KV (kernels/common/split_kv.hpp; kv_splits > 1): each tile is one split
  // of split_blocks KV blocks and writes its rows' partial (unnormalized O and
  // softmax state, row (b x Hq + h) x Nq + i of split s at s x B x Hq x Nq + row)
  // instead of O and LSE; kernels/split_kv/combine.cu merges them.
  int kv_splits = 1;
  int split_blocks = 0;
  // A sequence batch with the KV split on (decode): its plan chooses the
  // blocks per split for this many CTA slots (kernels/common/sequence_schedule.hpp),
  // and the tiles write partial rows where it split.
  int split_slots = 0;
  float* partial_o = nullptr;
  RowSoftmaxState* partial_states = nullptr;
  // Traits::kFp8: the pre-pass's scales (kernels/fp8_prepass/workspace.hpp),
  // per (batch, head) blocks of q_scales_per_head / k_scales_per_head /
  // head_dim (V per channel) floats, and the LSE's smooth-K term and the
  // non-finite mark (row_nan) per quantized row. Quantized rows count from
  // query row first_row_block x kBlockM.
  const float* q_scales = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  const float* lse_shift = nullptr;
  const float* row_nan = nullptr;  // int8 Q and K: NaN for a row a non-finite Q or K value reaches
  int64_t q_scales_per_head = 0, k_scales_per_head = 0, v_scales_per_head = 0;
  bool qk_scale_per_block = false;
  // V scaled per 128-key block (else per channel): O is kept in units of the
  // current block's scale, each block's factor times old / new scale.
  bool v_scale_per_block = false;
  const float* v_mean = nullptr;  // smooth-V: added back to every row that attends a key
  // A paged cache (AttentionProblem::sequences) loaded by TMA: the rows of
  // one load of K and V, dividing the page size and a V stage's 64 keys (the
  // maps' boxes: a load never crosses a page), at least 8: a KV block is at
  // most 16 of them.
  int page_box_rows = 0;
  // A paged cache gathered instead (gathers_pages, family.hpp): the producer
  // warpgroup copies K and V a key row a thread (producer_gather.cuh); only
  // with Traits::kGathersPages.
  bool gather_pages = false;
  // Traits::kPageGroups: how K's and V's grouped maps fold the KV head (the
  // same for both: the producer looks a page up once for the two).
  PageMapSteps page_steps;
};

}  // namespace ffpa::detail::sm90_wgmma
