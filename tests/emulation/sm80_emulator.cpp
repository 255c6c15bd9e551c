// The CPU emulation of a CTA (sm80_emulator.hpp): fibers on ucontext, one
// rendezvous per warp for the warp collectives and one per CTA for the
// barrier. A collective's last arriving lane computes every lane's result
// into that lane's own slot, so lanes may run on to their next collective
// before the others have read theirs.
#include "emulation/sm80_emulator.hpp"

#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ffpa::emulation {
namespace {

constexpr size_t kStackBytes = size_t{1} << 19;

enum class Op { none, sync, shuffle, shuffle_xor, any, ldmatrix, ldmatrix_trans, mma_f16, mma_bf16, mma_f16_f16 };

struct LaneInput {
  uint32_t u[6];
  float f[4];
  int i[2];
};

struct LaneOutput {
  uint32_t u[4];
  float f[4];
};

struct Copy {
  uint32_t dst;
  const void* src;
  bool valid;
  int bytes;
};

struct Fiber {
  ucontext_t context;
  std::vector<Copy> open_group;           // cp.async since the last commit
  std::deque<std::vector<Copy>> groups;   // committed, not yet waited for: oldest first
  std::unique_ptr<char[]> stack;
  bool done = false;
  const uint64_t* wait_generation = nullptr;  // blocked until *wait_generation >= wait_until
  uint64_t wait_until = 0;
  bool spinning = false;  // yielded in a spin-wait
  int stalled_rounds = 0;  // schedule exploration: rounds it sits out (preempt_point)
  LaneOutput out{};
};

struct Rendezvous {
  int arrived = 0;
  uint64_t generation = 0;
  Op op = Op::none;
  LaneInput in[32];
};

// Per CTA of the running cluster: its shared memory and barriers.
struct CtaBarriers {
  unsigned char* shared = nullptr;
  Rendezvous barrier;    // __syncthreads
  Rendezvous named[16];  // bar.sync ids 0..15; `in` unused, `op` unused
  int named_count[16] = {};
};

// The running cluster (one CTA without one): fiber i is thread i % cta_threads
// of CTA (rank) i / cta_threads.
struct Cta {
  Index3 block;     // rank 0's
  int threads = 0;  // every fiber of the cluster
  int cta_threads = 0;
  std::vector<CtaBarriers> ctas;
  Rendezvous cluster_barrier;
  std::vector<Fiber> fibers;
  std::vector<Rendezvous> warps;
  uint64_t progress = 0;  // events that let another thread run on
  uint64_t schedule_seed = 0, random_state = 0;  // FFPA_EMULATION_SCHEDULE_SEED (0: the fixed order)
  ucontext_t scheduler;
  int current = -1;
  const std::function<void()>* body = nullptr;
};

Cta* g_cta = nullptr;

// Schedule exploration (sm80_emulator.hpp): splitmix64 over the running cluster's state.
uint64_t next_random() {
  uint64_t z = (g_cta->random_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "emulator: %s\n", what);
  std::abort();
}

Fiber& me() { return g_cta->fibers[static_cast<size_t>(g_cta->current)]; }
int my_rank() { return g_cta->current / g_cta->cta_threads; }
CtaBarriers& my_cta() { return g_cta->ctas[static_cast<size_t>(my_rank())]; }

void fiber_main(int index) {
  (void)index;
  (*g_cta->body)();
  me().done = true;
  // Returning resumes the scheduler (uc_link).
}

// Parks the current fiber until `generation` passes `until`.
void block_on(const uint64_t* generation, uint64_t until) {
  Fiber& fiber = me();
  fiber.wait_generation = generation;
  fiber.wait_until = until;
  swapcontext(&fiber.context, &g_cta->scheduler);
}

// A barrier of `count` threads: the last to arrive releases the others.
void rendezvous(Rendezvous& r, int count) {
  const uint64_t generation = r.generation;
  if (++r.arrived == count) {
    r.arrived = 0;
    ++r.generation;
  } else {
    block_on(&r.generation, generation + 1);
  }
}

uint16_t half_word(uint32_t word, int which) { return static_cast<uint16_t>(which == 0 ? word & 0xFFFFu : word >> 16); }

float to_float(uint16_t bits, Op op) { return half_bits_value(bits, op == Op::mma_bf16); }

uint16_t load16(uint32_t address) {
  uint16_t v;
  std::memcpy(&v, my_cta().shared + address, 2);
  return v;
}

// Computes a completed warp collective: every lane's output slot.
void complete(Rendezvous& r, int warp) {
  Fiber* lanes[32];
  for (int l = 0; l < 32; ++l) lanes[l] = &g_cta->fibers[static_cast<size_t>(warp * 32 + l)];
  switch (r.op) {
    case Op::shuffle:
    case Op::shuffle_xor:
      for (int l = 0; l < 32; ++l) {
        const int width = r.in[l].i[1];
        const int base = l / width * width;
        const int source = r.op == Op::shuffle ? base + r.in[l].i[0] % width : base + ((l % width) ^ r.in[l].i[0]) % width;
        lanes[l]->out.u[0] = r.in[source].u[0];
      }
      break;
    case Op::any: {
      uint32_t any = 0;
      for (int l = 0; l < 32; ++l) any |= r.in[l].u[0];
      for (int l = 0; l < 32; ++l) lanes[l]->out.u[0] = any;
      break;
    }
    case Op::ldmatrix:
    case Op::ldmatrix_trans:
      // Matrix m's row j is at the address lane 8 m + j gave.
      for (int l = 0; l < 32; ++l)
        for (int m = 0; m < 4; ++m) {
          uint16_t lo, hi;
          if (r.op == Op::ldmatrix) {
            const uint32_t row = r.in[8 * m + l / 4].u[0];
            lo = load16(row + 4 * (l % 4));
            hi = load16(row + 4 * (l % 4) + 2);
          } else {
            lo = load16(r.in[8 * m + 2 * (l % 4)].u[0] + 2 * (l / 4));
            hi = load16(r.in[8 * m + 2 * (l % 4) + 1].u[0] + 2 * (l / 4));
          }
          lanes[l]->out.u[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
        }
      break;
    case Op::mma_f16:
    case Op::mma_bf16:
    case Op::mma_f16_f16: {
      const Op element = r.op == Op::mma_bf16 ? Op::mma_bf16 : Op::mma_f16;
      float a[16][16], b[16][8];
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        const uint32_t* ar = r.in[l].u;
        for (int e = 0; e < 2; ++e) {
          a[g][2 * t + e] = to_float(half_word(ar[0], e), element);
          a[g + 8][2 * t + e] = to_float(half_word(ar[1], e), element);
          a[g][2 * t + 8 + e] = to_float(half_word(ar[2], e), element);
          a[g + 8][2 * t + 8 + e] = to_float(half_word(ar[3], e), element);
          b[2 * t + e][g] = to_float(half_word(ar[4], e), element);
          b[2 * t + 8 + e][g] = to_float(half_word(ar[5], e), element);
        }
      }
      for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int e = 0; e < 4; ++e) {
          const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
          float sum = r.op == Op::mma_f16_f16 ? to_float(half_word(r.in[l].i[e / 2] , e % 2), Op::mma_f16)
                                              : r.in[l].f[e];
          for (int k = 0; k < 16; ++k) sum += a[row][k] * b[k][col];
          lanes[l]->out.f[e] = r.op == Op::mma_f16_f16 ? __half2float(__float2half_rn(sum)) : sum;
        }
      }
      break;
    }
    case Op::sync: break;  // __syncwarp: the rendezvous is the whole effect
    case Op::none: fail("a collective without an operation");
  }
}

// Arrives at the current warp's rendezvous with `in` for `op`; returns this
// lane's output once every lane has arrived.
LaneOutput warp_collective(Op op, const LaneInput& in) {
  const int thread = g_cta->current;
  const int warp = thread / 32, lane = thread % 32;
  Rendezvous& r = g_cta->warps[static_cast<size_t>(warp)];
  if (r.arrived == 0) {
    r.op = op;
  } else if (r.op != op) {
    fail("the lanes of a warp reached different collectives (divergence)");
  }
  r.in[lane] = in;
  const uint64_t generation = r.generation;
  if (++r.arrived == 32) {
    complete(r, warp);
    r.arrived = 0;
    ++r.generation;
  } else {
    block_on(&r.generation, generation + 1);
  }
  return me().out;
}

}  // namespace

Index3 thread_index() { return {static_cast<unsigned>(g_cta->current % g_cta->cta_threads), 0, 0}; }
Index3 block_index() {
  return {g_cta->block.x + static_cast<unsigned>(my_rank()), g_cta->block.y, g_cta->block.z};
}
Index3 block_dim() { return {static_cast<unsigned>(g_cta->cta_threads), 1, 1}; }
unsigned char* shared_memory_base() { return my_cta().shared; }
int cluster_rank() { return my_rank(); }
unsigned char* cluster_shared_memory(int rank) {
  if (rank < 0 || rank >= static_cast<int>(g_cta->ctas.size())) fail("a cluster rank outside the cluster");
  return g_cta->ctas[static_cast<size_t>(rank)].shared;
}

void run_cta(Index3 block, int threads, unsigned char* shared, const std::function<void()>& body,
             const std::function<bool()>& idle) {
  run_cluster(block, 1, threads, &shared, body, idle);
}

void run_cluster(Index3 first_block, int ranks, int cta_threads, unsigned char* const* shared,
                 const std::function<void()>& body, const std::function<bool()>& idle) {
  if (cta_threads % 32 != 0 || cta_threads <= 0) fail("a CTA of whole warps");
  if (ranks < 1) fail("a cluster of at least one CTA");
  const int threads = ranks * cta_threads;
  Cta cta;
  cta.block = first_block;
  cta.threads = threads;
  cta.cta_threads = cta_threads;
  cta.ctas.resize(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) cta.ctas[static_cast<size_t>(r)].shared = shared[r];
  cta.body = &body;
  cta.fibers.resize(static_cast<size_t>(threads));
  cta.warps.resize(static_cast<size_t>(threads / 32));
  g_cta = &cta;
  for (int i = 0; i < threads; ++i) {
    Fiber& fiber = cta.fibers[static_cast<size_t>(i)];
    fiber.stack.reset(new char[kStackBytes]);
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack.get();
    fiber.context.uc_stack.ss_size = kStackBytes;
    fiber.context.uc_link = &cta.scheduler;
    makecontext(&fiber.context, reinterpret_cast<void (*)()>(fiber_main), 1, i);
  }
  if (const char* seed = std::getenv("FFPA_EMULATION_SCHEDULE_SEED")) cta.schedule_seed = std::strtoull(seed, nullptr, 0);
  cta.random_state = cta.schedule_seed ^ (0xD1B54A32D192ED03ull * (first_block.x + 1));  // per cluster
  std::vector<int> order(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) order[static_cast<size_t>(i)] = i;
  for (;;) {
    bool all_done = true, progress = false;
    const uint64_t events = cta.progress;
    if (cta.schedule_seed != 0) {  // a fresh order every round (Fisher-Yates)
      for (int i = threads - 1; i > 0; --i)
        std::swap(order[static_cast<size_t>(i)], order[next_random() % static_cast<uint64_t>(i + 1)]);
    }
    for (int i : order) {
      Fiber& fiber = cta.fibers[static_cast<size_t>(i)];
      if (fiber.done) continue;
      all_done = false;
      if (fiber.stalled_rounds > 0) {  // not a wait: it runs on once the stall is over
        --fiber.stalled_rounds;
        progress = true;
        continue;
      }
      if (fiber.wait_generation != nullptr && *fiber.wait_generation < fiber.wait_until) continue;
      fiber.wait_generation = nullptr;
      if (!fiber.spinning) progress = true;  // released from a collective, or running on
      fiber.spinning = false;
      cta.current = i;
      swapcontext(&cta.scheduler, &fiber.context);
      if (fiber.done) progress = true;
    }
    if (all_done) break;
    if (!progress && cta.progress == events && !(idle && idle())) {
      fail("deadlock: every live thread waits (a collective, a barrier or a spin-wait) for something no thread does");
    }
  }
  for (const Rendezvous& r : cta.warps)
    if (r.arrived != 0) fail("a warp collective left incomplete");
  for (const CtaBarriers& b : cta.ctas) {
    if (b.barrier.arrived != 0) fail("threads finished while others waited at __syncthreads");
    for (const Rendezvous& r : b.named)
      if (r.arrived != 0) fail("threads finished while others waited at a named barrier (or arrivals were left at one)");
  }
  if (cta.cluster_barrier.arrived != 0) fail("threads finished while others waited at the cluster barrier");
  g_cta = nullptr;
}

float half_bits_value(uint16_t bits, bool bf16) {
  if (bf16) {
    __nv_bfloat16_raw raw;
    raw.x = bits;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

int current_thread() { return g_cta != nullptr ? g_cta->current : -1; }

void spin_yield() {
  Fiber& fiber = me();
  fiber.spinning = true;
  swapcontext(&fiber.context, &g_cta->scheduler);
}

void note_progress() { ++g_cta->progress; }

void preempt_point() {
  if (g_cta == nullptr || g_cta->schedule_seed == 0 || g_cta->current < 0) return;
  if (next_random() % 4 != 0) return;
  Fiber& fiber = me();
  fiber.spinning = false;  // switched out while running on: not a wait
  // Now and then a long stall (its warp, then its warpgroup, wait for it at
  // their next collective), so that the other roles run far ahead of it.
  if (next_random() % 512 == 0) fiber.stalled_rounds = 1 + static_cast<int>(next_random() % 256);
  swapcontext(&fiber.context, &g_cta->scheduler);
}

// The named barrier `id` after checking the id and the count every thread gives.
static Rendezvous& named_rendezvous(int id, int count) {
  if (id < 0 || id >= 16 || count <= 0 || count % 32 != 0 || count > g_cta->cta_threads) {
    fail("bar.sync / bar.arrive: a bad id or count");
  }
  CtaBarriers& cta = my_cta();
  Rendezvous& r = cta.named[id];
  if (r.arrived == 0) {
    cta.named_count[id] = count;
  } else if (cta.named_count[id] != count) {
    fail("bar.sync / bar.arrive: threads of one barrier give different counts");
  }
  return r;
}

void named_barrier(int id, int count) { rendezvous(named_rendezvous(id, count), count); }

void named_barrier_arrive(int id, int count) {
  Rendezvous& r = named_rendezvous(id, count);
  if (++r.arrived == count) {
    r.arrived = 0;
    ++r.generation;
  }
}

void cp_async(uint32_t dst, const void* src, bool valid, int bytes) {
  me().open_group.push_back({dst, src, valid, bytes});
}

void cp_async_commit() {
  Fiber& fiber = me();
  fiber.groups.push_back(std::move(fiber.open_group));
  fiber.open_group.clear();
}

void cp_async_wait(int pending) {
  Fiber& fiber = me();
  while (static_cast<int>(fiber.groups.size()) > pending) {
    for (const Copy& copy : fiber.groups.front()) {
      unsigned char* to = my_cta().shared + copy.dst;
      if (copy.valid) {
        std::memcpy(to, copy.src, copy.bytes);
      } else {
        std::memset(to, 0, copy.bytes);
      }
    }
    fiber.groups.pop_front();
  }
}

void sync_threads() { rendezvous(my_cta().barrier, g_cta->cta_threads); }

void cluster_sync() { rendezvous(g_cta->cluster_barrier, g_cta->threads); }

uint32_t shuffle(uint32_t value, int source_lane, int width) {
  LaneInput in{};
  in.u[0] = value;
  in.i[0] = source_lane;
  in.i[1] = width;
  return warp_collective(Op::shuffle, in).u[0];
}

uint32_t shuffle_xor(uint32_t value, int lane_mask, int width) {
  LaneInput in{};
  in.u[0] = value;
  in.i[0] = lane_mask;
  in.i[1] = width;
  return warp_collective(Op::shuffle_xor, in).u[0];
}

void sync_warp() { (void)warp_collective(Op::sync, LaneInput{}); }

bool any(bool predicate) {
  LaneInput in{};
  in.u[0] = predicate ? 1u : 0u;
  return warp_collective(Op::any, in).u[0] != 0;
}

void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, bool transposed) {
  if (address % 16 != 0) fail("ldmatrix: a row address that is not 16-byte aligned");
  LaneInput in{};
  in.u[0] = address;
  const LaneOutput out = warp_collective(transposed ? Op::ldmatrix_trans : Op::ldmatrix, in);
  for (int m = 0; m < 4; ++m) r[m] = out.u[m];
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, MmaType type) {
  LaneInput in{};
  for (int i = 0; i < 4; ++i) in.u[i] = a[i], in.f[i] = d[i];
  in.u[4] = b0;
  in.u[5] = b1;
  const LaneOutput out = warp_collective(type == MmaType::bf16 ? Op::mma_bf16 : Op::mma_f16, in);
  for (int i = 0; i < 4; ++i) d[i] = out.f[i];
}

void mma_m16n8k16_f16(uint32_t (&d)[2], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  LaneInput in{};
  for (int i = 0; i < 4; ++i) in.u[i] = a[i];
  in.u[4] = b0;
  in.u[5] = b1;
  in.i[0] = static_cast<int>(d[0]);
  in.i[1] = static_cast<int>(d[1]);
  const LaneOutput out = warp_collective(Op::mma_f16_f16, in);
  for (int h = 0; h < 2; ++h) {
    const uint16_t lo = static_cast<__half_raw>(__float2half_rn(out.f[2 * h])).x;
    const uint16_t hi = static_cast<__half_raw>(__float2half_rn(out.f[2 * h + 1])).x;
    d[h] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}

}  // namespace ffpa::emulation
