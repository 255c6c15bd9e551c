// Emulation shim of src/kernels/sm90_wgmma/ptx.cuh: the same wrappers on the
// CPU emulator (sm90_emulator.hpp), clusters included.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "emulation/sm90_emulator.hpp"

namespace ffpa::detail::sm90_wgmma {

namespace emu = ::ffpa::emulation::sm90;

// The running CTA's shared memory (each CTA of an emulated cluster its own).
inline unsigned char* cta_shared_memory() { return ::ffpa::emulation::shared_memory_base(); }

inline void mbarrier_init(uint32_t bar, uint32_t arrivals) { emu::mbarrier_init(bar, arrivals); }
inline void fence_barrier_init() {}
inline void mbarrier_arrive(uint32_t bar) { emu::mbarrier_arrive(bar); }
inline void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) { emu::mbarrier_arrive_expect_tx(bar, bytes); }
inline bool mbarrier_try_wait(uint32_t bar, uint32_t parity) { return emu::mbarrier_try_wait(bar, parity); }
inline void mbarrier_wait(uint32_t bar, uint32_t parity) {
  while (!emu::mbarrier_try_wait(bar, parity)) ::ffpa::emulation::spin_yield();
}

inline uint32_t cluster_cta_rank() { return static_cast<uint32_t>(::ffpa::emulation::cluster_rank()); }
inline void cluster_sync() { ::ffpa::emulation::cluster_sync(); }
inline uint32_t peer_address(uint32_t local, uint32_t rank) { return emu::peer_address(local, rank); }
// The emulator runs one grid at a time: every grid is complete before the next starts.
inline void launch_dependent_grid() {}
inline void wait_prerequisite_grid() {}
inline void store_cluster_f32x4(uint32_t remote, float a, float b, float c, float d) {
  emu::store_cluster_f32x4(remote, a, b, c, d);
}
inline void mbarrier_arrive_cluster(uint32_t remote_bar) { emu::mbarrier_arrive_cluster(remote_bar); }
inline void store_async_cluster_f32x4(uint32_t remote, float a, float b, float c, float d, uint32_t remote_bar) {
  emu::store_async_cluster_f32x4(remote, a, b, c, d, remote_bar);
}
inline void mbarrier_wait_cluster(uint32_t bar, uint32_t parity) { mbarrier_wait(bar, parity); }

inline void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) { emu::cp_async_16(dst, src, src_bytes); }
inline void cp_async_arrive_noinc(uint32_t bar) { emu::cp_async_arrive_noinc(bar); }
inline void st_shared_u32(uint32_t dst, uint32_t value) {
  std::memcpy(::ffpa::emulation::shared_memory_base() + dst, &value, 4);
}
inline void ld_shared_v4(uint32_t src, uint32_t (&words)[4]) {
  std::memcpy(words, ::ffpa::emulation::shared_memory_base() + src, 16);
}

inline void st_shared_v4(uint32_t dst, const uint32_t (&words)[4]) {
  std::memcpy(::ffpa::emulation::shared_memory_base() + dst, words, 16);
}
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int kPending>
inline void cp_async_wait() {
  emu::cp_async_wait(kPending);
}

inline void prefetch_tensor_map(const CUtensorMap*) {}
inline void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  emu::tma_load_4d(dst, map, bar, c0, c1, c2, c3);
}
inline void tma_load_5d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  emu::tma_load_5d(dst, map, bar, c0, c1, c2, c3, c4);
}
inline void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  emu::tma_store_4d(map, src, c0, c1, c2, c3);
}
inline void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  emu::tma_reduce_add_4d(map, src, c0, c1, c2, c3);
}
inline void tma_store_commit() {}
inline void tma_store_wait_read() { emu::tma_store_wait_read(); }
inline void fence_proxy_async() {}

inline void wgmma_fence() {}
inline void wgmma_commit() { emu::wgmma_commit(); }
template <int kPending>
inline void wgmma_wait() {
  emu::wgmma_wait(kPending);
}
template <int N>
inline void fence_operands(float (&)[N]) {}
template <int N>
inline void fence_operands(int32_t (&)[N]) {}
template <int N>
inline void fence_operands(uint32_t (&)[N]) {}

inline uint64_t smem_descriptor(uint32_t address, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (uint64_t{1} << 62);
}

template <int kRegisters>
inline void setmaxnreg_increase() {}
template <int kRegisters>
inline void setmaxnreg_decrease() {}

inline int lane_id() { return ::ffpa::emulation::current_thread() % 32; }
inline int quad_lane() { return lane_id() % 4; }
inline void named_barrier_sync(int id, int threads) { ::ffpa::emulation::named_barrier(id, threads); }
inline void named_barrier_arrive(int id, int threads) { ::ffpa::emulation::named_barrier_arrive(id, threads); }

}  // namespace ffpa::detail::sm90_wgmma
