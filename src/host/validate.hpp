// Validation of a forward call: every bad input gets its own status and a
// message naming the argument, before anything is launched or written.
#pragma once

#include "common/attention_problem.hpp"
#include "common/backward_problem.hpp"
#include "common/quantization_options.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// Checks shapes, dtypes, strides, alignment, mask layout, options and
// overlaps (it never dereferences the tensors' pointers). On success fills
// *problem with the normalized description. Implementation availability and
// memory space are checked later, by dispatch.
Status validate_forward(const ForwardParams& params, AttentionProblem* problem);

// The same for a backward call: its forward call (q, k, v, o, mask, lse,
// options) as validate_forward sees it, lse required, then d_o (o's shape
// and dtype), the gradients (q's, k's, v's; d_mask the mask's, additive masks
// only) laid out like the forward's tensors, no output overlapping another
// tensor of the call, the inputs' precision.
Status validate_backward(const BackwardParams& params, BackwardProblem* problem);

// The FP8 knobs' enum values (invalid_option naming `name`, e.g. "options.fp8").
Status validate_fp8_knobs(const Fp8Options& fp8, const char* name);

// The knobs as the model, the pre-pass and the kernels take them, with
// `n_early` hybrid rows (resolved: the option or its default).
QuantizationOptions quantization_options(const Fp8Options& fp8, int64_t n_early);

// An fp8_quantize_kv call: k and v as the forward takes them (f16 / bf16,
// Dv == D), the knobs, the cache (the output: the dense layout of k's shape,
// aligned, overlapping neither k, v nor itself). On success *problem is the
// K/V half of an FP8 call (no queries) for fp8_quantize_kv_on_device / _on_host.
Status validate_fp8_quantize_kv(const Fp8QuantizeKvParams& params, AttentionProblem* problem);

}  // namespace ffpa::detail
