// Split-KV's combine step, host side: the partial rows the splits of a call
// wrote into the workspace, merged into O and LSE (kernels/common/split_kv.hpp
// has the per-row arithmetic, combine.cu the kernel).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/common/softmax_state.hpp"

namespace ffpa::detail::split_kv {

// Row r = (b x Hq + h) x Nq + i of split s: unnormalized O at o[(s x rows + r)
// x head_dim + c] (fp32), its state at states[s x rows + r].
struct Partials {
  const float* o = nullptr;
  const RowSoftmaxState* states = nullptr;
  int splits = 0;
};

// The workspace bytes of `splits` splits' partials for the problem's rows.
int64_t partial_bytes(const AttentionProblem& problem, int splits);

// O (the problem's dtype and strides, scaled for dropout) and, when asked, LSE
// from the partials, on `stream`.
Status launch_combine(const AttentionProblem& problem, const Partials& partials, cudaStream_t stream);

}  // namespace ffpa::detail::split_kv
