// The FP8 path of a validated call (issue 11): the pre-pass quantizes Q, K and
// V into the workspace (kernels/fp8_prepass/), then the sm90 family's FP8
// kernel attends from the codes. With an FP8 KV cache (ForwardParams::
// fp8_kv_cache) the pre-pass quantizes Q alone and the kernel reads K and V
// from the cache. Host side, stream-ordered, no allocation: the caller gives
// a workspace of fp8_workspace_bytes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/attention_problem.hpp"
#include "common/quantization_options.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// The workspace the call needs: the pre-pass's codes, scales and partial
// sums; with a cache, Q's codes, scales and LSE terms only.
size_t fp8_workspace_bytes(const AttentionProblem& problem, const QuantizationOptions& options,
                           const Fp8KvCache* kv_cache = nullptr);

// Why the FP8 path cannot serve this call (impl_unavailable, invalid_option,
// misaligned), or ok.
Status check_fp8(const AttentionProblem& problem, const QuantizationOptions& options);

// O (and LSE) of the call through the FP8 path, on `stream`; K and V from
// `kv_cache` (validated by validate_forward) when given.
Status fp8_forward(const AttentionProblem& problem, const QuantizationOptions& options, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream, const Fp8KvCache* kv_cache = nullptr);

}  // namespace ffpa::detail
