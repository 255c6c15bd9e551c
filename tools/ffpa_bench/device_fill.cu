#include "device_fill.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "random_stream.hpp"

namespace ffpa::bench {
namespace {

__global__ void fill_kernel(unsigned char* data, DType dtype, int64_t count, uint64_t stream) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t bits = element_bits(stream, e);
    if (dtype == DType::boolean) {
      data[e] = bool_element(bits) ? 1 : 0;
      continue;
    }
    const float value = uniform_element(bits);
    if (dtype == DType::f32) {
      reinterpret_cast<float*>(data)[e] = value;
    } else if (dtype == DType::f16) {
      reinterpret_cast<__half*>(data)[e] = __float2half_rn(value);
    } else {
      reinterpret_cast<__nv_bfloat16*>(data)[e] = __float2bfloat16_rn(value);
    }
  }
}

}  // namespace

cudaError_t fill_inputs_on_device(void* slab, const InputSlab& layout, const PointTensors& t, uint64_t seed,
                                  cudaStream_t stream) {
  const std::pair<const Tensor*, size_t> inputs[] = {
      {&t.q, layout.q_offset}, {&t.k, layout.k_offset}, {&t.v, layout.v_offset}, {&t.mask, layout.mask_offset}};
  for (int64_t set = 0; set < layout.sets; ++set) {
    unsigned char* base = static_cast<unsigned char*>(slab) + static_cast<size_t>(set) * layout.set_bytes;
    uint64_t input_index = 0;
    for (const auto& [tensor, offset] : inputs) {
      const uint64_t values = input_stream(seed, set, input_index++);
      const int64_t count = element_count(*tensor);
      if (count == 0) continue;
      fill_kernel<<<1024, 256, 0, stream>>>(base + offset, tensor->dtype, count, values);
      if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
    }
  }
  return cudaSuccess;
}

}  // namespace ffpa::bench
