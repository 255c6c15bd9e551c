// Validation: every status validate_forward can return, each with a message
// naming the argument and with the outputs untouched; and the normalized
// problem of a valid call. The ForwardRejects group goes through the public
// entry point ffpa::forward (the full library) to prove it rejects before
// writing anything.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/philox.hpp"
#include "ffpa/ffpa.hpp"
#include "host/validate.hpp"
#include "support/host_tensors.hpp"

namespace {

using ffpa::DType;
using ffpa::ForwardParams;
using ffpa::Status;
using ffpa::StatusCode;
using ffpa::Tensor;
using ffpa::detail::AttentionProblem;
using ffpa::testing::HostTensor;
using ffpa::testing::Layout;
using ffpa::testing::make_host_lse;
using ffpa::testing::make_host_tensor;

struct Sizes {
  int64_t batch = 2, heads_q = 4, heads_kv = 2, seq_q = 5, seq_kv = 7, head_dim = 64;
};

uint64_t fresh_seed() { return std::random_device{}(); }

// A valid call's tensors (random inputs, random "sentinel" outputs) and a
// snapshot of the outputs' bytes to prove that nothing wrote to them.
struct Call {
  Sizes sizes;
  HostTensor q, k, v, o, mask, lse;
  std::vector<unsigned char> o_before, lse_before;

  explicit Call(Sizes s = {}, DType dtype = DType::bf16, Layout layout = Layout::bhnd)
      : sizes(s),
        q(make_host_tensor(dtype, {s.batch, s.heads_q, s.seq_q, s.head_dim}, layout)),
        k(make_host_tensor(dtype, {s.batch, s.heads_kv, s.seq_kv, s.head_dim}, layout)),
        v(make_host_tensor(dtype, {s.batch, s.heads_kv, s.seq_kv, s.head_dim}, layout)),
        o(make_host_tensor(dtype, {s.batch, s.heads_q, s.seq_q, s.head_dim}, layout)),
        mask(make_host_tensor(DType::boolean, {s.batch, 1, s.seq_q, s.seq_kv})),
        lse(make_host_lse(s.batch, s.heads_q, s.seq_q)) {
    const uint64_t seed = fresh_seed();
    ffpa::testing::fill_uniform(q, seed, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(k, seed + 1, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(v, seed + 2, -1.0f, 1.0f);
    ffpa::testing::fill_bool(mask, seed + 3, 0.8);
    ffpa::testing::fill_uniform(o, seed + 4, -1.0f, 1.0f);
    ffpa::testing::fill_uniform(lse, seed + 5, -1.0f, 1.0f);
    o_before = o.storage;
    lse_before = lse.storage;
  }

  // q, k, v, o, a boolean mask and lse; the cpu_reference implementation.
  ForwardParams params() const {
    ForwardParams p;
    p.q = q.tensor;
    p.k = k.tensor;
    p.v = v.tensor;
    p.o = o.tensor;
    p.mask = mask.tensor;
    p.lse = lse.tensor;
    p.options.impl = ffpa::Impl::cpu_reference;
    return p;
  }

  bool outputs_untouched() const { return o.storage == o_before && lse.storage == lse_before; }
};

// validate_forward(p) fails with `code`, its message contains every one of
// `words`, it leaves *problem alone and the outputs of `call` untouched.
::testing::AssertionResult rejected(const Call& call, const ForwardParams& p, StatusCode code,
                                    std::initializer_list<const char*> words) {
  AttentionProblem problem;
  problem.batch = -12345;
  const Status status = ffpa::detail::validate_forward(p, &problem);
  if (status.code != code)
    return ::testing::AssertionFailure()
           << "expected " << ffpa::status_name(code) << ", got " << ffpa::status_name(status.code)
           << " (\"" << status.message << "\")";
  for (const char* word : words)
    if (status.message.find(word) == std::string::npos)
      return ::testing::AssertionFailure()
             << "message \"" << status.message << "\" does not contain \"" << word << "\"";
  if (problem.batch != -12345) return ::testing::AssertionFailure() << "*problem was written";
  if (!call.outputs_untouched()) return ::testing::AssertionFailure() << "an output was written";
  return ::testing::AssertionSuccess() << status.message;
}

::testing::AssertionResult accepted(const ForwardParams& p, AttentionProblem* problem = nullptr) {
  AttentionProblem local;
  const Status status = ffpa::detail::validate_forward(p, problem ? problem : &local);
  if (!status.ok())
    return ::testing::AssertionFailure()
           << ffpa::status_name(status.code) << ": " << status.message;
  return ::testing::AssertionSuccess();
}

// A pointer `bytes` past the tensor's data (validation never dereferences it).
void* offset_pointer(const Tensor& t, int64_t bytes) { return static_cast<char*>(t.data) + bytes; }

// --- positive cases ---------------------------------------------------------------

TEST(Validation, ValidCallFillsProblem) {
  Sizes s;
  Call call(s, DType::f16, Layout::bnhd);
  ForwardParams p = call.params();
  // A [B, 1, 1, Nkv] additive mask plus a full-size dim broadcast by stride 0.
  HostTensor mask = make_host_tensor(DType::f32, {s.batch, 1, 1, s.seq_kv});
  ffpa::testing::fill_uniform(mask, fresh_seed(), -2.0f, 0.0f);
  p.mask = mask.tensor;
  p.mask.stride[1] = 999;  // size-1 dims: any stride, normalized to 0
  p.mask.stride[2] = 12345;
  p.options.causal = ffpa::Causal::bottom_right;
  p.options.dropout_p = 0.25f;
  p.options.dropout_seed = 0x123456789abcdefull;
  p.options.dropout_offset = 77;
  p.options.accumulation = ffpa::Accumulation::f16;

  AttentionProblem problem;
  ASSERT_TRUE(accepted(p, &problem));
  EXPECT_EQ(problem.batch, s.batch);
  EXPECT_EQ(problem.heads_q, s.heads_q);
  EXPECT_EQ(problem.heads_kv, s.heads_kv);
  EXPECT_EQ(problem.seq_q, s.seq_q);
  EXPECT_EQ(problem.seq_kv, s.seq_kv);
  EXPECT_EQ(problem.head_dim, s.head_dim);
  EXPECT_EQ(problem.dtype, DType::f16);
  EXPECT_EQ(problem.q, call.q.tensor.data);
  EXPECT_EQ(problem.k, call.k.tensor.data);
  EXPECT_EQ(problem.v, call.v.tensor.data);
  EXPECT_EQ(problem.o, call.o.tensor.data);
  // [B, N, H, D] buffers: b stride N*H*D, h stride D, n stride H*D.
  const int64_t D = s.head_dim;
  const int64_t q_expected[3] = {s.seq_q * s.heads_q * D, D, s.heads_q * D};
  const int64_t kv_expected[3] = {s.seq_kv * s.heads_kv * D, D, s.heads_kv * D};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(problem.q_stride[i], q_expected[i]) << i;
    EXPECT_EQ(problem.o_stride[i], q_expected[i]) << i;
    EXPECT_EQ(problem.k_stride[i], kv_expected[i]) << i;
    EXPECT_EQ(problem.v_stride[i], kv_expected[i]) << i;
  }
  EXPECT_EQ(problem.mask_kind, ffpa::detail::MaskKind::additive_f32);
  EXPECT_EQ(problem.mask, mask.tensor.data);
  EXPECT_EQ(problem.mask_stride[0], s.seq_kv);
  EXPECT_EQ(problem.mask_stride[1], 0);
  EXPECT_EQ(problem.mask_stride[2], 0);
  EXPECT_EQ(problem.mask_stride[3], 1);
  EXPECT_EQ(problem.lse, call.lse.tensor.data);
  EXPECT_EQ(problem.lse_stride[0], s.heads_q * s.seq_q);
  EXPECT_EQ(problem.lse_stride[1], s.seq_q);
  EXPECT_EQ(problem.lse_stride[2], 1);
  EXPECT_EQ(problem.scale, 0.125f);  // 1/sqrt(64)
  EXPECT_EQ(problem.causal, ffpa::Causal::bottom_right);
  EXPECT_EQ(problem.dropout_p, 0.25f);
  EXPECT_EQ(problem.dropout_threshold, ffpa::detail::dropout_threshold(0.25f));
  EXPECT_EQ(problem.dropout_scale, 1.3330078125f);  // 4/3 rounded to f16, as SDPA scales kept values
  EXPECT_EQ(problem.dropout_seed, 0x123456789abcdefull);
  EXPECT_EQ(problem.dropout_offset, 77u);
  EXPECT_EQ(problem.accumulation, ffpa::Accumulation::f16);
  EXPECT_TRUE(call.outputs_untouched());
}

TEST(Validation, DefaultScaleIsComputedInDouble) {
  Sizes s;
  s.head_dim = 200;
  Call call(s);
  AttentionProblem problem;
  ForwardParams p = call.params();
  ASSERT_TRUE(accepted(p, &problem));
  EXPECT_EQ(problem.scale, static_cast<float>(1.0 / std::sqrt(200.0)));
  p.options.scale = -0.5f;  // any finite scale is the caller's choice
  ASSERT_TRUE(accepted(p, &problem));
  EXPECT_EQ(problem.scale, -0.5f);
}

TEST(Validation, MaskKindsAndBroadcastStrides) {
  Sizes s;
  Call call(s);
  const struct {
    DType dtype;
    ffpa::detail::MaskKind kind;
  } kinds[] = {{DType::boolean, ffpa::detail::MaskKind::boolean},
               {DType::f16, ffpa::detail::MaskKind::additive_f16},
               {DType::bf16, ffpa::detail::MaskKind::additive_bf16},
               {DType::f32, ffpa::detail::MaskKind::additive_f32}};
  for (const auto& kind : kinds) {
    HostTensor mask = make_host_tensor(kind.dtype, {s.batch, s.heads_q, s.seq_q, s.seq_kv});
    ForwardParams p = call.params();
    // Full-size dims broadcast by stride 0 (b and i) keep stride 0.
    p.mask = ffpa::testing::broadcast_view(mask, {true, false, true, false});
    AttentionProblem problem;
    ASSERT_TRUE(accepted(p, &problem));
    EXPECT_EQ(problem.mask_kind, kind.kind);
    EXPECT_EQ(problem.mask_stride[0], 0);
    EXPECT_EQ(problem.mask_stride[1], s.seq_q * s.seq_kv);
    EXPECT_EQ(problem.mask_stride[2], 0);
    EXPECT_EQ(problem.mask_stride[3], 1);
  }
  ForwardParams p = call.params();
  p.mask = {};
  AttentionProblem problem;
  ASSERT_TRUE(accepted(p, &problem));
  EXPECT_EQ(problem.mask_kind, ffpa::detail::MaskKind::none);
  EXPECT_EQ(problem.mask, nullptr);
}

TEST(Validation, EmptyProblemsAcceptNullPointers) {
  for (Sizes s : {Sizes{0, 4, 2, 5, 7, 64}, Sizes{2, 4, 2, 0, 7, 64}, Sizes{2, 4, 2, 5, 0, 64},
                  Sizes{2, 0, 2, 5, 7, 64}}) {
    Call call(s);
    ForwardParams p = call.params();
    const bool q_empty = s.batch == 0 || s.heads_q == 0 || s.seq_q == 0;
    const bool kv_empty = s.batch == 0 || s.seq_kv == 0;
    if (q_empty) p.q.data = p.o.data = nullptr;
    if (kv_empty) p.k.data = p.v.data = nullptr;
    AttentionProblem problem;
    EXPECT_TRUE(accepted(p, &problem)) << s.batch << " " << s.seq_q << " " << s.seq_kv;
    EXPECT_EQ(problem.seq_kv, s.seq_kv);
  }
  // An empty tensor is never accessed: its pointer and strides need no alignment.
  Call call(Sizes{0, 4, 2, 5, 7, 64});
  ForwardParams p = call.params();
  p.q.data = offset_pointer(p.q, 2);
  p.q.stride[2] = 66;
  EXPECT_TRUE(accepted(p));
}

TEST(Validation, SizeOneDimsNeedNoAlignedStride) {
  Sizes s;
  s.seq_q = 1;  // decode: o.stride[2] is never used
  Call call(s);
  ForwardParams p = call.params();
  p.q.stride[2] = 3;
  p.o.stride[2] = 5;
  EXPECT_TRUE(accepted(p));
}

// --- one status code at a time ----------------------------------------------------

TEST(Validation, NullPointer) {
  Call call;
  for (auto [field, name] : {std::pair{&ForwardParams::q, "q.data is null"},
                             std::pair{&ForwardParams::k, "k.data is null"},
                             std::pair{&ForwardParams::v, "v.data is null"},
                             std::pair{&ForwardParams::o, "o.data is null"}}) {
    ForwardParams p = call.params();
    (p.*field).data = nullptr;
    EXPECT_TRUE(rejected(call, p, StatusCode::null_pointer, {name}));
  }
  ForwardParams p = call.params();
  p.workspace_bytes = 1024;
  EXPECT_TRUE(rejected(call, p, StatusCode::null_pointer, {"workspace", "1024"}));
}

TEST(Validation, InvalidRank) {
  Call call;
  ForwardParams p = call.params();
  p.q.rank = 3;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_rank, {"q.rank = 3", "expected 4"}));
  p = call.params();
  p.o.rank = 5;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_rank, {"o.rank = 5"}));
  p = call.params();
  p.mask.rank = 2;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_rank, {"mask.rank = 2"}));
  p = call.params();
  p.lse.rank = 4;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_rank, {"lse.rank = 4", "expected 3"}));
  // A zero-initialized Tensor has rank 0.
  p = call.params();
  p.v = Tensor{};
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_rank, {"v.rank = 0"}));
}

TEST(Validation, UnsupportedDtype) {
  Call call;
  ForwardParams p = call.params();
  p.q.dtype = p.k.dtype = p.v.dtype = p.o.dtype = static_cast<DType>(12);
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"q.dtype = unknown (12)"}));
  p = call.params();
  p.q.dtype = p.k.dtype = p.v.dtype = p.o.dtype = DType::i32;
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"q.dtype = i32"}));
  p = call.params();
  p.q.dtype = p.k.dtype = p.v.dtype = p.o.dtype = DType::e4m3;  // e4m3 is for k and v beside 16-bit q
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"q.dtype = e4m3"}));
  p = call.params();
  p.mask.dtype = static_cast<DType>(9);
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"mask.dtype", "9"}));
  p = call.params();
  p.lse.dtype = DType::bf16;
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_dtype, {"lse.dtype = bf16"}));
}

// f32 and f64 inputs pass validation (the CPU reference serves them; the
// planner refuses them to the GPU families: test_dispatch.cpp); their strides
// keep the 16-byte rule in their own elements.
TEST(Validation, WideDtypesAreValidWithSixteenByteStrides) {
  for (DType dtype : {DType::f32, DType::f64}) {
    const int64_t d = 8;
    HostTensor q = make_host_tensor(dtype, {1, 2, 3, d}), k = make_host_tensor(dtype, {1, 2, 5, d}),
               v = make_host_tensor(dtype, {1, 2, 5, d}), o = make_host_tensor(dtype, {1, 2, 3, d}),
               mask = make_host_tensor(DType::f64, {1, 1, 3, 5});
    ForwardParams p;
    p.q = q.tensor, p.k = k.tensor, p.v = v.tensor, p.o = o.tensor, p.mask = mask.tensor;
    AttentionProblem problem;
    EXPECT_TRUE(accepted(p, &problem));
    EXPECT_EQ(problem.dtype, dtype);
    EXPECT_EQ(problem.mask_kind, ffpa::detail::MaskKind::additive_f64);
    p.q.stride[2] = d + 16 / static_cast<int64_t>(ffpa::testing::dtype_size(dtype));  // 16 bytes more: fine
    EXPECT_TRUE(accepted(p));
    p.q.stride[2] = d + 1;
    const Status status = ffpa::detail::validate_forward(p, &problem);
    EXPECT_EQ(status.code, StatusCode::misaligned) << status.message;
    EXPECT_NE(status.message.find(dtype == DType::f32 ? "multiple of 4 elements" : "multiple of 2 elements"),
              std::string::npos)
        << status.message;
  }
}

TEST(Validation, DtypeMismatch) {
  Call call;  // bf16
  ForwardParams p = call.params();
  p.k.dtype = DType::f16;
  EXPECT_TRUE(
      rejected(call, p, StatusCode::dtype_mismatch, {"k.dtype = f16 differs from q.dtype = bf16"}));
  p = call.params();
  p.o.dtype = DType::f32;
  EXPECT_TRUE(rejected(call, p, StatusCode::dtype_mismatch, {"o.dtype = f32"}));
}

TEST(Validation, ShapeMismatch) {
  Sizes s;
  s.head_dim = 128;
  Call call(s);
  struct Case {
    ffpa::Tensor ForwardParams::*field;
    int dim;
    const char* message;
  };
  const Case cases[] = {
      {&ForwardParams::v, 0, "v.shape[0] (B) = 3 differs from q.shape[0] = 2"},
      {&ForwardParams::o, 1, "o.shape[1] (Hq) = 5 differs from q.shape[1] = 4"},
      {&ForwardParams::v, 1, "v.shape[1] (Hkv) = 3 differs from k.shape[1] = 2"},
      {&ForwardParams::o, 2, "o.shape[2] (Nq) = 6 differs from q.shape[2] = 5"},
      {&ForwardParams::v, 2, "v.shape[2] (Nkv) = 8 differs from k.shape[2] = 7"},
      {&ForwardParams::o, 3, "o.shape[3] (Dv) = 129 differs from v.shape[3] = 128"},
      {&ForwardParams::lse, 2, "lse.shape[2] (Nq) = 6 differs from q.shape[2] = 5"},
  };
  for (const Case& c : cases) {
    ForwardParams p = call.params();
    ++(p.*c.field).shape[c.dim];
    EXPECT_TRUE(rejected(call, p, StatusCode::shape_mismatch, {c.message}));
  }
  ForwardParams p = call.params();
  p.k.shape[3] = 96;
  EXPECT_TRUE(rejected(call, p, StatusCode::shape_mismatch,
                       {"k.shape[3] (D) = 96 differs from q.shape[3] = 128"}));
}

// Dv may differ from D (D_qk != D_v); o must have v's, and Dv is checked
// like D. (value_head_dim_mismatch is no longer returned.)
TEST(Validation, ValueHeadDimMayDifferFromTheQueryKeyHeadDim) {
  Sizes s;
  s.head_dim = 128;
  Call call(s);
  HostTensor v = make_host_tensor(DType::bf16, {s.batch, s.heads_kv, s.seq_kv, 64});
  HostTensor o = make_host_tensor(DType::bf16, {s.batch, s.heads_q, s.seq_q, 64});
  ForwardParams p = call.params();
  p.v = v.tensor;
  p.o = o.tensor;
  ffpa::detail::AttentionProblem problem;
  ASSERT_TRUE(ffpa::detail::validate_forward(p, &problem).ok());
  EXPECT_EQ(problem.head_dim, 128);
  EXPECT_EQ(problem.dv(), 64);
  p.o = call.params().o;  // o with D = 128 columns against v's 64
  EXPECT_TRUE(rejected(call, p, StatusCode::shape_mismatch, {"o.shape[3] (Dv) = 128", "v.shape[3] = 64"}));
  HostTensor v12 = make_host_tensor(DType::bf16, {s.batch, s.heads_kv, s.seq_kv, 12});
  HostTensor o12 = make_host_tensor(DType::bf16, {s.batch, s.heads_q, s.seq_q, 12});
  p.v = v12.tensor;
  p.o = o12.tensor;
  EXPECT_TRUE(rejected(call, p, StatusCode::unsupported_head_dim, {"v.shape[3] (Dv) = 12"}));
}

TEST(Validation, UnsupportedHeadDim) {
  for (int64_t d : {0, 4, 12, 1028, 1032, 2048}) {
    Sizes s;
    s.head_dim = d;
    Call call(s);
    const std::string expected = "q.shape[3] (D) = " + std::to_string(d);
    EXPECT_TRUE(
        rejected(call, call.params(), StatusCode::unsupported_head_dim, {expected.c_str()}));
  }
  for (int64_t d : {8, 40, 1016, 1024}) {
    Sizes s;
    s.head_dim = d;
    Call call(s);
    EXPECT_TRUE(accepted(call.params())) << d;
  }
}

TEST(Validation, InvalidGqaRatio) {
  Sizes s;
  s.heads_q = 6;
  s.heads_kv = 4;
  Call call(s);
  EXPECT_TRUE(rejected(call, call.params(), StatusCode::invalid_gqa_ratio,
                       {"q.shape[1] (Hq) = 6", "k.shape[1] (Hkv) = 4"}));
  s.heads_kv = 0;
  Call no_kv_heads(s);
  EXPECT_TRUE(rejected(no_kv_heads, no_kv_heads.params(), StatusCode::invalid_gqa_ratio,
                       {"k.shape[1] (Hkv) = 0"}));
}

TEST(Validation, NoncontiguousLastDim) {
  Call call;
  for (auto [field, name] : {std::pair{&ForwardParams::q, "q.stride[3] = 2"},
                             std::pair{&ForwardParams::k, "k.stride[3] = 2"},
                             std::pair{&ForwardParams::v, "v.stride[3] = 2"},
                             std::pair{&ForwardParams::o, "o.stride[3] = 2"}}) {
    ForwardParams p = call.params();
    (p.*field).stride[3] = 2;
    EXPECT_TRUE(rejected(call, p, StatusCode::noncontiguous_last_dim, {name}));
  }
}

TEST(Validation, Misaligned) {
  Sizes s;
  Call call(s);
  ForwardParams p = call.params();
  p.k.data = offset_pointer(p.k, 2);
  EXPECT_TRUE(rejected(call, p, StatusCode::misaligned, {"k.data", "16-byte"}));
  p = call.params();
  p.o.data = offset_pointer(p.o, 8);
  EXPECT_TRUE(rejected(call, p, StatusCode::misaligned, {"o.data", "16-byte"}));

  // Rows padded by 4 elements: 8 bytes, not 16.
  HostTensor padded = make_host_tensor(DType::bf16, {s.batch, s.heads_q, s.seq_q, s.head_dim + 4});
  padded.tensor.shape[3] = s.head_dim;
  p = call.params();
  p.q = padded.tensor;
  EXPECT_TRUE(rejected(call, p, StatusCode::misaligned, {"q.stride[1] = 340", "multiple of 8"}));
  p.q.shape[1] = 1;  // the h stride no longer matters; the n stride does
  p.o.shape[1] = p.lse.shape[1] = 1;
  p.k.shape[1] = p.v.shape[1] = 1;
  EXPECT_TRUE(rejected(call, p, StatusCode::misaligned, {"q.stride[2] = 68", "multiple of 8"}));

  p = call.params();
  p.lse.data = offset_pointer(p.lse, 2);
  EXPECT_TRUE(rejected(call, p, StatusCode::misaligned, {"lse.data", "4-byte"}));

  HostTensor mask = make_host_tensor(DType::f32, {1, 1, 1, s.seq_kv + 1});
  mask.tensor.shape[3] = s.seq_kv;
  p = call.params();
  p.mask = mask.tensor;
  p.mask.data = offset_pointer(p.mask, 2);
  EXPECT_TRUE(rejected(call, p, StatusCode::misaligned, {"mask.data", "4-byte"}));
  p.mask.dtype = DType::f16;  // the same pointer is fine for 2-byte elements
  EXPECT_TRUE(accepted(p));
}

TEST(Validation, InvalidStrideNegative) {
  Call call;
  ForwardParams p = call.params();
  p.k.stride[0] = -p.k.stride[0];
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"k.stride[0]", "negative"}));
  p = call.params();
  p.lse.stride[1] = -1;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"lse.stride[1] = -1", "negative"}));
}

TEST(Validation, InvalidStrideOutputAliasesItself) {
  Sizes s;
  Call call(s);
  ForwardParams p = call.params();
  p.o.stride[1] = 0;  // every head writes the same rows
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"o.stride", "alias"}));
  p = call.params();
  p.o.stride[2] = 8;  // rows of 64 elements, 8 apart
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"o.stride", "alias"}));
  p = call.params();
  p.lse.stride[2] = 0;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"lse.stride", "alias"}));
  // Inputs may alias themselves (a broadcast k is fine).
  p = call.params();
  p.k.stride[0] = 0;
  EXPECT_TRUE(accepted(p));
}

TEST(Validation, InterleavedOutputRowsAreDecidedExactly) {
  // D = 8, rows n at 16 * n and heads h at 24 * h: rows {0,16,32} and {24,40,56}
  // interleave without overlap; the sorted strides do not nest.
  Sizes s{1, 2, 1, 3, 4, 8};
  Call call(s);
  HostTensor o_buffer = make_host_tensor(DType::bf16, {1, 1, 1, 64});
  ForwardParams p = call.params();
  p.o.data = o_buffer.tensor.data;
  p.o.stride[0] = 64;
  p.o.stride[1] = 24;
  p.o.stride[2] = 16;
  EXPECT_TRUE(accepted(p));
  p.o.stride[1] = 32;  // head 1 row 0 == head 0 row 2
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"o.stride = [64, 32, 16, 1]"}));
  p.o.stride[1] = 36;  // head 1 row 0 starts 4 elements into head 0 row 2
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"o.stride = [64, 36, 16, 1]"}));
}

TEST(Validation, InvalidStrideWhenAliasingCannotBeDecided) {
  // 4096^3 rows of 8 elements whose three strides are near-equal (2^26 rows
  // apart, offset by the primes 4099 and 4111): no two elements meet, but
  // every assignment of the search's roles needs over 2^24 steps, so the
  // layout is rejected rather than trusted.
  Sizes s{1, 1, 1, 1, 1, 8};
  Call call(s);
  ForwardParams p = call.params();
  p.lse = {};
  p.mask = {};
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.o}) {
    t->shape[0] = t->shape[1] = t->shape[2] = 4096;
    t->stride[0] = int64_t{8} << 26;
    t->stride[1] = 8 * ((int64_t{1} << 26) + 4099);
    t->stride[2] = 8 * ((int64_t{1} << 26) + 4111);
  }
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"o.stride", "prove"}));
  // n and h strides of 16 and 24 elements interleave rows that do meet
  // (h = 2, n = 0 and h = 0, n = 3): found, not undecided.
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.o}) {
    t->stride[0] = int64_t{1} << 30;
    t->stride[1] = 24;
    t->stride[2] = 16;
  }
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"o.stride", "same memory"}));
}

TEST(Validation, InvalidStrideExtentOverflow) {
  Call call;
  ForwardParams p = call.params();
  p.q.stride[0] = int64_t{1} << 62;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_stride, {"q.stride", "spans"}));
}

TEST(Validation, InvalidMaskLayout) {
  Sizes s;
  Call call(s);
  HostTensor mask = make_host_tensor(DType::boolean, {s.batch, 1, 3, s.seq_kv});
  ForwardParams p = call.params();
  p.mask = mask.tensor;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_mask_layout, {"mask.shape[2] = 3", "Nq = 5"}));
  p = call.params();
  p.mask.stride[2] = -p.mask.stride[2];
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_mask_layout, {"mask.stride[2]", "negative"}));
  p = call.params();
  p.mask.stride[1] = -1;  // negative even on a size-1 dim
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_mask_layout, {"mask.stride[1] = -1"}));
}

TEST(Validation, InvalidDropout) {
  Call call;
  for (float p_drop : {1.0f, -0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity()}) {
    ForwardParams p = call.params();
    p.options.dropout_p = p_drop;
    EXPECT_TRUE(rejected(call, p, StatusCode::invalid_dropout, {"options.dropout_p"}));
  }
  ForwardParams p = call.params();
  p.options.dropout_p = std::nextafter(1.0f, 0.0f);
  EXPECT_TRUE(accepted(p));
}

TEST(Validation, UnsupportedAccumulation) {
  Call bf16_call(Sizes{}, DType::bf16);
  ForwardParams p = bf16_call.params();
  p.options.accumulation = ffpa::Accumulation::f16;
  EXPECT_TRUE(rejected(bf16_call, p, StatusCode::unsupported_accumulation,
                       {"options.accumulation", "bf16"}));
  Call f16_call(Sizes{}, DType::f16);
  p = f16_call.params();
  p.options.accumulation = ffpa::Accumulation::f16;
  EXPECT_TRUE(accepted(p));
}

TEST(Validation, OutputOverlapsInput) {
  Sizes s;
  Call call(s);
  ForwardParams p = call.params();
  p.o.data = p.q.data;  // in place
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"o (bytes", "overlaps q"}));
  // v at the start of one buffer, o 64 bytes further: o overlaps only v.
  HostTensor arena =
      make_host_tensor(DType::bf16, {1, 1, 1, static_cast<int64_t>(call.o.numel()) + 32});
  p = call.params();
  p.v.data = arena.tensor.data;
  p.o.data = offset_pointer(p.v, 64);
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"overlaps v"}));
  p = call.params();
  p.lse.data = p.k.data;
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"lse (bytes", "overlaps k"}));
  HostTensor mask = make_host_tensor(DType::f32, {s.batch, 1, s.seq_q, s.seq_kv});  // >= lse bytes
  p = call.params();
  p.mask = mask.tensor;
  p.lse.data = p.mask.data;
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"overlaps mask"}));
  p = call.params();
  p.lse.data = offset_pointer(p.o, 16);
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"o (bytes", "overlaps lse"}));

  // o and lse side by side in one buffer, touching but not overlapping.
  const int64_t o_bytes = static_cast<int64_t>(call.o.bytes());
  HostTensor both =
      make_host_tensor(DType::f32, {1, 1, 1, o_bytes / 4 + static_cast<int64_t>(call.lse.numel())});
  p = call.params();
  p.o.data = both.tensor.data;
  p.lse.data = offset_pointer(p.o, o_bytes);
  EXPECT_TRUE(accepted(p));

  // A one-byte boolean mask sharing exactly o's last byte, or o's first byte.
  HostTensor arena2 =
      make_host_tensor(DType::bf16, {1, 1, 1, static_cast<int64_t>(call.o.numel()) + 16});
  HostTensor one = make_host_tensor(DType::boolean, {1, 1, 1, 1});
  p = call.params();
  p.o.data = offset_pointer(arena2.tensor, 16);
  p.mask = one.tensor;
  p.mask.data = offset_pointer(p.o, o_bytes - 1);
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"overlaps mask"}));
  p.mask.data = p.o.data;
  EXPECT_TRUE(rejected(call, p, StatusCode::output_overlaps_input, {"overlaps mask"}));
  p.mask.data = offset_pointer(p.o, o_bytes);
  EXPECT_TRUE(accepted(p));
  p.mask.data = offset_pointer(p.o, -1);
  EXPECT_TRUE(accepted(p));
}

TEST(Validation, InvalidOption) {
  Call call;
  ForwardParams p = call.params();
  p.options.causal = static_cast<ffpa::Causal>(3);
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"options.causal = 3"}));
  p = call.params();
  p.options.accumulation = static_cast<ffpa::Accumulation>(-1);
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"options.accumulation = -1"}));
  p = call.params();
  p.options.impl = static_cast<ffpa::Impl>(42);
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"options.impl = 42"}));
  for (float scale :
       {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    p = call.params();
    p.options.scale = scale;
    EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"options.scale", "not finite"}));
  }
  p = call.params();
  p.v.shape[2] = -7;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"v.shape[2] = -7", "negative"}));
  p = call.params();
  p.mask.shape[0] = -1;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"mask.shape[0] = -1"}));
  p = call.params();
  p.q.shape[0] = p.q.shape[1] = p.q.shape[2] = int64_t{1} << 30;
  EXPECT_TRUE(rejected(call, p, StatusCode::invalid_option, {"q.shape", "2^63 elements"}));
}

// --- through the public entry point (needs the full library) -------------------------

TEST(ForwardRejects, BeforeWritingAnything) {
  Sizes s;
  s.head_dim = 128;
  Call call(s);
  struct Case {
    const char* what;
    void (*spoil)(ForwardParams&);
    StatusCode code;
  };
  const Case cases[] = {
      {"k.shape[3]", [](ForwardParams& p) { p.k.shape[3] = 96; }, StatusCode::shape_mismatch},
      {"q.data", [](ForwardParams& p) { p.q.data = static_cast<char*>(p.q.data) + 2; },
       StatusCode::misaligned},
      {"overlaps q", [](ForwardParams& p) { p.o.data = p.q.data; },
       StatusCode::output_overlaps_input},
      {"options.dropout_p", [](ForwardParams& p) { p.options.dropout_p = 1.0f; },
       StatusCode::invalid_dropout},
      {"mask.shape[3]", [](ForwardParams& p) { p.mask.shape[3] = 3; },
       StatusCode::invalid_mask_layout},
      {"options.impl", [](ForwardParams& p) { p.options.impl = static_cast<ffpa::Impl>(7); },
       StatusCode::invalid_option},
  };
  for (const Case& c : cases) {
    ForwardParams p = call.params();
    c.spoil(p);
    const Status status = ffpa::forward(p);
    EXPECT_EQ(status.code, c.code) << c.what << ": " << status.message;
    EXPECT_NE(status.message.find(c.what), std::string::npos) << status.message;
    EXPECT_TRUE(call.outputs_untouched()) << c.what;
  }
}

}  // namespace
