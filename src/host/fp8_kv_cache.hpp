// The FP8 KV cache (ffpa::Fp8KvCache) on the host side: the dense layout a
// cache must have (validation compares against it; fp8_kv_cache_layout
// reports it), a validated cache bound as the main loop's K and V, and
// writing one (ffpa::fp8_quantize_kv): the pre-pass's K/V kernels on device
// tensors, the CPU model on host tensors. The format is the K/V half of the
// pre-pass's workspace (kernels/fp8_prepass/workspace.hpp,
// common/quantized_kv_layout.hpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/quantization_options.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/fp8_prepass/workspace.hpp"

namespace ffpa::detail {

// The cache of K [batch, heads_kv, seq_kv, head_dim] and V [..., value_dim]
// under `options` into *layout: every tensor's dtype (u8 codes, f32 scales and
// means), rank, shape and dense strides, data null. Sizes must be
// non-negative; false (and *layout unspecified) when a tensor would have 2^63
// elements or more.
bool fp8_kv_cache_layout(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t head_dim, int64_t value_dim,
                         const QuantizationOptions& options, Fp8KvCache* layout);

// A validated cache's tensors as the pre-pass's and the main loop's K and V
// (the means only where the cache has them).
void bind_kv_cache(const Fp8KvCache& cache, fp8_prepass::QuantizedBuffers* buffers);

// Below, `problem` is an fp8_quantize_kv call (validate_fp8_quantize_kv):
// K and V at problem.k / problem.v, no queries, and `cache` validated for it.

// Scratch bytes fp8_quantize_kv needs on device tensors (the partial sums, the
// zero means of a knob that is off); 0 on host tensors.
size_t fp8_quantize_kv_workspace_bytes(const AttentionProblem& problem, const QuantizationOptions& options);

// Writes `cache` from the problem's K and V on `stream` with the pre-pass's
// K/V kernels, its scratch from `workspace` (256-byte aligned) or, when null,
// stream-ordered memory.
Status fp8_quantize_kv_on_device(const AttentionProblem& problem, const QuantizationOptions& options,
                                 const Fp8KvCache& cache, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream);

// The same on host tensors, from the CPU model (reference/fp8_kv_cache.hpp);
// out_of_memory when the model's buffers cannot be allocated (then nothing is
// written).
Status fp8_quantize_kv_on_host(const AttentionProblem& problem, const QuantizationOptions& options,
                               const Fp8KvCache& cache);

}  // namespace ffpa::detail
