// The CPU reference backend: exact attention on host memory with double
// accumulation, multithreaded. It implements every semantic of the spec and
// is the oracle of the GPU tests.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"

namespace ffpa::detail {

// Query rows to compute: all of them (rows == nullptr), or `count` row
// indices (each in [0, Nq)), the same rows for every batch and head.
struct RowSubset {
  const int64_t* rows = nullptr;
  int64_t count = 0;
};

// Writes o (rounded to the problem's dtype) and, if requested, lse for the
// selected rows; nothing else is touched. num_threads <= 0: hardware threads.
void cpu_attention_forward(const AttentionProblem& problem, RowSubset rows = {},
                           int num_threads = 0);

// The same computation with fp64 outputs, for tests and error measurement:
// out is [B, Hq, R, Dv] and lse [B, Hq, R] (may be null), contiguous, where R
// is the number of selected rows, in the order given.
void cpu_attention_forward_f64(const AttentionProblem& problem, RowSubset rows, double* out,
                               double* lse, int num_threads = 0);

}  // namespace ffpa::detail
