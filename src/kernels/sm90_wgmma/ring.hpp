// The order of the sm90_wgmma kernel's shared-memory ring, as positions: the
// producer fills positions 0, 1, 2, ... in order, and each consumer takes the
// positions of its blocks. Host and device: the CPU tests check the
// invariants the kernel's barriers rely on (tests/cpu/test_sm90_ring.cpp).
//
// Order: K_0, K_1, V_0, K_2, V_1, ..., K_{n-1}, V_{n-2}, V_{n-1}. A K block is
// k_stages positions, a V block v_stages: the consumers' parts interleaved,
// (part 0, consumer 0), (part 0, consumer 1), (part 1, consumer 0), ...; the
// bf16 family's 4 are its two key halves per consumer (V N-major), an 8-bit
// family's 2 would be one [Dv half][128 keys] V^T tile per consumer (8-bit
// wgmma takes only K-major B: docs/kernels/sm90_fp8_plan.md).
#pragma once

#include "common/host_device.hpp"

namespace ffpa::detail::sm90_wgmma {

constexpr int kRingVStages = 4;  // ring positions of one V block (the bf16 family)

// Stages of the ring: 4, or 3 in a cluster, whose 32 KB exchange slot takes
// the fourth stage's shared memory.
FFPA_HOST_DEVICE constexpr int ring_stages(int cluster_size) { return cluster_size == 1 ? 4 : 3; }

// First position of K_j.
FFPA_HOST_DEVICE constexpr int ring_k_position(int j, int k_stages, int v_stages = kRingVStages) {
  return j == 0 ? 0 : j * (k_stages + v_stages) - v_stages;
}

// First position of V_j among n blocks: V_j follows K_{j+1}; the last V block
// follows the V block before it.
FFPA_HOST_DEVICE constexpr int ring_v_position(int j, int n_blocks, int k_stages, int v_stages = kRingVStages) {
  return (j + 1 < n_blocks ? 2 : 1) * k_stages + j * (k_stages + v_stages);
}

// Position of consumer w's part `part` (< v_stages / 2) of V_j.
FFPA_HOST_DEVICE constexpr int ring_v_part_position(int j, int n_blocks, int k_stages, int part, int w,
                                                      int v_stages = kRingVStages) {
  return ring_v_position(j, n_blocks, k_stages, v_stages) + 2 * part + w;
}

}  // namespace ffpa::detail::sm90_wgmma
