// A sequence batch's two plans in the backward (kernels/serving/plan.hpp),
// shared by every backward family: the query-stationary kernels' tiles
// (blocks of 64 query rows of a query head: the dQ kernels) and the
// key-stationary kernels' (blocks of 64 keys of a KV head: dK, dV). Both
// families' stationary blocks are 64 rows (sm80_backward's kBlockQ and
// kBlockK, sm90_backward's kTileRows: static_asserted where they are used).
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/host_device.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/serving/plan.hpp"

namespace ffpa::detail::sm80_backward {

inline constexpr int kSequenceBlock = 64;

FFPA_HOST_DEVICE SequenceTiling query_tiling() { return {kSequenceBlock, kSequenceBlock, 1, 0, false}; }
FFPA_HOST_DEVICE SequenceTiling key_tiling() { return {kSequenceBlock, kSequenceBlock, 1, 0, true}; }

// The most tiles of a plan (query_rows: the query tiling's, else the key
// tiling's): a launch's CTAs (those past the plan's count return at once).
inline int64_t sequence_tile_bound(const AttentionProblem& p, bool query_rows) {
  return serving::max_tiles(p, query_rows ? query_tiling() : key_tiling());
}

}  // namespace ffpa::detail::sm80_backward
