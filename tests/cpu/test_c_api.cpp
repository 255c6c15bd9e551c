// The C ABI of <ffpa/ffpa.h>: codes and messages (truncated, NUL-terminated,
// optional), NULL arguments, out-of-range enum values, status names, the
// structs' layout, the FP8 options (zero means the defaults). The
// CApiForward group computes through the C ABI with the CPU reference and
// compares with the C++ API bit for bit (it needs the full library).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "support/c_tensors.hpp"
#include "support/host_tensors.hpp"

namespace {

using ffpa::DType;
using ffpa::testing::c_tensor;
using ffpa::testing::HostTensor;
using ffpa::testing::Layout;
using ffpa::testing::make_host_lse;
using ffpa::testing::make_host_tensor;

struct Sizes {
  int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
};

// Random q, k, v and a NaN-poisoned o; params zero-initialized except for them.
struct CCall {
  HostTensor q, k, v, o;
  std::vector<unsigned char> o_before;

  explicit CCall(Sizes s, DType dtype = DType::bf16)
      : q(make_host_tensor(dtype, {s.batch, s.heads_q, s.seq_q, s.head_dim}, Layout::bnhd)),
        k(make_host_tensor(dtype, {s.batch, s.heads_kv, s.seq_kv, s.head_dim})),
        v(make_host_tensor(dtype, {s.batch, s.heads_kv, s.seq_kv, s.head_dim}, Layout::bnhd)),
        o(make_host_tensor(dtype, {s.batch, s.heads_q, s.seq_q, s.head_dim})) {
    const uint64_t seed = std::random_device{}();
    ffpa::testing::fill_uniform(q, seed, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(k, seed + 1, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(v, seed + 2, -1.0f, 1.0f);
    ffpa::testing::fill_nan(o);
    o_before = o.storage;
  }

  ffpa_forward_params params() const {
    ffpa_forward_params p;
    std::memset(&p, 0, sizeof p);
    p.q = c_tensor(q.tensor);
    p.k = c_tensor(k.tensor);
    p.v = c_tensor(v.tensor);
    p.o = c_tensor(o.tensor);
    return p;
  }

  bool o_untouched() const { return o.storage == o_before; }
};

const Sizes kSmall{2, 4, 2, 5, 7, 64};

// The structs' layout as the Python binding's ctypes mirror asserts it
// (python/ffpa_attn/_library.py, x86-64 and aarch64): a field added on one side
// only would shift every later field silently.
static_assert(sizeof(ffpa_tensor) == 80, "ffpa_tensor: FfpaTensor's size");
static_assert(offsetof(ffpa_options, dropout_seed) == 16 && offsetof(ffpa_options, impl) == 36,
              "ffpa_options: FfpaOptions' offsets");
static_assert(offsetof(ffpa_options, precision) == 40 && offsetof(ffpa_options, fp8) == 48,
              "ffpa_options: precision and fp8 where FfpaOptions has them");
static_assert(offsetof(ffpa_fp8_options, qk_scales) == 4 && offsetof(ffpa_fp8_options, no_smooth_k) == 8 &&
                  offsetof(ffpa_fp8_options, has_early_rows) == 12 && offsetof(ffpa_fp8_options, early_rows) == 16 &&
                  offsetof(ffpa_fp8_options, v_scales) == 24 && offsetof(ffpa_fp8_options, smooth_v) == 28,
              "ffpa_fp8_options: FfpaFp8Options' offsets");
static_assert(sizeof(ffpa_fp8_options) == 32, "ffpa_fp8_options: FfpaFp8Options' size");
static_assert(offsetof(ffpa_library_info, sm90_fp8_head_dim_count) == 220 &&
                  offsetof(ffpa_library_info, sm90_backward_head_dim_count) == 288 &&
                  sizeof(ffpa_library_info) == 360,
              "ffpa_library_info: FfpaLibraryInfo's layout (python/ffpa_attn/_library.py)");
static_assert(offsetof(ffpa_options, has_window) == 80 && offsetof(ffpa_options, window_left) == 88 &&
                  offsetof(ffpa_options, softcap) == 104 && sizeof(ffpa_options) == 112,
              "ffpa_options: FfpaOptions' window, softcap and size");
static_assert(offsetof(ffpa_forward_params, options) == 480 && offsetof(ffpa_forward_params, stream) == 592,
              "ffpa_forward_params: FfpaForwardParams' offsets");
static_assert(offsetof(ffpa_forward_params, fp8_kv_cache) == 616 && offsetof(ffpa_forward_params, sinks) == 624 &&
                  offsetof(ffpa_forward_params, sequences) == 864 &&
                  offsetof(ffpa_forward_params, sequence_plan) == 872 && sizeof(ffpa_forward_params) == 880,
              "ffpa_forward_params: FfpaForwardParams' trailing fields and size");
static_assert(offsetof(ffpa_backward_params, options) == 960 && offsetof(ffpa_backward_params, stream) == 1072 &&
                  offsetof(ffpa_backward_params, sequences) == 1096 && offsetof(ffpa_backward_params, sinks) == 1104 &&
                  offsetof(ffpa_backward_params, d_sinks) == 1184 && sizeof(ffpa_backward_params) == 1264,
              "ffpa_backward_params: FfpaBackwardParams' layout");
static_assert(offsetof(ffpa_sequence_batch, max_seqlen_q) == 320 && sizeof(ffpa_sequence_batch) == 336,
              "ffpa_sequence_batch: FfpaSequenceBatch's layout");
static_assert(sizeof(ffpa_fp8_kv_cache) == 480 && offsetof(ffpa_fp8_kv_cache, v_codes) == 240,
              "ffpa_fp8_kv_cache: FfpaFp8KvCache's layout");
static_assert(offsetof(ffpa_fp8_quantize_kv_params, cache) == 160 && offsetof(ffpa_fp8_quantize_kv_params, fp8) == 640 &&
                  offsetof(ffpa_fp8_quantize_kv_params, stream) == 672 &&
                  sizeof(ffpa_fp8_quantize_kv_params) == 696,
              "ffpa_fp8_quantize_kv_params: FfpaFp8QuantizeKvParams' layout");

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

bool has_cuda_device() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

// --- no computation ----------------------------------------------------------------

TEST(CApi, StatusNamesAreDistinctAndMatchTheCppNames) {
  std::set<std::string> names;
  for (int code = FFPA_OK; code <= FFPA_OUT_OF_MEMORY; ++code) {
    const char* name = ffpa_status_name(static_cast<ffpa_status>(code));
    ASSERT_NE(name, nullptr) << code;
    EXPECT_STRNE(name, "") << code;
    EXPECT_STREQ(name, ffpa::status_name(static_cast<ffpa::StatusCode>(code)));
    names.insert(name);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(FFPA_OUT_OF_MEMORY + 1));
  EXPECT_STREQ(ffpa_status_name(FFPA_OK), "ok");
  EXPECT_STREQ(ffpa_status_name(FFPA_NULL_POINTER), "null_pointer");
  EXPECT_STREQ(ffpa_status_name(FFPA_OUTPUT_OVERLAPS_INPUT), "output_overlaps_input");
  EXPECT_STREQ(ffpa_status_name(FFPA_CUDA_ERROR), "cuda_error");
  EXPECT_STREQ(ffpa_status_name(FFPA_OUT_OF_MEMORY), "out_of_memory");
}

// Any integer is a status a C caller may pass (hostile-input finding 1: 100 or
// -1 was a value outside the C++ enum, undefined to load). The brace
// initializations below compile only with the fixed underlying type.
TEST(CApi, StatusNameTakesAnyInteger) {
  static_assert(sizeof(ffpa_status) == sizeof(int32_t), "a 32-bit status, as C sees it");
  const ffpa_status out_of_range{100}, negative{-1}, largest{INT32_MAX}, smallest{INT32_MIN};
  for (ffpa_status status : {out_of_range, negative, largest, smallest})
    EXPECT_STREQ(ffpa_status_name(status), "unknown_status");
  EXPECT_STREQ(ffpa_status_name(ffpa_status{21}), "out_of_memory");
}

// A valid host call whose CPU-reference scratch cannot exist (Nkv = 2^58 + 1
// keys, every one the same row through stride 0): out_of_memory from both
// APIs, never an exception or a cuda_error (hostile-input finding 2: the C++
// API let std::length_error escape, the C ABI said "internal error").
TEST(CApi, ScratchBeyondAddressableMemoryIsOutOfMemory) {
  for (const int64_t seq_kv : {(int64_t{1} << 58) + 1, int64_t{1} << 40}) {
    SCOPED_TRACE("Nkv = " + std::to_string(seq_kv));
    HostTensor q = make_host_tensor(DType::f16, {1, 1, 1, 8});
    HostTensor o = make_host_tensor(DType::f16, {1, 1, 1, 8});
    HostTensor row = make_host_tensor(DType::f16, {1, 1, 1, 8});
    ffpa::testing::fill_uniform(q, 1, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(row, 2, -1.0f, 1.0f);
    ffpa::testing::fill_nan(o);
    const std::vector<unsigned char> o_before = o.storage;
    ffpa::ForwardParams params;
    params.q = q.tensor;
    params.o = o.tensor;
    params.k = params.v = ffpa::make_tensor(row.tensor.data, DType::f16, {1, 1, seq_kv, 8});
    params.k.stride[0] = params.k.stride[1] = params.k.stride[2] = 0;
    params.v = params.k;
    ffpa::Status status;
    EXPECT_NO_THROW(status = ffpa::forward(params));
    EXPECT_EQ(status.code, ffpa::StatusCode::out_of_memory) << status.message;
    EXPECT_TRUE(o.storage == o_before) << "o was written";

    ffpa_forward_params c;
    std::memset(&c, 0, sizeof c);
    c.q = c_tensor(params.q), c.k = c_tensor(params.k), c.v = c_tensor(params.v), c.o = c_tensor(params.o);
    char message[256] = {};
    EXPECT_EQ(ffpa_forward(&c, message, sizeof message), FFPA_OUT_OF_MEMORY) << message;
    EXPECT_TRUE(o.storage == o_before) << "o was written";
  }
}

TEST(CApi, Version) {
  ASSERT_NE(ffpa_version(), nullptr);
  EXPECT_STREQ(ffpa_version(), ffpa::version());
  EXPECT_NE(std::string(ffpa_version()).find('.'), std::string::npos);
}

TEST(CApi, NullParamsAndNullBytes) {
  char message[128];
  EXPECT_EQ(ffpa_forward(nullptr, message, sizeof message), FFPA_NULL_POINTER);
  EXPECT_STREQ(message, "params is null");
  EXPECT_EQ(ffpa_forward(nullptr, nullptr, 0), FFPA_NULL_POINTER);
  size_t bytes = 0;
  EXPECT_EQ(ffpa_workspace_size(nullptr, &bytes, message, sizeof message), FFPA_NULL_POINTER);
  EXPECT_STREQ(message, "params is null");
  CCall call(kSmall);
  const ffpa_forward_params p = call.params();
  EXPECT_EQ(ffpa_workspace_size(&p, nullptr, message, sizeof message), FFPA_NULL_POINTER);
  EXPECT_STREQ(message, "bytes is null");
}

TEST(CApi, ZeroInitializedParamsAreRejected) {
  ffpa_forward_params p;
  std::memset(&p, 0, sizeof p);
  char message[256];
  EXPECT_EQ(ffpa_forward(&p, message, sizeof message), FFPA_INVALID_RANK);
  EXPECT_NE(std::string(message).find("q.rank = 0"), std::string::npos) << message;
}

TEST(CApi, ErrorsComeBackAsCodesWithMessages) {
  CCall call(kSmall);
  char message[256];
  const struct {
    void (*spoil)(ffpa_forward_params&);
    ffpa_status code;
    const char* names;
  } cases[] = {
      {[](ffpa_forward_params& p) { p.k.dtype = FFPA_DTYPE_F16; }, FFPA_DTYPE_MISMATCH, "k.dtype"},
      {[](ffpa_forward_params& p) { p.v.data = nullptr; }, FFPA_NULL_POINTER, "v.data is null"},
      {[](ffpa_forward_params& p) { p.k.shape[3] = 96; }, FFPA_SHAPE_MISMATCH,
       "k.shape[3] (D) = 96"},
      {[](ffpa_forward_params& p) { p.q.stride[3] = 2; }, FFPA_NONCONTIGUOUS_LAST_DIM,
       "q.stride[3]"},
      {[](ffpa_forward_params& p) { p.o.data = p.q.data; }, FFPA_OUTPUT_OVERLAPS_INPUT,
       "overlaps q"},
      {[](ffpa_forward_params& p) { p.options.dropout_p = 1.0f; }, FFPA_INVALID_DROPOUT,
       "dropout_p"},
      {[](ffpa_forward_params& p) { p.options.accumulation = FFPA_ACCUM_F16; },
       FFPA_UNSUPPORTED_ACCUMULATION, "options.accumulation"},
  };
  for (const auto& c : cases) {
    ffpa_forward_params p = call.params();
    p.options.impl = FFPA_IMPL_CPU_REFERENCE;
    c.spoil(p);
    EXPECT_EQ(ffpa_forward(&p, message, sizeof message), c.code) << message;
    EXPECT_NE(std::string(message).find(c.names), std::string::npos) << message;
    size_t bytes = 12345;
    EXPECT_EQ(ffpa_workspace_size(&p, &bytes, message, sizeof message), c.code) << message;
    EXPECT_NE(std::string(message).find(c.names), std::string::npos) << message;
  }
  EXPECT_TRUE(call.o_untouched());
}

TEST(CApi, OutOfRangeEnumValuesAreRejected) {
  CCall call(kSmall);
  char message[256];
  const struct {
    void (*spoil)(ffpa_forward_params&);
    ffpa_status code;
    const char* names;
  } cases[] = {
      {[](ffpa_forward_params& p) { p.options.causal = 42; }, FFPA_INVALID_OPTION,
       "options.causal = 42"},
      {[](ffpa_forward_params& p) { p.options.accumulation = 7; }, FFPA_INVALID_OPTION,
       "options.accumulation = 7"},
      {[](ffpa_forward_params& p) { p.options.impl = -3; }, FFPA_INVALID_OPTION,
       "options.impl = -3"},
      {[](ffpa_forward_params& p) {
         p.options.has_scale = 1;
         p.options.scale = INFINITY;
       },
       FFPA_INVALID_OPTION, "options.scale"},
      {[](ffpa_forward_params& p) { p.q.dtype = p.k.dtype = p.v.dtype = p.o.dtype = 99; },
       FFPA_UNSUPPORTED_DTYPE, "q.dtype = unknown (99)"},
  };
  for (const auto& c : cases) {
    ffpa_forward_params p = call.params();
    c.spoil(p);
    EXPECT_EQ(ffpa_forward(&p, message, sizeof message), c.code) << message;
    EXPECT_NE(std::string(message).find(c.names), std::string::npos) << message;
  }
  EXPECT_TRUE(call.o_untouched());
}

// Zero-initialised options are the C++ API's defaults, FP8's knobs included.
TEST(CApi, ZeroedOptionsAreTheCppDefaults) {
  ffpa_options c;
  std::memset(&c, 0, sizeof c);
  const ffpa::Options cpp;
  EXPECT_EQ(c.precision, static_cast<int32_t>(cpp.precision));
  EXPECT_EQ(c.precision, FFPA_PRECISION_INPUT);
  EXPECT_EQ(c.fp8.qk_format, static_cast<int32_t>(cpp.fp8.qk_format));
  EXPECT_EQ(c.fp8.qk_format, FFPA_FP8_QK_INT8);
  EXPECT_EQ(c.fp8.qk_scales, static_cast<int32_t>(cpp.fp8.qk_scales));
  EXPECT_EQ(c.fp8.qk_scales, FFPA_FP8_QK_SCALES_PER_THREAD_GROUP);
  EXPECT_EQ(c.fp8.no_smooth_k == 0, cpp.fp8.smooth_k);
  EXPECT_EQ(c.fp8.has_early_rows != 0, cpp.fp8.early_rows.has_value());
  EXPECT_EQ(c.fp8.v_scales, static_cast<int32_t>(cpp.fp8.v_scales));
  EXPECT_EQ(c.fp8.v_scales, FFPA_FP8_V_SCALES_PER_CHANNEL);
  EXPECT_EQ(c.fp8.smooth_v != 0, cpp.fp8.smooth_v);
}

// Bad FP8 options come back as their codes from both entry points, before any
// implementation is asked (impl auto, host pointers), and write nothing.
TEST(CApi, Fp8OptionErrorsComeBackAsCodesWithMessages) {
  CCall call(kSmall, DType::f16);
  char message[256];
  const struct {
    void (*spoil)(ffpa_forward_params&);
    ffpa_status code;
    const char* names;
  } cases[] = {
      {[](ffpa_forward_params& p) { p.options.precision = 7; }, FFPA_INVALID_OPTION,
       "options.precision = 7"},
      {[](ffpa_forward_params& p) { p.options.precision = -1; }, FFPA_INVALID_OPTION,
       "options.precision = -1"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.qk_format = 7;
       },
       FFPA_INVALID_OPTION, "options.fp8.qk_format = 7"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.qk_scales = 2;
       },
       FFPA_INVALID_OPTION, "options.fp8.qk_scales = 2"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.v_scales = 5;
       },
       FFPA_INVALID_OPTION, "options.fp8.v_scales = 5"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.v_scales = -1;
       },
       FFPA_INVALID_OPTION, "options.fp8.v_scales = -1"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.smooth_v = 1;
         p.options.dropout_p = 0.25f;
       },
       FFPA_INVALID_OPTION, "options.fp8.smooth_v with dropout"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.has_early_rows = 1;
         p.options.fp8.early_rows = 65;
       },
       FFPA_INVALID_OPTION, "options.fp8.early_rows = 65"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.fp8.has_early_rows = 1;
         p.options.fp8.early_rows = -64;
       },
       FFPA_INVALID_OPTION, "options.fp8.early_rows = -64"},
      {[](ffpa_forward_params& p) {
         p.options.precision = FFPA_PRECISION_FP8;
         p.options.accumulation = FFPA_ACCUM_F16;  // f16 inputs: fine without FP8
       },
       FFPA_UNSUPPORTED_ACCUMULATION, "precision fp8"},
  };
  for (const auto& c : cases) {
    ffpa_forward_params p = call.params();
    c.spoil(p);
    SCOPED_TRACE(c.names);
    EXPECT_EQ(ffpa_forward(&p, message, sizeof message), c.code) << message;
    EXPECT_TRUE(contains(message, c.names)) << message;
    size_t bytes = 12345;
    EXPECT_EQ(ffpa_workspace_size(&p, &bytes, message, sizeof message), c.code) << message;
    EXPECT_TRUE(contains(message, c.names)) << message;
  }
  EXPECT_TRUE(call.o_untouched());
}

// FP8 runs on the sm90 family only: on host pointers, impl auto and sm90_wgmma
// meet the sm90 family's own answer (no device here: impl_unavailable; with one:
// host pointers are the wrong memory space); cpu_reference and sm80_split_d are
// refused as implementations without FP8. Nothing runs.
TEST(CApi, Fp8OnHostPointersIsRefused) {
  CCall call(kSmall);
  char message[256];
  const ffpa_status sm90_answer = has_cuda_device() ? FFPA_WRONG_MEMORY_SPACE : FFPA_IMPL_UNAVAILABLE;
  const struct {
    int32_t impl;
    ffpa_status code;
    const char* names;
  } cases[] = {
      {FFPA_IMPL_AUTO, sm90_answer, "sm90_wgmma"},
      {FFPA_IMPL_SM90_WGMMA, sm90_answer, "sm90_wgmma"},
      {FFPA_IMPL_CPU_REFERENCE, FFPA_IMPL_UNAVAILABLE, "precision fp8 runs on impl sm90_wgmma only, not cpu_reference"},
      {FFPA_IMPL_SM80_SPLIT_D, FFPA_IMPL_UNAVAILABLE, "precision fp8 runs on impl sm90_wgmma only, not sm80_split_d"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.names);
    ffpa_forward_params p = call.params();
    p.options.impl = c.impl;
    p.options.precision = FFPA_PRECISION_FP8;
    EXPECT_EQ(ffpa_forward(&p, message, sizeof message), c.code) << message;
    EXPECT_TRUE(contains(message, c.names)) << message;
    size_t bytes = 12345;
    EXPECT_EQ(ffpa_workspace_size(&p, &bytes, message, sizeof message), c.code) << message;
    EXPECT_TRUE(contains(message, c.names)) << message;
    // early_rows is read only with has_early_rows: 65 alone is no option error.
    p.options.fp8.early_rows = 65;
    EXPECT_EQ(ffpa_forward(&p, message, sizeof message), c.code) << message;
    // per-block V scales and smooth-V without dropout are valid knobs.
    p.options.fp8.v_scales = FFPA_FP8_V_SCALES_PER_BLOCK;
    p.options.fp8.smooth_v = 1;
    EXPECT_EQ(ffpa_forward(&p, message, sizeof message), c.code) << message;
    EXPECT_EQ(ffpa_workspace_size(&p, &bytes, message, sizeof message), c.code) << message;
  }
  EXPECT_TRUE(call.o_untouched());
}

TEST(CApi, MessagesAreTruncatedAndNulTerminated) {
  CCall call(kSmall);
  ffpa_forward_params p = call.params();
  p.k.shape[3] = 96;
  char full[512];
  ASSERT_EQ(ffpa_forward(&p, full, sizeof full), FFPA_SHAPE_MISMATCH);
  ASSERT_GT(std::strlen(full), 8u);

  char tiny[9];
  std::memset(tiny, 'X', sizeof tiny);
  EXPECT_EQ(ffpa_forward(&p, tiny, 8), FFPA_SHAPE_MISMATCH);
  EXPECT_EQ(std::strlen(tiny), 7u);
  EXPECT_EQ(std::string(tiny), std::string(full, 7));
  EXPECT_EQ(tiny[8], 'X');  // nothing written past message_size

  std::memset(tiny, 'X', sizeof tiny);
  EXPECT_EQ(ffpa_forward(&p, tiny, 1), FFPA_SHAPE_MISMATCH);
  EXPECT_EQ(tiny[0], '\0');
  EXPECT_EQ(tiny[1], 'X');

  std::memset(tiny, 'X', sizeof tiny);
  EXPECT_EQ(ffpa_forward(&p, tiny, 0), FFPA_SHAPE_MISMATCH);
  EXPECT_EQ(tiny[0], 'X');  // message_size 0: nothing written

  EXPECT_EQ(ffpa_forward(&p, nullptr, 64), FFPA_SHAPE_MISMATCH);  // NULL message is allowed
  EXPECT_TRUE(call.o_untouched());
}

// --- computing through the C ABI (needs the full library) ---------------------------

// Whether two outputs are the same bytes, and every value of o is finite.
void expect_same_finite(const HostTensor& a, const HostTensor& b) {
  ASSERT_EQ(a.bytes(), b.bytes());
  EXPECT_EQ(std::memcmp(a.tensor.data, b.tensor.data, a.bytes()), 0);
  const int64_t* s = a.tensor.shape;
  double sum_abs = 0.0;
  for (int64_t i0 = 0; i0 < s[0]; ++i0)
    for (int64_t i1 = 0; i1 < s[1]; ++i1)
      for (int64_t i2 = 0; i2 < s[2]; ++i2)
        for (int64_t i3 = 0; i3 < s[3]; ++i3) {
          const double x = ffpa::testing::element_as_double(a.tensor, {i0, i1, i2, i3});
          ASSERT_TRUE(std::isfinite(x)) << i0 << " " << i1 << " " << i2 << " " << i3;
          sum_abs += std::fabs(x);
        }
  EXPECT_GT(sum_abs, 0.0);
}

TEST(CApiForward, MatchesTheCppApiBitForBit) {
  const Sizes s{2, 4, 2, 13, 17, 72};
  CCall call(s);
  HostTensor mask = make_host_tensor(DType::f32, {s.batch, 1, s.seq_q, s.seq_kv});
  ffpa::testing::fill_uniform(mask, std::random_device{}(), -3.0f, 1.0f);
  HostTensor lse = make_host_lse(s.batch, s.heads_q, s.seq_q);
  ffpa::testing::fill_nan(lse);

  ffpa_forward_params p = call.params();
  p.mask = c_tensor(mask.tensor);
  p.lse = c_tensor(lse.tensor);
  p.options.has_scale = 1;
  p.options.scale = 0.3f;
  p.options.causal = FFPA_CAUSAL_BOTTOM_RIGHT;
  p.options.dropout_p = 0.2f;
  p.options.dropout_seed = 0xfeedbeefcafeull;
  p.options.dropout_offset = 3;
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  char message[256] = "";
  ASSERT_EQ(ffpa_forward(&p, message, sizeof message), FFPA_OK) << message;
  EXPECT_STREQ(message, "");

  HostTensor o_cpp = call.o, lse_cpp = lse;
  ffpa::testing::fill_nan(o_cpp);
  ffpa::testing::fill_nan(lse_cpp);
  ffpa::ForwardParams cpp;
  cpp.q = call.q.tensor;
  cpp.k = call.k.tensor;
  cpp.v = call.v.tensor;
  cpp.o = o_cpp.tensor;
  cpp.mask = mask.tensor;
  cpp.lse = lse_cpp.tensor;
  cpp.options.scale = 0.3f;
  cpp.options.causal = ffpa::Causal::bottom_right;
  cpp.options.dropout_p = 0.2f;
  cpp.options.dropout_seed = 0xfeedbeefcafeull;
  cpp.options.dropout_offset = 3;
  cpp.options.impl = ffpa::Impl::cpu_reference;
  const ffpa::Status status = ffpa::forward(cpp);
  ASSERT_TRUE(status.ok()) << status.message;

  expect_same_finite(call.o, o_cpp);
  EXPECT_EQ(std::memcmp(lse.tensor.data, lse_cpp.tensor.data, lse.bytes()), 0);
}

TEST(CApiForward, HasScaleZeroMeansTheDefaultScale) {
  const Sizes s{1, 3, 3, 9, 11, 40};
  CCall call(s, DType::f16);
  ffpa_forward_params p = call.params();
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  p.options.scale = 5.0f;  // ignored: has_scale = 0
  ASSERT_EQ(ffpa_forward(&p, nullptr, 0), FFPA_OK);
  const HostTensor by_default = call.o;

  ffpa::testing::fill_nan(call.o);
  p.options.has_scale = 1;
  p.options.scale = static_cast<float>(1.0 / std::sqrt(40.0));
  ASSERT_EQ(ffpa_forward(&p, nullptr, 0), FFPA_OK);
  expect_same_finite(call.o, by_default);

  ffpa::testing::fill_nan(call.o);
  p.options.scale = 5.0f;
  ASSERT_EQ(ffpa_forward(&p, nullptr, 0), FFPA_OK);
  EXPECT_NE(std::memcmp(call.o.tensor.data, by_default.tensor.data, by_default.bytes()), 0);
}

// FP8's knobs are read only with precision fp8: with the inputs' precision,
// values that would be rejected there change nothing, bit for bit.
TEST(CApiForward, Fp8OptionsAreIgnoredWithoutPrecisionFp8) {
  const Sizes s{1, 2, 2, 9, 11, 64};
  CCall call(s);
  ffpa_forward_params p = call.params();
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  ASSERT_EQ(ffpa_forward(&p, nullptr, 0), FFPA_OK);
  const HostTensor zeroed = call.o;

  ffpa::testing::fill_nan(call.o);
  p.options.precision = FFPA_PRECISION_INPUT;
  p.options.fp8.qk_format = 7;
  p.options.fp8.qk_scales = -3;
  p.options.fp8.no_smooth_k = 1;
  p.options.fp8.has_early_rows = 1;
  p.options.fp8.early_rows = 65;
  p.options.fp8.v_scales = 5;
  p.options.fp8.smooth_v = 1;
  char message[256] = "";
  ASSERT_EQ(ffpa_forward(&p, message, sizeof message), FFPA_OK) << message;
  expect_same_finite(call.o, zeroed);
}

TEST(CApiForward, WorkspaceSizeOfTheCpuReferenceIsZero) {
  CCall call(kSmall);
  ffpa_forward_params p = call.params();
  p.options.impl = FFPA_IMPL_CPU_REFERENCE;
  size_t bytes = 12345;
  char message[128];
  EXPECT_EQ(ffpa_workspace_size(&p, &bytes, message, sizeof message), FFPA_OK) << message;
  EXPECT_EQ(bytes, 0u);
  EXPECT_TRUE(call.o_untouched());
}

}  // namespace
