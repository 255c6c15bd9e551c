// The sm90 instructions on the fiber emulation (sm90_emulator.hpp). State per
// cluster run: the mbarriers by (CTA, shared-window address), the TMA copies,
// st.async stores and cp.async copies not yet landed, each warpgroup's wgmma operations and
// groups, the threads spinning and on what.
#include "emulation/sm90_emulator.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

namespace ffpa::emulation::sm90 {
namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "sm90 emulator: %s (thread %d)\n", what, current_thread());
  std::abort();
}

constexpr uint32_t kMapMagic = 0x5EA90A11u;

struct StoredMap {
  uint32_t magic;
  TensorMapInfo info;
};
static_assert(sizeof(StoredMap) <= sizeof(CUtensorMap), "the emulated map fits the opaque descriptor");

const TensorMapInfo& decode(const CUtensorMap* map) {
  const StoredMap* stored = reinterpret_cast<const StoredMap*>(map);
  if (stored->magic != kMapMagic) fail("a tensor map not made by the emulation's encode_tensor_map");
  return stored->info;
}

struct Barrier {
  uint32_t expected = 0;  // arrivals per phase
  uint32_t pending = 0;   // arrivals still missing in the current phase
  int64_t tx = 0;         // transaction bytes still missing
  uint32_t phase = 0;     // completed phases
};

// A barrier or shared-memory byte of a CTA of the cluster: (rank << 32) | shared-window address.
using ClusterAddress = uint64_t;
ClusterAddress local(uint32_t address) { return (static_cast<uint64_t>(cluster_rank()) << 32) | address; }
// peer_address's encoding of CTA `rank`'s address (what mapa returns on the GPU).
constexpr uint32_t kRemoteFlag = 1u << 31;
ClusterAddress from_remote(uint32_t remote) {
  if ((remote & kRemoteFlag) == 0) fail("a shared::cluster address not made by peer_address");
  return (static_cast<uint64_t>((remote >> 24) & 0x7F) << 32) | (remote & 0xFFFFFF);
}

struct PendingLoad {
  int rank;
  uint32_t dst;
  const CUtensorMap* map;
  int coords[5];
};

// cp.async: 16 bytes into a CTA's shared memory, the first src_bytes from src.
struct AsyncCopy {
  int rank;
  uint32_t dst;
  const void* src;
  uint32_t src_bytes;
};

// st.async: 16 bytes for a CTA's shared memory, completing a transaction on its barrier.
struct PendingAsyncStore {
  int rank;
  uint32_t offset;
  unsigned char bytes[16];
};

struct PendingStore {
  const CUtensorMap* map;
  uint32_t src;
  int coords[5];
  bool add = false;  // a reduction (tma_reduce_add_4d): fp32 elements added, not stored
};

struct WgmmaOp {
  WgmmaKind kind;
  int n;
  bool transpose_b, transpose_a;
  uint64_t desc_a, desc_b;
  bool accumulate;
  void* d[128] = {};
  int contributed = 0;
  // RS: each thread's A registers, and their values at issue (a change
  // before the wgmma retires is a kernel bug the real GPU would not report).
  bool a_in_registers = false;
  const uint32_t* a[128] = {};
  uint32_t a_at_issue[128][4] = {};
};

struct Warpgroup {
  std::deque<WgmmaOp> ops;  // stable references while threads spin
  std::vector<size_t> group_end;  // ops [.., group_end[g]) close group g
  size_t executed = 0;            // ops [0, executed) are done
  int issued[128] = {};
  int committed[128] = {};
};

struct State {
  TmaLanding landing = TmaLanding::at_issue;
  std::map<ClusterAddress, Barrier> barriers;
  std::map<ClusterAddress, std::vector<PendingLoad>> loads;  // by barrier
  std::map<ClusterAddress, std::vector<PendingAsyncStore>> async_stores;  // by barrier
  // cp.async: each thread's copies since its last noinc arrival (by
  // (rank << 32) | thread; already landed with TmaLanding::at_issue), and the
  // arrivals waiting for their copies (at_wait), by barrier.
  std::map<uint64_t, std::vector<AsyncCopy>> open_copies;
  std::map<ClusterAddress, std::vector<std::vector<AsyncCopy>>> copy_arrivals;
  // cp.async groups a thread has committed and not yet waited for, oldest first.
  std::map<uint64_t, std::deque<std::vector<AsyncCopy>>> copy_groups;
  std::map<int, std::vector<PendingStore>> stores;     // by thread
  std::vector<Warpgroup> warpgroups;
  std::map<int, std::pair<ClusterAddress, uint32_t>> spinning;  // thread -> (barrier, parity) of its failed try_wait
};

State* g_state = nullptr;

// The 128-byte swizzle on a shared-window byte address (atoms 1024-byte aligned):
// the 16-byte chunk within a 128-byte row XOR the row within the 8-row atom.
uint32_t swizzle(uint32_t address) { return address ^ (((address >> 7) & 7u) << 4); }

Barrier& barrier(ClusterAddress bar) {
  auto it = g_state->barriers.find(bar);
  if (it == g_state->barriers.end()) fail("an mbarrier used before mbarrier_init");
  return it->second;
}

void maybe_complete(Barrier& b) {
  if (b.pending == 0 && b.tx == 0) {
    ++b.phase;
    b.pending = b.expected;
    note_progress();
  }
}

void arrive(ClusterAddress bar) {
  Barrier& b = barrier(bar);
  if (b.pending == 0) fail("an mbarrier arrival beyond its count");
  --b.pending;
  note_progress();
  maybe_complete(b);
}

void land_copy(const AsyncCopy& copy) {
  unsigned char* to = cluster_shared_memory(copy.rank) + copy.dst;
  if (copy.src_bytes > 0) std::memcpy(to, copy.src, copy.src_bytes);
  std::memset(to + copy.src_bytes, 0, 16 - copy.src_bytes);
}

// The box at `coords` between global memory and shared memory at `smem`:
// loaded into shared memory, stored from it, or (fp32) added from it.
enum class BoxCopy { load, store, add_f32 };
template <BoxCopy kCopy>
void copy_box(const TensorMapInfo& m, unsigned char* shared, uint32_t smem, const int (&coords)[5]) {
  if (kCopy == BoxCopy::add_f32 && m.element_bytes != 4) fail("a TMA reduce-add of other than fp32 elements");
  const int eb = m.element_bytes;
  if (m.box[0] * eb != 128) fail("TMA boxes of 128-byte rows (the 128-byte swizzle)");
  if (smem % 1024 != 0) fail("a swizzled TMA box not 1024-byte aligned in shared memory");
  uint32_t row = 0;
  for (int i4 = 0; i4 < m.box[4]; ++i4)
    for (int i3 = 0; i3 < m.box[3]; ++i3)
      for (int i2 = 0; i2 < m.box[2]; ++i2)
        for (int i1 = 0; i1 < m.box[1]; ++i1, ++row)
          for (int i0 = 0; i0 < m.box[0]; ++i0) {
            const int64_t c[5] = {int64_t{coords[0]} + i0, int64_t{coords[1]} + i1, int64_t{coords[2]} + i2,
                                  int64_t{coords[3]} + i3, int64_t{coords[4]} + i4};
            bool inside = true;
            for (int k = 0; k < 5; ++k) inside = inside && c[k] >= 0 && c[k] < m.dims[k];
            unsigned char* s = shared + swizzle(smem + row * 128 + static_cast<uint32_t>(i0 * eb));
            const int64_t offset =
                c[0] * eb + c[1] * m.strides[0] + c[2] * m.strides[1] + c[3] * m.strides[2] + c[4] * m.strides[3];
            unsigned char* const g = const_cast<unsigned char*>(m.base) + offset;
            if (kCopy == BoxCopy::load) {
              if (inside) {
                std::memcpy(s, g, static_cast<size_t>(eb));
              } else {
                std::memset(s, 0, static_cast<size_t>(eb));
              }
            } else if (inside && kCopy == BoxCopy::store) {
              std::memcpy(g, s, static_cast<size_t>(eb));
            } else if (inside) {
              float sum, term;
              std::memcpy(&sum, g, 4);
              std::memcpy(&term, s, 4);
              sum += term;
              std::memcpy(g, &sum, 4);
            }
          }
}

int64_t box_bytes(const TensorMapInfo& m) {
  return int64_t{m.box[0]} * m.box[1] * m.box[2] * m.box[3] * m.box[4] * m.element_bytes;
}

void land(ClusterAddress bar, const PendingLoad& load) {
  copy_box<BoxCopy::load>(decode(load.map), cluster_shared_memory(load.rank), load.dst, load.coords);
  Barrier& b = barrier(bar);
  b.tx -= box_bytes(decode(load.map));
  maybe_complete(b);
}

void land_store(ClusterAddress bar, const PendingAsyncStore& store) {
  std::memcpy(cluster_shared_memory(store.rank) + store.offset, store.bytes, 16);
  Barrier& b = barrier(bar);
  b.tx -= 16;
  maybe_complete(b);
}

void land_loads_of(ClusterAddress bar) {
  auto it = g_state->loads.find(bar);
  if (it != g_state->loads.end() && !it->second.empty()) {
    std::vector<PendingLoad> loads = std::move(it->second);
    it->second.clear();
    for (const PendingLoad& load : loads) land(bar, load);
  }
  auto stores = g_state->async_stores.find(bar);
  if (stores != g_state->async_stores.end() && !stores->second.empty()) {
    std::vector<PendingAsyncStore> pending = std::move(stores->second);
    stores->second.clear();
    for (const PendingAsyncStore& store : pending) land_store(bar, store);
  }
  auto arrivals = g_state->copy_arrivals.find(bar);
  if (arrivals != g_state->copy_arrivals.end() && !arrivals->second.empty()) {
    std::vector<std::vector<AsyncCopy>> pending = std::move(arrivals->second);
    arrivals->second.clear();
    for (const std::vector<AsyncCopy>& copies : pending) {
      for (const AsyncCopy& copy : copies) land_copy(copy);
      arrive(bar);
    }
  }
}

// Before a deadlock is declared: which threads spin on which barrier, in runs of threads.
void describe_waits() {
  std::fprintf(stderr, "sm90 emulator: no thread can progress; spin-waits:\n");
  int first = -1, last = -1;
  std::pair<ClusterAddress, uint32_t> wait{};
  auto flush = [&] {
    if (first < 0) return;
    const Barrier& b = g_state->barriers[wait.first];
    std::fprintf(stderr,
                 "  threads %d-%d: barrier at CTA %u shared +%u, parity %u (completed phases %u, arrivals missing %u "
                 "of %u, tx %lld)\n",
                 first, last, static_cast<unsigned>(wait.first >> 32), static_cast<unsigned>(wait.first & 0xFFFFFFFFu),
                 wait.second, b.phase, b.pending, b.expected, static_cast<long long>(b.tx));
  };
  for (const auto& [thread, w] : g_state->spinning) {
    if (first >= 0 && thread == last + 1 && w == wait) {
      last = thread;
      continue;
    }
    flush();
    first = last = thread;
    wait = w;
  }
  flush();
}

bool land_everything() {
  std::vector<ClusterAddress> bars;
  for (const auto& [bar, loads] : g_state->loads)
    if (!loads.empty()) bars.push_back(bar);
  for (const auto& [bar, stores] : g_state->async_stores)
    if (!stores.empty()) bars.push_back(bar);
  for (const auto& [bar, arrivals] : g_state->copy_arrivals)
    if (!arrivals.empty()) bars.push_back(bar);
  for (ClusterAddress bar : bars) land_loads_of(bar);
  return !bars.empty();
}

void flush_stores(int thread) {
  auto it = g_state->stores.find(thread);
  if (it == g_state->stores.end()) return;
  for (const PendingStore& store : it->second) {
    if (store.add) {
      copy_box<BoxCopy::add_f32>(decode(store.map), shared_memory_base(), store.src, store.coords);
    } else {
      copy_box<BoxCopy::store>(decode(store.map), shared_memory_base(), store.src, store.coords);
    }
  }
  it->second.clear();
}

// --- wgmma ---------------------------------------------------------------------------

struct Descriptor {
  uint32_t start, leading, stride;
};

Descriptor decode_descriptor(uint64_t desc) {
  if ((desc >> 62) != 1) fail("a wgmma descriptor without the 128-byte swizzle");
  return {static_cast<uint32_t>(desc & 0x3FFF) << 4, static_cast<uint32_t>((desc >> 16) & 0x3FFF) << 4,
          static_cast<uint32_t>((desc >> 32) & 0x3FFF) << 4};
}

float element_value(WgmmaKind kind, uint32_t address) {
  const unsigned char* p = shared_memory_base() + swizzle(address);  // the issuing warpgroup's CTA
  switch (kind) {
    case WgmmaKind::bf16:
    case WgmmaKind::f16: {
      uint16_t bits;
      std::memcpy(&bits, p, 2);
      return half_bits_value(bits, kind == WgmmaKind::bf16);
    }
    case WgmmaKind::e4m3: {
      const unsigned v = *p;
      const int sign = v >> 7, exponent = (v >> 3) & 15, mantissa = v & 7;
      if (exponent == 15 && mantissa == 7) return std::nanf("");
      const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa) / 8.0f, -6)
                                            : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
      return sign ? -magnitude : magnitude;
    }
    case WgmmaKind::s8: return static_cast<float>(static_cast<int8_t>(*p));
  }
  return 0.0f;
}

void execute(WgmmaOp& op) {
  const int element_bytes = op.kind == WgmmaKind::bf16 || op.kind == WgmmaKind::f16 ? 2 : 1;
  const int k_steps = 32 / element_bytes;  // 32 bytes of a 128-byte row per instruction
  const Descriptor a = op.a_in_registers ? Descriptor{} : decode_descriptor(op.desc_a), b = decode_descriptor(op.desc_b);
  // A [64][k] K-major: 8-row groups `stride` apart, rows of 128 bytes. M-major
  // ([k][m], 16-bit only): as an N-major B.
  auto a_address = [&](int m, int k) {
    if (!op.transpose_a) return a.start + (m / 8) * a.stride + (m % 8) * 128 + k * element_bytes;
    return a.start + (m / 64) * a.leading + (k / 8) * a.stride + (k % 8) * 128 + (m % 64) * 2;
  };
  // B K-major ([n][k]): as A. N-major ([k][n], 16-bit only): 64-column blocks
  // `leading` apart, 8-row (k) groups `stride` apart.
  auto b_address = [&](int k, int n) {
    if (!op.transpose_b) return b.start + (n / 8) * b.stride + (n % 8) * 128 + k * element_bytes;
    return b.start + (n / 64) * b.leading + (k / 8) * b.stride + (k % 8) * 128 + (n % 64) * 2;
  };
  std::vector<float> av(static_cast<size_t>(64 * k_steps)), bv(static_cast<size_t>(k_steps * op.n));
  if (op.a_in_registers) {
    // Thread t = 32 w + l: register j holds row 16 w + l / 4 + 8 (j % 2),
    // columns 8 (j / 2) + 2 (l % 4) + {0, 1} (the low half first).
    for (int t = 0; t < 128; ++t) {
      const int w = t / 32, l = t % 32;
      for (int j = 0; j < 4; ++j) {
        if (op.a[t][j] != op.a_at_issue[t][j]) fail("an RS wgmma's A registers changed before it retired");
        const int row = 16 * w + l / 4 + 8 * (j % 2), col = 8 * (j / 2) + 2 * (l % 4);
        for (int e = 0; e < 2; ++e) {
          const auto bits = static_cast<uint16_t>(e == 0 ? op.a[t][j] & 0xFFFFu : op.a[t][j] >> 16);
          av[static_cast<size_t>(row * k_steps + col + e)] = half_bits_value(bits, op.kind == WgmmaKind::bf16);
        }
      }
    }
  } else {
    for (int m = 0; m < 64; ++m)
      for (int k = 0; k < k_steps; ++k) av[static_cast<size_t>(m * k_steps + k)] = element_value(op.kind, a_address(m, k));
  }
  for (int k = 0; k < k_steps; ++k)
    for (int n = 0; n < op.n; ++n) bv[static_cast<size_t>(k * op.n + n)] = element_value(op.kind, b_address(k, n));
  for (int t = 0; t < 128; ++t) {
    const int w = t / 32, l = t % 32;
    for (int i = 0; i < op.n / 8; ++i)
      for (int e = 0; e < 4; ++e) {
        const int row = 16 * w + l / 4 + 8 * (e / 2), col = 8 * i + 2 * (l % 4) + e % 2;
        const int index = 4 * i + e;
        if (op.kind == WgmmaKind::s8) {
          int32_t* d = static_cast<int32_t*>(op.d[t]);
          int32_t sum = op.accumulate ? d[index] : 0;
          for (int k = 0; k < k_steps; ++k)
            sum += static_cast<int32_t>(av[static_cast<size_t>(row * k_steps + k)]) *
                   static_cast<int32_t>(bv[static_cast<size_t>(k * op.n + col)]);
          d[index] = sum;
        } else {
          float* d = static_cast<float*>(op.d[t]);
          float sum = op.accumulate ? d[index] : 0.0f;
          for (int k = 0; k < k_steps; ++k)
            sum += av[static_cast<size_t>(row * k_steps + k)] * bv[static_cast<size_t>(k * op.n + col)];
          d[index] = sum;
        }
      }
  }
}

Warpgroup& my_warpgroup(int* index_in_group) {
  const int thread = current_thread();
  *index_in_group = thread % 128;
  return g_state->warpgroups[static_cast<size_t>(thread / 128)];
}

}  // namespace

void encode_tensor_map(const TensorMapInfo& info, CUtensorMap* map) {
  std::memset(map, 0, sizeof *map);
  StoredMap stored{kMapMagic, info};
  std::memcpy(static_cast<void*>(map), &stored, sizeof stored);
}

void run_cta(Index3 block, int threads, unsigned char* shared, TmaLanding landing, const std::function<void()>& body) {
  run_cluster(block, 1, threads, &shared, landing, body);
}

void run_cluster(Index3 first_block, int ranks, int threads, unsigned char* const* shared, TmaLanding landing,
                 const std::function<void()>& body) {
  for (int r = 0; r < ranks; ++r)
    if (reinterpret_cast<uintptr_t>(shared[r]) % 1024 != 0) fail("shared memory not 1024-byte aligned");
  if (threads % 128 != 0) fail("an sm90 CTA of whole warpgroups");
  State state;
  state.landing = landing;
  state.warpgroups.resize(static_cast<size_t>(ranks * threads / 128));
  g_state = &state;
  const std::function<void()> wrapped = [&] {
    body();
    flush_stores(current_thread());
  };
  emulation::run_cluster(first_block, ranks, threads, shared, wrapped, [] {
    if (land_everything()) return true;
    describe_waits();
    return false;
  });
  for (auto& [bar, loads] : state.loads)
    if (!loads.empty()) fail("TMA loads never waited for");
  for (auto& [bar, stores] : state.async_stores)
    if (!stores.empty()) fail("st.async stores never waited for");
  for (auto& [thread, copies] : state.open_copies)
    if (!copies.empty()) fail("cp.async copies without a cp.async.mbarrier.arrive after them");
  for (auto& [bar, arrivals] : state.copy_arrivals)
    if (!arrivals.empty()) fail("cp.async arrivals never waited for");
  for (auto& [thread, groups] : state.copy_groups)
    if (!groups.empty()) fail("cp.async groups never waited for");
  for (const Warpgroup& group : state.warpgroups)
    if (group.executed != group.ops.size()) fail("wgmma operations never waited for");
  g_state = nullptr;
}

void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  if (bar % 8 != 0) fail("an mbarrier not 8-byte aligned");
  Barrier b;
  b.expected = b.pending = arrivals;
  g_state->barriers[local(bar)] = b;
  note_progress();
}

void mbarrier_arrive(uint32_t bar) {
  arrive(local(bar));
  preempt_point();
}

void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  Barrier& b = barrier(local(bar));
  b.tx += bytes;
  arrive(local(bar));
  preempt_point();
}

bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  const ClusterAddress address = local(bar);
  land_loads_of(address);
  const bool done = (barrier(address).phase & 1u) != (parity & 1u);
  if (done) {
    g_state->spinning.erase(current_thread());
    note_progress();
    preempt_point();  // the phase may move on while the waiter is switched out
  } else {
    g_state->spinning[current_thread()] = {address, parity};
  }
  return done;
}

uint32_t peer_address(uint32_t local_address, uint32_t rank) {
  if (local_address >= (1u << 24) || rank > 0x7F) fail("mapa: an address or rank out of range");
  return kRemoteFlag | (rank << 24) | local_address;
}

void store_cluster_f32x4(uint32_t remote, float a, float b, float c, float d) {
  const ClusterAddress address = from_remote(remote);
  if ((address & 15) != 0) fail("st.shared::cluster.v4: an address not 16-byte aligned");
  const float values[4] = {a, b, c, d};
  std::memcpy(cluster_shared_memory(static_cast<int>(address >> 32)) + (address & 0xFFFFFFFFu), values, 16);
  note_progress();
}

void mbarrier_arrive_cluster(uint32_t remote_bar) {
  arrive(from_remote(remote_bar));
  preempt_point();
}

void store_async_cluster_f32x4(uint32_t remote, float a, float b, float c, float d, uint32_t remote_bar) {
  const ClusterAddress address = from_remote(remote), bar = from_remote(remote_bar);
  if ((address & 15) != 0) fail("st.async.v4: an address not 16-byte aligned");
  if ((address >> 32) != (bar >> 32)) fail("st.async: the data and its barrier in different CTAs");
  (void)barrier(bar);
  PendingAsyncStore store{static_cast<int>(address >> 32), static_cast<uint32_t>(address & 0xFFFFFFFFu), {}};
  const float values[4] = {a, b, c, d};
  std::memcpy(store.bytes, values, 16);
  note_progress();
  if (g_state->landing == TmaLanding::at_issue) {
    land_store(bar, store);
  } else {
    g_state->async_stores[bar].push_back(store);
  }
  preempt_point();
}

void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  if (dst % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) fail("cp.async.cg 16: an address not 16-byte aligned");
  if (src_bytes > 16) fail("cp.async: a source size above the copy's 16 bytes");
  const AsyncCopy copy{cluster_rank(), dst, src, src_bytes};
  if (g_state->landing == TmaLanding::at_issue) land_copy(copy);
  g_state->open_copies[(static_cast<uint64_t>(cluster_rank()) << 32) | static_cast<uint32_t>(current_thread())].push_back(
      copy);
  note_progress();
}

void cp_async_arrive_noinc(uint32_t bar) {
  const ClusterAddress address = local(bar);
  (void)barrier(address);
  std::vector<AsyncCopy>& open =
      g_state->open_copies[(static_cast<uint64_t>(cluster_rank()) << 32) | static_cast<uint32_t>(current_thread())];
  if (g_state->landing == TmaLanding::at_issue) {
    arrive(address);  // the copies have landed
  } else {
    g_state->copy_arrivals[address].push_back(std::move(open));
  }
  open.clear();
  note_progress();
  preempt_point();
}

void cp_async_commit() {
  const uint64_t key = (static_cast<uint64_t>(cluster_rank()) << 32) | static_cast<uint32_t>(current_thread());
  std::vector<AsyncCopy>& open = g_state->open_copies[key];
  g_state->copy_groups[key].push_back(std::move(open));
  open.clear();
  note_progress();
}

void cp_async_wait(int pending) {
  const uint64_t key = (static_cast<uint64_t>(cluster_rank()) << 32) | static_cast<uint32_t>(current_thread());
  std::deque<std::vector<AsyncCopy>>& groups = g_state->copy_groups[key];
  while (static_cast<int>(groups.size()) > pending) {
    if (g_state->landing != TmaLanding::at_issue)
      for (const AsyncCopy& copy : groups.front()) land_copy(copy);
    groups.pop_front();
  }
  note_progress();
  preempt_point();
}

void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3) {
  tma_load_5d(dst, map, bar, c0, c1, c2, c3, 0);
}

void tma_load_5d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
  PendingLoad load{cluster_rank(), dst, map, {c0, c1, c2, c3, c4}};
  const ClusterAddress address = local(bar);
  note_progress();
  if (g_state->landing == TmaLanding::at_issue) {
    land(address, load);
  } else {
    (void)barrier(address);
    g_state->loads[address].push_back(load);
  }
  preempt_point();
}

void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  g_state->stores[current_thread()].push_back({map, src, {c0, c1, c2, c3, 0}});
  note_progress();
}

void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  g_state->stores[current_thread()].push_back({map, src, {c0, c1, c2, c3, 0}, true});
  note_progress();
}

void tma_store_wait_read() { flush_stores(current_thread()); }

void wgmma(WgmmaKind kind, int n, bool transpose_b, uint64_t desc_a, uint64_t desc_b, bool accumulate, void* d,
           bool transpose_a) {
  int t = 0;
  Warpgroup& group = my_warpgroup(&t);
  const size_t k = static_cast<size_t>(group.issued[t]++);
  if (k == group.ops.size()) group.ops.push_back(WgmmaOp{kind, n, transpose_b, transpose_a, desc_a, desc_b, accumulate});
  WgmmaOp& op = group.ops[k];
  if (op.a_in_registers || op.kind != kind || op.n != n || op.transpose_b != transpose_b ||
      op.transpose_a != transpose_a || op.desc_a != desc_a || op.desc_b != desc_b || op.accumulate != accumulate) {
    fail("the threads of a warpgroup issued different wgmmas");
  }
  if (op.d[t] != nullptr) fail("a wgmma issued twice by one thread");
  op.d[t] = d;
  ++op.contributed;
  note_progress();
}

void wgmma_rs(WgmmaKind kind, int n, bool transpose_b, const uint32_t* a, uint64_t desc_b, bool accumulate, void* d) {
  if (kind != WgmmaKind::bf16 && kind != WgmmaKind::f16) fail("an RS wgmma of 8-bit operands (not emulated)");
  int t = 0;
  Warpgroup& group = my_warpgroup(&t);
  const size_t k = static_cast<size_t>(group.issued[t]++);
  if (k == group.ops.size()) {
    WgmmaOp op{kind, n, transpose_b, false, 0, desc_b, accumulate};
    op.a_in_registers = true;
    group.ops.push_back(op);
  }
  WgmmaOp& op = group.ops[k];
  if (!op.a_in_registers || op.kind != kind || op.n != n || op.transpose_b != transpose_b || op.desc_b != desc_b ||
      op.accumulate != accumulate) {
    fail("the threads of a warpgroup issued different wgmmas");
  }
  if (op.d[t] != nullptr) fail("a wgmma issued twice by one thread");
  op.d[t] = d;
  op.a[t] = a;
  for (int j = 0; j < 4; ++j) op.a_at_issue[t][j] = a[j];
  ++op.contributed;
  note_progress();
}

void wgmma_commit() {
  int t = 0;
  Warpgroup& group = my_warpgroup(&t);
  const size_t g = static_cast<size_t>(group.committed[t]++);
  if (g == group.group_end.size()) {
    group.group_end.push_back(static_cast<size_t>(group.issued[t]));
  } else if (group.group_end[g] != static_cast<size_t>(group.issued[t])) {
    fail("the threads of a warpgroup committed different wgmma groups");
  }
  note_progress();
}

void wgmma_wait(int pending) {
  int t = 0;
  Warpgroup& group = my_warpgroup(&t);
  const int retire = group.committed[t] - pending;
  if (retire <= 0) return;
  const size_t end = group.group_end[static_cast<size_t>(retire - 1)];
  while (group.executed < end) {
    WgmmaOp& op = group.ops[group.executed];
    while (op.contributed < 128) spin_yield();  // .sync.aligned: the others issue it too
    if (group.executed < end && &op == &group.ops[group.executed]) {
      execute(op);
      ++group.executed;
      note_progress();
    }
  }
}

}  // namespace ffpa::emulation::sm90
