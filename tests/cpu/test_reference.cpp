// The CPU reference against a naive implementation written straight from the
// formula (single-threaded loops, double, no tricks), on fresh random inputs
// with odd sizes, every mask kind and broadcast pattern, both causal
// alignments, dropout, lse, both layouts, row subsets and thread counts.
// Outputs are poisoned with NaN before every run.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/attention_problem.hpp"
#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "reference/cpu_attention.hpp"
#include "support/host_tensors.hpp"
#include "support/nonfinite_expectation.hpp"

namespace ffpa {
namespace {

using detail::AttentionProblem;
using detail::MaskKind;
using detail::RowSubset;
using testing::HostTensor;
using testing::Layout;
using testing::set_problem_strides;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Case {
  int64_t batch = 2, heads_q = 4, heads_kv = 2, seq_q = 7, seq_kv = 33, dim = 24;
  DType dtype = DType::bf16;
  Layout layout = Layout::bhnd;
  MaskKind mask = MaskKind::none;
  // Dims of [B, Hq, Nq, Nkv] the mask broadcasts over: as size-1 dims, or
  // (broadcast_by_stride) as full-size dims with stride 0.
  std::array<bool, 4> mask_broadcast = {false, false, false, false};
  bool broadcast_by_stride = false;
  Causal causal = Causal::none;
  float dropout_p = 0.0f;
  uint64_t seed = 1;

  std::string describe() const {
    std::ostringstream s;
    s << "B=" << batch << " Hq=" << heads_q << " Hkv=" << heads_kv << " Nq=" << seq_q
      << " Nkv=" << seq_kv << " D=" << dim << " dtype=" << static_cast<int>(dtype)
      << " layout=" << (layout == Layout::bhnd ? "bhnd" : "bnhd")
      << " mask=" << static_cast<int>(mask) << " broadcast=" << mask_broadcast[0]
      << mask_broadcast[1] << mask_broadcast[2] << mask_broadcast[3]
      << (broadcast_by_stride ? " (stride 0)" : " (size 1)")
      << " causal=" << static_cast<int>(causal) << " p=" << dropout_p << " seed=" << seed;
    return s.str();
  }
};

DType mask_dtype(MaskKind kind) {
  switch (kind) {
    case MaskKind::additive_f16: return DType::f16;
    case MaskKind::additive_bf16: return DType::bf16;
    case MaskKind::additive_f32: return DType::f32;
    case MaskKind::additive_f64: return DType::f64;
    default: return DType::boolean;
  }
}

// Inputs of one case, and the problem describing them.
struct Inputs {
  HostTensor q, k, v, o, lse, mask;
  Tensor mask_view;  // the mask as the problem reads it
  AttentionProblem problem;
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  in.q = testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim}, c.layout);
  in.k = testing::make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, c.layout);
  in.v = testing::make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, c.layout);
  in.o = testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim}, c.layout);
  in.lse = testing::make_host_lse(c.batch, c.heads_q, c.seq_q);
  testing::fill_uniform(in.q, c.seed * 7 + 1, -2.0f, 2.0f);
  testing::fill_uniform(in.k, c.seed * 7 + 2, -2.0f, 2.0f);
  testing::fill_uniform(in.v, c.seed * 7 + 3, -1.0f, 1.0f);
  testing::fill_nan(in.o);
  testing::fill_nan(in.lse);

  AttentionProblem& p = in.problem;
  testing::set_problem_shape(p, c.batch, c.heads_q, c.heads_kv, c.seq_q, c.seq_kv, c.dim, c.dtype);
  testing::set_problem_qkv(p, in.q.tensor, in.k.tensor, in.v.tensor);
  p.o = in.o.tensor.data;
  set_problem_strides(in.o.tensor, p.o_stride);
  p.lse = static_cast<float*>(in.lse.tensor.data);
  set_problem_strides(in.lse.tensor, p.lse_stride);
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.dim)));
  p.causal = c.causal;
  p.dropout_p = c.dropout_p;
  p.dropout_threshold = detail::dropout_threshold(c.dropout_p);
  p.dropout_scale = c.dropout_p > 0.0f ? static_cast<float>(1.0 / (1.0 - static_cast<double>(c.dropout_p))) : 1.0f;
  p.dropout_seed = 0x9E3779B97F4A7C15ull * c.seed;
  p.dropout_offset = 0xD1B54A32D192ED03ull * (c.seed + 1);

  p.mask_kind = c.mask;
  if (c.mask != MaskKind::none) {
    std::array<int64_t, 4> shape = {c.batch, c.heads_q, c.seq_q, c.seq_kv};
    for (int d = 0; d < 4; ++d) {
      if (c.mask_broadcast[d] && !c.broadcast_by_stride) shape[d] = 1;
    }
    in.mask = testing::make_host_tensor(mask_dtype(c.mask), shape);
    if (c.mask == MaskKind::boolean) {
      testing::fill_bool(in.mask, c.seed * 7 + 4, 0.75);
    } else {
      testing::fill_uniform(in.mask, c.seed * 7 + 4, -3.0f, 3.0f);
      // About one element in six excludes its key.
      std::mt19937_64 rng(c.seed * 7 + 5);
      for (int64_t e = 0; e < in.mask.numel(); e += 1 + static_cast<int64_t>(rng() % 11)) {
        const int64_t j = e % shape[3], i = e / shape[3] % shape[2];
        const int64_t h = e / (shape[3] * shape[2]) % shape[1];
        testing::set_element(in.mask.tensor, {e / (shape[3] * shape[2] * shape[1]), h, i, j},
                             kNegInf);
      }
    }
    in.mask_view =
        c.broadcast_by_stride ? testing::broadcast_view(in.mask, c.mask_broadcast) : in.mask.tensor;
    p.mask = in.mask_view.data;
    for (int d = 0; d < 4; ++d) {
      p.mask_stride[d] = in.mask_view.shape[d] == 1 ? 0 : in.mask_view.stride[d];
    }
  }
  return in;
}

// Naive attention: out [B, Hq, Nq, D] and lse [B, Hq, Nq], straight from the formula.
struct Expected {
  std::vector<double> out, lse;
};

Expected naive_attention(const Inputs& in) {
  const AttentionProblem& p = in.problem;
  const int64_t B = p.batch, Hq = p.heads_q, Nq = p.seq_q, Nkv = p.seq_kv, D = p.head_dim;
  Expected e;
  e.out.assign(B * Hq * Nq * D, 0.0);
  e.lse.assign(B * Hq * Nq, kNegInf);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv_head = h / (p.heads_q / p.heads_kv);
      for (int64_t i = 0; i < Nq; ++i) {
        std::vector<double> score(Nkv);
        std::vector<bool> attend(Nkv);
        for (int64_t j = 0; j < Nkv; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            dot += testing::element_as_double(in.q.tensor, {b, h, i, d}) *
                   testing::element_as_double(in.k.tensor, {b, kv_head, j, d});
          }
          score[j] = static_cast<double>(p.scale) * dot;
          attend[j] = p.causal == Causal::none || (p.causal == Causal::top_left && j <= i) ||
                      (p.causal == Causal::bottom_right && j <= i + Nkv - Nq);
          if (p.mask_kind != MaskKind::none) {
            std::array<int64_t, 4> index = {b, h, i, j};
            for (int d = 0; d < 4; ++d) {
              if (in.mask_view.shape[d] == 1) index[d] = 0;
            }
            const double m = testing::element_as_double(in.mask_view, index);
            if (p.mask_kind == MaskKind::boolean) {
              attend[j] = attend[j] && m != 0.0;
            } else {
              score[j] += m;
            }
          }
          if (score[j] == kNegInf) attend[j] = false;
        }
        double max_score = kNegInf;
        for (int64_t j = 0; j < Nkv; ++j) {
          if (attend[j] && score[j] > max_score) max_score = score[j];
        }
        if (max_score == kNegInf) continue;  // no attended key: o = 0, lse = -inf
        double denominator = 0.0;
        for (int64_t j = 0; j < Nkv; ++j) {
          if (attend[j]) denominator += std::exp(score[j] - max_score);
        }
        const int64_t row = (b * Hq + h) * Nq + i;
        e.lse[row] = max_score + std::log(denominator);
        for (int64_t j = 0; j < Nkv; ++j) {
          if (!attend[j]) continue;
          double weight = std::exp(score[j] - max_score) / denominator;
          if (p.dropout_p > 0.0f) {
            const bool keep = detail::dropout_keep(p.dropout_seed, p.dropout_offset,
                                                   static_cast<uint64_t>(b * Hq + h), static_cast<uint64_t>(Nq),
                                                   static_cast<uint64_t>(Nkv), i, j, p.dropout_threshold);
            weight = keep ? weight * static_cast<double>(p.dropout_scale) : 0.0;
          }
          for (int64_t d = 0; d < D; ++d) {
            e.out[row * D + d] +=
                weight * testing::element_as_double(in.v.tensor, {b, kv_head, j, d});
          }
        }
      }
    }
  }
  return e;
}

double round_to(DType dtype, double x) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case DType::f16: return detail::half_bits_to_float(detail::float_to_half_bits(f));
    case DType::bf16: return detail::bf16_bits_to_float(detail::float_to_bf16_bits(f));
    case DType::f32: return f;
    default: return x;
  }
}

void expect_close(double got, double want, const char* what, int64_t index) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what << " " << index;
  } else {
    EXPECT_NEAR(got, want, 1e-11 * (1.0 + std::fabs(want))) << what << " " << index;
  }
}

// Runs both entry points on all rows and checks them against the naive
// implementation: fp64 outputs to 1e-11, the dtype outputs bit-exactly as the
// rounding of the fp64 ones, every element written. Returns the number of
// fully masked rows.
int64_t check_against_naive(const Case& c, int num_threads = 0) {
  SCOPED_TRACE(c.describe());
  Inputs in = make_inputs(c);
  const AttentionProblem& p = in.problem;
  const Expected want = naive_attention(in);

  std::vector<double> out(want.out.size(), std::nan("")), lse(want.lse.size(), std::nan(""));
  detail::cpu_attention_forward_f64(p, {}, out.data(), lse.data(), num_threads);
  detail::cpu_attention_forward(p, {}, num_threads);

  int64_t fully_masked = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q; ++i) {
        const int64_t row = (b * c.heads_q + h) * c.seq_q + i;
        expect_close(lse[row], want.lse[row], "lse", row);
        EXPECT_EQ(testing::element_as_double(in.lse.tensor, {b, h, i}),
                  static_cast<double>(static_cast<float>(lse[row])))
            << "lse " << row;
        if (want.lse[row] == kNegInf) ++fully_masked;
        for (int64_t d = 0; d < c.dim; ++d) {
          const int64_t e = row * c.dim + d;
          if (want.lse[row] == kNegInf) {
            EXPECT_EQ(out[e], 0.0) << "out " << e;
          } else {
            expect_close(out[e], want.out[e], "out", e);
          }
          EXPECT_EQ(testing::element_as_double(in.o.tensor, {b, h, i, d}),
                    round_to(c.dtype, out[e]))
              << "o " << e;
        }
      }
    }
  }
  return fully_masked;
}

TEST(CpuReference, SizesHeadDimsAndGqaRatios) {
  uint64_t seed = 100;
  for (const int64_t seq_q : {1, 7, 33}) {
    for (const int64_t seq_kv : {1, 7, 33}) {
      for (const int64_t dim : {8, 24, 64}) {
        for (const int64_t heads_kv : {4, 2, 1}) {
          Case c;
          c.seq_q = seq_q;
          c.seq_kv = seq_kv;
          c.dim = dim;
          c.heads_kv = heads_kv;
          c.dtype = seed % 2 ? DType::f16 : DType::bf16;
          c.layout = seed % 3 ? Layout::bhnd : Layout::bnhd;
          c.seed = ++seed;
          check_against_naive(c);
        }
      }
    }
  }
}

TEST(CpuReference, EveryMaskKindAndBroadcastPattern) {
  const std::array<bool, 4> patterns[] = {
      {true, true, true, false},     // [1, 1, 1, Nkv]
      {false, true, true, false},    // [B, 1, 1, Nkv]
      {false, true, false, false},   // [B, 1, Nq, Nkv]
      {false, false, false, false},  // [B, Hq, Nq, Nkv]
      {true, false, true, false},    // [1, Hq, 1, Nkv]
      {true, true, false, true},     // [1, 1, Nq, 1]
  };
  uint64_t seed = 1000;
  for (const MaskKind kind : {MaskKind::boolean, MaskKind::additive_f16, MaskKind::additive_bf16,
                              MaskKind::additive_f32}) {
    for (const auto& pattern : patterns) {
      for (const bool by_stride : {false, true}) {
        Case c;
        c.mask = kind;
        c.mask_broadcast = pattern;
        c.broadcast_by_stride = by_stride;
        c.dtype = seed % 2 ? DType::f16 : DType::bf16;
        c.seed = ++seed;
        check_against_naive(c);
      }
    }
  }
}

// f32 and f64 inputs (the CPU reference's own, for checks in double) and an
// f64 mask: the same results as the naive formula, f64 outputs exactly the
// fp64 accumulation.
TEST(CpuReference, WideDtypesAndAnF64Mask) {
  for (DType dtype : {DType::f32, DType::f64}) {
    for (Layout layout : {Layout::bhnd, Layout::bnhd}) {
      Case c;
      c.dtype = dtype, c.layout = layout, c.seq_q = 9, c.seq_kv = 19, c.dim = 40;
      c.mask = MaskKind::additive_f64, c.mask_broadcast = {false, true, false, false};
      c.causal = Causal::bottom_right, c.dropout_p = 0.25f;
      check_against_naive(c);
      c.mask = MaskKind::boolean, c.causal = Causal::none, c.dropout_p = 0.0f, c.seed = 3;
      check_against_naive(c);
    }
  }
}

TEST(CpuReference, CausalAlignments) {
  const std::array<int64_t, 2> shapes[] = {{7, 33}, {33, 7}, {7, 7}, {1, 33}, {33, 1}};
  uint64_t seed = 2000;
  for (const Causal causal : {Causal::top_left, Causal::bottom_right}) {
    for (const auto& shape : shapes) {
      for (const MaskKind mask : {MaskKind::none, MaskKind::boolean}) {
        Case c;
        c.causal = causal;
        c.seq_q = shape[0];
        c.seq_kv = shape[1];
        c.mask = mask;
        c.mask_broadcast = {false, true, false, false};
        c.seed = ++seed;
        const int64_t fully_masked = check_against_naive(c);
        if (causal == Causal::bottom_right && c.seq_q > c.seq_kv && mask == MaskKind::none) {
          // Rows i < Nq - Nkv see no key.
          EXPECT_EQ(fully_masked, c.batch * c.heads_q * (c.seq_q - c.seq_kv));
        }
      }
    }
  }
}

TEST(CpuReference, DropoutUsesTheSameKeepMask) {
  uint64_t seed = 3000;
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    for (const Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.dropout_p = p;
      c.causal = causal;
      c.seq_q = 33;
      c.mask = MaskKind::additive_f32;
      c.mask_broadcast = {false, true, true, false};
      c.seed = ++seed;
      check_against_naive(c);
    }
  }
}

TEST(CpuReference, DropoutChangesWithSeedAndOffset) {
  Case c;
  c.dropout_p = 0.5f;
  Inputs in = make_inputs(c);
  const size_t n = static_cast<size_t>(c.batch * c.heads_q * c.seq_q * c.dim);
  std::vector<double> base(n), other(n);
  detail::cpu_attention_forward_f64(in.problem, {}, base.data(), nullptr);
  for (const int field : {0, 1}) {
    AttentionProblem p = in.problem;
    (field == 0 ? p.dropout_seed : p.dropout_offset) += 1;
    detail::cpu_attention_forward_f64(p, {}, other.data(), nullptr);
    EXPECT_NE(base, other) << (field == 0 ? "seed" : "offset");
  }
}

TEST(CpuReference, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  for (const MaskKind kind : {MaskKind::boolean, MaskKind::additive_f16, MaskKind::additive_bf16,
                              MaskKind::additive_f32}) {
    Case c;
    c.mask = kind;
    c.seed = 4000 + static_cast<uint64_t>(kind);
    Inputs in = make_inputs(c);
    // Rows 0 and 5 of (b = 1, h = 2) exclude every key.
    const double exclude = kind == MaskKind::boolean ? 0.0 : kNegInf;
    for (const int64_t i : {0, 5}) {
      for (int64_t j = 0; j < c.seq_kv; ++j) {
        testing::set_element(in.mask.tensor, {1, 2, i, j}, exclude);
      }
    }
    detail::cpu_attention_forward(in.problem);
    const Expected want = naive_attention(in);
    for (int64_t b = 0; b < c.batch; ++b) {
      for (int64_t h = 0; h < c.heads_q; ++h) {
        for (int64_t i = 0; i < c.seq_q; ++i) {
          const bool masked = b == 1 && h == 2 && (i == 0 || i == 5);
          const double lse = testing::element_as_double(in.lse.tensor, {b, h, i});
          EXPECT_EQ(lse == kNegInf, masked) << b << " " << h << " " << i;
          EXPECT_EQ(want.lse[(b * c.heads_q + h) * c.seq_q + i] == kNegInf, masked);
          for (int64_t d = 0; d < c.dim; ++d) {
            const double o = testing::element_as_double(in.o.tensor, {b, h, i, d});
            EXPECT_FALSE(std::isnan(o));
            if (masked) {
              EXPECT_EQ(o, 0.0);
            }
          }
        }
      }
    }
  }
}

TEST(CpuReference, NoKeysMasksEveryRow) {
  Case c;
  c.seq_kv = 0;
  c.mask = MaskKind::boolean;
  EXPECT_EQ(check_against_naive(c), c.batch * c.heads_q * c.seq_q);
}

TEST(CpuReference, CustomScaleAndNoLse) {
  Case c;
  c.seed = 5000;
  Inputs in = make_inputs(c);
  in.problem.scale = 0.37f;
  in.problem.lse = nullptr;
  detail::cpu_attention_forward(in.problem);
  const Expected want = naive_attention(in);
  for (int64_t e = 0; e < in.lse.numel(); ++e) {
    EXPECT_TRUE(std::isnan(static_cast<float*>(in.lse.tensor.data)[e]));  // not requested
  }
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q; ++i) {
        for (int64_t d = 0; d < c.dim; ++d) {
          const double w = want.out[((b * c.heads_q + h) * c.seq_q + i) * c.dim + d];
          EXPECT_NEAR(testing::element_as_double(in.o.tensor, {b, h, i, d}), w,
                      std::fabs(w) / 128.0 + 1e-30);
        }
      }
    }
  }
}

// NaN inputs (spec.md, "Non-finite inputs"): a NaN in q row i reaches row i;
// in k row j every row with key j in its causal reach (masked or not: the
// mask is added, and NaN + -inf is NaN); in v (j, c) column c of those rows
// that attend any key; in the mask its row. A row that masking alone empties
// stays O = 0, LSE = -inf; everything else is bit-identical to the run without
// the NaNs. A q NaN in a row the boolean mask empties reaches it (NaN + -inf);
// a v NaN of a key the row does not attend reaches it where the row attends
// other keys (0 x NaN), not where masking empties it.
TEST(CpuReference, NanInputsReachTheRowsTheyTouch) {
  const double nan = std::nan("");
  int64_t nan_rows = 0;
  for (const Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
    for (const MaskKind kind : {MaskKind::none, MaskKind::boolean, MaskKind::additive_f32}) {
      for (const float dropout : {0.0f, 0.25f}) {
        Case c;
        c.causal = causal;
        c.mask = kind;
        c.dropout_p = dropout;
        c.seq_q = 9;
        c.seq_kv = 33;
        c.seed = 7000 + static_cast<uint64_t>(causal) * 10 + static_cast<uint64_t>(kind) * 2 + (dropout > 0);
        SCOPED_TRACE(c.describe());
        Inputs clean = make_inputs(c), in = make_inputs(c);
        testing::set_element(in.q.tensor, {1, 1, 2, 3}, nan);
        testing::set_element(in.k.tensor, {0, 1, 30, 5}, nan);  // bottom_right: rows 6.. reach key 30
        testing::set_element(in.v.tensor, {1, 0, 9, 7}, nan);
        if (kind != MaskKind::none) {
          // Row (0, 3, 6) masked whole, with a q NaN; row (1, 0, 5) masked
          // whole, with the v NaN among its keys; a mask NaN in row (0, 0, 4).
          for (Inputs* inputs : {&clean, &in}) {
            for (int64_t j = 0; j < c.seq_kv; ++j) {
              testing::set_element(inputs->mask.tensor, {0, 3, 6, j}, kind == MaskKind::boolean ? 0.0 : kNegInf);
              testing::set_element(inputs->mask.tensor, {1, 0, 5, j}, kind == MaskKind::boolean ? 0.0 : kNegInf);
            }
          }
          testing::set_element(in.q.tensor, {0, 3, 6, 0}, nan);
          if (kind != MaskKind::boolean) testing::set_element(in.mask.tensor, {0, 0, 4, 3}, nan);
        }
        const testing::ForwardExpectation want = testing::expect_forward_nans(in.problem, 0);
        EXPECT_GT(want.nan_rows, 0);
        std::vector<double> got_o(want.o.size()), got_lse(want.lse.size());
        std::vector<double> clean_o(want.o.size()), clean_lse(want.lse.size());
        detail::cpu_attention_forward_f64(in.problem, {}, got_o.data(), got_lse.data());
        detail::cpu_attention_forward_f64(clean.problem, {}, clean_o.data(), clean_lse.data());
        EXPECT_EQ(testing::count_off(want.o, got_o, clean_o, "o"), 0);
        EXPECT_EQ(testing::count_off(want.lse, got_lse, clean_lse, "lse"), 0);
        // The dtype entry point writes the same, rounded.
        detail::cpu_attention_forward(in.problem);
        std::vector<double> written_o, written_lse;
        for (int64_t b = 0; b < c.batch; ++b)
          for (int64_t h = 0; h < c.heads_q; ++h)
            for (int64_t i = 0; i < c.seq_q; ++i) {
              written_lse.push_back(testing::element_as_double(in.lse.tensor, {b, h, i}));
              for (int64_t d = 0; d < c.dim; ++d) written_o.push_back(testing::element_as_double(in.o.tensor, {b, h, i, d}));
            }
        for (size_t e = 0; e < written_o.size(); ++e) clean_o[e] = round_to(c.dtype, clean_o[e]);
        for (size_t e = 0; e < written_lse.size(); ++e) clean_lse[e] = static_cast<float>(clean_lse[e]);
        EXPECT_EQ(testing::count_off(want.o, written_o, clean_o, "o (dtype)"), 0);
        EXPECT_EQ(testing::count_off(want.lse, written_lse, clean_lse, "lse (dtype)"), 0);
        nan_rows += want.nan_rows;
      }
    }
  }
  EXPECT_GT(nan_rows, 0);
}

// Output strides with gaps: everything between the rows stays poisoned.
TEST(CpuReference, WritesOnlyTheOutputElements) {
  Case c;
  c.seed = 6000;
  c.causal = Causal::top_left;
  Inputs in = make_inputs(c);
  HostTensor o_padded =
      testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q + 2, c.dim + 8});
  HostTensor lse_padded = testing::make_host_lse(c.batch, c.heads_q + 1, c.seq_q + 3);
  testing::fill_nan(o_padded);
  testing::fill_nan(lse_padded);
  AttentionProblem p = in.problem;
  p.o = o_padded.tensor.data;
  set_problem_strides(o_padded.tensor, p.o_stride);
  p.lse = static_cast<float*>(lse_padded.tensor.data);
  set_problem_strides(lse_padded.tensor, p.lse_stride);
  detail::cpu_attention_forward(p);
  detail::cpu_attention_forward(in.problem);

  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q + 1; ++h) {
      for (int64_t i = 0; i < c.seq_q + 3; ++i) {
        const double lse = testing::element_as_double(lse_padded.tensor, {b, h, i});
        if (h < c.heads_q && i < c.seq_q) {
          EXPECT_EQ(lse, testing::element_as_double(in.lse.tensor, {b, h, i}));
        } else {
          EXPECT_TRUE(std::isnan(lse));
        }
      }
    }
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q + 2; ++i) {
        for (int64_t d = 0; d < c.dim + 8; ++d) {
          const double o = testing::element_as_double(o_padded.tensor, {b, h, i, d});
          if (i < c.seq_q && d < c.dim) {
            EXPECT_EQ(o, testing::element_as_double(in.o.tensor, {b, h, i, d}));
          } else {
            EXPECT_TRUE(std::isnan(o));
          }
        }
      }
    }
  }
}

TEST(CpuReference, RowSubsetsMatchTheFullRun) {
  Case c;
  c.seq_q = 33;
  c.causal = Causal::bottom_right;
  c.mask = MaskKind::boolean;
  c.dropout_p = 0.3f;
  c.layout = Layout::bnhd;
  c.seed = 7000;
  Inputs full = make_inputs(c);
  detail::cpu_attention_forward(full.problem);
  const int64_t row_count = c.batch * c.heads_q * c.seq_q;
  std::vector<double> full_out(row_count * c.dim), full_lse(row_count);
  detail::cpu_attention_forward_f64(full.problem, {}, full_out.data(), full_lse.data());

  const std::vector<int64_t> rows = {32, 0, 17, 5, 31, 6, 7};  // unordered, odd count
  Inputs part = make_inputs(c);
  detail::cpu_attention_forward(part.problem, {rows.data(), static_cast<int64_t>(rows.size())});
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<double> part_out(c.batch * c.heads_q * R * c.dim), part_lse(c.batch * c.heads_q * R);
  detail::cpu_attention_forward_f64(part.problem, {rows.data(), R}, part_out.data(),
                                    part_lse.data(), 3);

  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q; ++i) {
        const bool selected = std::find(rows.begin(), rows.end(), i) != rows.end();
        const double lse = testing::element_as_double(part.lse.tensor, {b, h, i});
        if (selected) {
          EXPECT_EQ(lse, testing::element_as_double(full.lse.tensor, {b, h, i}));
        } else {
          EXPECT_TRUE(std::isnan(lse));
        }
        for (int64_t d = 0; d < c.dim; ++d) {
          const double o = testing::element_as_double(part.o.tensor, {b, h, i, d});
          if (selected) {
            EXPECT_EQ(o, testing::element_as_double(full.o.tensor, {b, h, i, d}));
          } else {
            EXPECT_TRUE(std::isnan(o));
          }
        }
      }
      for (int64_t r = 0; r < R; ++r) {
        const int64_t full_row = (b * c.heads_q + h) * c.seq_q + rows[r];
        const int64_t part_row = (b * c.heads_q + h) * R + r;
        EXPECT_EQ(part_lse[part_row], full_lse[full_row]);
        for (int64_t d = 0; d < c.dim; ++d) {
          EXPECT_EQ(part_out[part_row * c.dim + d], full_out[full_row * c.dim + d]);
        }
      }
    }
  }
}

TEST(CpuReference, EmptySelectionsWriteNothing) {
  Case c;
  c.seed = 8000;
  Inputs in = make_inputs(c);
  const int64_t row = 3;
  detail::cpu_attention_forward(in.problem, {&row, 0});
  AttentionProblem no_rows = in.problem;
  no_rows.seq_q = 0;
  detail::cpu_attention_forward(no_rows);
  AttentionProblem no_batch = in.problem;
  no_batch.batch = 0;
  detail::cpu_attention_forward(no_batch);
  for (int64_t e = 0; e < in.o.numel(); ++e) {
    EXPECT_EQ(static_cast<uint16_t*>(in.o.tensor.data)[e], 0x7FC0u);  // the bf16 poison
  }
  for (int64_t e = 0; e < in.lse.numel(); ++e) {
    EXPECT_TRUE(std::isnan(static_cast<float*>(in.lse.tensor.data)[e]));
  }
}

TEST(CpuReference, ThreadCountDoesNotChangeAnyBit) {
  Case c;
  c.seq_q = 33;
  c.seq_kv = 7;
  c.dim = 64;
  c.heads_kv = 1;
  c.causal = Causal::top_left;
  c.mask = MaskKind::additive_bf16;
  c.dropout_p = 0.2f;
  c.seed = 9000;
  Inputs single = make_inputs(c);
  detail::cpu_attention_forward(single.problem, {}, 1);
  for (const int threads : {2, 3, 7, 64, 0}) {
    Inputs multi = make_inputs(c);
    detail::cpu_attention_forward(multi.problem, {}, threads);
    EXPECT_EQ(std::memcmp(single.o.tensor.data, multi.o.tensor.data, single.o.bytes()), 0)
        << threads << " threads";
    EXPECT_EQ(std::memcmp(single.lse.tensor.data, multi.lse.tensor.data, single.lse.bytes()), 0)
        << threads << " threads";
  }
}

// Mixed layouts (q and o [B, N, H, D], k and v [B, H, N, D]) give the bits of
// the all-bhnd run.
TEST(CpuReference, LayoutsGiveIdenticalResults) {
  Case c;
  c.seed = 10000;
  c.mask = MaskKind::boolean;
  Inputs bhnd = make_inputs(c);
  detail::cpu_attention_forward(bhnd.problem);

  Inputs mixed = make_inputs(c);
  HostTensor q =
      testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim}, Layout::bnhd);
  HostTensor o =
      testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim}, Layout::bnhd);
  testing::fill_nan(o);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q; ++i) {
        for (int64_t d = 0; d < c.dim; ++d) {
          testing::set_element(q.tensor, {b, h, i, d},
                               testing::element_as_double(bhnd.q.tensor, {b, h, i, d}));
        }
      }
    }
  }
  mixed.problem.q = q.tensor.data;
  set_problem_strides(q.tensor, mixed.problem.q_stride);
  mixed.problem.o = o.tensor.data;
  set_problem_strides(o.tensor, mixed.problem.o_stride);
  detail::cpu_attention_forward(mixed.problem);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t i = 0; i < c.seq_q; ++i) {
        for (int64_t d = 0; d < c.dim; ++d) {
          EXPECT_EQ(testing::element_as_double(o.tensor, {b, h, i, d}),
                    testing::element_as_double(bhnd.o.tensor, {b, h, i, d}));
        }
      }
    }
  }
}

// An anonymous mapping reserving address space only: pages are committed when touched.
class SparseMapping {
 public:
  explicit SparseMapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<unsigned char*>(p);
  }
  ~SparseMapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  SparseMapping(const SparseMapping&) = delete;
  SparseMapping& operator=(const SparseMapping&) = delete;
  unsigned char* data() const { return data_; }

 private:
  size_t bytes_;
  unsigned char* data_;
};

// Batch strides above 2^31 elements for q, o, mask and lse: the offsets of
// batch 1 only fit in 64-bit indexing.
TEST(CpuReference, IndexesBeyondTwoToThe31Elements) {
  Case c;
  c.batch = 2;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.seq_q = 5;
  c.seq_kv = 9;
  c.dim = 16;
  c.mask = MaskKind::boolean;
  c.mask_broadcast = {false, true, true, false};
  c.seed = 11000;
  Inputs compact = make_inputs(c);
  detail::cpu_attention_forward(compact.problem);

  const int64_t big_stride = (int64_t{1} << 31) + 64;  // elements
  const size_t region = 4096;  // bytes per tensor and batch: each slice is smaller
  SparseMapping mapping(static_cast<size_t>(4 * big_stride) + 4 * region);
  if (mapping.data() == nullptr) GTEST_SKIP() << "cannot reserve the address space";
  unsigned char* q_base = mapping.data();
  unsigned char* o_base = q_base + region;
  unsigned char* mask_base = q_base + 2 * region;
  unsigned char* lse_base = q_base + 3 * region;

  AttentionProblem p = compact.problem;
  const size_t q_slice = static_cast<size_t>(c.heads_q * c.seq_q * c.dim) * 2;
  for (int64_t b = 0; b < c.batch; ++b) {
    std::memcpy(q_base + 2 * b * big_stride,
                static_cast<const unsigned char*>(compact.q.tensor.data) + b * q_slice, q_slice);
    std::memcpy(mask_base + b * big_stride,
                static_cast<const unsigned char*>(compact.mask.tensor.data) + b * c.seq_kv,
                static_cast<size_t>(c.seq_kv));
  }
  p.q = q_base;
  p.q_stride[0] = big_stride;
  p.o = o_base;
  p.o_stride[0] = big_stride;
  p.mask = mask_base;
  p.mask_stride[0] = big_stride;
  p.lse = reinterpret_cast<float*>(lse_base);
  p.lse_stride[0] = big_stride;
  detail::cpu_attention_forward(p);

  const size_t lse_slice = static_cast<size_t>(c.heads_q * c.seq_q) * 4;
  for (int64_t b = 0; b < c.batch; ++b) {
    EXPECT_EQ(std::memcmp(o_base + 2 * b * big_stride,
                          static_cast<const unsigned char*>(compact.o.tensor.data) + b * q_slice,
                          q_slice),
              0)
        << "o, batch " << b;
    EXPECT_EQ(
        std::memcmp(lse_base + 4 * b * big_stride,
                    static_cast<const unsigned char*>(compact.lse.tensor.data) + b * lse_slice,
                    lse_slice),
        0)
        << "lse, batch " << b;
  }
}

}  // namespace
}  // namespace ffpa
