// The validated, normalized description of one forward call. Host validation
// produces it; the CPU reference and the GPU launchers consume it. Layouts are
// normalized to logical [B, H, N, D] with element strides (the last dimension
// is contiguous), so [B, N, H, D] buffers run through the same code unchanged.
#pragma once

#include <climits>
#include <cstdint>

#include "common/host_device.hpp"
#include "common/quantization_options.hpp"
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

  FFPA_HOST_DEVICE int64_t group_size() const { return heads_q / heads_kv; }  // query heads per kv head
  FFPA_HOST_DEVICE int64_t dv() const { return value_dim > 0 ? value_dim : head_dim; }
  FFPA_HOST_DEVICE bool has_dropout() const { return dropout_p > 0.0f; }
  // Last key row i may attend, before clipping to [0, Nkv): i + causal_shift().
  FFPA_HOST_DEVICE int64_t causal_shift() const { return causal == Causal::bottom_right ? seq_kv - seq_q : 0; }
  // The keys in row i's reach before the mask: [0, keys_in_reach(i)).
  FFPA_HOST_DEVICE int64_t keys_in_reach(int64_t i) const {
    if (causal == Causal::none) return seq_kv;
    const int64_t end = i + causal_shift() + 1;
    return end < 0 ? 0 : end < seq_kv ? end : seq_kv;
  }
};

}  // namespace ffpa::detail
