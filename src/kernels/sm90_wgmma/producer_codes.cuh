// The sm90_wgmma producer warpgroup on an e4m3 cache (Traits::kCacheCodes: a
// serving engine's FP8 KV cache, dense or paged, any page size). Its 128
// threads copy the codes with cp.async straight into the ring stage that
// will hold their 16-bit values, each chunk of 16 codes into the first half
// of the 32 bytes its values take, and once a thread's copies of a stage
// have landed it widens its own chunks in place (unpack_e4m3x2: every e4m3
// value is an f16 value; the kernel multiplies f16: Traits::Operand) and
// arrives on the stage's full barrier
// (128 arrivals a phase, cta.cuh). A thread reads and writes only its own
// chunks' 32 bytes, so the widening needs no barrier of its own; the
// consumers are the 16-bit kernel's. The descales act on the scores and on
// O (Cta::code_factors).
//
// Rows come as in producer_gather.cuh: thread t owns key t of each 128-key
// block (a page lookup, or the dense row), whose 16-byte-unit offset it
// publishes in its warp's row table, and a warp copies its 32 keys' rows in
// whole 128-byte lines: lane l copies chunk c = l % 8 (codes 16 c .. 16 c +
// 15 of a line) of rows r_i = ((l / 8) ^ (c / 4)) + 4 i, i = 0..7. The XOR
// gives the lanes that write box 0 (c < 4) and box 1 (c >= 4) rows of
// opposite swizzle parity, so the 8 lanes of a 16-byte phase write 8
// different 16-byte bank groups (the same rows in both boxes would collide
// two by two); a line is still read whole by one instruction.
//
// Copies run kAhead = kStages - 1 ring positions ahead of the widening. A
// thread widens position p before it waits for position p + kAhead's stage
// to be free: with an e4m3 cache a consumer holds a stage at most until the
// next position is full (a K stage until it has issued the next one's
// wgmmas, compute_s; its V part's key half 0 only until its own wgmmas are
// done, issue_pv), so freeing p + kAhead - kStages = p - 1 waits at most for
// p, which is then full. (The 16-bit kernels hold key half 0 until half 1's
// wgmmas are done too: two positions on; at two positions ahead the copies
// of a V block waited for the consumers' round trip every position, 1.09 ms
// for the batch of docs/kernels/serving.md.)
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/common/compiler_hints.cuh"
#include "kernels/common/element.cuh"
#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/producer.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"
#include "kernels/sm90_wgmma/row_table.cuh"

namespace ffpa::detail::sm90_wgmma {

template <class Traits>
struct CodeProducer {
  static_assert(Traits::kCacheCodes && Traits::kBlockN == 128, "a producer thread per key of a block");
  static_assert(Traits::kHalfCols % 128 == 0, "a consumer's V columns are whole 128-code lines");
  using Operand = typename Traits::Operand;  // what the codes widen to
  static constexpr int kStages = Traits::kStages, kKStages = Traits::kKStages;
  static constexpr int kAhead = kStages - 1;  // positions copied while one is widened
  static constexpr int kPartBits = 5;         // a pending position's part in `pending`
  static_assert(kAhead * kPartBits <= 32, "the pending positions' parts in one register");
  static constexpr int kLastKBoxes = Traits::kQKChunks - 2 * (kKStages - 1);
  static constexpr int kVLines = Traits::kHalfCols / 128;  // 128-code lines of a consumer's V row
  // A pending position's part: K stage ks (0..kKStages-1), or V part
  // kVPart + 2 x key half + consumer.
  static constexpr int kVPart = 16;

  const Cta<Traits>& cta;
  const int thread;  // 0..127: key `thread` of every KV block
  int copy_position = 0;
  // The parts of the positions copied and not yet widened, the youngest in
  // the low kPartBits: position copy_position - 1 - y at bits kPartBits x y.
  uint32_t pending = 0;
  int page = -1, next_page = -1;   // as producer_gather.cuh (the dense cache: 0, or -1 past Nkv)

  __device__ __forceinline__ int lane() const { return thread % 32; }
  __device__ __forceinline__ int half() const { return lane() % 8 / 4; }  // the box of this lane's chunks
  // This lane's first row of its warp (rows first + 4 i).
  __device__ __forceinline__ int first_row() const { return (lane() / 8) ^ half(); }
  // The 16-byte offset of this lane's chunk in row first + 4 i of a box: its
  // segment pair's first, swizzled by (row % 8) = first + 4 (i % 2).
  __device__ __forceinline__ uint32_t segment_offset(int i) const {
    return 16u * static_cast<uint32_t>((2 * (lane() % 4)) ^ first_row() ^ (4 * (i % 2)));
  }

  __device__ __forceinline__ void look_up_page(int j) {
    const SequenceLayout& s = cta.p.sequences;
    const int key = cta.block_key(j) + thread;
    if (key >= cta.sequence()->seq_kv) {
      next_page = -1;
    } else if (s.paged()) {
      next_page = s.block_table[cta.tile()->batch * s.block_table_stride[0] +
                                (key / static_cast<int>(s.page_size)) * s.block_table_stride[1]];
    } else {
      next_page = 0;
    }
  }

  // This thread's key row of block j in k or v (b, h, n strides: codes are
  // bytes) in 16-byte units from the tensor's base (gather_units_fit keeps
  // them below 2^32 - 1), kNoKeyRow past the sequence.
  __device__ __forceinline__ uint32_t row_units(const int64_t (&stride)[3], int block_page, int j) const {
    if (block_page < 0) return kNoKeyRow;
    const SequenceLayout& s = cta.p.sequences;
    const int key = cta.block_key(j) + thread;
    const TileSequence* seq = cta.sequence();
    const int64_t batch = s.paged() ? block_page : seq->kv_batch;
    const int64_t row = s.paged() ? key % static_cast<int>(s.page_size) : seq->kv_begin + key;
    return static_cast<uint32_t>((batch * stride[0] + cta.tile()->kv_head * stride[1] + row * stride[2]) / 16);
  }

  // This warp's row table of K (kv 0) or V (1) (row_table.cuh): lane l
  // finds its rows first_row() + 4 i at entries 8 first_row() + i.
  __device__ __forceinline__ uint32_t row_table(int kv) const { return key_row_table(cta, thread, kv); }
  __device__ __forceinline__ void publish_row(int kv, uint32_t units) const { publish_key_row(cta, thread, kv, units); }

  // Columns [16 col_units, + 16) of this lane's 8 rows (`table`) into their
  // places at `rows` (the box's row first of this warp's 32), `width` codes
  // a row.
  __device__ __forceinline__ void copy_rows(uint32_t rows, const void* tensor, uint32_t table, int col_units,
                                            int width) const {
    uint32_t units[8];
    ld_shared_v4(table + 32 * first_row(), *reinterpret_cast<uint32_t(*)[4]>(&units[0]));
    ld_shared_v4(table + 32 * first_row() + 16, *reinterpret_cast<uint32_t(*)[4]>(&units[4]));
    const uint32_t bytes = static_cast<uint32_t>(min(max(width - 16 * col_units, 0), 16));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool none = units[i] == kNoKeyRow;
      const uint32_t src = none ? static_cast<uint32_t>(col_units) : units[i] + static_cast<uint32_t>(col_units);
      cp_async_16(chunk_address(rows, i), static_cast<const char*>(tensor) + 16 * static_cast<uint64_t>(src),
                  none ? 0u : bytes);
    }
  }

  // Widens this lane's 8 chunks of the box rows at `rows` in place, four
  // loads issued back to back before their conversions: one load, its
  // conversion and its stores a chunk left each load's latency exposed (ncu:
  // the first shift after a load waited on it, 23 % of the converters'
  // samples).
  __device__ __forceinline__ void widen_rows(uint32_t rows) const {
    constexpr int kBatch = 4;
#pragma unroll
    for (int first = 0; first < 8; first += kBatch) {
      uint32_t codes[kBatch][4];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) ld_shared_v4(chunk_address(rows, first + b), codes[b]);
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        uint32_t low[4], high[4];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          low[2 * k] = unpack_e4m3x2<Operand>(codes[b][k]);
          low[2 * k + 1] = unpack_e4m3x2<Operand>(codes[b][k] >> 16);
          high[2 * k] = unpack_e4m3x2<Operand>(codes[b][2 + k]);
          high[2 * k + 1] = unpack_e4m3x2<Operand>(codes[b][2 + k] >> 16);
        }
        const uint32_t at = chunk_address(rows, first + b);
        st_shared_v4(at, low);
        st_shared_v4(at ^ 16u, high);  // the pair's other segment: bit 0 of the segment
      }
    }
  }

  // This lane's chunk in row first + 4 i of the box rows at `rows`.
  __device__ __forceinline__ uint32_t chunk_address(uint32_t rows, int i) const {
    return rows + (first_row() + 4 * i) * kSwizzleRowBytes + segment_offset(i);
  }

  // Where part `part` of a position in `stage` puts this lane's rows: K stage
  // ks, box half(); V part, line `line`'s box 2 line + half(); nothing (0)
  // where this warp has no rows (a V part of the other key half, a last K
  // stage of one box).
  __device__ __forceinline__ uint32_t part_rows(int part, int stage, int line) const {
    const uint32_t base = cta.ring() + stage * Traits::kStageBytes;
    const int warp = thread / 32;
    if (part < kVPart) {
      if (part + 1 == kKStages && half() >= kLastKBoxes) return 0;
      return base + half() * Traits::kKBoxBytes + warp * 32 * kSwizzleRowBytes;
    }
    const int key_half = (part - kVPart) / 2;
    if (warp / 2 != key_half) return 0;
    return base + (2 * line + half()) * Traits::kTileBytes + (warp % 2) * 32 * kSwizzleRowBytes;
  }

  // Waits until the next position's stage is free, copies this lane's codes
  // of `part` of block j into it, and closes the position's copy group.
  __device__ __forceinline__ void copy(int part, int j) {
    if (copy_position >= kAhead) widen<kAhead - 1>();
    const int stage = copy_position % kStages;
    mbarrier_wait(cta.empty(stage), ((copy_position / kStages) & 1) ^ 1);
    const int c = lane() % 8;
    if (part < kVPart) {
      const uint32_t rows = part_rows(part, stage, 0);
      if (rows != 0) copy_rows(rows, cta.p.k, row_table(0), 8 * part + c, static_cast<int>(cta.p.head_dim));
    } else {
      const int w = (part - kVPart) % 2;
#pragma unroll
      for (int line = 0; line < kVLines; ++line) {
        const uint32_t rows = part_rows(part, stage, line);
        if (rows != 0) {
          copy_rows(rows, cta.p.v, row_table(1), (w * Traits::kHalfCols) / 16 + 8 * line + c,
                    static_cast<int>(cta.p.dv()));
        }
      }
    }
    cp_async_commit();
    pending = (pending << kPartBits) | static_cast<uint32_t>(part);
    ++copy_position;
  }

  // Widens pending position copy_position - 1 - kYounger (the oldest of
  // kYounger + 1 pending) once this thread's copies of it have landed (its
  // kYounger younger groups may still be in flight), and marks it full.
  template <int kYounger>
  __device__ __forceinline__ void widen() {
    const int position = copy_position - 1 - kYounger;
    const int part = static_cast<int>((pending >> (kPartBits * kYounger)) & ((1u << kPartBits) - 1));
    cp_async_wait<kYounger>();
    const int stage = position % kStages;
#pragma unroll
    for (int line = 0; line < (part < kVPart ? 1 : kVLines); ++line) {
      const uint32_t rows = part_rows(part, stage, line);
      if (rows != 0) widen_rows(rows);
    }
    fence_proxy_async();  // the generic proxy's writes, before the consumers' wgmmas read the stage
    mbarrier_arrive(cta.full(position));
  }

  __device__ __forceinline__ void load_k(int j) {
    publish_row(0, row_units(cta.p.k_stride, page, j));
#pragma unroll 1
    for (int ks = 0; ks < kKStages; ++ks) copy(ks, j);
  }

  __device__ __forceinline__ void load_v(int j, int block_page) {
    publish_row(1, row_units(cta.p.v_stride, block_page, j));
#pragma unroll 1
    for (int part = 0; part < 4; ++part) copy(kVPart + part, j);
  }

  __device__ __forceinline__ void run(const CUtensorMap* q_map) {
    if (thread == 0) load_q(cta, q_map);
    const int blocks = cta.tile()->kv_blocks;
    if (blocks == 0) return;
    look_up_page(0);
    for (int j = 0; j < blocks; ++j) {  // V_{j-1} follows K_j (ring.hpp)
      const int previous_page = page;
      page = next_page;
      if (j + 1 < blocks) look_up_page(j + 1);
      load_k(j);
      if (j > 0) load_v(j - 1, previous_page);
    }
    load_v(blocks - 1, page);
    static_assert(kAhead == 3, "the last positions: three widened below");
    widen<2>();
    widen<1>();
    widen<0>();
  }
};

}  // namespace ffpa::detail::sm90_wgmma
