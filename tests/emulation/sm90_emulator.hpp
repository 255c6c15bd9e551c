// The sm90 family's Hopper instructions on the CPU emulation of a CTA
// (sm80_emulator.hpp: threads as fibers): mbarriers with phases and
// transaction counts, TMA tensor copies through emulated tensor maps (the
// 128-byte swizzle, zero fill out of range), wgmma with shared-memory
// descriptors (128-byte swizzle, K-major and N-major B), its groups and
// waits; cp.async with its mbarrier arrival (noinc), landing as TMA loads
// do. The kernel sources compile unchanged as host code through the shims
// of kernels/sm90_wgmma/ptx.cuh and wgmma.cuh in shim/.
//
// Asynchrony is modelled at its latest where that exposes a missing wait:
// a wgmma reads shared memory and writes its accumulators when a wait retires
// its group; a TMA store reads shared memory at its wait_read (or the
// thread's end). TMA loads land either at once (`TmaLanding::at_issue`:
// a stage refilled before its readers released it shows) or when a thread
// first waits on their barrier (`at_wait`: a read before the wait shows).
// Clusters (kSplit = 2, D > 512): every CTA's threads on one scheduler,
// peer addresses encoded by peer_address (rank in the high bits).
#pragma once

#include <cuda.h>  // CUtensorMap

#include <cstdint>
#include <functional>

#include "emulation/sm80_emulator.hpp"

namespace ffpa::emulation::sm90 {

enum class TmaLanding { at_issue, at_wait };

// A tensor map the emulated TMA reads: a tensor of up to 5 dimensions
// (dims[0] innermost, contiguous; byte strides of dims 1..4; a 4-d map has
// dims[4] = box[4] = 1), boxes of box[0..4] elements, the 128-byte swizzle.
// Written into the CUtensorMap's 128 opaque bytes.
struct TensorMapInfo {
  const unsigned char* base = nullptr;
  int element_bytes = 2;
  int64_t dims[5] = {0, 0, 0, 0, 1};
  int64_t strides[4] = {};  // bytes, dims 1..4
  int box[5] = {0, 0, 0, 0, 1};
};
void encode_tensor_map(const TensorMapInfo& info, CUtensorMap* map);

// Runs one CTA (sm80_emulator's run_cta) with the sm90 state reset before and
// checked after (no barrier phase or wgmma group left pending).
void run_cta(Index3 block, int threads, unsigned char* shared, TmaLanding landing, const std::function<void()>& body);
// The same for a cluster of `ranks` CTAs (sm80_emulator's run_cluster).
void run_cluster(Index3 first_block, int ranks, int threads, unsigned char* const* shared, TmaLanding landing,
                 const std::function<void()>& body);

// --- the instructions (called by the ptx.cuh / wgmma.cuh shims) ------------------
void mbarrier_init(uint32_t bar, uint32_t arrivals);
void mbarrier_arrive(uint32_t bar);
void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes);
bool mbarrier_try_wait(uint32_t bar, uint32_t parity);
// Distributed shared memory: CTA `rank`'s address for a local one (mapa), a
// 16-byte store there, an arrival on a barrier there.
uint32_t peer_address(uint32_t local_address, uint32_t rank);
void store_cluster_f32x4(uint32_t remote, float a, float b, float c, float d);
void mbarrier_arrive_cluster(uint32_t remote_bar);
// st.async.shared::cluster.mbarrier::complete_tx::bytes.v4: lands (as TMA
// loads do, per TmaLanding) and completes 16 bytes on the barrier in that CTA.
void store_async_cluster_f32x4(uint32_t remote, float a, float b, float c, float d, uint32_t remote_bar);
// cp.async.cg of 16 bytes, the first src_bytes (0..16) read from src, the
// rest zero-filled; the thread's copies land (per TmaLanding, as TMA loads)
// with its next cp.async.mbarrier.arrive.noinc, which arrives once they have:
// every copy must be followed by one.
void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes);
void cp_async_arrive_noinc(uint32_t bar);
// cp.async.commit_group / wait_group: the thread's copies since its last
// commit (or noinc arrival) form a group; a wait lands (per TmaLanding) every
// group but the `pending` youngest.
void cp_async_commit();
void cp_async_wait(int pending);
void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3);
void tma_load_5d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4);
void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3);
// cp.reduce.async.bulk.tensor .add of an fp32 box: lands, as the stores do, at
// the thread's next tma_store_wait_read (adding to what global memory holds then).
void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3);
void tma_store_wait_read();

enum class WgmmaKind { bf16, f16, e4m3, s8 };
// One wgmma.mma_async of the calling thread's warpgroup: D[64 x n] (+)= A B,
// `d` this thread's n / 2 accumulators (float, or int32_t for s8); transposes:
// B N-major, A M-major (16-bit operands).
void wgmma(WgmmaKind kind, int n, bool transpose_b, uint64_t desc_a, uint64_t desc_b, bool accumulate, void* d,
           bool transpose_a = false);
// The same with A in registers (RS, 16-bit): `a` this thread's four A
// registers (wgmma.cuh's fragment: warp w rows 16w + lane / 4 (+ 8), columns
// 2 (lane % 4) (+ 8), two elements a register, the first in the low half),
// read when the wgmma executes; a change to them before it retires fails.
void wgmma_rs(WgmmaKind kind, int n, bool transpose_b, const uint32_t* a, uint64_t desc_b, bool accumulate, void* d);
void wgmma_commit();
void wgmma_wait(int pending);

}  // namespace ffpa::emulation::sm90
