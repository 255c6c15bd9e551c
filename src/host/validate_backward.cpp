// Validation of a backward call: its forward call as validate_forward sees
// it (a sequence batch's tensors and shapes included), then what the backward
// does not serve, d_o, the gradients and their overlaps.
#include <cstdint>

#include "host/validate.hpp"
#include "host/validate_checks.hpp"
#include "host/validate_sequences.hpp"

namespace ffpa::detail {
namespace {

// grad must have ref's rank, sizes and dtype, a contiguous last dim,
// non-negative strides, 16-byte rows like the forward's tensors, and data.
Status check_like(Arg grad, Arg ref) {
  FFPA_RETURN_IF_ERROR(check_rank(grad, ref.t.rank, "the shape of the tensor it is the gradient of"));
  if (grad.t.dtype != ref.t.dtype)
    return fail(StatusCode::dtype_mismatch, grad.name, ".dtype = ", dtype_name(grad.t.dtype), " differs from ",
                ref.name, ".dtype = ", dtype_name(ref.t.dtype));
  for (int32_t i = 0; i < ref.t.rank; ++i)
    if (grad.t.shape[i] != ref.t.shape[i])
      return fail(StatusCode::shape_mismatch, grad.name, ".shape = ", list_text(grad.t.shape, grad.t.rank),
                  " differs from ", ref.name, ".shape = ", list_text(ref.t.shape, ref.t.rank));
  if (!grad.t.data && !is_empty(grad.t))
    return fail(StatusCode::null_pointer, grad.name, ".data is null (", grad.name, ".shape = ",
                list_text(grad.t.shape, grad.t.rank), ")");
  if (grad.t.stride[grad.t.rank - 1] != 1 && ref.t.rank == 4)
    return fail(StatusCode::noncontiguous_last_dim, grad.name, ".stride[3] = ", grad.t.stride[3],
                "; the last dimension must be contiguous (stride 1)");
  for (int32_t i = 0; i < grad.t.rank; ++i)
    if (grad.t.stride[i] < 0)
      return fail(StatusCode::invalid_stride, grad.name, ".stride[", i, "] = ", grad.t.stride[i], " is negative");
  if (ref.t.rank == 4 && !is_empty(grad.t)) FFPA_RETURN_IF_ERROR(check_vector_alignment(grad));
  return {};
}

}  // namespace

Status validate_backward(const BackwardParams& p, BackwardProblem* problem) {
  ForwardParams forward;
  forward.q = p.q;
  forward.k = p.k;
  forward.v = p.v;
  forward.o = p.o;
  forward.mask = p.mask;
  forward.lse = p.lse;
  forward.options = p.options;
  forward.stream = p.stream;
  forward.workspace = p.workspace;
  forward.workspace_bytes = p.workspace_bytes;
  forward.sinks = p.sinks;
  forward.sequences = p.sequences;
  if (!p.lse.data)
    return fail(StatusCode::null_pointer, "lse.data is null; the backward needs the forward's lse (",
                p.sequences && p.sequences->cu_seqlens_q.data ? "[1, Hq, total_q]" : "[B, Hq, Nq]", ")");
  AttentionProblem forward_problem;
  FFPA_RETURN_IF_ERROR(validate_forward(forward, &forward_problem));
  if (p.options.precision != Precision::input)
    return fail(StatusCode::invalid_option, "options.precision = ", static_cast<int32_t>(p.options.precision),
                "; the backward runs in the inputs' precision only");
  if (p.sequences && p.sequences->block_table.data)
    return fail(StatusCode::invalid_option,
                "sequences.block_table is given: a paged cache has no backward (a training call passes k and v "
                "packed, with cu_seqlens_k, or batched)");
  if (forward_problem.kv_e4m3)
    return fail(StatusCode::unsupported_dtype, "k.dtype = e4m3; the backward runs on 16-bit k and v");
  if (p.options.accumulation != Accumulation::f32)
    return fail(StatusCode::unsupported_accumulation,
                "options.accumulation = f16; the backward accumulates in f32 (its default)");

  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"}, mask{p.mask, "mask"}, lse{p.lse, "lse"};
  const Arg d_o{p.d_o, "d_o"}, d_q{p.d_q, "d_q"}, d_k{p.d_k, "d_k"}, d_v{p.d_v, "d_v"}, d_mask{p.d_mask, "d_mask"};
  const Arg d_lse{p.d_lse, "d_lse"}, sinks{p.sinks, "sinks"}, d_sinks{p.d_sinks, "d_sinks"};
  FFPA_RETURN_IF_ERROR(check_like(d_o, o));
  if (p.d_lse.data) {
    FFPA_RETURN_IF_ERROR(check_like(d_lse, lse));
    if (!aligned(p.d_lse.data, 4))
      return fail(StatusCode::misaligned, "d_lse.data = ", p.d_lse.data, " is not 4-byte aligned");
  }
  FFPA_RETURN_IF_ERROR(check_like(d_q, q));
  FFPA_RETURN_IF_ERROR(check_like(d_k, k));
  FFPA_RETURN_IF_ERROR(check_like(d_v, v));
  if (p.d_mask.data) {
    if (!p.mask.data || p.mask.dtype == DType::boolean)
      return fail(StatusCode::invalid_mask_layout, "d_mask is given but the mask is ",
                  p.mask.data ? "boolean" : "absent", "; only an additive mask has a gradient");
    FFPA_RETURN_IF_ERROR(check_rank(d_mask, 4, "the mask's shape"));
    if (p.d_mask.dtype != p.mask.dtype)
      return fail(StatusCode::dtype_mismatch, "d_mask.dtype = ", dtype_name(p.d_mask.dtype),
                  " differs from mask.dtype = ", dtype_name(p.mask.dtype));
    if (p.d_mask.shape[3] > 1 && p.d_mask.stride[3] != 1)
      return fail(StatusCode::noncontiguous_last_dim, "d_mask.stride[3] = ", p.d_mask.stride[3],
                  "; the last dimension must be contiguous (stride 1)");
    for (int32_t i = 0; i < 4; ++i) {
      if (p.d_mask.shape[i] != p.mask.shape[i])
        return fail(StatusCode::shape_mismatch, "d_mask.shape = ", list_text(p.d_mask.shape, 4),
                    " differs from mask.shape = ", list_text(p.mask.shape, 4));
      if (p.d_mask.stride[i] < 0)
        return fail(StatusCode::invalid_stride, "d_mask.stride[", i, "] = ", p.d_mask.stride[i], " is negative");
    }
    if (!aligned(p.d_mask.data, static_cast<uintptr_t>(element_size(p.d_mask.dtype))))
      return fail(StatusCode::misaligned, "d_mask.data = ", p.d_mask.data, " is not aligned to its elements");
  }

  if (p.d_sinks.data) {
    if (!p.sinks.data)
      return fail(StatusCode::invalid_option, "d_sinks is given but sinks.data is null; only sinks have a gradient");
    FFPA_RETURN_IF_ERROR(check_like(d_sinks, sinks));
    if (!aligned(p.d_sinks.data, 4))
      return fail(StatusCode::misaligned, "d_sinks.data = ", p.d_sinks.data, " is not 4-byte aligned");
    if (p.d_sinks.shape[0] > 1 && p.d_sinks.stride[0] == 0)
      return fail(StatusCode::invalid_stride, "d_sinks.stride[0] = 0 with shape [", p.d_sinks.shape[0],
                  "]: an output must not alias itself");
  }

  // Outputs: none aliases itself, and none overlaps another tensor of the call.
  for (Arg a : {d_q, d_k, d_v, d_mask}) FFPA_RETURN_IF_ERROR(check_self_aliasing(a, a.t.shape[3]));
  const SequenceBatch no_sequences;
  const SequenceBatch& batch = p.sequences ? *p.sequences : no_sequences;
  const Arg inputs[] = {q, k, v, o, mask, lse, d_o, d_lse, sinks,
                        Arg{batch.cu_seqlens_q, "sequences.cu_seqlens_q"},
                        Arg{batch.cu_seqlens_k, "sequences.cu_seqlens_k"},
                        Arg{batch.seqused_k, "sequences.seqused_k"}};
  const Arg outputs[] = {d_q, d_k, d_v, d_mask, d_sinks};
  constexpr int kInputs = sizeof inputs / sizeof inputs[0], kOutputs = sizeof outputs / sizeof outputs[0];
  ByteRange in_ranges[kInputs], out_ranges[kOutputs];
  for (int i = 0; i < kInputs; ++i) FFPA_RETURN_IF_ERROR(byte_range(inputs[i], &in_ranges[i]));
  for (int i = 0; i < kOutputs; ++i) FFPA_RETURN_IF_ERROR(byte_range(outputs[i], &out_ranges[i]));
  for (int i = 0; i < kOutputs; ++i) {
    for (int j = 0; j < kInputs; ++j)
      FFPA_RETURN_IF_ERROR(check_overlap(outputs[i].name, out_ranges[i], inputs[j].name, in_ranges[j]));
    for (int j = i + 1; j < kOutputs; ++j)
      FFPA_RETURN_IF_ERROR(check_overlap(outputs[i].name, out_ranges[i], outputs[j].name, out_ranges[j]));
  }

  BackwardProblem b;
  b.forward = forward_problem;
  b.d_o = p.d_o.data;
  b.d_q = p.d_q.data;
  b.d_k = p.d_k.data;
  b.d_v = p.d_v.data;
  copy_strides(p.d_o, b.d_o_stride);
  copy_strides(p.d_q, b.d_q_stride);
  copy_strides(p.d_k, b.d_k_stride);
  copy_strides(p.d_v, b.d_v_stride);
  if (p.d_mask.data) {
    b.d_mask = p.d_mask.data;
    for (int32_t i = 0; i < 4; ++i) {
      b.d_mask_shape[i] = p.d_mask.shape[i];
      b.d_mask_stride[i] = p.d_mask.shape[i] == 1 ? 0 : p.d_mask.stride[i];
    }
  }
  if (p.d_lse.data) {
    b.d_lse = static_cast<const float*>(p.d_lse.data);
    copy_strides(p.d_lse, b.d_lse_stride);
  }
  if (p.d_sinks.data) {
    b.d_sinks = static_cast<float*>(p.d_sinks.data);
    b.d_sinks_stride = p.d_sinks.stride[0];
  }
  *problem = b;
  return {};
}

}  // namespace ffpa::detail
