// A CPU emulation of the sm80 kernels' execution model, for tests on a
// machine without a GPU: one CTA at a time, each thread a fiber (ucontext),
// the warp-collective instructions the portable kernels use (ldmatrix,
// mma.sync m16n8k16, shuffles, vote) and __syncthreads computed once all
// their participants have arrived. cp.async is asynchronous as on the
// hardware, at its latest: a thread's copies land when it waits for their
// group (cp.async.wait_group), so a read of a stage before its wait sees the
// old bytes.
// The kernel sources compile unchanged as host code through the shims in
// shim/ (ptx.cuh, compiler_hints.cuh, shared_memory.cuh, fast_math.cuh) and
// device_shim.hpp (threadIdx, __shfl_sync, ...). Timing means nothing here;
// fragment layouts, indexing, masking, synchronization and results do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace ffpa::emulation {

struct Index3 {
  unsigned x = 0, y = 0, z = 0;
};

// The current fiber's thread and block index, the block's size.
Index3 thread_index();
Index3 block_index();
Index3 block_dim();

// The base of the running CTA's shared memory (shared-window addresses are
// offsets from it).
unsigned char* shared_memory_base();

// Runs `body` as a CTA of `threads` threads (a multiple of 32) with index
// `block` whose dynamic shared memory is `shared` (the kernel's extern array).
// Aborts with a message on a deadlock (threads waiting at different barriers).
// `idle`: called when no thread can progress, before a deadlock is declared;
// returns true when it did something (then the threads run again).
void run_cta(Index3 block, int threads, unsigned char* shared, const std::function<void()>& body,
             const std::function<bool()>& idle = {});

// A cluster of `ranks` CTAs of `cta_threads` threads (blocks first_block.x,
// first_block.x + 1, ...), CTA r's shared memory at shared[r], all their
// threads on one scheduler (sm90's distributed shared memory and cluster barrier).
void run_cluster(Index3 first_block, int ranks, int cta_threads, unsigned char* const* shared,
                 const std::function<void()>& body, const std::function<bool()>& idle = {});
int cluster_rank();
unsigned char* cluster_shared_memory(int rank);
// barrier.cluster arrive + wait: every thread of the cluster.
void cluster_sync();

// cp.async of `bytes` (zero-fill when !valid) into shared-window address
// dst, queued in the thread's open group; commit closes the group; wait
// lands every group but the `pending` newest.
void cp_async(uint32_t dst, const void* src, bool valid, int bytes);
void cp_async_commit();
void cp_async_wait(int pending);

// The running thread's index in its CTA (-1 outside run_cta).
int current_thread();

// A 16-bit element's value from its bits (bf16, or fp16): the mma.sync and
// wgmma emulations' operand reads.
float half_bits_value(uint16_t bits, bool bf16);

// Spin-waits (the sm90 family's mbarrier try_wait loops): the thread yields
// to the others. A round of the scheduler in which every live thread only
// spun or waited, with no progress noted, is a deadlock, once the idle hook
// (set per run_cta; e.g. landing deferred TMA copies) has nothing left to do.
void spin_yield();
void note_progress();

// Schedule exploration: with FFPA_EMULATION_SCHEDULE_SEED unset or 0 the
// scheduler runs the threads round-robin in index order, each until it
// waits; another seed visits them in a fresh pseudo-random order every round
// and, at each preempt_point(), switches the running thread out with
// probability 1/4, one time in 512 of those for 1-256 whole rounds (its
// warpgroup then stalls at its next collective while the others run far
// ahead), so that a test sees other interleavings of the same kernel
// (a race between two consumers sharing a barrier showed only so: the
// ninth session's sm90 backward; a W buffer freed by the wrong reader, a
// wgmma's operand overwritten before its wait, only with the long stalls:
// the tenth's, under seeds 1 and 4 of 1-6). preempt_point: where an sm90 barrier, TMA, cp.async arrival or
// st.async operation has finished (the emulator's state consistent).
void preempt_point();

// bar.sync id, count: `count` threads (whole warps) meet at hardware barrier id.
void named_barrier(int id, int count);
// bar.arrive id, count: counts towards the barrier's `count` without waiting.
void named_barrier_arrive(int id, int count);

// Collectives: every lane of the warp (every thread of the CTA for
// sync_threads) calls them, converged.
void sync_threads();
uint32_t shuffle(uint32_t value, int source_lane, int width);
uint32_t shuffle_xor(uint32_t value, int lane_mask, int width);
bool any(bool predicate);
void sync_warp();
void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, bool transposed);
enum class MmaType { f16, bf16 };
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, MmaType type);
// fp16 inputs and fp16 accumulators (two half2 registers: rows g and g + 8);
// each product sum is rounded to fp16 once (the hardware's internal order is
// not modelled).
void mma_m16n8k16_f16(uint32_t (&d)[2], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

}  // namespace ffpa::emulation
