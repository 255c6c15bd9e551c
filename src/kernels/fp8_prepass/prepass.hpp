// The FP8 path's pre-pass, host side: quantizes a call's Q, K and V into its
// workspace (workspace.hpp) exactly as the CPU model does
// (reference/fp8_quantization.hpp: quantize_attention_inputs, bit for bit),
// so that the main loop reads codes and scales and the tests compare them
// byte for byte. Built for sm_90a with the FP8 main loop.
#pragma once

#include <cuda_runtime_api.h>

#include "common/attention_problem.hpp"
#include "common/quantization_options.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/fp8_prepass/workspace.hpp"

namespace ffpa::detail::fp8_prepass {

// Why the pre-pass cannot quantize this call, or an empty message: the
// model-only formats (QkFormat / PvFormat::unquantized), smooth_v with
// dropout, a negative n_early, rows of q, k or v that are not 16-byte aligned
// (the kernels read 8 elements per load; a null tensor is not read).
Status check_prepass(const AttentionProblem& problem, const QuantizationOptions& options);

// Writes every region of `buffers` (bound from WorkspaceLayout::of(problem,
// options)) on `stream`: four to six kernels in stream order (the means and
// per-channel V scales are reductions over all keys that the codes wait for).
// The two halves below, in this order.
Status launch_prepass(const AttentionProblem& problem, const QuantizationOptions& options,
                      const QuantizedBuffers& buffers, cudaStream_t stream);

// K and V only (problem.q is not read): the means, K's codes and scales, V^T's
// codes and scales, from the partials' scratch (an FP8 KV cache's writer,
// ffpa::fp8_quantize_kv). Every K/V pointer and both partials must be bound.
Status launch_quantize_kv(const AttentionProblem& problem, const QuantizationOptions& options,
                          const QuantizedBuffers& buffers, cudaStream_t stream);

// Q only (problem.k and problem.v are not read): its codes, scales and, with
// smooth-K, the LSE terms from buffers.k_mean (a forward with an FP8 KV cache).
Status launch_quantize_q(const AttentionProblem& problem, const QuantizationOptions& options,
                         const QuantizedBuffers& buffers, cudaStream_t stream);

}  // namespace ffpa::detail::fp8_prepass
