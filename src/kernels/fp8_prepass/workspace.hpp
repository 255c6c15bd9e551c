// Where the FP8 pre-pass writes in the call's workspace: the quantized
// inputs the main loop reads (codes and scales, the smoothing means) and the
// pre-pass's own per-block partial reductions. One layout, computed on the
// host from the problem and the options, for the size query, the pre-pass
// and the main loop alike. Layouts of the codes and scales are the CPU
// model's (reference/fp8_quantization.hpp: QuantizedInputs) except that rows
// of codes are padded to 16 bytes (TMA's stride unit; the padding zeroed): Q
// and K rows to code_pitch bytes, and V kept transposed per head ([D][v_pitch]:
// the K-major B operand 8-bit wgmma needs for P V); common/quantized_kv_layout.hpp.
// K's and V's regions are also the FP8 KV cache's format (ffpa::Fp8KvCache):
// a forward with a cache holds only Q's regions here, and fp8_quantize_kv only
// the pre-pass's scratch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/attention_problem.hpp"
#include "common/ceil_div.hpp"
#include "common/quantization_options.hpp"
#include "common/quantized_kv_layout.hpp"
#include "common/quantization_scales.hpp"

namespace ffpa::detail::fp8_prepass {

// The workspace's regions, as device pointers (null: not written by this call).
struct QuantizedBuffers {
  uint8_t* q_codes = nullptr;   // [B][Hq][rows][code_pitch], rows = Nq - first_row
  float* q_scales = nullptr;    // [B][Hq][q_scale_count(rows)]
  // smooth_k: scale * (q . k_mean) of each quantized row, fp32, what the
  // row's LSE adds back (K's mean shifts every score of a row alike).
  float* lse_shift = nullptr;   // [B][Hq][rows]
  // int8 Q and K: NaN for a quantized row that a non-finite Q or K value
  // reaches, else 0 (reference/fp8_quantization.hpp's row_nan), what the
  // row's O factor and LSE add.
  float* row_nan = nullptr;     // [B][Hq][rows]
  float* k_mean = nullptr;      // [B][Hkv][D] (zeros without smooth_k)
  uint8_t* k_codes = nullptr;   // [B][Hkv][Nkv][code_pitch]
  float* k_scales = nullptr;    // [B][Hkv][k_scale_count(Nkv)]
  float* v_mean = nullptr;      // [B][Hkv][D] (zeros without smooth_v)
  uint8_t* v_codes = nullptr;   // [B][Hkv][D][v_pitch]: V^T
  float* v_scales = nullptr;    // [B][Hkv][v_scale_count(Nkv, D)]
  // The pre-pass's scratch: per (kv head, 128-key block, channel), K's block
  // sums and V's block sums (smooth_v) or block amax (per-channel V scales).
  float* k_partials = nullptr;  // [B][Hkv][key_blocks][D]
  float* v_partials = nullptr;  // [B][Hkv][key_blocks][D]
  int64_t first_row = 0, rows = 0, code_pitch = 0, v_pitch = 0, key_blocks = 0;
};

// Which regions a workspace holds.
enum class Regions {
  all,                 // the forward's pre-pass: Q, K and V quantized here
  queries,             // a forward with an FP8 KV cache: Q's codes, scales and LSE terms
  key_value_scratch,   // fp8_quantize_kv: the partials, and the zero means of a knob
                       // that is off (the kernels read them; a cache may omit them)
};

// The region offsets of one call's workspace, in bytes from its start (each
// 256-byte aligned; kAbsent for a region it does not hold), and its size.
struct WorkspaceLayout {
  static constexpr size_t kAlignment = 256;
  static constexpr size_t kAbsent = ~size_t{0};
  size_t q_codes = 0, q_scales = 0, lse_shift = 0, row_nan = 0, k_mean = 0, k_codes = 0, k_scales = 0, v_mean = 0, v_codes = 0, v_scales = 0,
         k_partials = 0, v_partials = 0;
  size_t bytes = 0;
  int64_t first_row = 0, rows = 0, code_pitch = 0, v_pitch = 0, key_blocks = 0;

  static WorkspaceLayout of(const AttentionProblem& p, const QuantizationOptions& o, Regions regions = Regions::all) {
    WorkspaceLayout w;
    w.first_row = o.n_early < p.seq_q ? o.n_early : p.seq_q;
    w.rows = p.seq_q - w.first_row;
    const QuantizedKvLayout kv = quantized_kv_layout(p.seq_kv, p.head_dim, o);
    w.code_pitch = kv.k_pitch;
    w.v_pitch = kv.v_pitch;
    w.key_blocks = ceil_div(p.seq_kv, kQuantKeyBlock);
    const size_t q_heads = static_cast<size_t>(p.batch * p.heads_q), kv_heads = static_cast<size_t>(p.batch * p.heads_kv);
    const size_t dim = static_cast<size_t>(p.head_dim), nkv = static_cast<size_t>(p.seq_kv);
    const size_t pitch = static_cast<size_t>(w.code_pitch);
    const bool queries = regions != Regions::key_value_scratch, key_values = regions == Regions::all;
    const bool scratch = regions != Regions::queries;
    size_t at = 0;
    auto region = [&at](bool held, size_t bytes) {
      if (!held) return kAbsent;
      const size_t start = at;
      at = round_up(at + bytes, kAlignment);
      return start;
    };
    w.q_codes = region(queries, q_heads * static_cast<size_t>(w.rows) * pitch);
    w.q_scales = region(queries, q_heads * static_cast<size_t>(q_scale_count(w.rows, o.qk_granularity)) * sizeof(float));
    w.lse_shift = region(queries, q_heads * static_cast<size_t>(w.rows) * sizeof(float));
    w.row_nan = region(queries && o.qk_format == QkFormat::int8, q_heads * static_cast<size_t>(w.rows) * sizeof(float));
    w.k_mean = region(key_values || (scratch && !o.smooth_k), kv_heads * dim * sizeof(float));
    w.k_codes = region(key_values, kv_heads * nkv * pitch);
    w.k_scales = region(key_values, kv_heads * static_cast<size_t>(kv.k_scales) * sizeof(float));
    w.v_mean = region(key_values || (scratch && !o.smooth_v), kv_heads * dim * sizeof(float));
    w.v_codes = region(key_values, kv_heads * dim * static_cast<size_t>(w.v_pitch));
    w.v_scales = region(key_values, kv_heads * static_cast<size_t>(kv.v_scales) * sizeof(float));
    const size_t partial_bytes = kv_heads * static_cast<size_t>(w.key_blocks) * dim * sizeof(float);
    w.k_partials = region(scratch, partial_bytes);
    w.v_partials = region(scratch, partial_bytes);
    w.bytes = at;
    return w;
  }

  // The regions' device pointers in `workspace`; null for absent ones.
  QuantizedBuffers bind(void* workspace) const {
    auto* base = static_cast<unsigned char*>(workspace);
    auto at = [base](size_t offset) { return offset == kAbsent ? nullptr : base + offset; };
    auto floats_at = [&at](size_t offset) { return reinterpret_cast<float*>(at(offset)); };
    QuantizedBuffers b;
    b.q_codes = at(q_codes);
    b.q_scales = floats_at(q_scales);
    b.lse_shift = floats_at(lse_shift);
    b.row_nan = floats_at(row_nan);
    b.k_mean = floats_at(k_mean);
    b.k_codes = at(k_codes);
    b.k_scales = floats_at(k_scales);
    b.v_mean = floats_at(v_mean);
    b.v_codes = at(v_codes);
    b.v_scales = floats_at(v_scales);
    b.k_partials = floats_at(k_partials);
    b.v_partials = floats_at(v_partials);
    b.first_row = first_row;
    b.rows = rows;
    b.code_pitch = code_pitch;
    b.v_pitch = v_pitch;
    b.key_blocks = key_blocks;
    return b;
  }

 private:
  static constexpr size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }
};

}  // namespace ffpa::detail::fp8_prepass
