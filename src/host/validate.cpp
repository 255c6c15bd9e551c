// Validation of a forward call. The checks run in a fixed order (ranks, sizes,
// dtypes, shapes, pointers, strides, mask layout, extents, self-aliasing,
// alignment, options, workspace, overlap) so that a call with several faults
// always reports the same one. Nothing here dereferences a tensor pointer.
#include "host/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "host/validate_checks.hpp"
#include "host/validate_fp8.hpp"
#include "host/validate_sequences.hpp"

namespace ffpa::detail {
namespace {

// --- ranks, sizes, dtypes, shapes ---------------------------------------------
Status check_dtypes(const ForwardParams& p) {
  const DType dtype = p.q.dtype;
  if (dtype != DType::f16 && dtype != DType::bf16 && dtype != DType::f32 && dtype != DType::f64)
    return fail(StatusCode::unsupported_dtype, "q.dtype = ", dtype_name(dtype),
                "; q, k, v and o must be f16 or bf16 (f32 and f64: the CPU reference only)");
  for (Arg a : {Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}})
    if (a.t.dtype == DType::u8)
      return fail(StatusCode::unsupported_dtype, a.name,
                  ".dtype = u8; 8-bit codes belong in an FP8 KV cache (ForwardParams::fp8_kv_cache), q, k, v and o "
                  "are f16 or bf16");
  // k and v in e4m3 beside 16-bit q: a serving engine's FP8 KV cache.
  const bool e4m3_kv = p.k.dtype == DType::e4m3 && (dtype == DType::f16 || dtype == DType::bf16);
  if (p.v.dtype == DType::e4m3 && !e4m3_kv)
    return fail(StatusCode::dtype_mismatch, "v.dtype = e4m3 but k.dtype = ", dtype_name(p.k.dtype),
                "; an FP8 KV cache has k and v in e4m3 beside f16 or bf16 q");
  for (Arg a : {Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}}) {
    const DType expected = e4m3_kv && &a.t != &p.o ? DType::e4m3 : dtype;
    if (a.t.dtype != expected)
      return fail(StatusCode::dtype_mismatch, a.name, ".dtype = ", dtype_name(a.t.dtype), " differs from ",
                  &a.t == &p.v && e4m3_kv ? "k.dtype = e4m3" : "q.dtype = ", &a.t == &p.v && e4m3_kv ? "" : dtype_name(dtype).c_str());
  }
  for (Arg a : {Arg{p.sinks, "sinks"}, Arg{p.k_descale, "k_descale"}, Arg{p.v_descale, "v_descale"}})
    if (a.t.data && a.t.dtype != DType::f32)
      return fail(StatusCode::unsupported_dtype, a.name, ".dtype = ", dtype_name(a.t.dtype), "; ", a.name,
                  " must be f32");
  if (p.mask.data) {
    const DType m = p.mask.dtype;
    if (m != DType::boolean && m != DType::f16 && m != DType::bf16 && m != DType::f32 && m != DType::f64)
      return fail(StatusCode::unsupported_dtype, "mask.dtype = ", dtype_name(m),
                  "; a mask must be boolean, f16, bf16 or f32 (f64: the CPU reference only)");
  }
  if (p.lse.data && p.lse.dtype != DType::f32)
    return fail(StatusCode::unsupported_dtype, "lse.dtype = ", dtype_name(p.lse.dtype),
                "; lse must be f32");
  return {};
}


// The batch and length dims of a dense call: one B, Nq and Nkv for all.
Status check_dense_shapes(const ForwardParams& p) {
  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"};
  for (Arg a : {k, v, o}) FFPA_RETURN_IF_ERROR(check_same_size(a, 0, q, 0, "B"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 2, q, 2, "Nq"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 2, k, 2, "Nkv"));
  if (p.lse.data) {
    const Arg lse{p.lse, "lse"};
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 0, q, 0, "B"));
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 1, q, 1, "Hq"));
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 2, q, 2, "Nq"));
  }
  return {};
}

// Sinks [Hq] and descales [B, Hkv] (B: the sequences of a serving call).
Status check_score_term_shapes(const ForwardParams& p) {
  if (p.sinks.data) {
    const Arg sinks{p.sinks, "sinks"};
    FFPA_RETURN_IF_ERROR(check_rank(sinks, 1, "[Hq]"));
    FFPA_RETURN_IF_ERROR(check_sizes(sinks));
    FFPA_RETURN_IF_ERROR(check_same_size(sinks, 0, Arg{p.q, "q"}, 1, "Hq"));
  }
  const int64_t batch = p.sequences ? sequence_count(*p.sequences, p) : p.q.shape[0];
  for (Arg a : {Arg{p.k_descale, "k_descale"}, Arg{p.v_descale, "v_descale"}}) {
    if (!a.t.data) continue;
    if (p.k.dtype != DType::e4m3)
      return fail(StatusCode::invalid_option, a.name, " is given but k and v are ", dtype_name(p.k.dtype),
                  "; descales belong to an e4m3 KV cache");
    FFPA_RETURN_IF_ERROR(check_rank(a, 2, "[B, Hkv]"));
    FFPA_RETURN_IF_ERROR(check_sizes(a));
    if (a.t.shape[0] != batch)
      return fail(StatusCode::shape_mismatch, a.name, ".shape[0] = ", a.t.shape[0], " differs from B = ", batch);
    FFPA_RETURN_IF_ERROR(check_same_size(a, 1, Arg{p.k, "k"}, 1, "Hkv"));
  }
  return {};
}

Status check_shapes(const ForwardParams& p) {
  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"};
  if (p.sequence_plan && !p.sequences)
    return fail(StatusCode::invalid_option, "sequence_plan is given without sequences; a plan is a sequence batch's");
  FFPA_RETURN_IF_ERROR(p.sequences ? check_sequence_batch(p) : check_dense_shapes(p));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 1, q, 1, "Hq"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 1, k, 1, "Hkv"));
  FFPA_RETURN_IF_ERROR(check_same_size(k, 3, q, 3, "D"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 3, v, 3, "Dv"));
  FFPA_RETURN_IF_ERROR(check_score_term_shapes(p));

  const int64_t heads_q = p.q.shape[1], heads_kv = p.k.shape[1];
  // Hkv = 0 is rejected even when Hq = 0: the ratio Hq / Hkv must exist.
  if (heads_kv == 0)
    return fail(StatusCode::invalid_gqa_ratio, "k.shape[1] (Hkv) = 0; Hkv must be at least 1");
  if (heads_q % heads_kv != 0)
    return fail(StatusCode::invalid_gqa_ratio, "q.shape[1] (Hq) = ", heads_q,
                " is not a multiple of k.shape[1] (Hkv) = ", heads_kv);

  // D (of q and k) and Dv (of v and o) each a multiple of kHeadDimMultiple in
  // range; they may differ (D_qk != D_v, e.g. absorbed MLA's 576 / 512).
  const int64_t d = p.q.shape[3], dv = p.v.shape[3];
  if (d < kMinHeadDim || d > kMaxHeadDim || d % kHeadDimMultiple != 0)
    return fail(StatusCode::unsupported_head_dim, "q.shape[3] (D) = ", d,
                " is not supported; D must be a multiple of ", kHeadDimMultiple, " in [",
                kMinHeadDim, ", ", kMaxHeadDim, "]");
  if (dv < kMinHeadDim || dv > kMaxHeadDim || dv % kHeadDimMultiple != 0)
    return fail(StatusCode::unsupported_head_dim, "v.shape[3] (Dv) = ", dv,
                " is not supported; Dv must be a multiple of ", kHeadDimMultiple, " in [",
                kMinHeadDim, ", ", kMaxHeadDim, "]");
  // e4m3 rows: 16-byte vectors of 16 elements.
  if (p.k.dtype == DType::e4m3 && (d % 16 != 0 || dv % 16 != 0))
    return fail(StatusCode::unsupported_head_dim, "D = ", d, ", Dv = ", dv,
                " with e4m3 k and v: an e4m3 row is read in 16-byte vectors, so D and Dv must be multiples of 16");
  return {};
}

// With an FP8 KV cache, k's and v's data may be null (the cache holds them):
// whether they are needed is decided with the cache (check_forward_kv_cache);
// their strides are then not read either.
bool held_by_cache(const ForwardParams& p, const Tensor& t) {
  return p.fp8_kv_cache != nullptr && (&t == &p.k || &t == &p.v) && !t.data;
}

Status check_null_pointers(const ForwardParams& p) {
  for (Arg a : {Arg{p.q, "q"}, Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}})
    if (!a.t.data && !is_empty(a.t) && !held_by_cache(p, a.t))
      return fail(StatusCode::null_pointer, a.name, ".data is null (", a.name,
                  ".shape = ", list_text(a.t.shape, 4), ")");
  return {};
}

// --- strides, mask layout ---------------------------------------------------------

Status check_strides(const ForwardParams& p) {
  for (Arg a : {Arg{p.q, "q"}, Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}}) {
    if (held_by_cache(p, a.t)) continue;
    if (a.t.stride[3] != 1)
      return fail(StatusCode::noncontiguous_last_dim, a.name, ".stride[3] = ", a.t.stride[3],
                  "; the last dimension must be contiguous (stride 1)");
    for (int32_t i = 0; i < 3; ++i)
      if (a.t.stride[i] < 0)
        return fail(StatusCode::invalid_stride, a.name, ".stride[", i, "] = ", a.t.stride[i],
                    " is negative");
  }
  if (p.lse.data)
    for (int32_t i = 0; i < 3; ++i)
      if (p.lse.stride[i] < 0)
        return fail(StatusCode::invalid_stride, "lse.stride[", i, "] = ", p.lse.stride[i],
                    " is negative");
  return {};
}

Status check_mask_layout(const ForwardParams& p) {
  if (!p.mask.data) return {};
  const int64_t full[4] = {p.q.shape[0], p.q.shape[1], p.q.shape[2], p.k.shape[2]};
  const char* full_name[4] = {"B", "Hq", "Nq", "Nkv"};
  for (int32_t i = 0; i < 4; ++i) {
    if (p.mask.shape[i] != 1 && p.mask.shape[i] != full[i])
      return fail(StatusCode::invalid_mask_layout, "mask.shape[", i, "] = ", p.mask.shape[i],
                  " is neither 1 nor ", full_name[i], " = ", full[i],
                  "; the mask must broadcast to [B, Hq, Nq, Nkv] = ", list_text(full, 4));
    if (p.mask.stride[i] < 0)
      return fail(StatusCode::invalid_mask_layout, "mask.stride[", i, "] = ", p.mask.stride[i],
                  " is negative");
  }
  return {};
}

Status check_alignment(const ForwardParams& p) {
  for (Arg a : {Arg{p.q, "q"}, Arg{p.k, "k"}, Arg{p.v, "v"}, Arg{p.o, "o"}}) {
    if (is_empty(a.t) || held_by_cache(p, a.t)) continue;  // never accessed
    FFPA_RETURN_IF_ERROR(check_vector_alignment(a));
  }
  if (p.lse.data && !is_empty(p.lse) && !aligned(p.lse.data, 4))
    return fail(StatusCode::misaligned, "lse.data = ", p.lse.data, " is not 4-byte aligned");
  for (Arg a : {Arg{p.sinks, "sinks"}, Arg{p.k_descale, "k_descale"}, Arg{p.v_descale, "v_descale"}}) {
    if (!a.t.data) continue;
    for (int32_t i = 0; i < a.t.rank; ++i)
      if (a.t.stride[i] < 0) return fail(StatusCode::invalid_stride, a.name, ".stride[", i, "] = ", a.t.stride[i], " is negative");
    if (!aligned(a.t.data, 4)) return fail(StatusCode::misaligned, a.name, ".data = ", a.t.data, " is not 4-byte aligned");
  }
  if (p.mask.data && !is_empty(p.mask)) {
    const int64_t size = element_size(p.mask.dtype);
    if (!aligned(p.mask.data, static_cast<uintptr_t>(size)))
      return fail(StatusCode::misaligned, "mask.data = ", p.mask.data, " is not ", size,
                  "-byte aligned (mask.dtype = ", dtype_name(p.mask.dtype), ")");
  }
  return {};
}

// --- options, workspace ---------------------------------------------------------------

Status check_options(const ForwardParams& p) {
  const Options& opt = p.options;
  const auto causal = static_cast<int32_t>(opt.causal);
  if (causal < 0 || causal > static_cast<int32_t>(Causal::bottom_right))
    return fail(StatusCode::invalid_option, "options.causal = ", causal,
                " is not a Causal value (0 none, 1 top_left, 2 bottom_right)");
  const auto accumulation = static_cast<int32_t>(opt.accumulation);
  if (accumulation < 0 || accumulation > static_cast<int32_t>(Accumulation::f16))
    return fail(StatusCode::invalid_option, "options.accumulation = ", accumulation,
                " is not an Accumulation value (0 f32, 1 f16)");
  const auto impl = static_cast<int32_t>(opt.impl);
  if (impl < 0 || impl > static_cast<int32_t>(Impl::sm90_wgmma))
    return fail(StatusCode::invalid_option, "options.impl = ", impl,
                " is not an Impl value (0 automatic, 1 cpu_reference, 2 sm80_split_d, 3 sm90_wgmma)");
  if (opt.scale && !std::isfinite(*opt.scale))
    return fail(StatusCode::invalid_option, "options.scale = ", *opt.scale, " is not finite");
  if (!std::isfinite(opt.dropout_p) || opt.dropout_p < 0.0f || opt.dropout_p >= 1.0f)
    return fail(StatusCode::invalid_dropout, "options.dropout_p = ", opt.dropout_p,
                " is outside [0, 1)");
  // The stream numbers a head's elements i * Nkv + j in 32 bits, as SDPA's
  // kernel does (common/philox.hpp); check_sizes has bounded both factors.
  if (opt.dropout_p > 0.0f && p.q.shape[2] * p.k.shape[2] > (int64_t{1} << 32))
    return fail(StatusCode::invalid_dropout, "dropout with Nq * Nkv = ", p.q.shape[2] * p.k.shape[2],
                " > 2^32: the dropout stream numbers a head's elements in 32 bits");
  if (opt.accumulation == Accumulation::f16 && p.q.dtype != DType::f16)
    return fail(StatusCode::unsupported_accumulation,
                "options.accumulation = f16 needs f16 inputs; q.dtype = ", dtype_name(p.q.dtype));
  const auto precision = static_cast<int32_t>(opt.precision);
  if (precision < 0 || precision > static_cast<int32_t>(Precision::fp8))
    return fail(StatusCode::invalid_option, "options.precision = ", precision,
                " is not a Precision value (0 input, 1 fp8)");
  if (opt.window_left < -1 || opt.window_right < -1)
    return fail(StatusCode::invalid_window, "options.window_left = ", opt.window_left, ", window_right = ",
                opt.window_right, "; a bound is -1 (unbounded) or a number of keys >= 0 (below -1 the window would "
                "exclude every key)");
  if (!std::isfinite(opt.softcap) || opt.softcap < 0.0f)
    return fail(StatusCode::invalid_option, "options.softcap = ", opt.softcap, " is not a finite value >= 0 (0: none)");
  if (opt.precision == Precision::fp8 && p.k.dtype == DType::e4m3)
    return fail(StatusCode::invalid_option,
                "precision fp8 with e4m3 k and v: the library's FP8 path quantizes 16-bit inputs itself");
  if (opt.precision == Precision::fp8) {
    const Fp8Options& fp8 = opt.fp8;
    FFPA_RETURN_IF_ERROR(validate_fp8_knobs(fp8, "options.fp8"));
    if (fp8.smooth_v && opt.dropout_p > 0.0f)
      return fail(StatusCode::invalid_option,
                  "options.fp8.smooth_v with dropout: the kept weights do not sum to 1, so V's mean cannot be added back");
    if (fp8.early_rows && (*fp8.early_rows < 0 || *fp8.early_rows % kQuantQueryBlock != 0))
      return fail(StatusCode::invalid_option, "options.fp8.early_rows = ", *fp8.early_rows,
                  " is not a non-negative multiple of ", kQuantQueryBlock);
    if (opt.accumulation == Accumulation::f16)
      return fail(StatusCode::unsupported_accumulation,
                  "options.accumulation = f16 with precision fp8: the FP8 path accumulates in fp32");
  }
  return {};
}

Status check_workspace(const ForwardParams& p) {
  if (p.workspace_bytes > 0 && !p.workspace)
    return fail(StatusCode::null_pointer,
                "workspace is null but workspace_bytes = ", p.workspace_bytes);
  return {};
}

// --- the normalized problem -------------------------------------------------------------

MaskKind mask_kind(const Tensor& mask) {
  if (!mask.data) return MaskKind::none;
  switch (mask.dtype) {
    case DType::boolean: return MaskKind::boolean;
    case DType::f16: return MaskKind::additive_f16;
    case DType::bf16: return MaskKind::additive_bf16;
    case DType::f32: return MaskKind::additive_f32;
    case DType::f64: return MaskKind::additive_f64;
    case DType::u8:
    case DType::e4m3:
    case DType::i32: break;
  }
  return MaskKind::none;  // unreachable after the dtype checks
}


AttentionProblem make_problem(const ForwardParams& p) {
  AttentionProblem problem;
  problem.batch = p.q.shape[0];
  problem.heads_q = p.q.shape[1];
  problem.heads_kv = p.k.shape[1];
  problem.seq_q = p.q.shape[2];
  problem.seq_kv = p.k.shape[2];
  problem.head_dim = p.q.shape[3];
  problem.value_dim = p.v.shape[3];
  problem.dtype = p.q.dtype;

  problem.q = p.q.data;
  problem.k = p.k.data;
  problem.v = p.v.data;
  problem.o = p.o.data;
  copy_strides(p.q, problem.q_stride);
  copy_strides(p.k, problem.k_stride);
  copy_strides(p.v, problem.v_stride);
  copy_strides(p.o, problem.o_stride);
  // k or v held by an FP8 KV cache: never read, strides unchecked; dense ones
  // keep every later check of them (TMA addressability, row alignment) quiet.
  if (held_by_cache(p, p.k)) dense_strides(p.k, problem.k_stride);
  if (held_by_cache(p, p.v)) dense_strides(p.v, problem.v_stride);

  problem.mask_kind = mask_kind(p.mask);
  if (problem.mask_kind != MaskKind::none) {
    problem.mask = p.mask.data;
    for (int32_t i = 0; i < 4; ++i)
      problem.mask_stride[i] = p.mask.shape[i] == 1 ? 0 : p.mask.stride[i];
    const int64_t* stride = problem.mask_stride;
    problem.mask_key_pairs = stride[3] == 1 && stride[0] % 2 == 0 && stride[1] % 2 == 0 && stride[2] % 2 == 0 &&
                             aligned(p.mask.data, static_cast<uintptr_t>(2 * element_size(p.mask.dtype)));
  }
  if (p.lse.data) {
    problem.lse = static_cast<float*>(p.lse.data);
    copy_strides(p.lse, problem.lse_stride);
  }

  const Options& opt = p.options;
  problem.scale = opt.scale
                      ? *opt.scale
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(problem.head_dim)));
  problem.causal = opt.causal;
  problem.dropout_p = opt.dropout_p;
  problem.dropout_threshold = dropout_threshold(opt.dropout_p);
  // SDPA scales kept values by 1 / (1 - p) in the inputs' dtype (common/philox.hpp).
  const float keep_scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(opt.dropout_p)));
  problem.dropout_scale = p.q.dtype == DType::bf16  ? bf16_bits_to_float(float_to_bf16_bits(keep_scale))
                          : p.q.dtype == DType::f16 ? half_bits_to_float(float_to_half_bits(keep_scale))
                                                    : keep_scale;
  problem.dropout_seed = opt.dropout_seed;
  problem.dropout_offset = opt.dropout_offset;
  problem.accumulation = opt.accumulation;
  problem.fp8 = opt.precision == Precision::fp8;
  if (problem.fp8) problem.quantization = quantization_options(opt.fp8, early_rows(opt));

  problem.window_left = opt.window_left;
  problem.window_right = opt.window_right;
  problem.softcap = opt.softcap;
  if (p.sinks.data) {
    problem.sinks = static_cast<const float*>(p.sinks.data);
    problem.sinks_stride = p.sinks.stride[0];
  }
  problem.kv_e4m3 = p.k.dtype == DType::e4m3;
  if (p.k_descale.data) {
    problem.k_descale = static_cast<const float*>(p.k_descale.data);
    for (int32_t i = 0; i < 2; ++i) problem.k_descale_stride[i] = p.k_descale.shape[i] == 1 ? 0 : p.k_descale.stride[i];
  }
  if (p.v_descale.data) {
    problem.v_descale = static_cast<const float*>(p.v_descale.data);
    for (int32_t i = 0; i < 2; ++i) problem.v_descale_stride[i] = p.v_descale.shape[i] == 1 ? 0 : p.v_descale.stride[i];
  }
  problem.sequences.queries_per_sequence = problem.seq_q;
  problem.sequences.keys_per_sequence = problem.seq_kv;
  if (p.sequences) set_sequence_layout(p, &problem);
  return problem;
}

}  // namespace

Status validate_forward(const ForwardParams& p, AttentionProblem* problem) {
  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"};
  const Arg mask{p.mask, "mask"}, lse{p.lse, "lse"};

  // A serving call's packed q is [1, Hq, total_q, D], its paged k [num_blocks,
  // Hkv, page_size, D]: still rank 4 (validate_sequences.cpp).
  const bool paged = p.sequences && p.sequences->block_table.data;
  FFPA_RETURN_IF_ERROR(check_rank(q, 4, "[B, Hq, Nq, D]"));
  FFPA_RETURN_IF_ERROR(check_rank(k, 4, paged ? "[num_blocks, Hkv, page_size, D]" : "[B, Hkv, Nkv, D]"));
  FFPA_RETURN_IF_ERROR(check_rank(v, 4, paged ? "[num_blocks, Hkv, page_size, Dv]" : "[B, Hkv, Nkv, Dv]"));
  FFPA_RETURN_IF_ERROR(check_rank(o, 4, "[B, Hq, Nq, Dv]"));
  if (p.mask.data) FFPA_RETURN_IF_ERROR(check_rank(mask, 4, "broadcastable to [B, Hq, Nq, Nkv]"));
  if (p.lse.data) FFPA_RETURN_IF_ERROR(check_rank(lse, 3, "[B, Hq, Nq]"));

  for (Arg a : {q, k, v, o}) FFPA_RETURN_IF_ERROR(check_sizes(a));
  if (p.mask.data) FFPA_RETURN_IF_ERROR(check_sizes(mask));
  if (p.lse.data) FFPA_RETURN_IF_ERROR(check_sizes(lse));

  FFPA_RETURN_IF_ERROR(check_dtypes(p));
  FFPA_RETURN_IF_ERROR(check_shapes(p));
  FFPA_RETURN_IF_ERROR(check_null_pointers(p));
  FFPA_RETURN_IF_ERROR(check_strides(p));
  FFPA_RETURN_IF_ERROR(check_mask_layout(p));

  ByteRange range_q, range_k, range_v, range_o, range_mask, range_lse;
  FFPA_RETURN_IF_ERROR(byte_range(q, &range_q));
  FFPA_RETURN_IF_ERROR(byte_range(k, &range_k));
  FFPA_RETURN_IF_ERROR(byte_range(v, &range_v));
  FFPA_RETURN_IF_ERROR(byte_range(o, &range_o));
  FFPA_RETURN_IF_ERROR(byte_range(mask, &range_mask));
  FFPA_RETURN_IF_ERROR(byte_range(lse, &range_lse));

  FFPA_RETURN_IF_ERROR(check_self_aliasing(o, p.o.shape[3]));
  FFPA_RETURN_IF_ERROR(check_self_aliasing(lse, 1));
  FFPA_RETURN_IF_ERROR(check_alignment(p));
  FFPA_RETURN_IF_ERROR(check_options(p));
  ByteRange cache_ranges[kCacheTensors];
  if (p.fp8_kv_cache) FFPA_RETURN_IF_ERROR(check_forward_kv_cache(p, cache_ranges));
  FFPA_RETURN_IF_ERROR(check_workspace(p));

  ByteRange range_sinks, range_k_descale, range_v_descale;
  FFPA_RETURN_IF_ERROR(byte_range(Arg{p.sinks, "sinks"}, &range_sinks));
  FFPA_RETURN_IF_ERROR(byte_range(Arg{p.k_descale, "k_descale"}, &range_k_descale));
  FFPA_RETURN_IF_ERROR(byte_range(Arg{p.v_descale, "v_descale"}, &range_v_descale));
  for (auto [name, range] :
       {std::pair{"q", range_q}, std::pair{"k", range_k}, std::pair{"v", range_v}, std::pair{"mask", range_mask},
        std::pair{"lse", range_lse}, std::pair{"sinks", range_sinks}, std::pair{"k_descale", range_k_descale},
        std::pair{"v_descale", range_v_descale}})
    FFPA_RETURN_IF_ERROR(check_overlap("o", range_o, name, range));
  for (auto [name, range] :
       {std::pair{"q", range_q}, std::pair{"k", range_k}, std::pair{"v", range_v}, std::pair{"mask", range_mask},
        std::pair{"sinks", range_sinks}, std::pair{"k_descale", range_k_descale},
        std::pair{"v_descale", range_v_descale}})
    FFPA_RETURN_IF_ERROR(check_overlap("lse", range_lse, name, range));
  if (p.fp8_kv_cache) {
    for (int i = 0; i < kCacheTensors; ++i) {
      const std::string name = std::string("fp8_kv_cache.") + kv_cache_tensor_name(i);
      FFPA_RETURN_IF_ERROR(check_overlap("o", range_o, name.c_str(), cache_ranges[i]));
      FFPA_RETURN_IF_ERROR(check_overlap("lse", range_lse, name.c_str(), cache_ranges[i]));
    }
  }
  if (p.sequences) {
    ByteRange ranges[kSequenceTensors];
    const char* names[kSequenceTensors];
    FFPA_RETURN_IF_ERROR(sequence_byte_ranges(*p.sequences, ranges, names));
    for (int i = 0; i < kSequenceTensors; ++i) {
      FFPA_RETURN_IF_ERROR(check_overlap("o", range_o, names[i], ranges[i]));
      FFPA_RETURN_IF_ERROR(check_overlap("lse", range_lse, names[i], ranges[i]));
    }
  }

  *problem = make_problem(p);
  return {};
}

}  // namespace ffpa::detail
