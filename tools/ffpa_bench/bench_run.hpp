// Running ffpa-bench's points: inputs, the checked call against the CPU
// reference, warm-up, timing with CUDA events (host clock for the CPU
// reference), device-memory accounting, and the printed results.
#pragma once

#include "bench_args.hpp"

namespace ffpa::bench {

// Runs every point of the command line, printing as it goes. Returns the exit
// status: 0 all ran and passed their check, 1 a check failed, 2 an ffpa or
// CUDA call failed (the message names the call and the status).
int run_benchmarks(const BenchArgs& args);

}  // namespace ffpa::bench
