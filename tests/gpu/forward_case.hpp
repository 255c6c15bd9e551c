// One GPU test case of forward(): shape, dtypes, mask, causal alignment,
// dropout, accumulation and memory layout; its readable test name; the host
// tensors it runs on (random inputs, NaN-poisoned outputs and row gaps); and the
// query rows whose values are compared with the CPU reference.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

enum class MaskShape {
  none,
  keys,          // [1, 1, 1, Nkv]
  batch_keys,    // [B, 1, 1, Nkv]
  batch_rows,    // [B, 1, Nq, Nkv]
  full,          // [B, Hq, Nq, Nkv]
  stride0_view,  // a [1, 1, Nq, Nkv] buffer viewed as [B, Hq, Nq, Nkv], stride 0 over B and Hq
};

struct ForwardCase {
  DType dtype = DType::bf16;
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 1, seq_kv = 1, head_dim = 64;
  Causal causal = Causal::none;
  MaskShape mask_shape = MaskShape::none;
  DType mask_dtype = DType::boolean;
  // Mask out whole rows: rows Nq/2 and Nq-1 (of some batches and heads) for
  // masks with a row dim, the last batch for [B,1,1,Nkv], every key for [1,1,1,Nkv].
  bool empty_rows = false;
  float dropout_p = 0.0f;
  Accumulation accumulation = Accumulation::f32;
  Layout layout = Layout::bhnd;
  int64_t row_pad = 0;  // elements between consecutive rows of q, k, v, o and lse
  std::optional<float> scale;
  bool with_lse = true;

  ForwardCase with_causal(Causal value) const {
    ForwardCase c = *this;
    c.causal = value;
    return c;
  }
  ForwardCase with_mask(DType dtype_of_mask, MaskShape shape, bool mask_whole_rows) const {
    ForwardCase c = *this;
    c.mask_dtype = dtype_of_mask;
    c.mask_shape = shape;
    c.empty_rows = mask_whole_rows;
    return c;
  }
  ForwardCase with_dropout(float p) const {
    ForwardCase c = *this;
    c.dropout_p = p;
    return c;
  }
  ForwardCase with_f16_accumulation() const {
    ForwardCase c = *this;
    c.accumulation = Accumulation::f16;
    return c;
  }
  ForwardCase with_layout(Layout value) const {
    ForwardCase c = *this;
    c.layout = value;
    return c;
  }
  ForwardCase with_row_pad(int64_t elements) const {
    ForwardCase c = *this;
    c.row_pad = elements;
    return c;
  }
  ForwardCase with_scale(float value) const {
    ForwardCase c = *this;
    c.scale = value;
    return c;
  }
  ForwardCase without_lse() const {
    ForwardCase c = *this;
    c.with_lse = false;
    return c;
  }
};

inline ForwardCase shape_case(DType dtype, int64_t batch, int64_t heads_q, int64_t heads_kv,
                              int64_t seq_q, int64_t seq_kv, int64_t head_dim) {
  ForwardCase c;
  c.dtype = dtype;
  c.batch = batch;
  c.heads_q = heads_q;
  c.heads_kv = heads_kv;
  c.seq_q = seq_q;
  c.seq_kv = seq_kv;
  c.head_dim = head_dim;
  return c;
}

// Whether the reference must report rows with no attended key for this case.
inline bool expects_empty_rows(const ForwardCase& c) {
  return c.empty_rows || (c.causal == Causal::bottom_right && c.seq_q > c.seq_kv);
}

// --- names ----------------------------------------------------------------------

inline const char* dtype_label(DType dtype) {
  switch (dtype) {
    case DType::f16: return "F16";
    case DType::bf16: return "Bf16";
    case DType::f32: return "F32";
    case DType::boolean: return "Bool";
  }
  return "Unknown";
}

inline const char* mask_shape_label(MaskShape shape) {
  switch (shape) {
    case MaskShape::none: return "";
    case MaskShape::keys: return "Keys";
    case MaskShape::batch_keys: return "BatchKeys";
    case MaskShape::batch_rows: return "BatchRows";
    case MaskShape::full: return "Full";
    case MaskShape::stride0_view: return "Stride0";
  }
  return "Unknown";
}

// E.g. "Bf16_B2_H8x1_Q129_K63_D72_TopLeft_MaskBoolBatchRows_EmptyRows_Drop10_Bnhd_Pad8".
// Only letters, digits and '_', as gtest parameter names need.
inline std::string case_name(const ForwardCase& c) {
  std::ostringstream name;
  name << dtype_label(c.dtype) << "_B" << c.batch << "_H" << c.heads_q << "x" << c.heads_kv << "_Q"
       << c.seq_q << "_K" << c.seq_kv << "_D" << c.head_dim;
  if (c.causal == Causal::top_left) name << "_TopLeft";
  if (c.causal == Causal::bottom_right) name << "_BottomRight";
  if (c.mask_shape != MaskShape::none)
    name << "_Mask" << dtype_label(c.mask_dtype) << mask_shape_label(c.mask_shape);
  if (c.empty_rows) name << "_EmptyRows";
  if (c.dropout_p > 0.0f) name << "_Drop" << std::lround(c.dropout_p * 100.0f);
  if (c.accumulation == Accumulation::f16) name << "_AccF16";
  if (c.layout == Layout::bnhd) name << "_Bnhd";
  if (c.row_pad > 0) name << "_Pad" << c.row_pad;
  if (c.scale) {
    std::ostringstream value;
    value << *c.scale;
    std::string text = value.str();
    std::replace(text.begin(), text.end(), '.', 'p');
    std::replace(text.begin(), text.end(), '-', 'm');
    name << "_Scale" << text;
  }
  if (!c.with_lse) name << "_NoLse";
  return name.str();
}

// gtest prints parameters with this (instead of their bytes).
inline void PrintTo(const ForwardCase& c, std::ostream* out) { *out << case_name(c); }

// --- seeds --------------------------------------------------------------------------

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// An independent seed for each use (q, k, v, mask, ...) of a test's seed.
inline uint64_t derive_seed(uint64_t seed, uint64_t use) { return splitmix64(seed ^ splitmix64(use)); }

enum SeedUse : uint64_t { seed_q = 1, seed_k, seed_v, seed_mask, seed_mask_rows, seed_dropout,
                          seed_dropout_offset, seed_checked_rows };

// --- host tensors --------------------------------------------------------------------

// Calls f(index) for every index of t's logical shape (rank <= 4; entries beyond
// the rank are 0).
template <class F>
void for_each_index(const Tensor& t, F&& f) {
  std::array<int64_t, 4> size{1, 1, 1, 1};
  for (int32_t d = 0; d < t.rank; ++d) size[d] = t.shape[d];
  for (int64_t a = 0; a < size[0]; ++a)
    for (int64_t b = 0; b < size[1]; ++b)
      for (int64_t c = 0; c < size[2]; ++c)
        for (int64_t d = 0; d < size[3]; ++d) f(std::array<int64_t, 4>{a, b, c, d});
}

// A host buffer and the tensor the call sees in it: the same strides, a shape
// that is narrower where rows are padded (the gap between rows is not part of
// the tensor) or wider where a size-1 dim is viewed with stride 0. Not
// copyable: the view points into the buffer.
struct HostView {
  HostTensor buffer;
  Tensor view;

  HostView() = default;
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;
  HostView(HostView&&) noexcept = default;
  HostView& operator=(HostView&&) noexcept = default;

  bool present() const { return view.data != nullptr; }
};

// Calls f(index) for every element of the buffer outside the view (the gaps
// between padded rows).
template <class F>
void for_each_gap_element(const HostView& t, F&& f) {
  for_each_index(t.buffer.tensor, [&](const std::array<int64_t, 4>& index) {
    for (int32_t d = 0; d < t.view.rank; ++d) {
      if (index[d] >= t.view.shape[d]) return f(index);
    }
  });
}

// A [B, H, N, D] tensor in `layout` whose rows are `row_pad` elements apart
// beyond D; the buffer is zero.
inline HostView make_padded(DType dtype, std::array<int64_t, 4> shape, Layout layout,
                            int64_t row_pad) {
  HostView t;
  t.buffer = make_host_tensor(dtype, {shape[0], shape[1], shape[2], shape[3] + row_pad}, layout);
  t.view = t.buffer.tensor;
  t.view.shape[3] = shape[3];
  return t;
}

// Uniform values in [lo, hi); the gaps between rows hold NaN, so that a kernel
// reading past the end of a row poisons its output.
inline HostView make_input(DType dtype, std::array<int64_t, 4> shape, const ForwardCase& c,
                           uint64_t seed, float lo, float hi) {
  HostView t = make_padded(dtype, shape, c.layout, c.row_pad);
  fill_uniform(t.buffer, seed, lo, hi);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for_each_gap_element(t, [&](const std::array<int64_t, 4>& index) {
    set_element(t.buffer.tensor, index, nan);
  });
  return t;
}

// The optional lse output [B, Hq, Nq], rows `row_pad` floats apart.
inline HostView make_lse(const ForwardCase& c) {
  HostView t;
  t.buffer = make_host_lse(c.batch, c.heads_q, c.seq_q + c.row_pad);
  t.view = t.buffer.tensor;
  t.view.shape[2] = c.seq_q;
  return t;
}

// Boolean: true with probability 0.85. Additive: uniform in [-2, 2) with -inf
// at about 10% of the entries. Then whole rows masked out if the case asks.
inline HostView make_mask(const ForwardCase& c, uint64_t seed) {
  const int64_t b = c.batch, h = c.heads_q, nq = c.seq_q, nkv = c.seq_kv;
  std::array<int64_t, 4> shape{};
  switch (c.mask_shape) {
    case MaskShape::none: return {};
    case MaskShape::keys: shape = {1, 1, 1, nkv}; break;
    case MaskShape::batch_keys: shape = {b, 1, 1, nkv}; break;
    case MaskShape::batch_rows: shape = {b, 1, nq, nkv}; break;
    case MaskShape::full: shape = {b, h, nq, nkv}; break;
    case MaskShape::stride0_view: shape = {1, 1, nq, nkv}; break;
  }
  HostView m;
  m.buffer = make_host_tensor(c.mask_dtype, shape);
  const bool boolean = c.mask_dtype == DType::boolean;
  const double masked = boolean ? 0.0 : -std::numeric_limits<double>::infinity();
  if (boolean) {
    fill_bool(m.buffer, seed, 0.85);
  } else {
    fill_uniform(m.buffer, seed, -2.0f, 2.0f);
    std::mt19937_64 rng(derive_seed(seed, seed_mask_rows));
    std::bernoulli_distribution exclude(0.1);
    for_each_index(m.buffer.tensor, [&](const std::array<int64_t, 4>& index) {
      if (exclude(rng)) set_element(m.buffer.tensor, index, masked);
    });
  }

  if (c.empty_rows) {
    // (batch, head, row) of the mask buffer to mask out entirely.
    std::vector<std::array<int64_t, 3>> rows;
    switch (c.mask_shape) {
      case MaskShape::none: break;
      case MaskShape::keys: rows = {{0, 0, 0}}; break;
      case MaskShape::batch_keys: rows = {{b - 1, 0, 0}}; break;
      case MaskShape::batch_rows:
      case MaskShape::stride0_view: rows = {{0, 0, nq / 2}, {shape[0] - 1, 0, nq - 1}}; break;
      case MaskShape::full: rows = {{0, 0, nq / 2}, {b - 1, h - 1, nq - 1}}; break;
    }
    for (const auto& row : rows)
      for (int64_t j = 0; j < nkv; ++j) set_element(m.buffer.tensor, {row[0], row[1], row[2], j}, masked);
  }

  m.view = m.buffer.tensor;
  if (c.mask_shape == MaskShape::stride0_view) {
    m.view = broadcast_view(m.buffer, {true, true, false, false});
    m.view.shape[0] = b;
    m.view.shape[1] = h;
  }
  return m;
}

// The tensors of one call on the host: q in [-2, 2) (so that the scores are
// far from uniform), k and v in [-1, 1), o and lse poisoned with NaN.
struct HostProblem {
  HostView q, k, v, o, mask, lse;
  Options options;
};

inline HostProblem make_host_problem(const ForwardCase& c, uint64_t seed) {
  HostProblem p;
  p.q = make_input(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c,
                   derive_seed(seed, seed_q), -2.0f, 2.0f);
  p.k = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c,
                   derive_seed(seed, seed_k), -1.0f, 1.0f);
  p.v = make_input(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.head_dim}, c,
                   derive_seed(seed, seed_v), -1.0f, 1.0f);
  p.o = make_padded(c.dtype, {c.batch, c.heads_q, c.seq_q, c.head_dim}, c.layout, c.row_pad);
  fill_nan(p.o.buffer);
  if (c.with_lse) {
    p.lse = make_lse(c);
    fill_nan(p.lse.buffer);
  }
  p.mask = make_mask(c, derive_seed(seed, seed_mask));

  p.options.scale = c.scale;
  p.options.causal = c.causal;
  p.options.dropout_p = c.dropout_p;
  p.options.dropout_seed = derive_seed(seed, seed_dropout);
  p.options.dropout_offset = derive_seed(seed, seed_dropout_offset);  // high bits set too
  p.options.accumulation = c.accumulation;
  return p;
}

// The call on the host tensors (what the CPU reference validates and runs).
inline ForwardParams host_params(const HostProblem& p) {
  ForwardParams params;
  params.q = p.q.view;
  params.k = p.k.view;
  params.v = p.v.view;
  params.o = p.o.view;
  params.mask = p.mask.view;
  params.lse = p.lse.view;
  params.options = p.options;
  return params;
}

// --- checked rows ----------------------------------------------------------------------

// Below this many query rows every row is compared with the reference.
constexpr int64_t kSampleRowsFrom = 777;
constexpr size_t kSampledRows = 48;

// The query rows compared with the reference (the same for every batch and
// head), ascending: all rows of short sequences; for long ones the first and
// last rows, rows at kernel row-block edges, rows around the causal
// boundaries, the rows that empty_rows masks out, and random others.
inline std::vector<int64_t> checked_rows(const ForwardCase& c, uint64_t seed) {
  const int64_t nq = c.seq_q, nkv = c.seq_kv;
  std::vector<int64_t> all;
  if (nq < kSampleRowsFrom) {
    for (int64_t i = 0; i < nq; ++i) all.push_back(i);
    return all;
  }
  std::set<int64_t> rows;
  auto add_around = [&](int64_t center) {
    for (int64_t i = center - 1; i <= center + 1; ++i)
      if (i >= 0 && i < nq) rows.insert(i);
  };
  add_around(0);
  add_around(nq / 2);
  add_around(nq - 1);
  for (int64_t edge : {int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}, nq / 64 * 64, nq / 128 * 128})
    add_around(edge);
  if (c.causal != Causal::none) {
    // Row i attends keys j <= i + shift: the first row with any key, and the
    // first that sees every key.
    const int64_t shift = c.causal == Causal::bottom_right ? nkv - nq : 0;
    add_around(-shift);
    add_around(nkv - 1 - shift);
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> any_row(0, nq - 1);
  while (rows.size() < kSampledRows) rows.insert(any_row(rng));
  return {rows.begin(), rows.end()};
}

}  // namespace ffpa::testing
