// The order of the sm90_wgmma kernel's shared-memory ring, as positions: the
// producer fills positions 0, 1, 2, ... in order, and each consumer takes the
// positions of its blocks. Host and device: the CPU tests check the
// invariants the kernel's barriers rely on (tests/cpu/test_sm90_ring.cpp).
//
// Order: K_0, K_1, V_0, K_2, V_1, ..., K_{n-1}, V_{n-2}, V_{n-1}. A K block is
// k_stages positions, a V block 4: (key half 0, consumer 0), (key half 0,
// consumer 1), (key half 1, consumer 0), (key half 1, consumer 1).
#pragma once

#include "common/host_device.hpp"

namespace ffpa::detail::sm90_wgmma {

constexpr int kRingVStages = 4;  // ring positions of one V block

// Stages of the ring: 4, or 3 in a cluster, whose 32 KB exchange slot takes
// the fourth stage's shared memory.
FFPA_HOST_DEVICE constexpr int ring_stages(int cluster_size) { return cluster_size == 1 ? 4 : 3; }

// First position of K_j.
FFPA_HOST_DEVICE constexpr int ring_k_position(int j, int k_stages) {
  return j == 0 ? 0 : j * (k_stages + kRingVStages) - kRingVStages;
}

// First position of V_j among n blocks: V_j follows K_{j+1}; the last V block
// follows the V block before it.
FFPA_HOST_DEVICE constexpr int ring_v_position(int j, int n_blocks, int k_stages) {
  return (j + 1 < n_blocks ? 2 : 1) * k_stages + j * (k_stages + kRingVStages);
}

// Position of consumer w's part of key half h of V_j.
FFPA_HOST_DEVICE constexpr int ring_v_part_position(int j, int n_blocks, int k_stages, int key_half,
                                                      int w) {
  return ring_v_position(j, n_blocks, k_stages) + 2 * key_half + w;
}

}  // namespace ffpa::detail::sm90_wgmma
