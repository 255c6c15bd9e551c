// What one benchmark point measured, and its two printed forms: a few lines
// of text for people and one JSON object per line for scripts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "bench_args.hpp"
#include "bench_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::bench {

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

struct CheckResult {
  int64_t rows = 0;  // query rows compared, in every batch and head
  double rel_l2 = 0, max_abs = 0;
  std::optional<double> lse_max_error;  // |lse - ref| / max(1, |ref|), with --lse
  int64_t nan_count = 0;                // NaN anywhere in o (and lse) after the checked call
  double tolerance = 0;                 // on rel_l2
  bool passed = false;
};

// Device memory the timed calls used beyond their inputs and outputs.
struct MemoryResult {
  size_t workspace = 0;       // ffpa::workspace_size
  size_t pool_used_high = 0;  // high-water mark of the default memory pool
  size_t free_drop = 0;       // largest drop of cudaMemGetInfo's free bytes
  size_t extra() const;       // the largest of the three
};

struct PointResult {
  int index = 0, count = 0;  // 1-based position in the sweep, number of points
  std::string device;        // GPU name, or "CPU reference"
  ProblemShape shape;
  KernelChoice kernel;
  double flops = 0;
  int64_t input_sets = 1;
  uint64_t data_seed = 0;
  Timing timing;
  std::optional<CheckResult> check;    // absent with --check-rows 0
  std::optional<MemoryResult> memory;  // GPU runs only
};

void print_text(std::FILE* out, const BenchArgs& args, const PointResult& result);

// One line of JSON, without the newline.
std::string to_json(const BenchArgs& args, const PointResult& result);

}  // namespace ffpa::bench
