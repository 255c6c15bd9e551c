// ffpa: exact attention for large head dimensions (D up to 1024), C++ API.
//
// One parameters struct, one entry point, a status with a message. Tensors are
// described by (pointer, dtype, rank, shape, strides); strides count elements,
// the last dimension must be contiguous. Logical shapes:
//   q [B, Hq, Nq, D]  k [B, Hkv, Nkv, D]  v [B, Hkv, Nkv, Dv]  o [B, Hq, Nq, Dv]
//   mask (optional)  broadcastable to [B, Hq, Nq, Nkv] (size-1 dims broadcast)
//   lse  (optional)  [B, Hq, Nq], fp32, natural log of the softmax denominator
// Both the [B, H, N, D] layout and a [B, N, H, D] buffer viewed through
// permuted strides are served without copies.
//
// No global state: everything that decides what runs travels in the call.
// The C ABI mirror of this header is <ffpa/ffpa.h>.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "ffpa/export.h"
#include "ffpa/version.h"  // FFPA_VERSION_MAJOR, _MINOR, _PATCH, _STRING, FFPA_VERSION

namespace ffpa {

// q, k, v, o: f16 or bf16 everywhere; f32 or f64 on the CPU reference only
// (host tensors; e.g. gradient checks in double). Masks: boolean, f16, bf16,
// f32 (and f64 on the CPU reference). u8: 8-bit codes, e4m3 or int8 as the
// FP8 options say, the codes of an Fp8KvCache only (q, k, v, o, mask and lse
// refuse it: unsupported_dtype). e4m3: k and v of an FP8 KV cache in the
// serving engines' format (ForwardParams::k_descale). i32: a SequenceBatch's
// lengths and block table.
enum class DType : int32_t { f16 = 0, bf16 = 1, f32 = 2, boolean = 3, f64 = 4, u8 = 5, e4m3 = 6, i32 = 7 };

enum class Causal : int32_t {
  none = 0,
  top_left = 1,      // row i attends keys j <= i (PyTorch SDPA is_causal=True)
  bottom_right = 2,  // row i attends keys j <= i + Nkv - Nq (FlashAttention)
};

enum class Accumulation : int32_t {
  f32 = 0,  // default
  f16 = 1,  // P*V accumulated in fp16; fp16 inputs only
};

enum class Impl : int32_t {
  automatic = 0,      // fastest correct path for the pointers, device and shape
  cpu_reference = 1,  // host pointers; exact (double accumulation), slow
  sm80_split_d = 2,   // portable split-D mma.sync kernels, sm80 and newer
  sm90_wgmma = 3,     // Hopper TMA + wgmma kernels (sm_90a), D <= 1024
};

// Every bad input has its own code; none of them writes to any output.
enum class StatusCode : int32_t {
  ok = 0,
  null_pointer = 1,
  invalid_rank = 2,
  unsupported_dtype = 3,
  dtype_mismatch = 4,
  shape_mismatch = 5,
  value_head_dim_mismatch = 6,  // no longer returned: Dv != D is valid (a family without kernels for it declines)
  unsupported_head_dim = 7,     // D outside [8, 1024] or not a multiple of 8
  invalid_gqa_ratio = 8,        // Hq % Hkv != 0
  noncontiguous_last_dim = 9,
  misaligned = 10,              // pointer or stride not 16-byte aligned
  invalid_stride = 11,          // negative stride, or an output that aliases itself
  invalid_mask_layout = 12,     // negative or non-broadcastable mask strides/shape
  invalid_dropout = 13,         // p outside [0, 1)
  unsupported_accumulation = 14,  // bf16 with fp16 accumulation
  impl_unavailable = 15,        // the device, its driver or this build lacks the implementation
                                // (also a kernel launch the device cannot run: no image, no resources)
  output_overlaps_input = 16,
  invalid_option = 17,          // unknown enum value, non-finite scale, negative size
  workspace_too_small = 18,
  wrong_memory_space = 19,      // host/device pointers do not fit the implementation
  cuda_error = 20,
  out_of_memory = 21,           // host memory for the CPU reference could not be allocated
  // A SequenceBatch whose lengths do not hold: cu_seqlens decreasing or past
  // its tensor, a sequence longer than max_seqlen, seqused_k beyond the keys
  // the sequence has (its cu_seqlens_k length, Nkv or its block table row).
  invalid_sequence_lengths = 22,
  invalid_block_table = 23,     // a block id a sequence reads outside [0, num_blocks)
  invalid_window = 24,          // a window bound below -1 (it would exclude every key)
};

struct Status {
  StatusCode code = StatusCode::ok;
  std::string message;
  bool ok() const { return code == StatusCode::ok; }
};

// Name of a status code, e.g. "misaligned".
FFPA_API const char* status_name(StatusCode code);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::bf16;
  int32_t rank = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t stride[4] = {0, 0, 0, 0};  // in elements
};

// A contiguous row-major tensor of the given shape (rank = shape.size()).
FFPA_API Tensor make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape);

// What the tensor cores multiply (docs/spec.md, "Precision"): the inputs'
// own fp16/bf16, or FP8: the library quantizes Q, K and V (a pre-pass into
// the workspace) and runs Q K^T and P V on Hopper's 8-bit tensor cores,
// output still in the inputs' dtype. FP8 runs on the sm90 family only.
enum class Precision : int32_t {
  input = 0,  // default
  fp8 = 1,
};

// The FP8 knobs; the defaults are the most accurate setting measured
// (docs/kernels/fp8_model.md).
enum class Fp8QkFormat : int32_t {
  int8 = 0,  // Q, K as int8 codes (exact s32 sums on the tensor cores)
  e4m3 = 1,  // Q, K as e4m3 codes
};
enum class Fp8QkScales : int32_t {
  per_thread_group = 0,  // the rows and keys one thread's scores cover (SageAttention2's)
  per_block = 1,         // 64 query rows, 128 keys
};
enum class Fp8VScales : int32_t {
  per_channel = 0,  // one scale per channel over all keys (applied in the epilogue)
  per_block = 1,    // one scale per 128 keys (applied as each block is added)
};
struct Fp8Options {
  Fp8QkFormat qk_format = Fp8QkFormat::int8;
  Fp8QkScales qk_scales = Fp8QkScales::per_thread_group;
  bool smooth_k = true;  // subtract K's per-channel mean over tokens first (softmax-invariant)
  Fp8VScales v_scales = Fp8VScales::per_channel;
  // Subtract V's per-channel mean over tokens before quantizing, add it back
  // to every row that attends a key (the weights sum to 1): not with dropout.
  bool smooth_v = false;
  // Hybrid rows: query rows [0, early_rows) computed in the inputs' precision
  // (a multiple of 64). Default: 256 with a causal mask (the first rows
  // attend few keys, where 8-bit P costs the most accuracy), else 0.
  std::optional<int64_t> early_rows;
};

struct Options {
  std::optional<float> scale;  // default 1/sqrt(D)
  Causal causal = Causal::none;
  float dropout_p = 0.0f;      // in [0, 1); keep-mask: SDPA's stream of (seed, offset) (docs/spec.md)
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  Accumulation accumulation = Accumulation::f32;
  Impl impl = Impl::automatic;
  Precision precision = Precision::input;
  Fp8Options fp8;  // Precision::fp8 only
  // Sliding window (FlashAttention's window_size): query row i, at key
  // position p_i = i + Nkv - Nq (bottom-right, per sequence), attends keys j
  // with p_i - window_left <= j <= p_i + window_right, intersected with the
  // causal limit; -1 leaves that side unbounded.
  int64_t window_left = -1, window_right = -1;
  // Logit softcap c > 0: a score s (after scaling) becomes c * tanh(s / c)
  // before the mask is added; 0 = none.
  float softcap = 0.0f;
};

// A batch of B sequences of different lengths in one call, the form serving
// engines and packed training use (docs/serving.md). Each tensor is int32 in
// the memory space of q (device for the GPU implementations). Sequence b's
// queries are its last Nq_b tokens: causal alignments and the window apply
// per sequence (bottom-right: FlashAttention's convention). A sequence with
// Nq_b = 0 is skipped; one with Nkv_b = 0 gives rows with no attended key.
//
// Queries: with cu_seqlens_q ([B + 1]) q is packed, [1, Hq, total_q, D] (a
// [total_q, Hq, D] buffer viewed through strides), o [1, Hq, total_q, Dv] and
// lse [1, Hq, total_q], and sequence b owns rows [cu_seqlens_q[b],
// cu_seqlens_q[b + 1]). Without it q is [B, Hq, Nq, D], every sequence Nq rows.
//
// Keys, one of three forms:
//   - packed: cu_seqlens_k ([B + 1]), k [1, Hkv, total_k, D], v [1, Hkv,
//     total_k, Dv]; sequence b owns rows [cu_seqlens_k[b], cu_seqlens_k[b + 1]);
//   - paged: block_table ([B, max_blocks]), k [num_blocks, Hkv, page_size, D]
//     and v [num_blocks, Hkv, page_size, Dv] with any strides on the first
//     three dims (a [num_blocks, page_size, Hkv, D] cache, or one half of a
//     [2, num_blocks, ...] one, viewed through strides; v may lie inside k's
//     rows, as MLA's latent cache); key j of sequence b is row j % page_size
//     of page block_table[b][j / page_size];
//   - batched: k [B, Hkv, Nkv, D], v [B, Hkv, Nkv, Dv] (a KV cache per sequence).
// seqused_k ([B], optional): the keys sequence b uses, at most what it has
// (its cu_seqlens_k length, its block table row's pages or Nkv); without it
// a sequence uses all of them. With a block table, cu_seqlens_k (when given)
// only supplies the lengths.
// max_seqlen_q / max_seqlen_k: bounds on every Nq_b / Nkv_b (the launch is
// sized by them); 0 derives the loosest (total_q or Nq; total_k, the table's
// width in keys, or Nkv). A longer sequence is invalid_sequence_lengths.
struct SequenceBatch {
  Tensor cu_seqlens_q;
  Tensor cu_seqlens_k;
  Tensor block_table;
  Tensor seqused_k;
  int64_t max_seqlen_q = 0;
  int64_t max_seqlen_k = 0;
};

// An FP8 KV cache (docs/spec.md, "FP8 KV cache"): K and V already quantized,
// in the library's own FP8 format, the K/V half of what the FP8 pre-pass
// writes (docs/kernels/fp8_model.md), so that a forward call skips their
// quantization. Every tensor is dense (contiguous, the shape below) in device
// memory: codes 16-byte aligned (TMA), means 16-byte and scales 8-byte
// aligned (the kernels' vector loads). With D the head dim, Nkv the keys:
//   k_codes  u8  [B, Hkv, Nkv, round_up(D, 16)]  K - k_mean, rows padded with zeros
//   k_scales f32 [B, Hkv, k_count]  k_count = ceil(Nkv / 128) x (4 per thread group, 1 per block)
//   k_mean   f32 [B, Hkv, D]        smooth-K's per-channel mean (zeros without it)
//   v_codes  u8  [B, Hkv, D, round_up(Nkv, 16)]  V - v_mean transposed (V^T), rows padded with zeros
//   v_scales f32 [B, Hkv, v_count]  v_count = D per channel, ceil(Nkv / 128) per block
//   v_mean   f32 [B, Hkv, D]        smooth-V's per-channel mean (zeros without it)
// k_mean (v_mean) may be absent (data null) when smooth_k (smooth_v) is off.
// fp8_kv_cache_layout() fills these shapes; fp8_quantize_kv() writes a cache.
// The cache does not record the knobs it was quantized with: a forward call
// must use the same Options::fp8 (qk_format, qk_scales, smooth_k, v_scales,
// smooth_v).
struct Fp8KvCache {
  Tensor k_codes, k_scales, k_mean;
  Tensor v_codes, v_scales, v_mean;
};

struct ForwardParams {
  Tensor q, k, v;
  Tensor o;
  Tensor mask;  // optional: data == nullptr means no mask
  Tensor lse;   // optional: data == nullptr means not requested
  Options options;
  cudaStream_t stream = nullptr;
  // Temporary memory. When null, the call allocates stream-ordered memory if
  // it needs any; workspace_size() says how much a call can use.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Optional, with Precision::fp8 only: K and V already quantized. k and v
  // still give the shapes (and dtype); their data may be null when no query
  // row is a hybrid row (options.fp8.early_rows resolves to 0), since then
  // only Q is quantized (the workspace holds Q's codes alone) and the kernel
  // reads K and V from the cache. Results are bit-identical to the same call
  // without the cache when the cache is fp8_quantize_kv(k, v) with the same knobs.
  const Fp8KvCache* fp8_kv_cache = nullptr;
  // Optional: attention sinks, f32 [Hq]: one logit per query head that joins
  // every row's softmax denominator and contributes no value (gpt-oss); the
  // lse includes it.
  Tensor sinks;
  // With k and v in e4m3 (an FP8 KV cache in the serving engines' format):
  // K = k_descale * k and V = v_descale * v, f32 [B, Hkv] (any strides; 0
  // strides broadcast, e.g. one descale for the tensor). data null: 1.
  Tensor k_descale, v_descale;
  // Optional: a batch of sequences of different lengths (serving, packed
  // training); null: q, k, v are [B, H, N, D] with one length for all.
  const SequenceBatch* sequences = nullptr;
  // Optional, with `sequences`: the plan plan_sequences() wrote for them, so
  // that this call plans nothing (one plan serves every call with the same
  // sequences and kernel tiling: the layers of one kind in a serving step).
  // null: the call plans into its workspace (a kernel; no host synchronization).
  const void* sequence_plan = nullptr;
};

// Computes o (and lse) for the parameters. Validates everything first.
// GPU implementations are asynchronous on params.stream; cpu_reference
// runs on the calling thread (using a few worker threads) and returns when done.
FFPA_API Status forward(const ForwardParams& params);

// Bytes of workspace the call would use (0 when it needs none).
FFPA_API Status workspace_size(const ForwardParams& params, size_t* bytes);

// The shapes, dtypes and dense strides of the FP8 KV cache of K [B, Hkv,
// Nkv, D] (and V of the same shape) under `fp8`'s knobs (early_rows is not
// read), data null: the caller allocates each tensor (k_mean / v_mean only
// when it wants them) and sets its data. invalid_option for a negative size
// or an unknown knob value, unsupported_head_dim for D outside the valid
// head dims.
FFPA_API Status fp8_kv_cache_layout(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t head_dim,
                                    const Fp8Options& fp8, Fp8KvCache* layout);

// Quantizes k and v into an FP8 KV cache, exactly as the FP8 forward's
// pre-pass would (its K/V kernels on device tensors, asynchronously on
// `stream`; the CPU model on host tensors, on the calling thread): the cache
// then equals the pre-pass's K/V bytes, padding included.
struct Fp8QuantizeKvParams {
  Tensor k, v;       // [B, Hkv, Nkv, D], f16 or bf16, as forward() takes them (Dv == D)
  Fp8KvCache cache;  // written; k_mean / v_mean required with smooth_k / smooth_v
  Fp8Options fp8;    // the knobs the forward calls will use (early_rows is not read)
  cudaStream_t stream = nullptr;
  // Scratch (the means' partial sums over key blocks); when null, stream-
  // ordered memory. fp8_quantize_kv_workspace_size() says how much.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};
FFPA_API Status fp8_quantize_kv(const Fp8QuantizeKvParams& params);
FFPA_API Status fp8_quantize_kv_workspace_size(const Fp8QuantizeKvParams& params, size_t* bytes);

// The gradients of a forward call (docs/spec.md, "Backward"): dq, dk, dv of
// sum(o * d_o) for the forward's q, k, v, mask and options (the same scale,
// causal alignment and dropout (seed, offset), so the backward redraws the
// forward's keep mask; the same window and softcap), from its o and lse. Host
// pointers: the CPU reference; device pointers: the GPU backward kernels.
// A sequence batch (packed training, docs/serving.md) takes the forward's
// packed or batched layouts: q, o, d_o [1, Hq, total_q, D or Dv], lse and
// d_lse [1, Hq, total_q], k, v [1, Hkv, total_k, D or Dv] (or their batched
// forms), the gradients laid out like q, k and v; rows of d_q, d_k and d_v
// that no sequence uses (past cu_seqlens' last offset, keys past a
// sequence's seqused_k) are not written. A paged cache has no backward.
struct BackwardParams {
  Tensor q, k, v;  // the forward's inputs
  Tensor o;        // the forward's output
  Tensor lse;      // the forward's lse, [B, Hq, Nq] f32 (required)
  Tensor mask;     // the forward's mask (optional)
  Tensor d_o;      // the gradient of o: o's shape and dtype
  Tensor d_q, d_k, d_v;  // outputs: q's, k's, v's shapes and dtype
  // Optional output with an additive mask: its gradient, the mask's shape and
  // dtype, summed over the dims the mask broadcasts along.
  Tensor d_mask;
  // Optional: the gradient of lse ([B, Hq, Nq] f32, data null: zero), for a
  // loss that reads the lse too (d lse_i / d s_ij = softmax_ij).
  Tensor d_lse;
  Options options;  // the forward call's (precision: the inputs' own only)
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The forward call's sequence batch (null: a dense call); packed or
  // batched keys (a block table is refused: invalid_option).
  const SequenceBatch* sequences = nullptr;
  // The forward's attention sinks (f32 [Hq], data null: none) and, optional
  // with them, their gradient d_sinks (f32 [Hq], written whole: the sum over
  // every attending row of -exp(sink - lse_i) (d_o_i . o_i - d_lse_i)).
  Tensor sinks;
  Tensor d_sinks;
};

FFPA_API Status backward(const BackwardParams& params);

// Bytes of workspace the backward would use (0 when it needs none).
FFPA_API Status backward_workspace_size(const BackwardParams& params, size_t* bytes);

// The plan of a serving call (docs/serving.md, "Plan"): the device-side
// checks of its lengths and block ids and the schedule of its tiles, written
// into a caller's buffer. sequence_plan_size() says how many bytes (0 for
// the CPU reference, which needs none); plan_sequences() writes it (device
// tensors: a kernel on params.stream, asynchronous, so it runs inside a CUDA
// graph with whatever lengths the buffers hold at replay; host tensors: on
// the calling thread). Hand it to forward() as ForwardParams::sequence_plan.
// A call that runs in two passes (KernelChoice::short_rows) has a plan for
// each in the one buffer, and a replay of the graph replays both.
// A kernel given a plan made for another call's tiling (another head dim,
// family or GQA packing) writes nothing.
FFPA_API Status sequence_plan_size(const ForwardParams& params, size_t* bytes);
FFPA_API Status plan_sequences(const ForwardParams& params, void* plan, size_t plan_bytes);

// The verdict of a serving call's data checks, as forward() on the CPU
// reference would report it: invalid_sequence_lengths or
// invalid_block_table naming the sequence and the value, or ok. forward()
// on a GPU never synchronizes, so it cannot return these: its kernels write
// nothing when the lengths or block ids do not hold, and this query says
// why. Synchronizes params.stream (device tensors).
FFPA_API Status check_sequences(const ForwardParams& params);

// What forward() would run for these parameters, without running it.
struct KernelChoice {
  Impl impl = Impl::automatic;
  std::string kernel;  // e.g. "sm80_split_d<bf16,f32,M4N2,out512,bc128>"
  int64_t padded_head_dim = 0;  // head dim of the instantiation that serves D
  int32_t value_splits = 1;     // CTAs sharing one row block, each a slice of Dv
  int32_t heads_per_tile = 1;   // GQA packing: query heads of one KV head in a tile (decode)
  // split-KV: CTAs sharing one row block, each a range of the keys; 0: a
  // sequence batch whose plan chooses its splits on the device from the
  // lengths (split_blocks then holds the CTA slots it splits for).
  int32_t kv_splits = 1;
  int32_t split_blocks = 0;     // split-KV: KV blocks per split
  Precision precision = Precision::input;
  // A sequence batch of decode rows beside longer sequences (sm90_wgmma): its
  // sequences of at most short_rows query rows run first, in a pass of their
  // own with short_heads_per_tile heads a tile and their plan's KV split for
  // short_split_slots CTA slots; the rest then run as the fields above say.
  // short_rows 0: one pass.
  int32_t short_rows = 0;
  int32_t short_heads_per_tile = 1;
  int32_t short_split_slots = 0;
};
FFPA_API Status select_kernel(const ForwardParams& params, KernelChoice* choice);

// Whether `impl` (automatic, sm80_split_d or sm90_wgmma) runs this build's
// kernels on CUDA device `device`: ok, or impl_unavailable saying why not (no
// driver or no device, a driver older than the library's CUDA runtime, a GPU
// this build has no kernel image for and no PTX it can compile, a kernel the
// device cannot give its threads). Asked of the CUDA runtime, not derived from
// compute capabilities. For automatic: whether any GPU kernel of this build
// runs there (the portable family's; automatic runs it wherever the Hopper
// family does not serve a call). A call can still be declined for its own
// reasons: select_kernel says. invalid_option for another impl or a device
// ordinal out of range. The answer is fixed for the process, so a binding that
// routes calls elsewhere asks once per device. Makes `device` current for the
// query (creating its primary context, as any first use does) and restores the
// calling thread's current device.
FFPA_API Status device_support(int device, Impl impl);

// Which implementation backward() runs for a call on device tensors of
// `dtype` with head dims D = `head_dim` (q, k) and Dv = `value_dim` (v, o) on
// CUDA device `device` under `requested` (automatic, sm80_split_d or
// sm90_wgmma): *impl = sm90_wgmma (the Hopper backward kernels) or
// sm80_split_d (the portable ones); backward()'s own plan answers, for a
// representative call (one query row and one key, dense, 16-byte aligned), the
// backward's analogue of device_support. The plan reads of a call: dtype, D
// and Dv (the sm90 instance serves max(D, Dv)), the device (compute
// capability, whether the kernels' images run there) and, beyond those, only
// its tensors' alignment (TMA: 16-byte bases and strides, as the bindings pass
// them; else the portable kernels) and sizes past the kernels' limits
// (max_sequence_length, 2^30 blocks of 64 rows: then declined); never the
// mask, causal alignment, dropout, scale or GQA ratio. So a binding asks once
// per (device, dtype, D, Dv, requested) and keeps the answer. Statuses:
// invalid_option for another impl or a device ordinal out of range,
// validation's for D, Dv or dtype out of what backward() takes
// (unsupported_head_dim, unsupported_dtype: f32 and f64 run on the CPU
// reference only), impl_unavailable with the reason where no requested
// kernel runs (no driver or device, sm90_wgmma not serving it). *impl is
// written on success only (null_pointer when impl is null). Makes `device`
// current for the query and restores the calling thread's current device.
FFPA_API Status backward_route(int device, DType dtype, int64_t head_dim, int64_t value_dim, Impl requested,
                               Impl* impl);

// Head dims that have their own kernel instantiation in this build.
FFPA_API std::string compiled_head_dims();

FFPA_API const char* version();

// What this build of the library serves (the C ABI's ffpa_library_info).
struct LibraryInfo {
  std::string version;  // version()
  int32_t version_major = 0, version_minor = 0, version_patch = 0;
  // The head dims validation accepts: multiples of head_dim_multiple in
  // [min_head_dim, max_head_dim].
  int32_t min_head_dim = 0, max_head_dim = 0, head_dim_multiple = 0;
  int64_t max_sequence_length = 0;  // longest Nq or Nkv the GPU implementations serve
  std::vector<int32_t> cuda_architectures;  // compiled, 10 * major + minor, ascending
  // Head dims with their own kernel instance, ascending; empty when the family
  // is not in this build.
  std::vector<int32_t> split_d_head_dims;        // Impl::sm80_split_d
  std::vector<int32_t> sm90_wgmma_head_dims;     // Impl::sm90_wgmma
  std::vector<int32_t> sm90_fp8_head_dims;       // Precision::fp8 (each serves every D up to it)
  std::vector<int32_t> sm90_backward_head_dims;  // backward() on sm_90a (each serves every D and Dv up to it)
};
FFPA_API LibraryInfo library_info();

}  // namespace ffpa
