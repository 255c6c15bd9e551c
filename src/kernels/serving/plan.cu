// The plan of a serving call (plan.hpp): one CTA checks every sequence's
// lengths, then every page its keys read; with the KV split on it chooses the
// blocks per split from the batch's lengths (sequence_schedule.hpp's rule,
// every candidate summed by its own warp and costed by its own thread); then it writes each
// sequence's first tile, page, partial row and query row. A fault is reported
// for the lowest sequence that has one (its lowest page), the same sequence
// the host's checks name; a faulty plan has no tiles, so the kernels that
// read it write nothing. A pass's plan (PassRows) gives tiles, partial rows
// and query rows to the pass's sequences only, and checks every sequence.
//
// A table of many pages (page size 1: 271k pages at B32 and 8k keys took the
// one CTA 136 us on the H200) is checked by more CTAs: CTA c >= 1 takes the
// sequences c - 1, c - 1 + (G - 1), ... and writes its lowest page fault in
// the plan's fault slot c; a verdict kernel (one CTA, launched after it)
// merges the slots with CTA 0's length verdict into the header.
#include "kernels/serving/plan.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "host/cuda_status.hpp"

namespace ffpa::detail::serving {
namespace {

constexpr int kPlanThreads = 1024;

// Pages one CTA checks at most (16 a thread); a table with more (its bound,
// B x max_blocks) gets a CTA per sequence beside CTA 0, at most kCheckCtas.
constexpr int64_t kPagesOneCta = 16 * kPlanThreads;
constexpr int kCheckCtas = 128;

// The page-checking CTAs beside CTA 0 (0: CTA 0 checks the pages itself).
int page_check_ctas(const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  if (!s.paged() || p.batch * s.max_blocks <= kPagesOneCta) return 0;
  return static_cast<int>(std::min<int64_t>(p.batch, kCheckCtas));
}

// The fault slots after the plan's arrays: slot c for CTA c (8-byte aligned).
__host__ __device__ int64_t fault_slots_offset(int64_t batch) { return (plan_bytes_for(batch) + 7) / 8 * 8; }
__host__ __device__ unsigned long long* fault_slots(void* plan, int64_t batch) {
  return reinterpret_cast<unsigned long long*>(static_cast<char*>(plan) + fault_slots_offset(batch));
}

// A fault's order: the sequence, then (a page fault) the page; a length fault
// of a sequence comes before its pages (they are not read then).
__device__ unsigned long long fault_key(int64_t b, int64_t page) {
  return (static_cast<unsigned long long>(b) << 32) | static_cast<unsigned long long>(page + 1);
}

// The header's fault from a fault key (ULLONG_MAX: none): the sequence's
// length check, or (a page) that page's.
__device__ void write_fault(const AttentionProblem& p, unsigned long long key, SequenceScheduleHeader* header) {
  const SequenceLayout& s = p.sequences;
  const int64_t b = static_cast<int64_t>(key >> 32);
  const int64_t page = static_cast<int64_t>(key & 0xFFFFFFFFull) - 1;
  const SequenceCheck check = page < 0 ? check_sequence(s, b, p.seq_q, p.seq_kv) : check_pages(s, b, page, page + 1);
  header->fault = static_cast<int32_t>(check.fault);
  header->sequence = static_cast<int32_t>(b);
  header->value = check.value;
  header->index = check.index;
  header->tiles = 0;
}

// CTA c >= 1 of a plan with page-checking CTAs: the pages of its sequences
// (those whose lengths hold), its lowest fault into slot c.
__device__ void check_pages_of_sequences(const AttentionProblem& p, void* plan) {
  __shared__ unsigned long long cta_fault;
  const SequenceLayout& s = p.sequences;
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) cta_fault = ULLONG_MAX;
  __syncthreads();
  for (int64_t b = blockIdx.x - 1; b < p.batch; b += gridDim.x - 1) {
    if (check_sequence(s, b, p.seq_q, p.seq_kv).fault != SequenceFault::none) continue;
    const int64_t pages = pages_read(s, b);
    for (int64_t page = tid; page < pages; page += kPlanThreads) {
      if (check_pages(s, b, page, page + 1).fault != SequenceFault::none) {
        atomicMin(&cta_fault, fault_key(b, page));
        break;  // this thread's later pages come after it
      }
    }
  }
  __syncthreads();
  if (tid == 0) fault_slots(plan, p.batch)[blockIdx.x] = cta_fault;
}

// Block-wide exclusive prefix sum of one value per thread, with the running
// total carried across calls (`carry`, shared): a shuffle scan within each
// warp, then warp 0 scans the warps' totals (two barriers a call; a
// Hillis-Steele scan over the block took twenty).
__device__ int32_t exclusive_scan(int32_t value, int32_t* warp_totals, int32_t* carry) {
  constexpr int kWarps = kPlanThreads / 32;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  int32_t inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset *= 2) {
    const int32_t other = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int32_t total = lane < kWarps ? warp_totals[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      const int32_t other = __shfl_up_sync(0xFFFFFFFFu, total, offset);
      if (lane >= offset) total += other;
    }
    if (lane < kWarps) warp_totals[lane] = total;  // inclusive over the warps
  }
  __syncthreads();
  const int32_t before = *carry + (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - value;
  __syncthreads();
  if (tid == kPlanThreads - 1) *carry += warp_totals[kWarps - 1];
  __syncthreads();
  return before;
}

// The host's bound on a split plan's tiles (max_tiles with the split on).
__host__ __device__ int64_t split_tile_bound(const AttentionProblem& p, const SequenceTiling& tiling) {
  return (p.heads_q / tiling.heads_per_tile) * p.batch + 4LL * tiling.split_slots;
}

// The attention kernel after a plan is its programmatic dependent on Hopper
// (sm90_wgmma's launch_tiles): its CTAs may start, and set up, while the plan
// runs, and they wait for its completion before any global read. A
// scheduling hint only: the plan's writes are ordered by that wait.
__device__ __forceinline__ void start_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const AttentionProblem p, const SequenceTiling tiling,
                                                            const PassRows pass, void* plan) {
  __shared__ int32_t warp_totals[kPlanThreads / 32];
  __shared__ int32_t tile_carry, page_carry, partial_carry, row_carry;
  __shared__ unsigned long long first_fault;
  __shared__ unsigned long long candidate_tiles[kSplitCandidates];
  __shared__ double candidate_cost[kSplitCandidates];
  __shared__ int max_blocks;
  __shared__ int32_t split_blocks;
  start_dependent_grid();
  if (blockIdx.x > 0) {
    check_pages_of_sequences(p, plan);
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const SequenceLayout& s = p.sequences;
  const PlanArrays arrays = plan_arrays(plan, p.batch);
  const int64_t groups = p.heads_q / tiling.heads_per_tile;
  if (tid == 0) tile_carry = page_carry = partial_carry = row_carry = 0, first_fault = ULLONG_MAX, max_blocks = 0;
  __syncthreads();

  // Lengths (a faulty sequence gets no tiles), a thread a sequence; with the
  // split on, each sequence's blocks and tiles a split go into the first_tile
  // and first_partial arrays (scratch until the scans below overwrite them)
  // and the longest sequence's blocks into max_blocks.
  for (int64_t chunk = 0; chunk < p.batch; chunk += kPlanThreads) {
    const int64_t b = chunk + tid;
    uint32_t blocks = 0, tiles_per_split = 0;  // 32-bit: a sequence's counts fit
    if (b < p.batch) {
      if (check_sequence(s, b, p.seq_q, p.seq_kv).fault != SequenceFault::none) {
        atomicMin(&first_fault, fault_key(b, -1));
      } else if (tiling.split_slots > 0) {
        const Sequence seq = sequence_at(s, b);
        if (pass.in_pass(seq)) {  // another pass's sequence: no tiles
          const int rows = tiling.block_m / tiling.heads_per_tile;
          blocks = static_cast<uint32_t>((seq.seq_kv + tiling.block_n - 1) / tiling.block_n);
          tiles_per_split = static_cast<uint32_t>((seq.seq_q + rows - 1) / rows * groups);
        }
      }
      if (tiling.split_slots > 0) arrays.first_tile[b] = blocks, arrays.first_partial[b] = tiles_per_split;
    }
    if (tiling.split_slots <= 0) continue;
    const uint32_t warp_max_blocks = __reduce_max_sync(0xFFFFFFFFu, blocks);
    if (tid % 32 == 0 && warp_max_blocks > 0) atomicMax(&max_blocks, static_cast<int>(warp_max_blocks));
  }
  __syncthreads();  // (global writes too: the scratch is read by other threads)
  // With the split on, every candidate's tiles over the batch: warp c sums
  // candidate c over the sequences its lanes take, without atomics; then each
  // candidate's cost by its own thread, and thread 0 picks the cheapest. (32
  // warps adding each of the 40 candidates into shared memory, then one
  // thread evaluating them in turn, were most of the plan's ~20 us for a
  // decode batch of 32 on the H200.)
  if (tiling.split_slots > 0) {
    const int warp = tid / 32, lane = tid % 32;
    for (int c = warp; c < kSplitCandidates; c += kPlanThreads / 32) {
      const uint32_t split = static_cast<uint32_t>(split_candidate(c));
      unsigned long long sum = 0;
      for (int64_t b = lane; b < p.batch; b += 32) {
        const uint32_t blocks = static_cast<uint32_t>(arrays.first_tile[b]);
        sum += kv_splits_of_blocks(blocks, split) * static_cast<uint32_t>(arrays.first_partial[b]);
      }
      for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
      if (lane == 0) candidate_tiles[c] = sum;
    }
  }
  __syncthreads();
  if (tid < kSplitCandidates && tiling.split_slots > 0) {
    candidate_cost[tid] = split_candidate_cost(tid, static_cast<int64_t>(candidate_tiles[tid]), max_blocks,
                                               tiling.block_n, tiling.split_slots, split_tile_bound(p, tiling));
  }
  __syncthreads();
  if (tid == 0) {
    split_blocks = tiling.split_slots > 0 &&
                           may_split_batch(static_cast<int64_t>(candidate_tiles[0]), max_blocks, tiling.split_slots)
                       ? static_cast<int32_t>(cheapest_split_blocks([&](int c) { return candidate_cost[c]; }))
                       : 0;
  }
  __syncthreads();

  // Each sequence's first tile, page, partial row and query row.
  for (int64_t chunk = 0; chunk < p.batch; chunk += kPlanThreads) {
    const int64_t b = chunk + tid;
    int32_t tiles = 0, pages = 0, partials = 0, rows = 0;
    if (b < p.batch && check_sequence(s, b, p.seq_q, p.seq_kv).fault == SequenceFault::none) {
      const Sequence seq = sequence_at(s, b);
      pages = s.paged() ? static_cast<int32_t>(pages_read(s, b)) : 0;  // every sequence's: the checks
      if (pass.in_pass(seq)) {
        tiles = static_cast<int32_t>(sequence_tiles(p, seq, tiling, split_blocks));
        rows = static_cast<int32_t>(seq.seq_q);
        partials = split_blocks > 0 ? static_cast<int32_t>(sequence_splits(seq, tiling.block_n, split_blocks) *
                                                           p.heads_q * seq.seq_q)
                                    : 0;
      }
    }
    const int32_t first_tile = exclusive_scan(tiles, warp_totals, &tile_carry);
    const int32_t first_page = exclusive_scan(pages, warp_totals, &page_carry);
    const int32_t first_partial = exclusive_scan(partials, warp_totals, &partial_carry);
    const int32_t first_row = exclusive_scan(rows, warp_totals, &row_carry);
    if (b < p.batch) {
      arrays.first_tile[b] = first_tile, arrays.first_page[b] = first_page;
      arrays.first_partial[b] = first_partial, arrays.first_row[b] = first_row;
    }
  }
  if (tid == 0) {
    arrays.first_tile[p.batch] = tile_carry, arrays.first_page[p.batch] = page_carry;
    arrays.first_partial[p.batch] = partial_carry, arrays.first_row[p.batch] = row_carry;
  }
  __syncthreads();

  // Every page read (unless CTAs 1.. check them), spread over the threads:
  // thread t takes pages t, t + kPlanThreads, ... of the flat list, walking
  // its sequence forward.
  if (s.paged() && gridDim.x == 1) {
    // A thread's first page's sequence by binary search (a walk from sequence
    // 0 was a chain of dependent loads), the later ones by walking on.
    int64_t b = tid < page_carry ? sequence_holding(arrays.first_page, static_cast<int>(p.batch), tid) : 0;
    for (int32_t flat = tid; flat < page_carry; flat += kPlanThreads) {
      while (arrays.first_page[b + 1] <= flat) ++b;
      const int64_t page = flat - arrays.first_page[b];
      if (check_pages(s, b, page, page + 1).fault != SequenceFault::none) atomicMin(&first_fault, fault_key(b, page));
    }
  }
  __syncthreads();

  if (tid == 0) {
    SequenceScheduleHeader header;
    header.tiling = tiling;
    header.split_blocks = split_blocks;
    header.tiles = tile_carry;
    if (first_fault != ULLONG_MAX) write_fault(p, first_fault, &header);
    *static_cast<SequenceScheduleHeader*>(plan) = header;
    if (gridDim.x > 1) fault_slots(plan, p.batch)[0] = first_fault;
  }
}

// After a plan kernel with page-checking CTAs: the lowest fault of its slots
// (CTA 0's: a length fault) into the header, which then has no tiles.
__global__ void __launch_bounds__(32) verdict_kernel(const AttentionProblem p, void* plan, int slots) {
  start_dependent_grid();
  const unsigned long long* const keys = fault_slots(plan, p.batch);
  unsigned long long key = ULLONG_MAX;
  for (int c = static_cast<int>(threadIdx.x); c < slots; c += 32) key = min(key, keys[c]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) key = min(key, __shfl_xor_sync(0xFFFFFFFFu, key, offset));
  if (threadIdx.x == 0 && key != ULLONG_MAX) write_fault(p, key, static_cast<SequenceScheduleHeader*>(plan));
}

}  // namespace

int64_t plan_bytes(const AttentionProblem& problem) {
  const int check_ctas = page_check_ctas(problem);
  return check_ctas > 0 ? fault_slots_offset(problem.batch) + (check_ctas + 1) * 8 : plan_bytes_for(problem.batch);
}

int64_t max_query_rows(const AttentionProblem& problem, const PassRows& pass) {
  const SequenceLayout& s = problem.sequences;
  const int64_t rows = s.packed_q() ? s.packed_rows_q : problem.batch * problem.seq_q;
  return std::min(rows, problem.batch * std::min(problem.seq_q, pass.max_q_rows));
}

int64_t max_tiles(const AttentionProblem& problem, const SequenceTiling& tiling, const PassRows& pass) {
  if (tiling.split_slots > 0) return split_tile_bound(problem, tiling);
  const SequenceLayout& s = problem.sequences;
  if (tiling.key_blocks) {  // packed: total_k / block_n, plus one partial block a sequence; else B x Nkv / block_n
    const int64_t n = tiling.block_n;
    const int64_t key_blocks = s.packed_k() ? (s.packed_rows_k + n - 1) / n + problem.batch
                                            : problem.batch * ((problem.seq_kv + n - 1) / n);
    return key_blocks * problem.heads_kv;
  }
  // Each of the pass's sequences has at most its longest row count's blocks;
  // packed queries at most total_q / rows, plus a partial block for each
  // sequence with rows (each at least min_q_rows of them).
  const int64_t rows = tiling.block_m / tiling.heads_per_tile;
  const int64_t longest = std::min(problem.seq_q, pass.max_q_rows);
  int64_t row_blocks = problem.batch * ((longest + rows - 1) / rows);
  if (s.packed_q()) {
    const int64_t sequences = std::min(problem.batch, s.packed_rows_q / std::max<int64_t>(pass.min_q_rows, 1));
    row_blocks = std::min(row_blocks, (s.packed_rows_q + rows - 1) / rows + sequences);
  }
  return row_blocks * (problem.heads_q / tiling.heads_per_tile);
}

int64_t max_partial_rows(const AttentionProblem& problem, const SequenceTiling& tiling, const PassRows& pass) {
  if (tiling.split_slots <= 0) return 0;
  const int64_t rows = std::min<int64_t>({tiling.block_m / tiling.heads_per_tile, problem.seq_q, pass.max_q_rows});
  return max_tiles(problem, tiling, pass) * tiling.heads_per_tile * rows;
}

bool may_split(const AttentionProblem& problem, int block_m, int heads_per_tile) {
  return problem.seq_q <= block_m / heads_per_tile;  // one row block a sequence
}

Status launch_plan(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan, cudaStream_t stream,
                   const PassRows& pass) {
  const int check_ctas = page_check_ctas(problem);
  plan_kernel<<<1 + check_ctas, kPlanThreads, 0, stream>>>(problem, tiling, pass, plan);
  if (Status status = cuda_status(cudaGetLastError(), "the serving plan kernel"); !status.ok() || check_ctas == 0) {
    return status;
  }
  verdict_kernel<<<1, 32, 0, stream>>>(problem, plan, 1 + check_ctas);
  return cuda_status(cudaGetLastError(), "the serving plan's verdict kernel");
}

void plan_on_host(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan, const PassRows& pass) {
  const SequenceLayout& s = problem.sequences;
  const PlanArrays arrays = plan_arrays(plan, problem.batch);
  SequenceScheduleHeader header;
  header.tiling = tiling;
  std::vector<bool> valid(static_cast<size_t>(problem.batch), false);
  int64_t max_blocks = 0;
  for (int64_t b = 0; b < problem.batch; ++b) {
    SequenceCheck check = check_sequence(s, b, problem.seq_q, problem.seq_kv);
    if (check.fault == SequenceFault::none && s.paged()) check = check_pages(s, b, 0, pages_read(s, b));
    if (check.fault != SequenceFault::none) {
      if (header.fault == 0) {
        header.fault = static_cast<int32_t>(check.fault);
        header.sequence = static_cast<int32_t>(b);
        header.value = check.value;
        header.index = check.index;
      }
      continue;
    }
    valid[static_cast<size_t>(b)] = true;
    if (!pass.in_pass(sequence_at(s, b))) continue;
    max_blocks = std::max<int64_t>(max_blocks, (sequence_at(s, b).seq_kv + tiling.block_n - 1) / tiling.block_n);
  }
  auto tiles_of = [&](int64_t split) {
    int64_t tiles = 0;
    for (int64_t b = 0; b < problem.batch; ++b)
      if (valid[static_cast<size_t>(b)] && pass.in_pass(sequence_at(s, b)))
        tiles += sequence_tiles(problem, sequence_at(s, b), tiling, split);
    return tiles;
  };
  const int64_t split_blocks =
      tiling.split_slots > 0 ? choose_split_blocks([&](int c) { return tiles_of(split_candidate(c)); }, max_blocks,
                                                   tiling.block_n, tiling.split_slots, split_tile_bound(problem, tiling))
                             : 0;
  header.split_blocks = static_cast<int32_t>(split_blocks);
  int32_t tiles = 0, pages = 0, partials = 0, rows = 0;
  for (int64_t b = 0; b < problem.batch; ++b) {
    arrays.first_tile[b] = tiles, arrays.first_page[b] = pages, arrays.first_partial[b] = partials;
    arrays.first_row[b] = rows;
    if (!valid[static_cast<size_t>(b)]) continue;
    const Sequence seq = sequence_at(s, b);
    pages += s.paged() ? static_cast<int32_t>(pages_read(s, b)) : 0;
    if (!pass.in_pass(seq)) continue;
    tiles += static_cast<int32_t>(sequence_tiles(problem, seq, tiling, split_blocks));
    rows += static_cast<int32_t>(seq.seq_q);
    if (split_blocks > 0)
      partials += static_cast<int32_t>(sequence_splits(seq, tiling.block_n, split_blocks) * problem.heads_q * seq.seq_q);
  }
  arrays.first_tile[problem.batch] = tiles, arrays.first_page[problem.batch] = pages;
  arrays.first_partial[problem.batch] = partials, arrays.first_row[problem.batch] = rows;
  header.tiles = header.fault == 0 ? tiles : 0;
  *static_cast<SequenceScheduleHeader*>(plan) = header;
}

}  // namespace ffpa::detail::serving
