// Random inputs drawn on the GPU (ffpa-bench --device-inputs): the host
// fill's values (bench_problem.hpp's fill_inputs: the same splitmix64 stream
// per element), written straight into device memory, for points whose inputs
// would take the host seconds to draw and copy (tens of GB of K and V).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "bench_problem.hpp"

namespace ffpa::bench {

// Fills every set of the device slab as fill_inputs fills a host one.
cudaError_t fill_inputs_on_device(void* slab, const InputSlab& layout, const PointTensors& tensors, uint64_t seed,
                                  cudaStream_t stream);

}  // namespace ffpa::bench
