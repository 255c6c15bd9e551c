// The validated, normalized description of one forward call. Host validation
// produces it; the CPU reference and the GPU launchers consume it. Layouts are
// normalized to logical [B, H, N, D] with element strides (the last dimension
// is contiguous), so [B, N, H, D] buffers run through the same code unchanged.
#pragma once

#include <climits>
#include <cstdint>

#include "common/host_device.hpp"
#include "common/quantization_options.hpp"
#include "common/sequence_batch.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::detail {

// The head dims validation accepts: multiples of kHeadDimMultiple (16-byte
// rows of fp16/bf16) in [kMinHeadDim, kMaxHeadDim]. ffpa_library_info_get
// reports these, so bindings ask instead of restating them.
inline constexpr int64_t kMinHeadDim = 8;
inline constexpr int64_t kMaxHeadDim = 1024;
inline constexpr int64_t kHeadDimMultiple = 8;

// The longest Nq or Nkv the GPU families serve: sequence positions are 32-bit
// in the kernels (addresses are 64-bit); the margin leaves room for positions
// a tile past the end.
inline constexpr int64_t kMaxSequenceLength = INT_MAX - 1024;

// additive_f64 and f32 / f64 inputs (`dtype`): the CPU reference only (plan_forward).
enum class MaskKind : int32_t { none, boolean, additive_f16, additive_bf16, additive_f32, additive_f64 };

struct AttentionProblem {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  // Dv, the head dim of v and o (issue 14's D_qk != D_v); 0 means head_dim.
  int64_t value_dim = 0;
  DType dtype = DType::bf16;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  int64_t q_stride[3] = {}, k_stride[3] = {}, v_stride[3] = {}, o_stride[3] = {};  // b, h, n

  MaskKind mask_kind = MaskKind::none;
  const void* mask = nullptr;
  int64_t mask_stride[4] = {};  // b, h, i, j; 0 where the mask broadcasts
  // Keys contiguous and every row starting on a two-element boundary: the
  // kernels read the mask a key pair (c, c + 1 with c even) per load.
  bool mask_key_pairs = false;

  float* lse = nullptr;
  int64_t lse_stride[3] = {};  // b, h, i

  float scale = 1.0f;
  Causal causal = Causal::none;
  float dropout_p = 0.0f;
  uint32_t dropout_threshold = 0;  // a draw below it drops the element (common/philox.hpp)
  float dropout_scale = 1.0f;      // kept values' factor: 1 / (1 - p) rounded to the inputs' dtype
  uint64_t dropout_seed = 0, dropout_offset = 0;
  Accumulation accumulation = Accumulation::f32;
  // Precision::fp8: the quantization (n_early resolved: a multiple of 64).
  bool fp8 = false;
  QuantizationOptions quantization;

  // Sliding window, -1 unbounded (Options::window_left / window_right), and
  // the logit softcap (0: none).
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  // Attention sinks: f32, one per query head (null: none).
  const float* sinks = nullptr;
  int64_t sinks_stride = 0;
  // k and v in e4m3 (the serving engines' FP8 KV cache), and their descales,
  // f32 [B, Hkv] (null: 1; a zero stride broadcasts).
  bool kv_e4m3 = false;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t k_descale_stride[2] = {}, v_descale_stride[2] = {};
  // Where each sequence lies (serving calls; a dense call: batch b's rows).
  // In a serving call batch is B, the sequences, and seq_q / seq_kv are the
  // bounds max_seqlen_q / max_seqlen_k: a sequence's own lengths come from
  // sequence_at(sequences, b).
  SequenceLayout sequences;

  FFPA_HOST_DEVICE int64_t group_size() const { return heads_q / heads_kv; }  // query heads per kv head
  FFPA_HOST_DEVICE int64_t dv() const { return value_dim > 0 ? value_dim : head_dim; }
  FFPA_HOST_DEVICE bool has_dropout() const { return dropout_p > 0.0f; }
  // Last key row i may attend, before clipping to [0, Nkv): i + causal_shift().
  FFPA_HOST_DEVICE int64_t causal_shift() const { return causal == Causal::bottom_right ? seq_kv - seq_q : 0; }
  FFPA_HOST_DEVICE bool has_window() const { return window_left >= 0 || window_right >= 0; }
  FFPA_HOST_DEVICE DType kv_dtype() const { return kv_e4m3 ? DType::e4m3 : dtype; }  // k's and v's elements
};

// The keys query row i of a sequence of seq_q queries and seq_kv keys
// attends before the user's mask: [first, end), empty when first >= end. The
// causal limit in the problem's alignment, then the window around the row's
// bottom-right position i + seq_kv - seq_q.
struct KeyRange {
  int64_t first = 0, end = 0;
};

FFPA_HOST_DEVICE KeyRange attended_keys(const AttentionProblem& p, int64_t i, int64_t seq_q, int64_t seq_kv) {
  int64_t first = 0, end = seq_kv;
  if (p.causal != Causal::none) {
    const int64_t limit = i + (p.causal == Causal::bottom_right ? seq_kv - seq_q : 0) + 1;
    end = limit < end ? limit : end;
  }
  const int64_t position = i + seq_kv - seq_q;
  if (p.window_right >= 0 && position + p.window_right + 1 < end) end = position + p.window_right + 1;
  if (p.window_left >= 0 && position - p.window_left > first) first = position - p.window_left;
  if (end < first) end = first;
  if (first > seq_kv) first = end = seq_kv;
  return {first, end};
}

}  // namespace ffpa::detail
