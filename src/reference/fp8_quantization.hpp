// The CPU model of the FP8 attention path (issue 11): the quantized inputs the
// GPU pre-pass must write, bit for bit (codes, scales, the smoothing means),
// and the attention the main loop computes from them, in double precision,
// with P quantized as the main loop quantizes it. The GPU tests compare the
// pre-pass's workspace with quantize_attention_inputs exactly and the FP8
// output with cpu_attention_quantized_f64 (and with the fp64 reference).
// The scheme, its rounding rules and measured accuracy:
// docs/kernels/fp8_model.md.
#pragma once

#include <cstdint>
#include <vector>

#include "common/attention_problem.hpp"
#include "common/fp8_e4m3.hpp"
#include "common/quantization_options.hpp"
#include "common/quantization_scales.hpp"

namespace ffpa::detail {

// P is in [0, 1] after the max subtraction; it is stored as e4m3(kPScale * p)
// (448 p in [0, 448]: the whole e4m3 range; p below 2^-10 / 448 becomes 0)
// and 1 / kPScale is folded into the epilogue's 1 / rowsum.
inline constexpr double kPScale = kE4m3Max;

// What the pre-pass writes, for one call. Codes are one byte per element:
// e4m3 bits, or int8 as two's complement bytes (QkFormat::int8). Layouts are
// contiguous, [batch][head][...]; the GPU keeps V transposed ([D][Nkv] per
// head, the K-major B operand 8-bit wgmma needs) with the same codes. An
// unquantized operand has no codes or scales (empty vectors).
struct QuantizedInputs {
  QuantizationOptions options;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  int64_t first_row = 0;  // min(n_early, Nq): Q rows [first_row, Nq) are quantized
  int64_t rows = 0;       // Nq - first_row

  std::vector<uint8_t> q_codes;  // [B][Hq][rows][D]; row r is query row first_row + r
  std::vector<float> q_scales;   // [B][Hq][q_scale_count(rows)]
  // int8 Q/K only (empty otherwise): per quantized row, NaN where a non-finite
  // Q or K value reaches the row (its own Q row with a key in reach, or a K
  // row within its causal reach; int8 codes cannot carry the NaN), else 0.
  // Added to the row's O factor and LSE. e4m3 carries NaN in its codes.
  std::vector<float> row_nan;    // [B][Hq][rows]
  std::vector<float> k_mean;     // [B][Hkv][D]; all 0 without smooth_k
  std::vector<uint8_t> k_codes;  // [B][Hkv][Nkv][D], of K - k_mean
  std::vector<float> k_scales;   // [B][Hkv][k_scale_count(Nkv)]; int8: negated for a group with a non-finite value
  std::vector<float> v_mean;     // [B][Hkv][D]; all 0 without smooth_v
  std::vector<uint8_t> v_codes;  // [B][Hkv][Nkv][D], of V - v_mean
  std::vector<float> v_scales;   // [B][Hkv][v_scale_count(Nkv, D)]

  int64_t q_scales_per_head() const { return q_scale_count(rows, options.qk_granularity); }
  int64_t k_scales_per_head() const { return k_scale_count(seq_kv, options.qk_granularity); }
  int64_t v_scales_per_head() const { return v_scale_count(seq_kv, head_dim, options.v_granularity); }
};

// The value of a Q or K code (e4m3 or int8), before its scale.
double qk_code_value(uint8_t code, QkFormat format);

// Quantizes q, k and v of the problem (fp16 or bf16 host memory, any
// strides) as the GPU pre-pass does. Throws std::invalid_argument for options
// the model does not define (negative n_early, smooth_v with dropout).
QuantizedInputs quantize_attention_inputs(const AttentionProblem& problem, const QuantizationOptions& options);

// The K and V half of it (q is not read; q_codes and q_scales stay empty):
// what an FP8 KV cache holds (reference/fp8_kv_cache.hpp).
QuantizedInputs quantize_key_values(const AttentionProblem& problem, const QuantizationOptions& options);

// Attention from the quantized inputs, in double: out [B][Hq][Nq][D] and lse
// [B][Hq][Nq] (may be null), contiguous, every row written. Rows below
// first_row are the fp64 reference's (cpu_attention_forward_f64, bit for bit);
// the others are computed from the dequantized Q, K, V with P quantized as
// the main loop quantizes it (fp8_model.md: "the main loop"). Masks, both
// causal alignments, dropout (the reference's keep-mask) and GQA as in the
// reference. `quantized` must come from this problem (throws
// std::invalid_argument when its shape differs). num_threads: the hybrid
// rows' reference call.
void cpu_attention_quantized_f64(const AttentionProblem& problem, const QuantizedInputs& quantized, double* out,
                                 double* lse, int num_threads = 0);

}  // namespace ffpa::detail
