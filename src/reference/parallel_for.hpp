// The CPU reference's worker threads (forward and backward): a dynamic
// index queue over a few std::threads, the calling thread included.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace ffpa::detail {

// Runs task(worker, index) for every index in [0, count) on up to `workers`
// threads (the calling thread is worker 0), handing out indices dynamically.
template <class Task>
void parallel_for(int64_t count, int workers, const Task& task) {
  std::atomic<int64_t> next{0};
  auto drain = [&](int worker) {
    for (int64_t index = next++; index < count; index = next++) task(worker, index);
  };
  const int helpers_wanted = static_cast<int>(std::min<int64_t>(workers, count)) - 1;
  std::vector<std::thread> helpers;
  helpers.reserve(helpers_wanted > 0 ? helpers_wanted : 0);
  try {
    for (int worker = 1; worker <= helpers_wanted; ++worker) helpers.emplace_back(drain, worker);
  } catch (const std::system_error&) {
    // The system refused another thread: the ones already running do the work.
  }
  drain(0);
  for (std::thread& helper : helpers) helper.join();
}

// num_threads, or the hardware's thread count when it is <= 0.
inline int resolve_threads(int num_threads) {
  if (num_threads > 0) return num_threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace ffpa::detail
