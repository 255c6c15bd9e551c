// Layout normalization: [B, H, N, D] and [B, N, H, D] buffers (and padded
// rows, and broadcast masks) validate to problems whose strides address the
// same logical elements; GQA grouping and the causal shift of both alignments.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "host/validate.hpp"
#include "support/host_tensors.hpp"

namespace {

using ffpa::DType;
using ffpa::ForwardParams;
using ffpa::detail::AttentionProblem;
using ffpa::testing::dtype_size;
using ffpa::testing::HostTensor;
using ffpa::testing::Layout;
using ffpa::testing::make_host_tensor;
using Index = std::array<int64_t, 4>;

struct Sizes {
  int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim;
};

struct Tensors {
  HostTensor q, k, v, o;
};

Tensors make_tensors(const Sizes& s, DType dtype, Layout q_layout, Layout kv_layout,
                     Layout o_layout) {
  return {make_host_tensor(dtype, {s.batch, s.heads_q, s.seq_q, s.head_dim}, q_layout),
          make_host_tensor(dtype, {s.batch, s.heads_kv, s.seq_kv, s.head_dim}, kv_layout),
          make_host_tensor(dtype, {s.batch, s.heads_kv, s.seq_kv, s.head_dim}, kv_layout),
          make_host_tensor(dtype, {s.batch, s.heads_q, s.seq_q, s.head_dim}, o_layout)};
}

ForwardParams params_of(const Tensors& t) {
  ForwardParams p;
  p.q = t.q.tensor;
  p.k = t.k.tensor;
  p.v = t.v.tensor;
  p.o = t.o.tensor;
  return p;
}

AttentionProblem validated(const ForwardParams& p) {
  AttentionProblem problem;
  const ffpa::Status status = ffpa::detail::validate_forward(p, &problem);
  EXPECT_TRUE(status.ok()) << ffpa::status_name(status.code) << ": " << status.message;
  return problem;
}

// The address the problem's strides give to element (b, h, n, d).
const unsigned char* address(const void* base, const int64_t (&stride)[3], const Index& i,
                             int64_t element_bytes) {
  const int64_t offset = i[0] * stride[0] + i[1] * stride[1] + i[2] * stride[2] + i[3];
  return static_cast<const unsigned char*>(base) + offset * element_bytes;
}

// The address of logical element (b, h, n, d) in a dense buffer of the layout,
// computed from the layout's definition rather than from strides.
const unsigned char* dense_address(const HostTensor& t, Layout layout, const Index& i) {
  const int64_t* s = t.tensor.shape;  // logical [B, H, N, D]
  const int64_t offset = layout == Layout::bhnd
                             ? ((i[0] * s[1] + i[1]) * s[2] + i[2]) * s[3] + i[3]
                             : ((i[0] * s[2] + i[2]) * s[1] + i[1]) * s[3] + i[3];
  return static_cast<const unsigned char*>(t.tensor.data) + offset * 2;
}

uint16_t load16(const unsigned char* p) {
  uint16_t value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

// Corners and random interior indices of [B, H, N, D].
std::vector<Index> sample_indices(const Index& shape, std::mt19937_64& rng, int count) {
  std::vector<Index> indices = {{0, 0, 0, 0},
                                {shape[0] - 1, shape[1] - 1, shape[2] - 1, shape[3] - 1},
                                {0, shape[1] - 1, 0, shape[3] - 1},
                                {shape[0] - 1, 0, shape[2] - 1, 0}};
  for (int c = 0; c < count; ++c) {
    Index i;
    for (int d = 0; d < 4; ++d) i[d] = std::uniform_int_distribution<int64_t>(0, shape[d] - 1)(rng);
    indices.push_back(i);
  }
  return indices;
}

// Copies every logical element of `from` into `to` (same logical shape).
void copy_logical(const HostTensor& from, const HostTensor& to) {
  const int64_t* s = from.tensor.shape;
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t n = 0; n < s[2]; ++n)
        for (int64_t d = 0; d < s[3]; ++d)
          ffpa::testing::set_element(to.tensor, {b, h, n, d},
                                     ffpa::testing::element_as_double(from.tensor, {b, h, n, d}));
}

TEST(Layouts, BhndAndBnhdAddressTheSameLogicalElements) {
  const Sizes s{3, 6, 2, 7, 11, 40};
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensors bhnd = make_tensors(s, dtype, Layout::bhnd, Layout::bhnd, Layout::bhnd);
    Tensors bnhd = make_tensors(s, dtype, Layout::bnhd, Layout::bnhd, Layout::bnhd);
    ffpa::testing::fill_uniform(bhnd.q, seed, -2.0f, 2.0f);
    ffpa::testing::fill_uniform(bhnd.k, seed + 1, -2.0f, 2.0f);
    ffpa::testing::fill_uniform(bhnd.v, seed + 2, -2.0f, 2.0f);
    copy_logical(bhnd.q, bnhd.q);
    copy_logical(bhnd.k, bnhd.k);
    copy_logical(bhnd.v, bnhd.v);
    const AttentionProblem a = validated(params_of(bhnd));
    const AttentionProblem b = validated(params_of(bnhd));

    const struct {
      const void *base_a, *base_b;
      const int64_t (&stride_a)[3];
      const int64_t (&stride_b)[3];
      const HostTensor &tensor_a, &tensor_b;
      bool input;
    } operands[] = {{a.q, b.q, a.q_stride, b.q_stride, bhnd.q, bnhd.q, true},
                    {a.k, b.k, a.k_stride, b.k_stride, bhnd.k, bnhd.k, true},
                    {a.v, b.v, a.v_stride, b.v_stride, bhnd.v, bnhd.v, true},
                    {a.o, b.o, a.o_stride, b.o_stride, bhnd.o, bnhd.o, false}};
    for (const auto& op : operands) {
      const int64_t* shape = op.tensor_a.tensor.shape;
      for (const Index& i : sample_indices({shape[0], shape[1], shape[2], shape[3]}, rng, 20)) {
        const unsigned char* in_a = address(op.base_a, op.stride_a, i, 2);
        const unsigned char* in_b = address(op.base_b, op.stride_b, i, 2);
        EXPECT_EQ(in_a, dense_address(op.tensor_a, Layout::bhnd, i));
        EXPECT_EQ(in_b, dense_address(op.tensor_b, Layout::bnhd, i));
        if (op.input) {
          EXPECT_EQ(load16(in_a), load16(in_b));  // same logical value
        }
      }
    }
  }
}

TEST(Layouts, MixedAndPaddedLayouts) {
  const Sizes s{2, 4, 4, 5, 9, 64};
  Tensors t = make_tensors(s, DType::bf16, Layout::bnhd, Layout::bhnd, Layout::bhnd);
  // o: rows padded to 72 elements inside a [B, N, H, 72] buffer.
  HostTensor padded =
      make_host_tensor(DType::bf16, {s.batch, s.heads_q, s.seq_q, 72}, Layout::bnhd);
  padded.tensor.shape[3] = s.head_dim;
  ForwardParams p = params_of(t);
  p.o = padded.tensor;
  const AttentionProblem problem = validated(p);
  EXPECT_EQ(problem.q_stride[0], s.seq_q * s.heads_q * s.head_dim);
  EXPECT_EQ(problem.q_stride[1], s.head_dim);
  EXPECT_EQ(problem.q_stride[2], s.heads_q * s.head_dim);
  EXPECT_EQ(problem.k_stride[0], s.heads_kv * s.seq_kv * s.head_dim);
  EXPECT_EQ(problem.k_stride[1], s.seq_kv * s.head_dim);
  EXPECT_EQ(problem.k_stride[2], s.head_dim);
  EXPECT_EQ(problem.o_stride[0], s.seq_q * s.heads_q * 72);
  EXPECT_EQ(problem.o_stride[1], 72);
  EXPECT_EQ(problem.o_stride[2], s.heads_q * 72);
  // The last logical element of o lies inside the padded buffer, before its padding.
  const Index last{s.batch - 1, s.heads_q - 1, s.seq_q - 1, s.head_dim - 1};
  const int64_t buffer_bytes = s.batch * s.seq_q * s.heads_q * 72 * 2;
  const unsigned char* end = static_cast<const unsigned char*>(padded.tensor.data) + buffer_bytes;
  EXPECT_EQ(address(problem.o, problem.o_stride, last, 2), end - 2 * (72 - s.head_dim) - 2);
}

TEST(Layouts, GqaGroupSize) {
  for (int64_t heads_kv : {8, 4, 2, 1}) {
    const Sizes s{1, 8, heads_kv, 3, 5, 32};
    Tensors t = make_tensors(s, DType::f16, Layout::bnhd, Layout::bnhd, Layout::bhnd);
    const AttentionProblem problem = validated(params_of(t));
    EXPECT_EQ(problem.group_size(), 8 / heads_kv);
    // Query head h reads kv head h / group_size: each kv head serves group_size heads.
    std::vector<int> served(static_cast<size_t>(heads_kv), 0);
    for (int64_t h = 0; h < problem.heads_q; ++h)
      ++served[static_cast<size_t>(h / problem.group_size())];
    for (int count : served) EXPECT_EQ(count, problem.group_size());
  }
}

TEST(Layouts, CausalShiftForBothAlignments) {
  const struct {
    int64_t seq_q, seq_kv;
    ffpa::Causal causal;
    int64_t shift;
  } cases[] = {{5, 9, ffpa::Causal::none, 0},          {5, 9, ffpa::Causal::top_left, 0},
               {5, 9, ffpa::Causal::bottom_right, 4},  {9, 5, ffpa::Causal::top_left, 0},
               {9, 5, ffpa::Causal::bottom_right, -4}, {7, 7, ffpa::Causal::bottom_right, 0},
               {1, 13, ffpa::Causal::bottom_right, 12}};
  for (const auto& c : cases) {
    const Sizes s{2, 2, 1, c.seq_q, c.seq_kv, 16};
    Tensors t = make_tensors(s, DType::bf16, Layout::bhnd, Layout::bnhd, Layout::bhnd);
    ForwardParams p = params_of(t);
    p.options.causal = c.causal;
    const AttentionProblem problem = validated(p);
    EXPECT_EQ(problem.causal, c.causal);
    EXPECT_EQ(problem.causal_shift(), c.shift) << c.seq_q << " x " << c.seq_kv;
  }
}

TEST(Layouts, MaskBroadcastShapesAddressTheBroadcastElement) {
  const Sizes s{3, 4, 2, 5, 6, 16};
  const Index full{s.batch, s.heads_q, s.seq_q, s.seq_kv};
  const Index mask_shapes[] = {{1, 1, 1, s.seq_kv},
                               {s.batch, 1, 1, s.seq_kv},
                               {s.batch, 1, s.seq_q, s.seq_kv},
                               {s.batch, s.heads_q, s.seq_q, s.seq_kv},
                               {1, s.heads_q, 1, 1}};
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(seed);
  std::mt19937_64 rng(seed);
  Tensors t = make_tensors(s, DType::f16, Layout::bhnd, Layout::bhnd, Layout::bhnd);
  for (const Index& shape : mask_shapes) {
    HostTensor mask = make_host_tensor(DType::f32, shape);
    ForwardParams p = params_of(t);
    p.mask = mask.tensor;
    const AttentionProblem problem = validated(p);
    for (int d = 0; d < 4; ++d) {
      const int64_t expected = shape[d] == 1 ? 0 : mask.tensor.stride[d];
      EXPECT_EQ(problem.mask_stride[d], expected) << "dim " << d;
    }
    for (const Index& i : sample_indices(full, rng, 20)) {
      const Index source{shape[0] == 1 ? 0 : i[0], shape[1] == 1 ? 0 : i[1],
                         shape[2] == 1 ? 0 : i[2], shape[3] == 1 ? 0 : i[3]};
      int64_t offset = 0;
      for (int d = 0; d < 4; ++d) offset += i[d] * problem.mask_stride[d];
      const auto* got = static_cast<const unsigned char*>(problem.mask) + 4 * offset;
      const auto* expected =
          static_cast<const unsigned char*>(mask.tensor.data) +
          4 * (((source[0] * shape[1] + source[1]) * shape[2] + source[2]) * shape[3] + source[3]);
      EXPECT_EQ(got, expected);
    }
  }
}

// The kernels read a mask a key pair per load only where every row starts on
// a pair boundary and keys are contiguous (AttentionProblem::mask_key_pairs).
TEST(Layouts, MaskKeyPairsOnlyForPairAlignedRows) {
  struct Case {
    Index shape;
    int64_t seq_kv;
    int64_t element_offset;  // of mask.data into its buffer
    bool pairs;
  } cases[] = {
      {{1, 1, 1, 6}, 6, 0, true},    // [1,1,1,Nkv]: one row
      {{3, 1, 1, 6}, 6, 0, true},    // batch stride 6
      {{3, 1, 2, 6}, 6, 0, true},    // row stride 6
      {{3, 1, 2, 5}, 5, 0, false},   // row stride 5: odd rows start mid-pair
      {{1, 1, 1, 5}, 5, 0, true},    // one row of odd length: the ragged tail is read by element
      {{1, 1, 1, 6}, 6, 1, false},   // data one element past a pair boundary
      {{1, 1, 2, 1}, 6, 0, false},   // broadcast over keys: stride 0, not contiguous
  };
  for (const Case& c : cases) {
    const Sizes s{3, 4, 2, 2, c.seq_kv, 16};
    Tensors t = make_tensors(s, DType::f16, Layout::bhnd, Layout::bhnd, Layout::bhnd);
    for (DType dtype : {DType::boolean, DType::f16, DType::f32}) {
      Index padded = c.shape;
      padded[3] += c.element_offset;
      HostTensor mask = make_host_tensor(dtype, padded);
      ForwardParams p = params_of(t);
      p.mask = mask.tensor;
      p.mask.shape[3] = c.shape[3];
      p.mask.data = static_cast<unsigned char*>(mask.tensor.data) +
                    c.element_offset * static_cast<int64_t>(dtype_size(dtype));
      const AttentionProblem problem = validated(p);
      EXPECT_EQ(problem.mask_key_pairs, c.pairs)
          << "shape [" << c.shape[0] << "," << c.shape[1] << "," << c.shape[2] << "," << c.shape[3]
          << "], offset " << c.element_offset << ", dtype " << static_cast<int>(dtype);
    }
  }
}

}  // namespace
