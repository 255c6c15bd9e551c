/* ffpa: exact attention for large head dimensions, C ABI for FFI.
 *
 * A plain-struct mirror of <ffpa/ffpa.hpp>: same semantics, same status codes.
 * A zero-initialised ffpa_forward_params means: no mask, no lse, default scale,
 * no causal mask, no dropout, fp32 accumulation, automatic implementation,
 * the inputs' precision (FP8's knobs at their defaults), no window, no
 * softcap, no sinks, a dense call (no sequence batch), default stream, no
 * workspace. Functions never throw and never abort; a
 * failing call returns its status and writes a NUL-terminated message into
 * `message` (truncated to `message_size` bytes) when `message` is not NULL. */
#ifndef FFPA_FFPA_H
#define FFPA_FFPA_H

#include <stddef.h>
#include <stdint.h>

/* The shared library hides its other symbols: these are its C ABI. */
#include "ffpa/export.h"
/* FFPA_VERSION_MAJOR, _MINOR, _PATCH, _STRING and FFPA_VERSION (generated). */
#include "ffpa/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ffpa_dtype {
  FFPA_DTYPE_F16 = 0,
  FFPA_DTYPE_BF16 = 1,
  FFPA_DTYPE_F32 = 2,
  FFPA_DTYPE_BOOL = 3,
  FFPA_DTYPE_F64 = 4, /* f32 and f64 q, k, v: the CPU reference only (host tensors) */
  FFPA_DTYPE_U8 = 5,  /* 8-bit codes (e4m3 or int8 as the FP8 options say): an ffpa_fp8_kv_cache's codes only */
  FFPA_DTYPE_E4M3 = 6, /* k and v of an FP8 KV cache in the serving engines' format (k_descale, v_descale) */
  FFPA_DTYPE_I32 = 7   /* an ffpa_sequence_batch's lengths and block table */
} ffpa_dtype;

typedef enum ffpa_causal {
  FFPA_CAUSAL_NONE = 0,
  FFPA_CAUSAL_TOP_LEFT = 1,
  FFPA_CAUSAL_BOTTOM_RIGHT = 2
} ffpa_causal;

typedef enum ffpa_accumulation { FFPA_ACCUM_F32 = 0, FFPA_ACCUM_F16 = 1 } ffpa_accumulation;

typedef enum ffpa_impl {
  FFPA_IMPL_AUTO = 0,
  FFPA_IMPL_CPU_REFERENCE = 1,
  FFPA_IMPL_SM80_SPLIT_D = 2,
  FFPA_IMPL_SM90_WGMMA = 3
} ffpa_impl;

/* What the tensor cores multiply: the inputs' own fp16/bf16, or FP8 (the
 * library quantizes Q, K and V into the workspace and runs Q K^T and P V on
 * Hopper's 8-bit tensor cores; the output keeps the inputs' dtype). FP8 runs
 * on the sm90 family only (FFPA_IMPL_AUTO or FFPA_IMPL_SM90_WGMMA). */
typedef enum ffpa_precision { FFPA_PRECISION_INPUT = 0, FFPA_PRECISION_FP8 = 1 } ffpa_precision;

typedef enum ffpa_fp8_qk_format {
  FFPA_FP8_QK_INT8 = 0, /* Q, K as int8 codes (exact s32 sums) */
  FFPA_FP8_QK_E4M3 = 1  /* Q, K as e4m3 codes */
} ffpa_fp8_qk_format;

typedef enum ffpa_fp8_qk_scales {
  FFPA_FP8_QK_SCALES_PER_THREAD_GROUP = 0, /* the rows and keys one thread's scores cover */
  FFPA_FP8_QK_SCALES_PER_BLOCK = 1         /* 64 query rows, 128 keys */
} ffpa_fp8_qk_scales;

typedef enum ffpa_fp8_v_scales {
  FFPA_FP8_V_SCALES_PER_CHANNEL = 0, /* one scale per channel over all keys (applied in the epilogue) */
  FFPA_FP8_V_SCALES_PER_BLOCK = 1    /* one scale per 128 keys (applied as each block is added) */
} ffpa_fp8_v_scales;

/* Under C++ the status has a fixed 32-bit underlying type, so that any
 * integer a C caller passes (ffpa_status_name(100), (ffpa_status)-1) is a
 * valid value there; C sees a plain enum of the same size. */
#ifdef __cplusplus
#define FFPA_STATUS_UNDERLYING : int32_t
#else
#define FFPA_STATUS_UNDERLYING
#endif

typedef enum ffpa_status FFPA_STATUS_UNDERLYING {
  FFPA_OK = 0,
  FFPA_NULL_POINTER = 1,
  FFPA_INVALID_RANK = 2,
  FFPA_UNSUPPORTED_DTYPE = 3,
  FFPA_DTYPE_MISMATCH = 4,
  FFPA_SHAPE_MISMATCH = 5,
  FFPA_VALUE_HEAD_DIM_MISMATCH = 6, /* no longer returned: Dv != D is valid */
  FFPA_UNSUPPORTED_HEAD_DIM = 7,
  FFPA_INVALID_GQA_RATIO = 8,
  FFPA_NONCONTIGUOUS_LAST_DIM = 9,
  FFPA_MISALIGNED = 10,
  FFPA_INVALID_STRIDE = 11,
  FFPA_INVALID_MASK_LAYOUT = 12,
  FFPA_INVALID_DROPOUT = 13,
  FFPA_UNSUPPORTED_ACCUMULATION = 14,
  FFPA_IMPL_UNAVAILABLE = 15, /* also: a device this build cannot run kernels on (no kernel
                               * image, a driver too old, a launch without resources) */
  FFPA_OUTPUT_OVERLAPS_INPUT = 16,
  FFPA_INVALID_OPTION = 17,
  FFPA_WORKSPACE_TOO_SMALL = 18,
  FFPA_WRONG_MEMORY_SPACE = 19,
  FFPA_CUDA_ERROR = 20,
  FFPA_OUT_OF_MEMORY = 21,
  FFPA_INVALID_SEQUENCE_LENGTHS = 22, /* an ffpa_sequence_batch's lengths do not hold */
  FFPA_INVALID_BLOCK_TABLE = 23,      /* a block id a sequence reads outside [0, num_blocks) */
  FFPA_INVALID_WINDOW = 24            /* a window bound below -1 */
} ffpa_status;

typedef struct ffpa_tensor {
  void* data;
  int32_t dtype; /* ffpa_dtype */
  int32_t rank;
  int64_t shape[4];
  int64_t stride[4]; /* in elements */
} ffpa_tensor;

/* FFPA_PRECISION_FP8's knobs (ignored otherwise); zero means each one's
 * default, the most accurate setting measured (docs/kernels/fp8_model.md). */
typedef struct ffpa_fp8_options {
  int32_t qk_format;      /* ffpa_fp8_qk_format: 0 int8, 1 e4m3 */
  int32_t qk_scales;      /* ffpa_fp8_qk_scales: 0 per_thread_group, 1 per_block */
  int32_t no_smooth_k;    /* nonzero: do not subtract K's per-channel mean over tokens first */
  int32_t has_early_rows; /* 0: early_rows = 256 with a causal mask, else 0 */
  int64_t early_rows;     /* query rows [0, early_rows) in the inputs' precision; a multiple of 64 */
  int32_t v_scales;       /* ffpa_fp8_v_scales */
  int32_t smooth_v;       /* nonzero: subtract V's per-channel mean first (not with dropout) */
} ffpa_fp8_options;

typedef struct ffpa_options {
  int32_t has_scale; /* 0: scale = 1/sqrt(D) */
  float scale;
  int32_t causal; /* ffpa_causal */
  float dropout_p;
  uint64_t dropout_seed;   /* the keep-mask is SDPA's stream of (seed, offset): docs/spec.md */
  uint64_t dropout_offset; /* in 32-bit words; a call uses ceil4(B * Hq * Nq * Nkv) of them */
  int32_t accumulation; /* ffpa_accumulation */
  int32_t impl;         /* ffpa_impl */
  int32_t precision;    /* ffpa_precision */
  ffpa_fp8_options fp8; /* FFPA_PRECISION_FP8 only */
  /* has_window nonzero: a sliding window, row i (key position p_i = i + Nkv -
   * Nq) attends keys in [p_i - window_left, p_i + window_right], -1 leaving a
   * side unbounded; 0: no window (both -1). */
  int32_t has_window;
  int64_t window_left, window_right;
  float softcap; /* > 0: scores become softcap * tanh(score / softcap); 0 = none */
} ffpa_options;

/* A batch of sequences of different lengths (ffpa::SequenceBatch, docs/serving.md):
 * int32 tensors in q's memory space; a tensor with data NULL is absent.
 *   cu_seqlens_q [B + 1]: q packed [1, Hq, total_q, D] (else q [B, Hq, Nq, D])
 *   cu_seqlens_k [B + 1]: k, v packed [1, Hkv, total_k, D]
 *   block_table [B, max_blocks]: k, v paged [num_blocks, Hkv, page_size, D]
 *   seqused_k [B]: the keys each sequence uses
 * max_seqlen_q / max_seqlen_k: bounds on the lengths; 0 derives them. */
typedef struct ffpa_sequence_batch {
  ffpa_tensor cu_seqlens_q, cu_seqlens_k, block_table, seqused_k;
  int64_t max_seqlen_q, max_seqlen_k;
} ffpa_sequence_batch;

/* An FP8 KV cache (ffpa::Fp8KvCache, docs/spec.md "FP8 KV cache"): K and V
 * already quantized in the library's FP8 format, dense tensors in device
 * memory (codes 16-byte, means 16-byte, scales 8-byte aligned):
 *   k_codes  u8  [B, Hkv, Nkv, round_up(D, 16)]   v_codes  u8  [B, Hkv, D, round_up(Nkv, 16)] (V^T)
 *   k_scales f32 [B, Hkv, k_count]                v_scales f32 [B, Hkv, v_count]
 *   k_mean   f32 [B, Hkv, D] (data NULL: absent, only without smooth-K)
 *   v_mean   f32 [B, Hkv, D] (data NULL: absent, only without smooth-V)
 * ffpa_fp8_kv_cache_layout fills the shapes; ffpa_fp8_quantize_kv writes one.
 * A forward call must use the FP8 knobs the cache was quantized with. */
typedef struct ffpa_fp8_kv_cache {
  ffpa_tensor k_codes, k_scales, k_mean;
  ffpa_tensor v_codes, v_scales, v_mean;
} ffpa_fp8_kv_cache;

typedef struct ffpa_forward_params {
  ffpa_tensor q, k, v, o;
  ffpa_tensor mask; /* data == NULL: no mask */
  ffpa_tensor lse;  /* data == NULL: not requested */
  ffpa_options options;
  void* stream; /* cudaStream_t */
  void* workspace;
  size_t workspace_bytes;
  /* NULL: none. With FFPA_PRECISION_FP8 only: K and V from this cache (k and v
   * still give the shapes; their data may be NULL without hybrid rows). */
  const ffpa_fp8_kv_cache* fp8_kv_cache;
  ffpa_tensor sinks;                  /* f32 [Hq]: per-head sink logits; data NULL: none */
  ffpa_tensor k_descale, v_descale;   /* f32 [B, Hkv] with e4m3 k, v; data NULL: 1 */
  const ffpa_sequence_batch* sequences; /* NULL: a dense call */
  const void* sequence_plan;            /* NULL: the call plans its sequences itself */
} ffpa_forward_params;

FFPA_API ffpa_status ffpa_forward(const ffpa_forward_params* params, char* message, size_t message_size);

FFPA_API ffpa_status ffpa_workspace_size(const ffpa_forward_params* params, size_t* bytes,
                                         char* message, size_t message_size);

/* A serving call's plan (ffpa::sequence_plan_size, plan_sequences,
 * check_sequences; docs/serving.md). */
FFPA_API ffpa_status ffpa_sequence_plan_size(const ffpa_forward_params* params, size_t* bytes, char* message,
                                             size_t message_size);
FFPA_API ffpa_status ffpa_plan_sequences(const ffpa_forward_params* params, void* plan, size_t plan_bytes,
                                         char* message, size_t message_size);
FFPA_API ffpa_status ffpa_check_sequences(const ffpa_forward_params* params, char* message, size_t message_size);

/* The dense shapes of the FP8 KV cache of K [B, Hkv, Nkv, D] under the FP8
 * knobs `fp8` (NULL: every default; early_rows is not read), data NULL. */
FFPA_API ffpa_status ffpa_fp8_kv_cache_layout(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t head_dim,
                                              const ffpa_fp8_options* fp8, ffpa_fp8_kv_cache* layout,
                                              char* message, size_t message_size);

/* Quantizes k and v into an FP8 KV cache exactly as the FP8 forward's
 * pre-pass would (ffpa::fp8_quantize_kv): device tensors asynchronously on
 * `stream`, host tensors on the CPU model. */
typedef struct ffpa_fp8_quantize_kv_params {
  ffpa_tensor k, v;        /* [B, Hkv, Nkv, D], f16 or bf16 */
  ffpa_fp8_kv_cache cache; /* written */
  ffpa_fp8_options fp8;    /* zero: every default; early_rows is not read */
  void* stream;            /* cudaStream_t */
  void* workspace;         /* NULL: stream-ordered memory */
  size_t workspace_bytes;
} ffpa_fp8_quantize_kv_params;

FFPA_API ffpa_status ffpa_fp8_quantize_kv(const ffpa_fp8_quantize_kv_params* params, char* message,
                                          size_t message_size);

FFPA_API ffpa_status ffpa_fp8_quantize_kv_workspace_size(const ffpa_fp8_quantize_kv_params* params, size_t* bytes,
                                                         char* message, size_t message_size);

/* The gradients of a forward call (ffpa::BackwardParams): d_q, d_k, d_v (and
 * d_mask for an additive mask) of sum(o * d_o) + sum(lse * d_lse), from the
 * forward's q, k, v, mask, options, o and lse (required). Host tensors run on
 * the CPU reference; device tensors on the Hopper backward kernels (sm_90a, D
 * and Dv up to the widest of ffpa_library_info's sm90_backward_head_dims) or
 * the portable ones (impl sm80_split_d, other GPUs). */
typedef struct ffpa_backward_params {
  ffpa_tensor q, k, v, o;
  ffpa_tensor lse;  /* the forward's, [B, Hq, Nq] f32 */
  ffpa_tensor mask; /* data == NULL: no mask */
  ffpa_tensor d_o;
  ffpa_tensor d_q, d_k, d_v;
  ffpa_tensor d_mask; /* data == NULL: not requested (additive masks only) */
  ffpa_tensor d_lse;  /* the gradient of lse, [B, Hq, Nq] f32; data == NULL: zero */
  ffpa_options options;
  void* stream; /* cudaStream_t */
  void* workspace;
  size_t workspace_bytes;
  /* The forward's sequence batch (NULL: a dense call): packed or batched keys,
   * no block table; the gradients take q's, k's and v's packed layouts, rows
   * no sequence uses are not written. */
  const ffpa_sequence_batch* sequences;
  ffpa_tensor sinks;   /* the forward's f32 [Hq] sink logits; data NULL: none */
  ffpa_tensor d_sinks; /* f32 [Hq], their gradient; data NULL: not requested */
} ffpa_backward_params;

FFPA_API ffpa_status ffpa_backward(const ffpa_backward_params* params, char* message, size_t message_size);

FFPA_API ffpa_status ffpa_backward_workspace_size(const ffpa_backward_params* params, size_t* bytes,
                                                  char* message, size_t message_size);

/* Whether impl (FFPA_IMPL_AUTO, FFPA_IMPL_SM80_SPLIT_D or FFPA_IMPL_SM90_WGMMA)
 * runs this build's kernels on CUDA device `device` (an ordinal):
 * FFPA_OK, or FFPA_IMPL_UNAVAILABLE with the reason (no driver or no device, a
 * driver older than the library's CUDA runtime, a GPU this build has no kernel
 * image for and no PTX it can compile). For FFPA_IMPL_AUTO: whether any GPU
 * kernel of this build runs there. A call can still be declined for its own
 * reasons. FFPA_INVALID_OPTION for another impl or an ordinal out of range.
 * Fixed for the process: ask once per device. Makes `device` current for the
 * query (creating its primary context) and restores the current device. */
FFPA_API ffpa_status ffpa_device_support(int32_t device, int32_t impl, char* message,
                                         size_t message_size);

/* Which implementation ffpa_backward runs for a call on device tensors of
 * `dtype` (ffpa_dtype) with head dims D = head_dim (q, k) and Dv = value_dim
 * (v, o) on CUDA device `device` under `requested_impl` (FFPA_IMPL_AUTO,
 * FFPA_IMPL_SM80_SPLIT_D or FFPA_IMPL_SM90_WGMMA): *impl =
 * FFPA_IMPL_SM90_WGMMA (the Hopper backward kernels) or FFPA_IMPL_SM80_SPLIT_D
 * (the portable ones), ffpa_backward's own plan for a representative call (one
 * query row and one key, dense, 16-byte aligned): the backward's analogue of
 * ffpa_device_support. Beyond dtype, D, Dv and the device the plan reads only
 * a call's alignment (TMA: 16-byte bases and strides, else the portable
 * kernels) and sizes past the kernels' limits (then declined); never its mask,
 * causal alignment, dropout, scale or GQA ratio: fixed for the process per
 * arguments, ask once. FFPA_INVALID_OPTION for another impl or an ordinal out
 * of range; FFPA_UNSUPPORTED_HEAD_DIM / FFPA_UNSUPPORTED_DTYPE for what
 * ffpa_backward does not take on device tensors; FFPA_IMPL_UNAVAILABLE with
 * the reason where no requested kernel runs (no driver or device,
 * FFPA_IMPL_SM90_WGMMA not serving the call); FFPA_NULL_POINTER for a NULL
 * impl. *impl is written on FFPA_OK only. Makes `device` current for the
 * query and restores the current device. */
FFPA_API ffpa_status ffpa_backward_route(int32_t device, int32_t dtype, int64_t head_dim, int64_t value_dim,
                                         int32_t requested_impl, int32_t* impl, char* message,
                                         size_t message_size);

/* The status's name ("ok", "null_pointer", ...); "unknown_status" for any
 * other integer. */
FFPA_API const char* ffpa_status_name(ffpa_status status);

FFPA_API const char* ffpa_version(void);

/* Capacities of ffpa_library_info's lists. A build lists at most 16 head dims
 * per family (FFPA_HEAD_DIMS and FFPA_SM90_HEAD_DIMS take multiples of 64 up
 * to 1024). */
#define FFPA_LIBRARY_INFO_MAX_ARCHITECTURES 8
#define FFPA_LIBRARY_INFO_MAX_HEAD_DIMS 16

/* What this build of the library serves, so that bindings ask instead of
 * restating it. The caller sets struct_size = sizeof(ffpa_library_info), so
 * that the struct can grow at its end: a struct_size below this version's size
 * is rejected, and bytes past it (a newer header's fields) are left as they are. */
typedef struct ffpa_library_info {
  size_t struct_size;  /* set by the caller */
  const char* version; /* ffpa_version(); static, never freed */
  int32_t version_major, version_minor, version_patch;
  /* The head dims validation accepts: multiples of head_dim_multiple in
   * [min_head_dim, max_head_dim]. */
  int32_t min_head_dim, max_head_dim, head_dim_multiple;
  int64_t max_sequence_length; /* longest Nq or Nkv the GPU implementations serve */
  /* Compiled CUDA architectures as 10 * major + minor (90 for sm_90a), ascending. */
  int32_t cuda_architecture_count;
  int32_t cuda_architectures[FFPA_LIBRARY_INFO_MAX_ARCHITECTURES];
  /* Head dims with their own kernel instance, ascending; other head dims are
   * served by a larger instance (padding) or, for split-D above the largest, by
   * splitting Dv across CTAs. A count of 0: the family is not in this build. */
  int32_t split_d_head_dim_count; /* FFPA_IMPL_SM80_SPLIT_D */
  int32_t split_d_head_dims[FFPA_LIBRARY_INFO_MAX_HEAD_DIMS];
  int32_t sm90_wgmma_head_dim_count; /* FFPA_IMPL_SM90_WGMMA */
  int32_t sm90_wgmma_head_dims[FFPA_LIBRARY_INFO_MAX_HEAD_DIMS];
  /* FFPA_PRECISION_FP8's instances (the sm90 family's 8-bit kernels): each
   * serves every D up to it; a count of 0: no FP8 in this build. */
  int32_t sm90_fp8_head_dim_count;
  int32_t sm90_fp8_head_dims[FFPA_LIBRARY_INFO_MAX_HEAD_DIMS];
  /* The sm90 backward kernels' instances (ffpa_backward's device path on
   * sm_90a): each serves every D and Dv up to it; a count of 0: no sm90
   * backward in this build. */
  int32_t sm90_backward_head_dim_count;
  int32_t sm90_backward_head_dims[FFPA_LIBRARY_INFO_MAX_HEAD_DIMS];
} ffpa_library_info;

/* Fills *info. FFPA_NULL_POINTER when info is NULL, FFPA_INVALID_OPTION when
 * info->struct_size is smaller than this version of the struct. */
FFPA_API ffpa_status ffpa_library_info_get(ffpa_library_info* info, char* message,
                                           size_t message_size);

#ifdef __cplusplus
}
#endif

#endif /* FFPA_FFPA_H */
