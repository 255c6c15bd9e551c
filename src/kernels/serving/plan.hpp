// The plan of a serving call (docs/serving.md): the data checks of its
// sequences and each sequence's first tile (common/sequence_schedule.hpp),
// written into a buffer the kernels read. On the device by one kernel (no
// host synchronization: a CUDA graph replays it with whatever lengths the
// buffers hold), on the host for host memory (the emulator, the tests).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/sequence_schedule.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::serving {

// Bytes of a call's plan: the header, the sequences' first tiles and (for
// the page checks) their first pages, each int32 [B + 1].
int64_t plan_bytes(const AttentionProblem& problem);

// The most tiles a call can have, whatever its lengths (it sizes the launch;
// tiles past the plan's count return at once): per head group, the row
// blocks of packed queries (total_q / rows, plus one partial block a
// sequence) or of B x Nq batched ones, times the most KV splits; key blocks
// (SequenceTiling::key_blocks) likewise per KV head.
int64_t max_tiles(const AttentionProblem& problem, const SequenceTiling& tiling);

// Enqueues the plan kernel on `stream`, writing `plan` (plan_bytes()).
Status launch_plan(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan, cudaStream_t stream);

// The same plan computed on the host (host memory: the lengths are read here).
void plan_on_host(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan);

// The header and first tiles of a plan.
inline const SequenceScheduleHeader* plan_header(const void* plan) {
  return static_cast<const SequenceScheduleHeader*>(plan);
}
inline const int32_t* plan_first_tiles(const void* plan) {
  return reinterpret_cast<const int32_t*>(plan_header(plan) + 1);
}

}  // namespace ffpa::detail::serving
