// Split-KV's combine step, host side: the partial rows the splits of a call
// wrote into the workspace, merged into O and LSE (kernels/common/split_kv.hpp
// has the per-row arithmetic, combine.cu the kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/common/sequence_schedule.hpp"
#include "kernels/common/softmax_state.hpp"

namespace ffpa::detail::split_kv {

// Row r = (b x Hq + h) x Nq + i of split s: unnormalized O at o[(s x rows + r)
// x Dv + c] (fp32), its state at states[s x rows + r]. A sequence batch
// (splits 0): each sequence's splits and partial rows as its plan placed
// them (tile_schedule.hpp: partial_row_index), for the sequences of the pass
// its plan was made for (the combine's rows: at most the pass's).
struct Partials {
  const float* o = nullptr;
  const RowSoftmaxState* states = nullptr;
  int splits = 0;
  PassRows pass = PassRows{};
};

// Where a call's partials lie in its workspace: O rows, then states, each on a
// 256-byte boundary.
struct PartialLayout {
  int64_t o_offset = 0, states_offset = 0, bytes = 0;
};
PartialLayout partial_layout(const AttentionProblem& problem, int splits);
PartialLayout partial_layout_of_rows(const AttentionProblem& problem, int64_t rows);

// O (the problem's dtype and strides, scaled for dropout) and, when asked, LSE
// from the partials, on `stream`; `programmatic`: launched as the programmatic
// dependent of the kernel before it on the stream (Hopper's PDL), which must
// have written the partials.
Status launch_combine(const AttentionProblem& problem, const Partials& partials, bool programmatic,
                      cudaStream_t stream);

}  // namespace ffpa::detail::split_kv
