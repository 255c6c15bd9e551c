// The random inputs' values, on the host (bench_problem.cpp) and the GPU
// (device_fill.cu, --device-inputs) alike: splitmix64, element e of stream s
// is mix(s + (e + 1) * golden), so any element is drawn independently and
// threads split a buffer freely.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace ffpa::bench {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

FFPA_HOST_DEVICE uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The stream of input `input` (q, k, v, mask) of set `set`.
FFPA_HOST_DEVICE uint64_t input_stream(uint64_t seed, int64_t set, uint64_t input) {
  return mix(seed ^ mix(static_cast<uint64_t>(set) * 4 + input));
}

FFPA_HOST_DEVICE uint64_t element_bits(uint64_t stream, int64_t e) {
  return mix(stream + static_cast<uint64_t>(e + 1) * kGolden);
}

// Boolean elements are true with probability 3/4, the others uniform in [-1, 1).
FFPA_HOST_DEVICE bool bool_element(uint64_t bits) { return bits < 0xC000000000000000ull; }
FFPA_HOST_DEVICE float uniform_element(uint64_t bits) {
  return static_cast<float>(static_cast<double>(bits >> 11) * 0x1.0p-52 - 1.0);
}

}  // namespace ffpa::bench
