// A serving call on host memory for tests: a batch of sequences of random
// lengths with packed, batched or paged queries and keys (shuffled block
// tables, the caches' usual strides), its ffpa::ForwardParams, and an fp64
// oracle written straight from the spec (docs/spec.md, "Serving semantics"):
// its own addressing of every form, the window, the softcap, the sinks and an
// e4m3 cache's descales, independent of the library's code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "reference/parallel_for.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

enum class KeyForm { packed, paged, batched };
// How a paged cache lies in memory: [num_blocks, page_size, Hkv, D] (vLLM's
// NHD), [num_blocks, Hkv, page_size, D] (HND), or K and V as the two halves
// of one [2, num_blocks, page_size, Hkv, D] buffer.
enum class CacheLayout { nhd, hnd, stacked };

struct ServingCase {
  int64_t heads_q = 4, heads_kv = 2, dim = 32, value_dim = 32;
  DType dtype = DType::f32;
  bool e4m3_kv = false;
  bool packed_q = true;
  KeyForm keys = KeyForm::packed;
  CacheLayout cache = CacheLayout::nhd;
  int64_t page_size = 16;
  bool value_in_key_rows = false;  // V is the first Dv columns of K's rows (MLA's latent cache)
  std::vector<int64_t> seq_q, seq_kv;  // per sequence; seq_q all equal when !packed_q
  bool seqused = false;                // packed keys: give seqused_k (else the cu_seqlens_k lengths)
  Causal causal = Causal::none;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool sinks = false;
  bool per_sequence_descale = false;  // else one descale for the tensor (stride-0 [B, Hkv])
  bool lse = true;
  uint64_t seed = 1;

  int64_t batch() const { return static_cast<int64_t>(seq_q.size()); }
  std::string describe() const {
    std::ostringstream s;
    s << "B=" << batch() << " Hq=" << heads_q << " Hkv=" << heads_kv << " D=" << dim << " Dv=" << value_dim
      << " dtype=" << static_cast<int>(dtype) << (e4m3_kv ? " e4m3" : "") << (packed_q ? " packed_q" : " batched_q")
      << " keys=" << static_cast<int>(keys) << " cache=" << static_cast<int>(cache) << " page=" << page_size
      << (value_in_key_rows ? " v_in_k" : "") << (seqused ? " seqused" : "") << " causal=" << static_cast<int>(causal)
      << " window=(" << window_left << "," << window_right << ") softcap=" << softcap << (sinks ? " sinks" : "")
      << (per_sequence_descale ? " descale_per_seq" : "") << " seed=" << seed << " seq_q=[";
    for (int64_t n : seq_q) s << n << " ";
    s << "] seq_kv=[";
    for (int64_t n : seq_kv) s << n << " ";
    s << "]";
    return s.str();
  }
};

// The tensors of a ServingCase and the params describing them.
struct ServingInputs {
  ServingCase c;
  HostTensor q, o, lse, k_buffer, v_buffer, sinks, k_descale, v_descale;
  HostTensor cu_q, cu_k, table, used;
  Tensor k, v;  // views into k_buffer / v_buffer (or k_buffer for both)
  std::vector<int64_t> q_begin, k_begin, capacity;  // per sequence
  std::vector<std::vector<int64_t>> pages;          // per sequence, its page ids
  int64_t num_blocks = 0;
  SequenceBatch batch;
  ForwardParams params;
};

inline HostTensor make_i32(std::vector<int64_t> values, std::vector<int64_t> shape) {
  int64_t dims[4] = {};
  for (size_t d = 0; d < shape.size(); ++d) dims[d] = shape[d];
  HostTensor t = host_tensor_detail::allocate(DType::i32, static_cast<int32_t>(shape.size()), dims);
  auto* data = static_cast<int32_t*>(t.tensor.data);
  for (size_t e = 0; e < values.size(); ++e) data[e] = static_cast<int32_t>(values[e]);
  return t;
}

inline ServingInputs make_serving_inputs(const ServingCase& c) {
  ServingInputs in;
  in.c = c;
  const int64_t B = c.batch();
  std::mt19937_64 rng(c.seed);
  const DType kv = c.e4m3_kv ? DType::e4m3 : c.dtype;
  // Queries.
  in.q_begin.assign(B, 0);
  int64_t total_q = 0;
  for (int64_t b = 0; b < B; ++b) {
    in.q_begin[b] = c.packed_q ? total_q : 0;
    total_q += c.seq_q[b];
  }
  if (c.packed_q) {
    // Two spare rows past the last sequence: never written (they stay NaN).
    in.q = make_host_tensor(c.dtype, {1, c.heads_q, total_q + 2, c.dim}, Layout::bnhd);
    in.o = make_host_tensor(c.dtype, {1, c.heads_q, total_q + 2, c.value_dim}, Layout::bnhd);
    if (c.lse) in.lse = make_host_lse(1, c.heads_q, total_q + 2);
    std::vector<int64_t> cu(B + 1, 0);
    for (int64_t b = 0; b < B; ++b) cu[b + 1] = cu[b] + c.seq_q[b];
    in.cu_q = make_i32(cu, {B + 1});
    in.batch.cu_seqlens_q = in.cu_q.tensor;
  } else {
    const int64_t n = B > 0 ? c.seq_q[0] : 0;
    in.q = make_host_tensor(c.dtype, {B, c.heads_q, n, c.dim}, Layout::bnhd);
    in.o = make_host_tensor(c.dtype, {B, c.heads_q, n, c.value_dim}, Layout::bnhd);
    if (c.lse) in.lse = make_host_lse(B, c.heads_q, n);
  }
  fill_uniform(in.q, c.seed * 11 + 1, -2.0f, 2.0f);
  fill_nan(in.o);
  if (c.lse) fill_nan(in.lse);

  // Keys: each sequence has capacity >= its used keys (seqused) or exactly them.
  in.capacity.assign(B, 0);
  for (int64_t b = 0; b < B; ++b) in.capacity[b] = c.seq_kv[b] + (c.seqused ? static_cast<int64_t>(rng() % 5) : 0);
  const int64_t key_cols = c.value_in_key_rows ? std::max(c.dim, c.value_dim) : c.dim;
  auto stacked = [&](int64_t rows_outer, int64_t rows_inner, int64_t cols) {
    // [2, outer, inner, Hkv, cols]: K the first half, V the second.
    const int64_t shape[4] = {2 * rows_outer, rows_inner, c.heads_kv, cols};
    return host_tensor_detail::allocate(kv, 4, shape);
  };
  auto view = [&](const HostTensor& buffer, int64_t offset_elements, int64_t outer, int64_t inner, int64_t cols,
                  bool hnd) {
    // Logical [outer, Hkv, inner, cols] over a buffer laid out [outer, inner, Hkv, row] (or HND).
    Tensor t;
    t.dtype = kv;
    t.rank = 4;
    t.data = static_cast<unsigned char*>(buffer.tensor.data) + offset_elements * dtype_size(kv);
    t.shape[0] = outer, t.shape[1] = c.heads_kv, t.shape[2] = inner, t.shape[3] = cols;
    const int64_t row = buffer.tensor.shape[3];
    if (hnd) {
      t.stride[2] = row, t.stride[1] = inner * row, t.stride[0] = c.heads_kv * inner * row;
    } else {
      t.stride[1] = row, t.stride[2] = c.heads_kv * row, t.stride[0] = inner * c.heads_kv * row;
    }
    t.stride[3] = 1;
    return t;
  };
  int64_t outer = 0, inner = 0;
  in.k_begin.assign(B, 0);
  if (c.keys == KeyForm::paged) {
    int64_t needed = 0;
    std::vector<int64_t> page_count(B);
    for (int64_t b = 0; b < B; ++b) needed += page_count[b] = (in.capacity[b] + c.page_size - 1) / c.page_size;
    in.num_blocks = needed + 3;  // spare pages nobody reads
    std::vector<int64_t> ids(in.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    int64_t max_blocks = 1;
    for (int64_t b = 0; b < B; ++b) max_blocks = std::max(max_blocks, page_count[b] + 1);
    std::vector<int64_t> table(B * max_blocks, 0);
    in.pages.assign(B, {});
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t p = 0; p < max_blocks; ++p) {
        // Entries past a sequence's pages hold garbage ids: never read.
        table[b * max_blocks + p] = p < page_count[b] ? ids[next++] : -7 - p;
        if (p < page_count[b]) in.pages[b].push_back(table[b * max_blocks + p]);
      }
    }
    in.table = make_i32(table, {B, max_blocks});
    in.batch.block_table = in.table.tensor;
    outer = in.num_blocks, inner = c.page_size;
  } else if (c.keys == KeyForm::packed) {
    std::vector<int64_t> cu(B + 1, 0);
    for (int64_t b = 0; b < B; ++b) {
      in.k_begin[b] = cu[b];
      cu[b + 1] = cu[b] + in.capacity[b];
    }
    in.cu_k = make_i32(cu, {B + 1});
    in.batch.cu_seqlens_k = in.cu_k.tensor;
    outer = 1, inner = cu[B] + 1;  // a spare row at the end
  } else {
    outer = B;
    inner = 1;
    for (int64_t b = 0; b < B; ++b) inner = std::max(inner, in.capacity[b]);
  }
  const bool hnd = c.keys == KeyForm::paged && c.cache == CacheLayout::hnd;
  if (c.keys == KeyForm::paged && c.cache == CacheLayout::stacked && !c.value_in_key_rows) {
    in.k_buffer = stacked(outer, inner, std::max(c.dim, c.value_dim));
    fill_uniform(in.k_buffer, c.seed * 11 + 2, -2.0f, 2.0f);
    in.k = view(in.k_buffer, 0, outer, inner, c.dim, false);
    in.v = view(in.k_buffer, outer * inner * c.heads_kv * in.k_buffer.tensor.shape[3], outer, inner, c.value_dim,
                false);
  } else {
    const int64_t shape[4] = {outer, hnd ? c.heads_kv : inner, hnd ? inner : c.heads_kv, key_cols};
    in.k_buffer = host_tensor_detail::allocate(kv, 4, shape);
    fill_uniform(in.k_buffer, c.seed * 11 + 2, -2.0f, 2.0f);
    in.k = view(in.k_buffer, 0, outer, inner, c.dim, hnd);
    if (c.value_in_key_rows) {
      in.v = view(in.k_buffer, 0, outer, inner, c.value_dim, hnd);
    } else {
      const int64_t v_shape[4] = {outer, hnd ? c.heads_kv : inner, hnd ? inner : c.heads_kv, c.value_dim};
      in.v_buffer = host_tensor_detail::allocate(kv, 4, v_shape);
      fill_uniform(in.v_buffer, c.seed * 11 + 3, -1.0f, 1.0f);
      in.v = view(in.v_buffer, 0, outer, inner, c.value_dim, hnd);
    }
  }
  // Paged and batched keys always say how many keys a sequence uses (the
  // engines do: without it a paged sequence would use its table row's width).
  if (c.seqused || c.keys != KeyForm::packed) {
    in.used = make_i32(c.seq_kv, {B});
    in.batch.seqused_k = in.used.tensor;
  }
  if (c.sinks) {
    const int64_t shape[1] = {c.heads_q};
    in.sinks = host_tensor_detail::allocate(DType::f32, 1, shape);
    fill_uniform(in.sinks, c.seed * 11 + 4, -1.0f, 3.0f);
    in.params.sinks = in.sinks.tensor;
  }
  if (c.e4m3_kv) {
    for (HostTensor* t : {&in.k_descale, &in.v_descale}) {
      const int64_t shape[2] = {c.per_sequence_descale ? B : 1, c.per_sequence_descale ? c.heads_kv : 1};
      *t = host_tensor_detail::allocate(DType::f32, 2, shape);
      fill_uniform(*t, c.seed * 11 + (t == &in.k_descale ? 5 : 6), 0.25f, 2.0f);
      if (!c.per_sequence_descale) {  // one value, broadcast through stride 0
        t->tensor.shape[0] = B, t->tensor.shape[1] = c.heads_kv;
        t->tensor.stride[0] = t->tensor.stride[1] = 0;
      }
    }
    in.params.k_descale = in.k_descale.tensor;
    in.params.v_descale = in.v_descale.tensor;
  }
  in.params.q = in.q.tensor;
  in.params.k = in.k;
  in.params.v = in.v;
  in.params.o = in.o.tensor;
  if (c.lse) in.params.lse = in.lse.tensor;
  in.params.options.impl = Impl::cpu_reference;
  in.params.options.causal = c.causal;
  in.params.options.window_left = c.window_left;
  in.params.options.window_right = c.window_right;
  in.params.options.softcap = c.softcap;
  in.params.sequences = &in.batch;
  return in;
}

// One row's expected output and lse, by the spec's formulas.
struct OracleRow {
  std::vector<double> out;
  double lse = 0.0;
};

// Sequence b's query row i of head h.
inline OracleRow serving_oracle_row(const ServingInputs& in, int64_t b, int64_t h, int64_t i) {
  const ServingCase& c = in.c;
  const int64_t nq = c.seq_q[b], nkv = c.seq_kv[b], kvh = h / (c.heads_q / c.heads_kv);
  const double inf = std::numeric_limits<double>::infinity();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
  const int64_t q_batch = c.packed_q ? 0 : b, q_row = in.q_begin[b] + i;
  auto key_index = [&](int64_t j) -> std::array<int64_t, 2> {  // [outer, row] of key j
    if (c.keys == KeyForm::paged) return {in.pages[b][j / c.page_size], j % c.page_size};
    if (c.keys == KeyForm::packed) return {0, in.k_begin[b] + j};
    return {b, j};
  };
  auto descale = [&](const HostTensor& t) {
    return c.e4m3_kv ? element_as_double(t.tensor, {c.per_sequence_descale ? b : 0, c.per_sequence_descale ? kvh : 0, 0, 0})
                     : 1.0;
  };
  std::vector<double> score(nkv, -inf);
  const int64_t position = i + nkv - nq;
  for (int64_t j = 0; j < nkv; ++j) {
    if (c.causal == Causal::top_left && j > i) continue;
    if (c.causal == Causal::bottom_right && j > position) continue;
    if (c.window_left >= 0 && j < position - c.window_left) continue;
    if (c.window_right >= 0 && j > position + c.window_right) continue;
    const auto [outer, row] = key_index(j);
    double dot = 0.0;
    for (int64_t d = 0; d < c.dim; ++d)
      dot += element_as_double(in.q.tensor, {q_batch, h, q_row, d}) * element_as_double(in.k, {outer, kvh, row, d});
    double s = scale * descale(in.k_descale) * dot;
    if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
    score[j] = s;
  }
  const double sink = c.sinks ? element_as_double(in.sinks.tensor, {h, 0, 0, 0}) : -inf;
  double m = sink;
  for (double s : score) m = std::max(m, s);
  OracleRow row;
  row.out.assign(c.value_dim, 0.0);
  if (m == -inf) {
    row.lse = -inf;
    return row;
  }
  double denominator = sink == -inf ? 0.0 : std::exp(sink - m);
  for (double s : score) denominator += std::exp(s - m);
  for (int64_t j = 0; j < nkv; ++j) {
    if (score[j] == -inf) continue;
    const double weight = std::exp(score[j] - m) / denominator * descale(in.v_descale);
    const auto [outer, r] = key_index(j);
    for (int64_t d = 0; d < c.value_dim; ++d) row.out[d] += weight * element_as_double(in.v, {outer, kvh, r, d});
  }
  row.lse = m + std::log(denominator);
  return row;
}

// Every query row of every sequence (sequence b's row i of head h at
// at(b, h, i)), computed on the machine's threads: the GPU tests' oracle of a
// D 512 batch took ~20 s a call on one.
struct OracleRows {
  std::vector<OracleRow> rows;
  std::vector<int64_t> first;  // [B + 1]: sequence b's rows from first[b], head-major
  std::vector<int64_t> seq_q;
  const OracleRow& at(int64_t b, int64_t h, int64_t i) const {
    return rows[static_cast<size_t>(first[b] + h * seq_q[b] + i)];
  }
};

inline OracleRows serving_oracle_rows(const ServingInputs& in) {
  const ServingCase& c = in.c;
  OracleRows o;
  o.seq_q = c.seq_q;
  o.first.assign(static_cast<size_t>(c.batch() + 1), 0);
  for (int64_t b = 0; b < c.batch(); ++b) o.first[b + 1] = o.first[b] + c.heads_q * c.seq_q[b];
  o.rows.resize(static_cast<size_t>(o.first.back()));
  detail::parallel_for(o.first.back(), detail::resolve_threads(0), [&](int, int64_t index) {
    const int64_t b = std::upper_bound(o.first.begin(), o.first.end(), index) - o.first.begin() - 1;
    const int64_t r = index - o.first[b];
    o.rows[static_cast<size_t>(index)] = serving_oracle_row(in, b, r / c.seq_q[b], r % c.seq_q[b]);
  });
  return o;
}

}  // namespace ffpa::testing
