#include "host/fp8_kv_cache.hpp"

#include <cstdint>
#include <initializer_list>
#include <new>
#include <string>

#include "common/quantized_kv_layout.hpp"
#include "host/workspace.hpp"
#include "kernels/fp8_prepass/prepass.hpp"
#include "reference/fp8_kv_cache.hpp"
#include "reference/fp8_quantization.hpp"

namespace ffpa::detail {
namespace {

// A contiguous tensor of the shape; false when its elements do not fit in int64.
bool dense_tensor(DType dtype, std::initializer_list<int64_t> shape, Tensor* t) {
  t->dtype = dtype;
  t->rank = static_cast<int32_t>(shape.size());
  int32_t d = 0;
  for (int64_t extent : shape) t->shape[d++] = extent;
  int64_t stride = 1;
  for (d = t->rank - 1; d >= 0; --d) {
    t->stride[d] = stride;
    if (__builtin_mul_overflow(stride, t->shape[d], &stride)) return false;
  }
  return true;
}

}  // namespace

bool fp8_kv_cache_layout(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t head_dim, int64_t value_dim,
                         const QuantizationOptions& options, Fp8KvCache* layout) {
  const QuantizedKvLayout k = quantized_kv_layout(seq_kv, head_dim, options);
  const QuantizedKvLayout v = quantized_kv_layout(seq_kv, value_dim, options);
  *layout = Fp8KvCache{};
  return dense_tensor(DType::u8, {batch, heads_kv, seq_kv, k.k_pitch}, &layout->k_codes) &&
         dense_tensor(DType::f32, {batch, heads_kv, k.k_scales}, &layout->k_scales) &&
         dense_tensor(DType::f32, {batch, heads_kv, head_dim}, &layout->k_mean) &&
         dense_tensor(DType::u8, {batch, heads_kv, value_dim, v.v_pitch}, &layout->v_codes) &&
         dense_tensor(DType::f32, {batch, heads_kv, v.v_scales}, &layout->v_scales) &&
         dense_tensor(DType::f32, {batch, heads_kv, value_dim}, &layout->v_mean);
}

void bind_kv_cache(const Fp8KvCache& cache, fp8_prepass::QuantizedBuffers* buffers) {
  buffers->k_codes = static_cast<uint8_t*>(cache.k_codes.data);
  buffers->k_scales = static_cast<float*>(cache.k_scales.data);
  buffers->v_codes = static_cast<uint8_t*>(cache.v_codes.data);
  buffers->v_scales = static_cast<float*>(cache.v_scales.data);
  if (cache.k_mean.data != nullptr) buffers->k_mean = static_cast<float*>(cache.k_mean.data);
  if (cache.v_mean.data != nullptr) buffers->v_mean = static_cast<float*>(cache.v_mean.data);
}

size_t fp8_quantize_kv_workspace_bytes(const AttentionProblem& problem, const QuantizationOptions& options) {
  return fp8_prepass::WorkspaceLayout::of(problem, options, fp8_prepass::Regions::key_value_scratch).bytes;
}

Status fp8_quantize_kv_on_device(const AttentionProblem& problem, const QuantizationOptions& options,
                                 const Fp8KvCache& cache, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream) {
  const fp8_prepass::WorkspaceLayout layout =
      fp8_prepass::WorkspaceLayout::of(problem, options, fp8_prepass::Regions::key_value_scratch);
  if (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % fp8_prepass::WorkspaceLayout::kAlignment != 0) {
    return {StatusCode::misaligned, "fp8_quantize_kv: the workspace must start on a 256-byte boundary"};
  }
  Workspace memory(workspace, workspace_bytes, stream);
  void* base = nullptr;
  if (Status status = memory.acquire(layout.bytes, "fp8_quantize_kv", &base); !status.ok()) return status;
  fp8_prepass::QuantizedBuffers buffers = layout.bind(base);
  bind_kv_cache(cache, &buffers);  // the means of a knob that is off: the cache's if it has them, else the scratch's
  return memory.release(fp8_prepass::launch_quantize_kv(problem, options, buffers, stream));
}

Status fp8_quantize_kv_on_host(const AttentionProblem& problem, const QuantizationOptions& options,
                               const Fp8KvCache& cache) {
  try {
    write_kv_cache(quantize_key_values(problem, options), cache);
  } catch (const std::bad_alloc&) {
    return {StatusCode::out_of_memory, "fp8_quantize_kv: out of host memory for the CPU model's K and V"};
  }
  return {};
}

}  // namespace ffpa::detail
