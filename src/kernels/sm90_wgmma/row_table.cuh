// The per-warp key-row tables of the producers that copy a key row a thread
// (producer_gather.cuh: a gathered paged cache; producer_codes.cuh: an e4m3
// cache's codes): uint32 [K, V][4 warps][32 keys] at Traits::
// kRowTableOffset, each entry a row's place in 16-byte units from its
// tensor's base. Entry (r % 4) x 8 + r / 4 holds the warp's row r, so that a
// lane whose eight rows are f + 4 i (f < 4) finds them at entries 8 f + i:
// two 16-byte loads.
#pragma once

#include <cstdint>

#include "kernels/sm90_wgmma/cta.cuh"
#include "kernels/sm90_wgmma/ptx.cuh"

namespace ffpa::detail::sm90_wgmma {

// An entry of a key past the sequence (its copies zero-fill).
constexpr uint32_t kNoKeyRow = 0xFFFFFFFFu;

// Thread `thread`'s warp's table of K (kv 0) or V (1).
template <class Traits>
__device__ __forceinline__ uint32_t key_row_table(const Cta<Traits>& cta, int thread, int kv) {
  return smem_address(cta.smem() + Traits::kRowTableOffset) + kv * 512 + (thread / 32) * 128;
}

// Thread `thread`'s row of a block into its warp's table (the warp's copies
// of the previous block have read the old entries: __syncwarp).
template <class Traits>
__device__ __forceinline__ void publish_key_row(const Cta<Traits>& cta, int thread, int kv, uint32_t units) {
  const int r = thread % 32;
  __syncwarp();
  st_shared_u32(key_row_table(cta, thread, kv) + 4 * ((r % 4) * 8 + r / 4), units);
  __syncwarp();
}

}  // namespace ffpa::detail::sm90_wgmma
