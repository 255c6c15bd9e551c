// Hopper (sm_90a) instructions of the sm90 family: mbarriers, TMA tensor
// copies, cluster barriers and proxy fences through the toolkit's own
// cuda::ptx (CCCL); in inline PTX only what cuda::ptx does not cover here
// (mapa and stores to a peer's shared memory, tensor-map prefetch, wgmma
// bookkeeping and descriptors, setmaxnreg, named barriers, the gather's
// cp.async and its barrier arrival). Each wrapper is
// one instruction (or a wait loop around one); the schedule lives in
// kernel.cuh and its role files.
//
// The kernel names shared memory by 32-bit shared-window addresses (the form
// wgmma descriptors and barrier arithmetic want); cuda::ptx takes generic
// pointers and converts them back, a round trip the compiler folds.
#pragma once

#include <cuda.h>  // CUtensorMap (header only: the driver call is made on the host)

#include <cstdint>
#include <cstdio>
#include <cuda/ptx>

namespace ffpa::detail::sm90_wgmma {

// The CTA's dynamic shared memory. wgmma and TMA swizzle atoms need 1024-byte
// alignment; dynamic shared memory starts the block's window (there is no
// static shared memory), so the declared alignment holds, and every offset
// from it is an immediate. Named, not passed around: the compiler keeps its
// alignment and address space only when it sees the symbol itself (the
// accessor inlines to it; the CPU emulation's shim returns each CTA's own).
extern __shared__ __align__(1024) unsigned char cta_smem[];
__device__ __forceinline__ unsigned char* cta_shared_memory() { return cta_smem; }

__device__ __forceinline__ uint64_t* barrier_pointer(uint32_t bar) {
  return static_cast<uint64_t*>(__cvta_shared_to_generic(bar));
}

// ---- mbarriers ---------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  cuda::ptx::mbarrier_init(barrier_pointer(bar), arrivals);
}

// Makes initialized barriers visible to the async proxy (TMA) and other threads.
__device__ __forceinline__ void fence_barrier_init() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  (void)cuda::ptx::mbarrier_arrive(barrier_pointer(bar));
}

// Arrives and announces `bytes` of TMA transactions that complete the phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             barrier_pointer(bar), bytes);
}

__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  return cuda::ptx::mbarrier_try_wait_parity(barrier_pointer(bar), parity);
}

// Waits until the phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
#ifdef FFPA_SM90_HANG_WATCHDOG
  const long long start = clock64();
  while (!mbarrier_try_wait(bar, parity)) {
    if (clock64() - start > 4000000000ll) {
      printf("HANG block %d thread %d bar 0x%x parity %u\n", blockIdx.x, threadIdx.x, bar, parity);
      __trap();
    }
  }
  return;
#endif
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// ---- clusters and distributed shared memory ------------------------------------
__device__ __forceinline__ uint32_t cluster_cta_rank() { return cuda::ptx::get_sreg_cluster_ctarank(); }

// Every thread of every CTA of the cluster: barrier init visible before remote
// arrives, and no CTA exits while its peer may still write into it.
__device__ __forceinline__ void cluster_sync() {
  // Not .aligned: the producer warp arrives diverged (lane 0 issued the loads).
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_release);
  cuda::ptx::barrier_cluster_wait(cuda::ptx::sem_acquire);
}

// Programmatic dependent launch (Hopper's PDL). launch_dependent_grid: the
// grid launched after this one as its programmatic dependent may start once
// every CTA of this one has called it (a scheduling hint; it orders no memory).
// wait_prerequisite_grid: returns once the grid this one was launched after as
// a programmatic dependent has completed and its writes are visible (at once
// for a grid launched without the attribute).
__device__ __forceinline__ void launch_dependent_grid() { cudaTriggerProgrammaticLaunchCompletion(); }
__device__ __forceinline__ void wait_prerequisite_grid() { cudaGridDependencySynchronize(); }

// The shared::cluster address of the same shared-memory offset in CTA `rank`.
__device__ __forceinline__ uint32_t peer_address(uint32_t local, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  return remote;
}

__device__ __forceinline__ void store_cluster_f32x4(uint32_t remote, float a, float b, float c, float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(remote), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

// Stores 16 bytes into another CTA's shared memory without waiting for them:
// they complete a 16-byte transaction on that CTA's barrier `remote_bar`
// (both addresses from peer_address), which is how the receiver knows.
__device__ __forceinline__ void store_async_cluster_f32x4(uint32_t remote, float a, float b, float c, float d,
                                                          uint32_t remote_bar) {
  asm volatile("st.async.weak.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                   remote),
               "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_bar)
               : "memory");
}

// Arrives on a barrier of another CTA of the cluster (release at CTA scope,
// as CUTLASS's ClusterBarrier: it orders this thread's earlier reads of its
// own shared memory before the arrival, which is what a slot's reuse needs; a
// cluster-scope release costs MEMBAR.GPU + ERRBAR on the consumer's path).
__device__ __forceinline__ void mbarrier_arrive_cluster(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" ::"r"(remote_bar)
               : "memory");
}

// The exchange's waits: CTA-scope acquire (the data are in this CTA's shared
// memory; a cluster-scope acquire adds CCTL.IVALL, an L1 invalidation, per wait).
__device__ __forceinline__ void mbarrier_wait_cluster(uint32_t bar, uint32_t parity) {
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, barrier_pointer(bar),
                                              parity)) {
  }
}

// ---- cp.async (the paged gather: producer_gather.cuh) ---------------------------
// 16 bytes from global memory into shared memory, of which the first
// `src_bytes` (0..16) are read and the rest zero-filled: 0 reads nothing (a
// key past the sequence, columns past D). dst and src 16-byte aligned.
// (cuda::ptx has no non-bulk cp.async.) Through L2 only (.cg): the gather
// copies whole lines, and through the L1 that 227 KB of shared memory leave
// its page-1 decode ran 1.47 ms against 0.77 (H200; docs/kernels/serving.md).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// Shared-memory words of the gather's row tables (volatile: a box's loads are
// its own, not hoisted and held across the boxes).
__device__ __forceinline__ void st_shared_u32(uint32_t dst, uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(dst), "r"(value) : "memory");
}
__device__ __forceinline__ void ld_shared_v4(uint32_t src, uint32_t (&words)[4]) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(words[0]), "=r"(words[1]), "=r"(words[2]), "=r"(words[3])
               : "r"(src)
               : "memory");
}

__device__ __forceinline__ void st_shared_v4(uint32_t dst, const uint32_t (&words)[4]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(dst), "r"(words[0]), "r"(words[1]), "r"(words[2]),
               "r"(words[3])
               : "memory");
}

// Closes this thread's group of cp.async copies; waits until at most
// kPending of its groups are in flight (the e4m3 cache's converters).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// One arrival on `bar` once every cp.async this thread has issued so far has
// landed; noinc: the arrival is one of those the barrier was initialised
// with (a phase of N such threads' copies is N arrivals). Inline PTX naming
// the .shared::cta space of the shared-window address (CCCL 13.0's
// cp_async_mbarrier_arrive_noinc names no state space).
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// ---- TMA ----------------------------------------------------------------------
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads the box at coordinates (c0 innermost .. c3) into shared memory; the
// bytes complete a transaction on `bar`. Out-of-range elements are zero-filled.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, __cvta_shared_to_generic(dst),
                                  map, coords, barrier_pointer(bar));
}

// The same for a 5-dimensional map (a paged cache in key groups).
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3, int c4) {
  const int32_t coords[5] = {c0, c1, c2, c3, c4};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, __cvta_shared_to_generic(dst),
                                  map, coords, barrier_pointer(bar));
}

// Stores a shared-memory box; out-of-range elements are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1,
                                             int c2, int c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords,
                                  __cvta_shared_to_generic(src));
}

// Adds a shared-memory box of fp32 values to global memory element by element
// (the bulk tensor reduction: each element's add atomic, the order between
// CTAs unspecified); out-of-range elements are skipped. Committed and waited
// for as the stores are.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2,
                                                  int c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_reduce_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, map,
                                         coords, __cvta_shared_to_generic(src));
}

__device__ __forceinline__ void tma_store_commit() { cuda::ptx::cp_async_bulk_commit_group(); }

// Waits until the committed stores have finished reading shared memory.
__device__ __forceinline__ void tma_store_wait_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }

// Orders this thread's generic-proxy shared-memory writes before later
// async-proxy reads (wgmma operands, TMA stores).
__device__ __forceinline__ void fence_proxy_async() { cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); }

// ---- wgmma bookkeeping ---------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accesses to accumulator registers across the
// asynchronous wgmma section.
template <int N>
__device__ __forceinline__ void fence_operands(float (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(regs[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&regs)[N]) {  // an RS wgmma's A fragment
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(regs[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle (tiles 1024-byte aligned).
// K-major operands: rows of 128 bytes, 8-row groups `stride_bytes` apart (the
// leading offset is unused). N-major operands: `leading_bytes` between 64-column
// blocks, `stride_bytes` between 8-row (k) groups.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading_bytes,
                                                    uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

// ---- warp specialization --------------------------------------------------------
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// This thread's lane, read afresh at every use (asm volatile: never merged
// across a loop, so it holds no register there).
__device__ __forceinline__ int lane_id() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

// This thread's index within its quad (the column pair of the wgmma
// accumulator layout), re-read at every use like lane_id.
__device__ __forceinline__ int quad_lane() { return lane_id() % 4; }

// Synchronizes `threads` threads (whole warps) on hardware barrier `id`.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at hardware barrier `id` of `threads` threads without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace ffpa::detail::sm90_wgmma
