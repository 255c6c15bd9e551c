// The plan of a serving call (plan.hpp): one CTA checks every sequence's
// lengths, then every page its keys read, and writes each sequence's first
// tile. A fault is reported for the lowest sequence that has one (its lowest
// page), the same sequence the host's checks name; a faulty plan has no
// tiles, so the kernels that read it write nothing.
#include "kernels/serving/plan.hpp"

#include <climits>

#include "host/cuda_status.hpp"

namespace ffpa::detail::serving {
namespace {

constexpr int kPlanThreads = 1024;

// Where a plan's arrays lie after its header.
struct PlanArrays {
  int32_t* first_tile;  // [B + 1]
  int32_t* first_page;  // [B + 1]: each sequence's pages in the flat page list
};

__host__ __device__ PlanArrays plan_arrays(void* plan, int64_t batch) {
  int32_t* const first_tile = reinterpret_cast<int32_t*>(static_cast<SequenceScheduleHeader*>(plan) + 1);
  return {first_tile, first_tile + batch + 1};
}

// A fault's order: the sequence, then (a page fault) the page; a length fault
// of a sequence comes before its pages (they are not read then).
__device__ unsigned long long fault_key(int64_t b, int64_t page) {
  return (static_cast<unsigned long long>(b) << 32) | static_cast<unsigned long long>(page + 1);
}

// Block-wide exclusive prefix sum of one value per thread, with the running
// total carried across calls (`carry`, shared).
__device__ int32_t exclusive_scan(int32_t value, int32_t* scratch, int32_t* carry) {
  const int tid = static_cast<int>(threadIdx.x);
  scratch[tid] = value;
  __syncthreads();
  for (int offset = 1; offset < kPlanThreads; offset *= 2) {
    const int32_t other = tid >= offset ? scratch[tid - offset] : 0;
    __syncthreads();
    scratch[tid] += other;
    __syncthreads();
  }
  const int32_t result = *carry + scratch[tid] - value;
  __syncthreads();
  if (tid == kPlanThreads - 1) *carry += scratch[tid];
  __syncthreads();
  return result;
}

__global__ void __launch_bounds__(kPlanThreads) plan_kernel(const AttentionProblem p, const SequenceTiling tiling,
                                                            void* plan) {
  __shared__ int32_t scratch[kPlanThreads];
  __shared__ int32_t tile_carry, page_carry;
  __shared__ unsigned long long first_fault;
  const int tid = static_cast<int>(threadIdx.x);
  const SequenceLayout& s = p.sequences;
  const PlanArrays arrays = plan_arrays(plan, p.batch);
  if (tid == 0) tile_carry = page_carry = 0, first_fault = ULLONG_MAX;
  __syncthreads();

  // Lengths, and each sequence's tiles and pages (none for a faulty one).
  for (int64_t chunk = 0; chunk < p.batch; chunk += kPlanThreads) {
    const int64_t b = chunk + tid;
    int32_t tiles = 0, pages = 0;
    if (b < p.batch) {
      const SequenceCheck check = check_sequence(s, b, p.seq_q, p.seq_kv);
      if (check.fault != SequenceFault::none) {
        atomicMin(&first_fault, fault_key(b, -1));
      } else {
        tiles = static_cast<int32_t>(sequence_tiles(p, sequence_at(s, b), tiling));
        pages = s.paged() ? static_cast<int32_t>(pages_read(s, b)) : 0;
      }
    }
    const int32_t first_tile = exclusive_scan(tiles, scratch, &tile_carry);
    const int32_t first_page = exclusive_scan(pages, scratch, &page_carry);
    if (b < p.batch) arrays.first_tile[b] = first_tile, arrays.first_page[b] = first_page;
  }
  if (tid == 0) arrays.first_tile[p.batch] = tile_carry, arrays.first_page[p.batch] = page_carry;
  __syncthreads();

  // Every page read, spread over the threads: thread t takes pages t, t +
  // kPlanThreads, ... of the flat list, walking its sequence forward.
  if (s.paged()) {
    int64_t b = 0;
    for (int32_t flat = tid; flat < page_carry; flat += kPlanThreads) {
      while (arrays.first_page[b + 1] <= flat) ++b;
      const int64_t page = flat - arrays.first_page[b];
      if (check_pages(s, b, page, page + 1).fault != SequenceFault::none) atomicMin(&first_fault, fault_key(b, page));
    }
  }
  __syncthreads();

  if (tid == 0) {
    SequenceScheduleHeader header;
    if (first_fault != ULLONG_MAX) {
      const int64_t b = static_cast<int64_t>(first_fault >> 32);
      const int64_t page = static_cast<int64_t>(first_fault & 0xFFFFFFFFull) - 1;
      const SequenceCheck check = page < 0 ? check_sequence(s, b, p.seq_q, p.seq_kv) : check_pages(s, b, page, page + 1);
      header.fault = static_cast<int32_t>(check.fault);
      header.sequence = static_cast<int32_t>(b);
      header.value = check.value;
      header.index = check.index;
      header.tiles = 0;
    } else {
      header.tiles = tile_carry;
    }
    *static_cast<SequenceScheduleHeader*>(plan) = header;
  }
}

}  // namespace

int64_t plan_bytes(const AttentionProblem& problem) {
  return static_cast<int64_t>(sizeof(SequenceScheduleHeader)) + 2 * (problem.batch + 1) * 4;
}

int64_t max_tiles(const AttentionProblem& problem, const SequenceTiling& tiling) {
  const SequenceLayout& s = problem.sequences;
  if (tiling.key_blocks) {  // packed: total_k / block_n, plus one partial block a sequence; else B x Nkv / block_n
    const int64_t n = tiling.block_n;
    const int64_t key_blocks = s.packed_k() ? (s.packed_rows_k + n - 1) / n + problem.batch
                                            : problem.batch * ((problem.seq_kv + n - 1) / n);
    return key_blocks * problem.heads_kv;
  }
  const int64_t rows = tiling.block_m / tiling.heads_per_tile;
  const int64_t row_blocks = s.packed_q() ? (s.packed_rows_q + rows - 1) / rows + problem.batch
                                          : problem.batch * ((problem.seq_q + rows - 1) / rows);
  int64_t splits = 1;
  if (tiling.split_blocks > 0) {
    const int64_t kv_blocks = (problem.seq_kv + tiling.block_n - 1) / tiling.block_n;
    splits = (kv_blocks + tiling.split_blocks - 1) / tiling.split_blocks;
    if (splits < 1) splits = 1;
  }
  return row_blocks * splits * (problem.heads_q / tiling.heads_per_tile);
}

Status launch_plan(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan, cudaStream_t stream) {
  plan_kernel<<<1, kPlanThreads, 0, stream>>>(problem, tiling, plan);
  return cuda_status(cudaGetLastError(), "the serving plan kernel");
}

void plan_on_host(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan) {
  const SequenceLayout& s = problem.sequences;
  const PlanArrays arrays = plan_arrays(plan, problem.batch);
  SequenceScheduleHeader header;
  int32_t tiles = 0, pages = 0;
  for (int64_t b = 0; b < problem.batch; ++b) {
    arrays.first_tile[b] = tiles, arrays.first_page[b] = pages;
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
    tiles += static_cast<int32_t>(sequence_tiles(problem, sequence_at(s, b), tiling));
    pages += s.paged() ? static_cast<int32_t>(pages_read(s, b)) : 0;
  }
  arrays.first_tile[problem.batch] = tiles, arrays.first_page[problem.batch] = pages;
  header.tiles = header.fault == 0 ? tiles : 0;
  *static_cast<SequenceScheduleHeader*>(plan) = header;
}

}  // namespace ffpa::detail::serving
