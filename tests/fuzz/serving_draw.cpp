// Drawing the API fuzz driver's serving calls and their faults
// (serving_cases.hpp). Every tensor is a view into a flat buffer the case
// owns, laid out as the engines lay theirs (padded rows, [N, H, D] orders,
// strided int32 vectors and block tables, shuffled or shared pages, garbage
// past what a sequence reads), and the driver records where each sequence's
// rows are for the reference.
#include <algorithm>
#include <climits>
#include <cmath>
#include <numeric>
#include <sstream>

#include "fuzz/serving_cases.hpp"

namespace ffpa_fuzz {
namespace {

using ffpa::DType;
using ffpa::StatusCode;
using ffpa::Tensor;
using ffpa::testing::HostTensor;

// A 16-byte aligned buffer of `elements` (at least one) elements.
HostTensor flat(DType dtype, int64_t elements) {
  const int64_t n = std::max<int64_t>(elements, 1);
  return ffpa::testing::host_tensor_detail::allocate(dtype, 1, &n);
}

// A rank-4 view into buffer from element `offset`.
Tensor view(const HostTensor& buffer, int64_t offset, std::array<int64_t, 4> shape, std::array<int64_t, 4> stride) {
  Tensor t;
  t.dtype = buffer.tensor.dtype;
  t.rank = 4;
  t.data = static_cast<unsigned char*>(buffer.tensor.data) + offset * element_bytes(t.dtype);
  for (int d = 0; d < 4; ++d) t.shape[d] = shape[d], t.stride[d] = stride[d];
  return t;
}

int32_t* i32_at(const Tensor& t, int64_t i0, int64_t i1 = 0) {
  return static_cast<int32_t*>(t.data) + i0 * t.stride[0] + (t.rank > 1 ? i1 * t.stride[1] : 0);
}

// An int32 tensor of `shape` with `stride`, values row-major; the storage
// between its elements holds garbage (never read).
HostTensor i32_tensor(const std::vector<int64_t>& values, std::vector<int64_t> shape, std::vector<int64_t> stride,
                      std::mt19937_64& rng) {
  int64_t last = 0;
  bool empty = false;
  for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * stride[d], empty = empty || shape[d] == 0;
  HostTensor t = flat(DType::i32, empty ? 1 : last + 1);
  auto* data = static_cast<int32_t*>(t.tensor.data);
  for (int64_t e = 0; e < t.numel(); ++e) data[e] = static_cast<int32_t>(rng() % 2000) - 1000;
  t.tensor.rank = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) t.tensor.shape[d] = shape[d], t.tensor.stride[d] = stride[d];
  for (size_t e = 0; e < values.size(); ++e) {
    const int64_t i0 = shape.size() > 1 ? static_cast<int64_t>(e) / shape[1] : static_cast<int64_t>(e);
    const int64_t i1 = shape.size() > 1 ? static_cast<int64_t>(e) % shape[1] : 0;
    *i32_at(t.tensor, i0, i1) = static_cast<int32_t>(values[e]);
  }
  return t;
}

// A [outer, heads, inner, row]-element buffer's strides in `layout`; the
// stacked layouts hold a second half (V) at *half_offset.
std::array<int64_t, 4> kv_strides(KvLayout layout, int64_t inner, int64_t heads, int64_t row, int64_t outer,
                                  int64_t* half_offset, int64_t* elements) {
  const int64_t block = inner * heads * row;
  *half_offset = layout == KvLayout::stacked ? outer * block : layout == KvLayout::stacked_inner ? block : 0;
  *elements = (layout == KvLayout::stacked || layout == KvLayout::stacked_inner ? 2 : 1) * outer * block;
  switch (layout) {
    case KvLayout::bhnd: return {block, inner * row, row, 1};
    case KvLayout::bnhd:
    case KvLayout::stacked: return {block, row, heads * row, 1};
    case KvLayout::stacked_inner: return {2 * block, row, heads * row, 1};
  }
  return {};
}

// e4m3 codes over the whole buffer: any finite value (NaN codes moved to +-448).
void fill_e4m3(HostTensor& t, std::mt19937_64& rng) {
  auto* bytes = static_cast<unsigned char*>(t.tensor.data);
  for (int64_t e = 0; e < t.numel(); ++e) {
    unsigned char code = static_cast<unsigned char>(rng());
    if ((code & 0x7F) == 0x7F) code ^= 1;
    bytes[e] = code;
  }
}

// A descale tensor f32 [B, Hkv]: per (sequence, head), per head (stride 0
// over sequences) or one value (both strides 0); null: absent.
HostTensor draw_descale(int64_t batch, int64_t heads_kv, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t mode = pick(0, 3);
  if (mode == 0) return {};
  const int64_t pitch = heads_kv + pick(0, 1);
  HostTensor t = flat(DType::f32, mode == 1 ? batch * pitch : mode == 2 ? heads_kv : 1);
  ffpa::testing::fill_uniform(t, rng(), 0.05f, 2.0f);
  t.tensor.rank = 2;
  t.tensor.shape[0] = batch, t.tensor.shape[1] = heads_kv;
  t.tensor.stride[0] = mode == 1 ? pitch : 0;
  t.tensor.stride[1] = mode == 3 ? 0 : 1;
  return t;
}

constexpr int64_t kPageSizes[] = {1, 2, 3, 5, 7, 8, 16};

}  // namespace

std::vector<HostTensor*> ServingCase::inputs() {
  return {&q, &k_buffer, &v_buffer, &cu_q, &cu_k, &table, &used, &sinks, &k_descale, &v_descale, &mask, &plan};
}

bool ServingCase::empty() const {
  const bool packed = queries == QueryForm::packed;
  const int64_t bound = packed && sequences.max_seqlen_q > 0 ? sequences.max_seqlen_q : q_rows;
  return batch == 0 || heads_q == 0 || bound == 0;
}

std::string ServingCase::describe() const {
  static const char* const kLayouts[] = {"bhnd", "bnhd", "stacked", "stacked_inner"};
  static const char* const kDtypes[] = {"f16", "bf16", "f32", "bool", "f64", "u8", "e4m3", "i32"};
  std::ostringstream s;
  s << (dense ? "dense" : queries == QueryForm::packed ? "packed_q" : "batched_q") << " keys="
    << (keys == KeyForm::packed ? "packed" : keys == KeyForm::batched ? "batched" : "paged") << "("
    << kLayouts[static_cast<int>(layout)];
  if (keys == KeyForm::paged) s << " page " << page_size << " blocks " << num_blocks << "x" << max_blocks;
  s << ") B=" << batch << " Hq=" << heads_q << " Hkv=" << heads_kv << " D=" << dim << " Dv=" << value_dim << " "
    << kDtypes[static_cast<int>(dtype)] << (e4m3 ? " e4m3" : "") << (value_in_key_rows ? " v_in_k" : "")
    << (sequences.cu_seqlens_k.data ? " cu_k" : "") << (sequences.seqused_k.data ? " seqused" : "")
    << " max_seqlen=(" << sequences.max_seqlen_q << "," << sequences.max_seqlen_k
    << ") causal=" << static_cast<int>(params.options.causal) << " window=(" << params.options.window_left << ","
    << params.options.window_right << ") softcap=" << params.options.softcap << (params.sinks.data ? " sinks" : "")
    << (params.k_descale.data ? " k_descale" : "") << (params.v_descale.data ? " v_descale" : "")
    << (params.lse.data ? " lse" : "") << " seq_q/kv=";
  for (const SequenceRows& r : reference.sequences) s << r.seq_q << "/" << r.keys.size() << ",";
  return s.str();
}

void draw_serving_case(ServingCase& c, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  c.dense = pick(0, 6) == 0;
  c.queries = !c.dense && pick(0, 2) != 0 ? QueryForm::packed : QueryForm::batched;
  c.keys = c.dense ? KeyForm::batched : static_cast<KeyForm>(pick(0, 2));
  c.batch = pick(0, 5) == 0 ? 0 : pick(1, 4);
  c.heads_kv = pick(1, 3);
  c.heads_q = c.heads_kv * pick(1, 3);
  c.dtype = pick(0, 1) ? DType::bf16 : DType::f16;
  if (pick(0, 7) == 0) c.dtype = pick(0, 1) ? DType::f32 : DType::f64;
  c.e4m3 = (c.dtype == DType::bf16 || c.dtype == DType::f16) && pick(0, 2) == 0;
  const int64_t unit = c.e4m3 ? 16 : 8;  // e4m3 rows are read in 16-byte vectors
  c.dim = unit * pick(1, c.e4m3 ? 5 : 9);
  c.value_dim = pick(0, 3) == 0 ? unit * pick(1, c.e4m3 ? 5 : 9) : c.dim;
  c.value_in_key_rows = pick(0, 3) == 0;
  const int64_t B = c.batch;
  const bool packed_q = c.queries == QueryForm::packed;
  const DType kv_dtype = c.e4m3 ? DType::e4m3 : c.dtype;

  // Query lengths (batched: one Nq for all), then where the rows are.
  std::vector<int64_t> seq_q(B);
  const int64_t nq = pick(0, 5) == 0 ? 0 : pick(1, 6);
  for (int64_t& n : seq_q) n = !packed_q ? nq : pick(0, 3) == 0 ? 0 : pick(1, 6);
  std::vector<int64_t> cu_q(B + 1, packed_q && pick(0, 2) == 0 ? pick(1, 2) : 0);
  for (int64_t b = 0; b < B; ++b) cu_q[b + 1] = cu_q[b] + seq_q[b];
  c.q_rows = packed_q ? cu_q[B] + pick(0, 2) : nq;

  // Keys: what each sequence has (capacity) and uses.
  bool with_cu_k = false, with_used = false;
  c.capacity.assign(B, 0);
  std::vector<int64_t> used(B);
  if (c.keys == KeyForm::packed) {
    with_cu_k = true, with_used = pick(0, 1) == 1;
    for (int64_t& n : c.capacity) n = pick(0, 4) == 0 ? 0 : pick(1, 12);
  } else if (c.keys == KeyForm::batched) {
    with_used = !c.dense && pick(0, 1) == 1;
    c.k_rows = pick(0, 5) == 0 ? 0 : pick(1, 12);
    std::fill(c.capacity.begin(), c.capacity.end(), c.k_rows);
  } else {
    c.page_size = kPageSizes[pick(0, 6)];
    c.k_rows = c.page_size;
    c.max_blocks = pick(0, std::max<int64_t>(1, 24 / c.page_size));
    // Lengths from seqused_k, from cu_seqlens_k (and perhaps seqused_k), or
    // neither: then each sequence uses its table row's every key.
    const int64_t mode = pick(0, 3);
    with_cu_k = mode == 1 || mode == 2, with_used = mode == 0 || mode == 2;
    for (int64_t& n : c.capacity) n = with_cu_k ? pick(0, c.max_blocks * c.page_size) : c.max_blocks * c.page_size;
  }
  for (int64_t b = 0; b < B; ++b) used[b] = with_used ? pick(0, c.capacity[b]) : c.capacity[b];
  std::vector<int64_t> cu_k(B + 1, pick(0, 2) == 0 ? pick(1, 3) : 0);
  for (int64_t b = 0; b < B; ++b) cu_k[b + 1] = cu_k[b] + c.capacity[b];
  if (c.keys == KeyForm::packed) c.k_rows = cu_k[B] + pick(0, 2);

  // A paged cache's pages: shuffled distinct ids, or ids drawn with
  // replacement (pages shared between sequences, as a prefix cache shares
  // them); table entries past the pages a sequence reads hold garbage.
  std::vector<int64_t> table(B * c.max_blocks, 0);
  if (c.keys == KeyForm::paged) {
    int64_t needed = 0;
    for (int64_t b = 0; b < B; ++b) needed += (used[b] + c.page_size - 1) / c.page_size;
    const bool shared = pick(0, 2) == 0;
    c.num_blocks = shared ? pick(needed > 0 ? 1 : 0, 6) : needed + pick(needed > 0 ? 0 : 1, 3);
    std::vector<int64_t> ids(std::max(needed, c.num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    int64_t next = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t read = (used[b] + c.page_size - 1) / c.page_size;
      for (int64_t p = 0; p < c.max_blocks; ++p) {
        int64_t& id = table[b * c.max_blocks + p];
        if (p < read) {
          id = shared ? pick(0, c.num_blocks - 1) : ids[next++];
        } else {
          const int64_t garbage = pick(0, 3);
          id = garbage == 0   ? -1 - pick(0, 5)
               : garbage == 1 ? c.num_blocks + pick(0, 5)
               : garbage == 2 && c.num_blocks > 0 ? pick(0, c.num_blocks - 1)
                                                  : INT32_MAX;
        }
      }
    }
  }

  // k and v: rows padded by 16-byte vectors; V in K's rows or in the other
  // half of a stacked buffer shares K's row width.
  c.layout = c.keys == KeyForm::paged ? static_cast<KvLayout>(pick(0, 3)) : static_cast<KvLayout>(pick(0, 1));
  const int64_t vector = 16 / element_bytes(kv_dtype);
  const bool stacked = c.layout == KvLayout::stacked || c.layout == KvLayout::stacked_inner;
  const bool shared_rows = c.value_in_key_rows || stacked;
  const int64_t k_outer = c.keys == KeyForm::paged ? c.num_blocks : c.keys == KeyForm::packed ? 1 : B;
  const int64_t k_row = (shared_rows ? std::max(c.dim, c.value_dim) : c.dim) + vector * (pick(0, 2) == 0 ? pick(1, 2) : 0);
  int64_t v_offset = 0, k_elements = 0;
  const std::array<int64_t, 4> k_stride = kv_strides(c.layout, c.k_rows, c.heads_kv, k_row, k_outer, &v_offset, &k_elements);
  c.k_buffer = flat(kv_dtype, k_elements);
  c.params.k = view(c.k_buffer, 0, {k_outer, c.heads_kv, c.k_rows, c.dim}, k_stride);
  if (shared_rows) {
    c.params.v = view(c.k_buffer, c.value_in_key_rows ? 0 : v_offset, {k_outer, c.heads_kv, c.k_rows, c.value_dim}, k_stride);
  } else {
    const int64_t v_row = c.value_dim + vector * (pick(0, 2) == 0 ? pick(1, 2) : 0);
    int64_t unused = 0, v_elements = 0;
    const std::array<int64_t, 4> v_stride = kv_strides(c.layout, c.k_rows, c.heads_kv, v_row, k_outer, &unused, &v_elements);
    c.v_buffer = flat(kv_dtype, v_elements);
    c.params.v = view(c.v_buffer, 0, {k_outer, c.heads_kv, c.k_rows, c.value_dim}, v_stride);
  }
  for (HostTensor* t : {&c.k_buffer, &c.v_buffer}) {
    if (t->storage.empty()) continue;
    if (c.e4m3) {
      fill_e4m3(*t, rng);
    } else {
      ffpa::testing::fill_uniform(*t, rng(), t == &c.k_buffer ? -2.0f : -1.0f, t == &c.k_buffer ? 2.0f : 1.0f);
    }
  }

  // q, o and lse: [1, Hq, rows, .] packed or [B, Hq, Nq, .], [N, H, D] or [H, N, D] order, padded rows.
  const int64_t q_outer = packed_q ? 1 : B;
  const KvLayout q_layout = pick(0, 1) ? KvLayout::bnhd : KvLayout::bhnd;
  const int64_t q_vector = 16 / element_bytes(c.dtype);
  int64_t unused = 0, elements = 0;
  const int64_t q_row = c.dim + q_vector * pick(0, 1), o_row = c.value_dim + q_vector * pick(0, 1);
  const std::array<int64_t, 4> q_stride = kv_strides(q_layout, c.q_rows, c.heads_q, q_row, q_outer, &unused, &elements);
  c.q = flat(c.dtype, elements);
  ffpa::testing::fill_uniform(c.q, rng(), -2.0f, 2.0f);
  c.params.q = view(c.q, 0, {q_outer, c.heads_q, c.q_rows, c.dim}, q_stride);
  const std::array<int64_t, 4> o_stride = kv_strides(q_layout, c.q_rows, c.heads_q, o_row, q_outer, &unused, &elements);
  c.o = flat(c.dtype, elements);
  ffpa::testing::fill_nan(c.o);
  c.params.o = view(c.o, 0, {q_outer, c.heads_q, c.q_rows, c.value_dim}, o_stride);
  if (pick(0, 2) != 0) {
    c.lse = flat(DType::f32, q_outer * c.heads_q * c.q_rows);
    ffpa::testing::fill_nan(c.lse);
    Tensor& lse = c.params.lse;
    lse = view(c.lse, 0, {q_outer, c.heads_q, c.q_rows, 1}, {c.heads_q * c.q_rows, c.q_rows, 1, 1});
    lse.rank = 3;
    if (pick(0, 1) == 1) lse.stride[1] = 1, lse.stride[2] = c.heads_q;  // a [rows, Hq] buffer
  }

  // The batch's int32 tensors, some of them strided views.
  ffpa::SequenceBatch& s = c.sequences;
  if (!c.dense) {
    if (packed_q) s.cu_seqlens_q = (c.cu_q = i32_tensor(cu_q, {B + 1}, {pick(1, 2)}, rng)).tensor;
    if (with_cu_k) s.cu_seqlens_k = (c.cu_k = i32_tensor(cu_k, {B + 1}, {pick(1, 2)}, rng)).tensor;
    if (with_used) s.seqused_k = (c.used = i32_tensor(used, {B}, {pick(1, 2)}, rng)).tensor;
    if (c.keys == KeyForm::paged) {
      const bool column_major = pick(0, 3) == 0;
      const std::vector<int64_t> stride =
          column_major ? std::vector<int64_t>{1, B} : std::vector<int64_t>{c.max_blocks + pick(0, 2), 1};
      s.block_table = (c.table = i32_tensor(table, {B, c.max_blocks}, stride, rng)).tensor;
    }
    const int64_t longest_q = B > 0 ? *std::max_element(seq_q.begin(), seq_q.end()) : 0;
    const int64_t longest_k = B > 0 ? *std::max_element(used.begin(), used.end()) : 0;
    if (pick(0, 1) == 1) s.max_seqlen_q = longest_q + pick(0, 2);
    if (pick(0, 1) == 1) s.max_seqlen_k = longest_k + pick(0, 2);
    c.params.sequences = &s;
  }

  // Options.
  ffpa::Options& opt = c.params.options;
  opt.causal = static_cast<ffpa::Causal>(pick(0, 2));
  if (pick(0, 2) == 0) opt.window_left = pick(0, 6);
  if (pick(0, 2) == 0) opt.window_right = pick(0, 6);
  if (pick(0, 3) == 0) opt.softcap = std::uniform_real_distribution<float>(0.5f, 10.0f)(rng);
  if (pick(0, 3) == 0) opt.scale = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  if (c.dtype == DType::f16 && pick(0, 5) == 0) opt.accumulation = ffpa::Accumulation::f16;
  opt.impl = pick(0, 1) ? ffpa::Impl::automatic : ffpa::Impl::cpu_reference;
  if (pick(0, 2) == 0) {
    const int64_t stride = pick(0, 2);  // 0: one sink for every head
    c.sinks = flat(DType::f32, stride == 0 ? 1 : c.heads_q * stride);
    ffpa::testing::fill_uniform(c.sinks, rng(), -2.0f, 3.0f);
    c.sinks.tensor.shape[0] = c.heads_q, c.sinks.tensor.stride[0] = stride;
    c.params.sinks = c.sinks.tensor;
  }
  if (c.e4m3) {
    c.k_descale = draw_descale(B, c.heads_kv, rng);
    c.v_descale = draw_descale(B, c.heads_kv, rng);
    c.params.k_descale = c.k_descale.tensor, c.params.v_descale = c.v_descale.tensor;
  }

  // Where each sequence's rows are, for the reference.
  c.reference.params = &c.params;
  c.reference.sequences.assign(B, {});
  for (int64_t b = 0; b < B; ++b) {
    SequenceRows& r = c.reference.sequences[b];
    r.q_entry = packed_q ? 0 : b, r.q_first = packed_q ? cu_q[b] : 0, r.seq_q = seq_q[b];
    for (int64_t j = 0; j < used[b]; ++j) {
      if (c.keys == KeyForm::paged) {
        r.keys.push_back({table[b * c.max_blocks + j / c.page_size], j % c.page_size});
      } else {
        r.keys.push_back({c.keys == KeyForm::packed ? 0 : b, (c.keys == KeyForm::packed ? cu_k[b] : 0) + j});
      }
    }
  }
}

bool inject_serving_fault(ServingCase& c, std::mt19937_64& rng) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  ffpa::ForwardParams& p = c.params;
  ffpa::SequenceBatch& s = c.sequences;
  const bool batch = p.sequences != nullptr;
  const int64_t B = c.batch;
  auto refuse = [&](const char* what, StatusCode code) {
    c.fault = what, c.expected = code;
    return true;
  };
  // A fault in the lengths or block ids: the run reads it, validation cannot.
  auto data = [&](const char* what, StatusCode code) {
    c.data_fault = true;
    return refuse(what, code);
  };
  std::vector<Tensor*> present;  // the batch's tensors the call has
  for (Tensor* t : {&s.cu_seqlens_q, &s.cu_seqlens_k, &s.block_table, &s.seqused_k})
    if (batch && t->data) present.push_back(t);
  Tensor* const some = present.empty() ? nullptr : present[pick(0, static_cast<int64_t>(present.size()) - 1)];
  int64_t longest_q = 0, longest_k = 0;
  for (const SequenceRows& r : c.reference.sequences)
    longest_q = std::max(longest_q, r.seq_q), longest_k = std::max<int64_t>(longest_k, r.keys.size());
  constexpr StatusCode lengths = StatusCode::invalid_sequence_lengths;

  switch (pick(0, 38)) {
    case 0: {
      if (!s.cu_seqlens_q.data || B < 1) return false;
      const int64_t b = pick(1, B);
      *i32_at(s.cu_seqlens_q, b) = *i32_at(s.cu_seqlens_q, b - 1) - static_cast<int32_t>(pick(1, 3));
      return data("cu_seqlens_q decreasing", lengths);
    }
    case 1:
      if (!s.cu_seqlens_q.data || B < 1) return false;
      *i32_at(s.cu_seqlens_q, B) = static_cast<int32_t>(c.q_rows + pick(1, 3));
      return data("cu_seqlens_q past q's rows", lengths);
    case 2: {
      if (!s.cu_seqlens_k.data || B < 1) return false;
      const int64_t b = pick(1, B);
      *i32_at(s.cu_seqlens_k, b) = *i32_at(s.cu_seqlens_k, b - 1) - static_cast<int32_t>(pick(1, 3));
      return data("cu_seqlens_k decreasing", lengths);
    }
    case 3:
      if (!s.cu_seqlens_k.data || c.keys != KeyForm::packed || B < 1) return false;
      *i32_at(s.cu_seqlens_k, B) = static_cast<int32_t>(c.k_rows + pick(1, 3));
      return data("cu_seqlens_k past k's rows", lengths);
    case 4: {
      if (!s.cu_seqlens_k.data || c.keys != KeyForm::paged || B < 1) return false;
      const int64_t b = pick(0, B - 1), extra = c.max_blocks * c.page_size - c.capacity[b] + pick(1, 3);
      for (int64_t i = b + 1; i <= B; ++i) *i32_at(s.cu_seqlens_k, i) += static_cast<int32_t>(extra);
      return data("cu_seqlens_k length beyond the block table row", lengths);
    }
    case 5: {
      if (!s.seqused_k.data || B < 1) return false;
      const int64_t b = pick(0, B - 1);
      *i32_at(s.seqused_k, b) = static_cast<int32_t>(pick(0, 1) ? c.capacity[b] + pick(1, 3) : -pick(1, 3));
      return data("seqused_k outside the keys a sequence has", lengths);
    }
    case 6:
      if (c.queries != QueryForm::packed || longest_q < 2) return false;
      s.max_seqlen_q = pick(1, longest_q - 1);
      return data("a sequence beyond max_seqlen_q", lengths);
    case 7:
      if (!batch || longest_k < 2) return false;
      s.max_seqlen_k = pick(1, longest_k - 1);
      return data("a sequence beyond max_seqlen_k", lengths);
    case 8: {
      std::vector<int64_t> reading;
      for (int64_t b = 0; b < B && c.keys == KeyForm::paged; ++b)
        if (!c.reference.sequences[b].keys.empty()) reading.push_back(b);
      if (reading.empty()) return false;
      const int64_t b = reading[pick(0, static_cast<int64_t>(reading.size()) - 1)];
      const int64_t pages = (static_cast<int64_t>(c.reference.sequences[b].keys.size()) + c.page_size - 1) / c.page_size;
      *i32_at(s.block_table, b, pick(0, pages - 1)) =
          static_cast<int32_t>(pick(0, 1) ? c.num_blocks + pick(0, 3) : -pick(1, 3));
      return data("block id out of range", StatusCode::invalid_block_table);
    }
    case 9:
      (pick(0, 1) ? p.options.window_left : p.options.window_right) = -2 - pick(0, 5);
      return refuse("window bound below -1", StatusCode::invalid_window);
    case 10:
      p.options.softcap = pick(0, 2) == 0 ? std::nanf("") : pick(0, 1) ? -0.5f : INFINITY;
      return refuse("softcap not finite and >= 0", StatusCode::invalid_option);
    case 11:
      if (!batch) return false;
      c.mask = ffpa::testing::make_host_tensor(DType::boolean, {1, 1, 1, 1});
      ffpa::testing::fill_bool(c.mask, 1, 1.0);
      p.mask = c.mask.tensor;
      return refuse("mask with a batch", StatusCode::invalid_mask_layout);
    case 12:
      if (!batch) return false;
      p.options.dropout_p = std::uniform_real_distribution<float>(0.05f, 0.9f)(rng);
      return refuse("dropout with a batch", StatusCode::invalid_dropout);
    case 13:
      if (!batch) return false;
      p.options.precision = ffpa::Precision::fp8;
      return refuse("fp8 precision with a batch", StatusCode::invalid_option);
    case 14:
      if (!some) return false;
      some->shape[some->rank] = 1, some->stride[some->rank] = 1, ++some->rank;
      return refuse("batch tensor rank", StatusCode::invalid_rank);
    case 15:
      if (!some) return false;
      some->dtype = std::array<DType, 4>{DType::f32, DType::f16, DType::u8, DType::f64}[pick(0, 3)];
      return refuse("batch tensor dtype", StatusCode::unsupported_dtype);
    case 16:
      if (!some) return false;
      some->stride[pick(0, some->rank - 1)] = -pick(1, 4);
      return refuse("batch tensor negative stride", StatusCode::invalid_stride);
    case 17:
      if (!some) return false;
      some->data = static_cast<unsigned char*>(some->data) + pick(1, 3);
      return refuse("batch tensor misaligned", StatusCode::misaligned);
    case 18: {
      std::vector<Tensor*> sized;  // tensors whose dim 0 is B or B + 1
      for (Tensor* t : {&s.cu_seqlens_k, &s.block_table, &s.seqused_k})
        if (t->data) sized.push_back(t);
      if (sized.empty()) return false;
      sized[pick(0, static_cast<int64_t>(sized.size()) - 1)]->shape[0] += pick(1, 2);
      return refuse("batch tensor shape", StatusCode::shape_mismatch);
    }
    case 19:
      if (c.queries != QueryForm::packed) return false;
      p.q.shape[0] = 2;
      return refuse("packed q with two batch entries", StatusCode::shape_mismatch);
    case 20:
      if (!batch) return false;
      (pick(0, 1) ? s.max_seqlen_q : s.max_seqlen_k) = -pick(1, 5);
      return refuse("max_seqlen negative", StatusCode::invalid_option);
    case 21:
      if (!p.sinks.data) return false;
      p.sinks.dtype = pick(0, 1) ? DType::f16 : DType::f64;
      return refuse("sinks dtype", StatusCode::unsupported_dtype);
    case 22:
      if (!p.sinks.data) return false;
      p.sinks.shape[0] += pick(0, 1) || c.heads_q == 1 ? 1 : -1;
      return refuse("sinks shape", StatusCode::shape_mismatch);
    case 23:
      if (!p.sinks.data) return false;
      p.sinks.rank = 2, p.sinks.shape[1] = 1, p.sinks.stride[1] = 1;
      return refuse("sinks rank", StatusCode::invalid_rank);
    case 24:
      if (!p.sinks.data) return false;
      if (pick(0, 1)) {
        p.sinks.data = static_cast<unsigned char*>(p.sinks.data) + 2;
        return refuse("sinks misaligned", StatusCode::misaligned);
      }
      p.sinks.stride[0] = -1;
      return refuse("sinks negative stride", StatusCode::invalid_stride);
    case 25:
      if (c.e4m3) return false;
      (pick(0, 1) ? c.k_descale : c.v_descale) = draw_descale(B, c.heads_kv, rng);
      if (!c.k_descale.tensor.data && !c.v_descale.tensor.data) return false;
      p.k_descale = c.k_descale.tensor, p.v_descale = c.v_descale.tensor;
      return refuse("descale without an e4m3 cache", StatusCode::invalid_option);
    case 26: {
      if (!p.k_descale.data && !p.v_descale.data) return false;
      Tensor& t = p.k_descale.data && (!p.v_descale.data || pick(0, 1)) ? p.k_descale : p.v_descale;
      switch (pick(0, 4)) {
        case 0: t.shape[0] += 1; return refuse("descale shape", StatusCode::shape_mismatch);
        case 1: t.stride[pick(0, 1)] = -1; return refuse("descale negative stride", StatusCode::invalid_stride);
        case 2: t.dtype = DType::f16; return refuse("descale dtype", StatusCode::unsupported_dtype);
        case 3: t.rank = 1; return refuse("descale rank", StatusCode::invalid_rank);
        default:
          t.data = static_cast<unsigned char*>(t.data) + 2;
          return refuse("descale misaligned", StatusCode::misaligned);
      }
    }
    case 27:
      p.v.dtype = c.e4m3 ? c.dtype : DType::e4m3;
      return refuse(c.e4m3 ? "16-bit v with e4m3 k" : "e4m3 v with 16-bit k", StatusCode::dtype_mismatch);
    case 28: {
      // lse over one of the call's other small inputs.
      std::vector<const Tensor*> inputs(present.begin(), present.end());
      for (const Tensor* t : {&p.sinks, &p.k_descale, &p.v_descale})
        if (t->data) inputs.push_back(t);
      if (!p.lse.data || c.q_rows == 0 || inputs.empty()) return false;
      const Tensor* t = inputs[pick(0, static_cast<int64_t>(inputs.size()) - 1)];
      if (t->shape[0] == 0 || (t->rank > 1 && t->shape[1] == 0)) return false;
      p.lse.data = t->data;
      return refuse("lse overlaps an input", StatusCode::output_overlaps_input);
    }
    case 29:
      if (!batch) return false;
      c.plan = flat(DType::f64, 8);
      p.sequence_plan = static_cast<unsigned char*>(c.plan.tensor.data) + 4;
      return refuse("sequence_plan misaligned", StatusCode::misaligned);
    case 30:
      if (batch) return false;
      c.plan = flat(DType::f64, 8);
      p.sequence_plan = c.plan.tensor.data;
      return refuse("sequence_plan without sequences", StatusCode::invalid_option);
    case 31:
      p.options.impl = static_cast<ffpa::Impl>(4 + pick(0, 99));
      return refuse("impl value", StatusCode::invalid_option);
    case 32:
      p.options.impl = pick(0, 1) ? ffpa::Impl::sm80_split_d : ffpa::Impl::sm90_wgmma;
      c.planning_refusal = true;
      if (c.dtype == DType::f32 || c.dtype == DType::f64)  // the CPU reference's own dtypes
        return refuse("GPU impl with f32 or f64 tensors", StatusCode::unsupported_dtype);
      c.dispatch_refusal = true;
      return refuse("GPU impl on host pointers", StatusCode::impl_unavailable);
    case 33:
      p.options.scale = pick(0, 1) ? std::nanf("") : INFINITY;
      return refuse("scale not finite", StatusCode::invalid_option);
    case 34:
      p.o.stride[3] = 2;
      return refuse("o last-dim stride", StatusCode::noncontiguous_last_dim);
    case 35: {
      Tensor& t = pick(0, 1) ? p.k : p.v;
      if (t.shape[0] * t.shape[2] == 0) return false;  // an empty tensor is never read: any address
      t.data = static_cast<unsigned char*>(t.data) + element_bytes(t.dtype) * (2 * pick(0, 1) + 1);  // never 16 bytes
      return refuse(&t == &p.k ? "k misaligned" : "v misaligned", StatusCode::misaligned);
    }
    case 36:
      p.k.shape[3] += c.e4m3 ? 16 : 8;
      return refuse("k head dim differs from q's", StatusCode::shape_mismatch);
    case 37:
      // Batched queries: every sequence has Nq of them, a shape validation sees.
      if (!batch || c.queries != QueryForm::batched || c.q_rows < 2) return false;
      s.max_seqlen_q = pick(1, c.q_rows - 1);
      return refuse("batched queries beyond max_seqlen_q", lengths);
    default:
      if (!batch || c.keys != KeyForm::paged) return false;
      p.k.rank = 3;
      return refuse("paged k of rank 3", StatusCode::invalid_rank);
  }
}

}  // namespace ffpa_fuzz
