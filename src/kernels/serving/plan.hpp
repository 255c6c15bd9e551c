// The plan of a serving call (docs/serving.md): the data checks of its
// sequences and each sequence's first tile (kernels/common/sequence_schedule.hpp),
// written into a buffer the kernels read. On the device by one kernel (no
// host synchronization: a CUDA graph replays it with whatever lengths the
// buffers hold), on the host for host memory (the emulator, the tests).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_problem.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail::serving {

// Bytes of a call's plan: the header and its four arrays (PlanArrays).
int64_t plan_bytes(const AttentionProblem& problem);

// The most tiles a call can have, whatever its lengths (it sizes the launch;
// tiles past the plan's count return at once): per head group, the row
// blocks of packed queries (total_q / rows, plus one partial block a
// sequence) or of B x Nq batched ones, times the most KV splits; key blocks
// (SequenceTiling::key_blocks) likewise per KV head. A pass (PassRows) of at
// most max_q_rows rows a sequence: at most B x its row blocks of those.
int64_t max_tiles(const AttentionProblem& problem, const SequenceTiling& tiling, const PassRows& pass = PassRows{});

// The most split-KV partial rows a call (or pass) can have (with the split
// on): each tile's heads times its rows, one row block a sequence.
int64_t max_partial_rows(const AttentionProblem& problem, const SequenceTiling& tiling,
                         const PassRows& pass = PassRows{});

// The most query rows of a pass's sequences (total_q or B x Nq, at most
// B x max_q_rows): the split-KV combine's rows.
int64_t max_query_rows(const AttentionProblem& problem, const PassRows& pass = PassRows{});

// Whether a call may split its keys: every sequence one row block of
// block_m / heads_per_tile rows (decode, speculative decode).
bool may_split(const AttentionProblem& problem, int block_m, int heads_per_tile);

// Enqueues the plan kernel on `stream`, writing `plan` (plan_bytes()): the
// tiles of the sequences of `pass` (every sequence by default).
Status launch_plan(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan, cudaStream_t stream,
                   const PassRows& pass = PassRows{});

// The same plan computed on the host (host memory: the lengths are read here).
void plan_on_host(const AttentionProblem& problem, const SequenceTiling& tiling, void* plan,
                  const PassRows& pass = PassRows{});

// The header of a plan.
inline const SequenceScheduleHeader* plan_header(const void* plan) {
  return static_cast<const SequenceScheduleHeader*>(plan);
}

}  // namespace ffpa::detail::serving
