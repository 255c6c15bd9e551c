// Split-KV's combine kernel (kernels/split_kv/combine.cu) on the GPU against
// the same merge on the host (kernels/common/split_kv.hpp): random partial
// rows, including splits a row does not attend, rows with no attended split,
// NaN states and O elements, 1 to 128 splits, head dims from 40 to 1000,
// dropout's scale, LSE.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/float16_bits.hpp"
#include "gpu/device_tensor.hpp"
#include "kernels/common/split_kv.hpp"
#include "kernels/split_kv/combine.hpp"

namespace {

using namespace ffpa;
using namespace ffpa::detail;
using ffpa::testing::DeviceBuffer;

struct CombineCase {
  DType dtype;
  int64_t batch, heads, seq_q, dim;
  int splits;
  bool dropout;
};

std::string case_name(const CombineCase& c) {
  return std::string(c.dtype == DType::bf16 ? "bf16" : "f16") + "_b" + std::to_string(c.batch) + "h" +
         std::to_string(c.heads) + "q" + std::to_string(c.seq_q) + "d" + std::to_string(c.dim) + "_s" +
         std::to_string(c.splits) + (c.dropout ? "_dropout" : "");
}

class SplitKvCombine : public ::testing::TestWithParam<CombineCase> {};

TEST_P(SplitKvCombine, MatchesTheHostMerge) {
  if (ffpa::testing::gpu_unavailable_reason()) GTEST_SKIP() << *ffpa::testing::gpu_unavailable_reason();
  const CombineCase c = GetParam();
  const int64_t rows = c.batch * c.heads * c.seq_q;
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + c.dim * 7 + c.splits));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  // Partials: split s of row r attends nothing with probability 1/4 (max -inf,
  // sum 0, O 0); row 0 attends no split at all.
  std::vector<RowSoftmaxState> states(static_cast<size_t>(c.splits * rows));
  std::vector<float> o(static_cast<size_t>(c.splits * rows * c.dim), 0.0f);
  for (int s = 0; s < c.splits; ++s)
    for (int64_t r = 0; r < rows; ++r) {
      RowSoftmaxState& state = states[static_cast<size_t>(s * rows + r)];
      if (r == 0 || rng() % 4 == 0) continue;
      state = {100.0f * (unit(rng) - 0.5f), 1.0f + 100.0f * unit(rng)};
      for (int64_t d = 0; d < c.dim; ++d) o[static_cast<size_t>((s * rows + r) * c.dim + d)] = state.sum * (2.0f * unit(rng) - 1.0f);
    }
  // NaN partials (spec.md, "Non-finite inputs"): row 0 attends nothing, and
  // stays 0 with a NaN in a split's O; row 1's split 0 has a NaN sum (a NaN
  // score): the whole row is NaN; row 2's last split attends nothing but holds
  // a NaN in column 3 (a key's NaN V times P = 0): that column is NaN.
  auto o_at = [&](int s, int64_t r, int64_t d) -> float& { return o[static_cast<size_t>((s * rows + r) * c.dim + d)]; };
  const float nan = std::nanf("");
  o_at(0, 0, 1) = nan;
  if (rows > 2 && c.splits > 1) {
    states[static_cast<size_t>(1)] = {5.0f, nan};
    states[static_cast<size_t>(2)] = {1.0f, 2.0f};
    states[static_cast<size_t>((c.splits - 1) * rows + 2)] = {-INFINITY, 0.0f};
    for (int64_t d = 0; d < c.dim; ++d) o_at(c.splits - 1, 2, d) = 0.0f;
    o_at(c.splits - 1, 2, 3) = nan;
  }
  AttentionProblem p;
  p.batch = c.batch, p.heads_q = p.heads_kv = c.heads, p.seq_q = c.seq_q, p.seq_kv = 1, p.head_dim = c.dim;
  p.dtype = c.dtype;
  p.o_stride[2] = c.dim, p.o_stride[1] = c.seq_q * c.dim, p.o_stride[0] = c.heads * c.seq_q * c.dim;
  p.lse_stride[2] = 1, p.lse_stride[1] = c.seq_q, p.lse_stride[0] = c.heads * c.seq_q;
  if (c.dropout) p.dropout_p = 0.25f, p.dropout_scale = 1.0f / 0.75f;
  DeviceBuffer d_states, d_o, d_out, d_lse;
  ASSERT_NO_FATAL_FAILURE(d_states.allocate(states.size() * sizeof(RowSoftmaxState)));
  ASSERT_NO_FATAL_FAILURE(d_o.allocate(o.size() * sizeof(float)));
  ASSERT_NO_FATAL_FAILURE(d_out.allocate(static_cast<size_t>(rows * c.dim) * 2));
  ASSERT_NO_FATAL_FAILURE(d_lse.allocate(static_cast<size_t>(rows) * sizeof(float)));
  FFPA_ASSERT_CUDA(cudaMemcpy(d_states.data(), states.data(), d_states.bytes(), cudaMemcpyHostToDevice));
  FFPA_ASSERT_CUDA(cudaMemcpy(d_o.data(), o.data(), d_o.bytes(), cudaMemcpyHostToDevice));
  FFPA_ASSERT_CUDA(cudaMemset(d_out.data(), 0xFF, d_out.bytes()));  // poisoned: NaN in both dtypes
  p.o = d_out.data();
  p.lse = static_cast<float*>(d_lse.data());
  split_kv::Partials partials;
  partials.o = static_cast<const float*>(d_o.data());
  partials.states = static_cast<const RowSoftmaxState*>(d_states.data());
  partials.splits = c.splits;
  const Status status = split_kv::launch_combine(p, partials, /*programmatic=*/false, nullptr);
  ASSERT_TRUE(status.ok()) << status.message;
  FFPA_ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> out(static_cast<size_t>(rows * c.dim));
  std::vector<float> lse(static_cast<size_t>(rows));
  FFPA_ASSERT_CUDA(cudaMemcpy(out.data(), d_out.data(), d_out.bytes(), cudaMemcpyDeviceToHost));
  FFPA_ASSERT_CUDA(cudaMemcpy(lse.data(), d_lse.data(), d_lse.bytes(), cudaMemcpyDeviceToHost));
  const float keep_scale = c.dropout ? p.dropout_scale : 1.0f;
  const double tolerance = c.dtype == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;  // the output dtype's rounding
  for (int64_t r = 0; r < rows; ++r) {
    const RowSoftmaxState merged = merge_split_states(states.data() + r, rows, c.splits);
    const float expected_lse = log_sum_exp(merged);
    SCOPED_TRACE("row " + std::to_string(r));
    if (std::isnan(expected_lse)) {
      EXPECT_TRUE(std::isnan(lse[static_cast<size_t>(r)]));
    } else if (expected_lse == -INFINITY) {
      EXPECT_EQ(lse[static_cast<size_t>(r)], -INFINITY);
    } else {
      EXPECT_NEAR(lse[static_cast<size_t>(r)], expected_lse, 1e-5 * std::max(1.0f, std::fabs(expected_lse)));
    }
    for (int64_t d = 0; d < c.dim; ++d) {
      double expected = 0.0;
      for (int s = 0; s < c.splits; ++s) {
        const size_t at = static_cast<size_t>(s * rows + r);
        expected += static_cast<double>(o[at * c.dim + d]) * split_weight(states[at], merged) * keep_scale;
      }
      expected = combined_output(expected, merged);
      const uint16_t bits = out[static_cast<size_t>(r * c.dim + d)];
      const double got = c.dtype == DType::bf16 ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(got)) << "column " << d;
      } else {
        ASSERT_NEAR(got, expected, tolerance * std::max(1.0, std::fabs(expected))) << "column " << d;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SplitKvCombine,
                         ::testing::Values(CombineCase{DType::bf16, 1, 32, 1, 512, 4, false},
                                           CombineCase{DType::f16, 2, 3, 5, 40, 7, false},
                                           CombineCase{DType::bf16, 2, 8, 4, 1000, 33, true},
                                           CombineCase{DType::f16, 1, 2, 16, 72, 128, false},
                                           CombineCase{DType::bf16, 3, 1, 7, 1024, 1, false}),
                         [](const ::testing::TestParamInfo<CombineCase>& info) { return case_name(info.param); });

}  // namespace
