// The CPU reference backend. The work runs one (batch, kv head) block at a
// time: the block's K and V rows are converted to float once (exact for fp16,
// bf16 and f32; double for f64 inputs) and shared by the group's query heads, whose (query head, row
// chunk) work items then run on worker threads. Query rows are computed four at
// a time so that each K/V element loaded serves four rows; every row goes
// through the same code whatever the chunking, the thread count or the row
// subset, so results are bit-identical across them. Scores, softmax and P*V
// are accumulated in double.
#include "reference/cpu_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "common/ceil_div.hpp"
#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "reference/element_io.hpp"
#include "reference/parallel_for.hpp"
#include "reference/score_terms.hpp"

namespace ffpa::detail {
namespace {

constexpr int kRowGroup = 4;  // query rows computed together (the inner loops spell out 4 lanes)

// a * b elements of T for a scratch buffer; std::bad_alloc (reported as
// out_of_memory) when the count overflows or exceeds what a vector can hold,
// so that no size error escapes as another exception.
template <typename T>
size_t scratch_elements(int64_t a, int64_t b) {
  int64_t n = 0;
  if (__builtin_mul_overflow(a, b, &n) || n < 0 || static_cast<uint64_t>(n) > std::vector<T>().max_size())
    throw std::bad_alloc();
  return static_cast<size_t>(n);
}
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Where results go: the problem's o and lse in their dtypes, or contiguous
// fp64 arrays out [B, Hq, R, Dv] and lse [B, Hq, R] (lse may be null).
struct Destination {
  bool f64 = false;
  double* out = nullptr;
  double* lse = nullptr;
};

// Per-worker buffers, allocated before the threads start.
struct Scratch {
  std::vector<double> q;       // [D][kRowGroup]: the group's query rows, lane-interleaved
  std::vector<double> weight;  // [kRowGroup][Nkv]: scores, then softmax weights
  std::vector<double> bias;    // [Nkv]: one mask row as an additive bias
  std::vector<double> out;     // [Dv][kRowGroup]: output accumulators, lane-interleaved
};

template <class Element>
const Element* offset_ptr(const void* base, int64_t elements) {
  return static_cast<const Element*>(base) + elements;
}

// Converts n elements of a row (offset `first` in base) to Kv (float, exact
// for every dtype but f64; double for f64).
template <class Kv>
void convert_row(DType dtype, const void* base, int64_t first, int64_t n, Kv* dst) {
  if (dtype == DType::f16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + first;
    for (int64_t e = 0; e < n; ++e) dst[e] = half_bits_to_float(src[e]);
  } else if (dtype == DType::bf16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + first;
    for (int64_t e = 0; e < n; ++e) dst[e] = bf16_bits_to_float(src[e]);
  } else {
    for (int64_t e = 0; e < n; ++e) dst[e] = static_cast<Kv>(load_element(dtype, base, first + e));
  }
}

// Turns scaled scores w[0, visible) of row (b, h, i) into the row's P*V
// weights over [0, visible_max) (0 for excluded and dropped keys): keys
// before `first` (a window's left bound) and masked ones are excluded; the
// head's sink logit joins the denominator. Returns the row's lse (-inf when
// no key is attended and there is no sink, leaving every weight 0), and in
// *attends whether the row attends a key (its O is 0 otherwise, whatever V
// holds). A row whose softmax is NaN (a NaN score, from q, k or the mask, or
// exp(inf - inf)) gets lse NaN and NaN weights: spec.md, "Non-finite inputs".
double softmax_weights(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t first,
                       int64_t visible, int64_t visible_max, double* w, double* bias, bool* attends) {
  mask_bias(p, b, h, i, visible, bias);
  double max_score = kNegInf;
  bool nan_score = false;
  for (int64_t j = 0; j < visible; ++j) {
    w[j] = j < first ? kNegInf : w[j] + bias[j];
    nan_score |= std::isnan(w[j]);
    max_score = std::max(max_score, w[j]);  // a NaN does not count
  }
  std::fill(w + visible, w + visible_max, 0.0);
  *attends = nan_score || max_score != kNegInf;
  const double sink = p.sinks != nullptr ? static_cast<double>(p.sinks[h * p.sinks_stride]) : kNegInf;
  const double base = std::max(max_score, sink);
  if (base == kNegInf && !nan_score) {
    std::fill(w, w + visible, 0.0);
    return kNegInf;
  }
  double denominator = 0.0;
  for (int64_t j = 0; j < visible; ++j) {
    w[j] = std::exp(w[j] - base);  // exp(-inf) = 0 for excluded keys
    denominator += w[j];
  }
  if (sink != kNegInf) denominator += std::exp(sink - base);
  if (nan_score || std::isnan(denominator)) {
    std::fill(w, w + visible, std::numeric_limits<double>::quiet_NaN());
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (p.has_dropout()) {
    const double factor = static_cast<double>(p.dropout_scale) / denominator;
    const uint64_t head_word = dropout_head_word(p.dropout_offset, static_cast<uint64_t>(b * p.heads_q + h),
                                                 static_cast<uint64_t>(p.seq_q), static_cast<uint64_t>(p.seq_kv));
    for (int64_t j = 0; j < visible; ++j) {
      const uint64_t word = dropout_word(head_word, static_cast<uint32_t>(i), static_cast<uint32_t>(p.seq_kv),
                                         static_cast<uint32_t>(j));
      w[j] = dropout_draw(p.dropout_seed, word) >= p.dropout_threshold ? w[j] * factor : 0.0;
    }
  } else {
    const double factor = 1.0 / denominator;
    for (int64_t j = 0; j < visible; ++j) w[j] *= factor;
  }
  return base + std::log(denominator);
}

// A descale of an e4m3 KV cache ([B, Hkv] f32), 1 when absent.
double descale(const float* descales, const int64_t (&stride)[2], int64_t b, int64_t kv_head) {
  return descales != nullptr ? static_cast<double>(descales[b * stride[0] + kv_head * stride[1]]) : 1.0;
}

// A scaled score: scale * q.k, through the softcap c * tanh(s / c) when there is one.
double scaled_score(const AttentionProblem& p, double scale, double dot) {
  const double s = scale * dot;
  if (p.softcap <= 0.0f) return s;
  const double c = p.softcap;
  return c * std::tanh(s / c);
}

// Computes query rows rows[0..kRowGroup) of head h, batch b into s.out and
// lse. k and v are the kv head's rows as Kv, [Nkv][D].
template <class Kv>
void attend_row_group(const AttentionProblem& p, int64_t b, int64_t h, const Kv* k,
                      const Kv* v, const int64_t (&rows)[kRowGroup], Scratch& s,
                      double (&lse)[kRowGroup]) {
  static_assert(kRowGroup == 4, "the loops below spell out four lanes");
  const int64_t dim = p.head_dim, dv = p.dv(), nkv = p.seq_kv;
  int64_t first[kRowGroup], visible[kRowGroup];
  int64_t visible_max = 0;
  for (int r = 0; r < kRowGroup; ++r) {
    const int64_t q_row = b * p.q_stride[0] + h * p.q_stride[1] + rows[r] * p.q_stride[2];
    for (int64_t d = 0; d < dim; ++d) s.q[d * kRowGroup + r] = load_element(p.dtype, p.q, q_row + d);
    const KeyRange keys = attended_keys(p, rows[r], p.seq_q, p.seq_kv);
    first[r] = keys.first;
    visible[r] = keys.end;
    visible_max = std::max(visible_max, visible[r]);
  }

  // An e4m3 cache's codes were converted as they are: its descales multiply
  // the scores and the output (FlashAttention-3's k_descale / v_descale).
  const int64_t kv_head = h / p.group_size();
  const double scale = p.scale * descale(p.k_descale, p.k_descale_stride, b, kv_head);
  const double v_scale = descale(p.v_descale, p.v_descale_stride, b, kv_head);
  double* w0 = s.weight.data();
  double* w1 = w0 + nkv;
  double* w2 = w1 + nkv;
  double* w3 = w2 + nkv;
  for (int64_t j = 0; j < visible_max; ++j) {
    const Kv* kj = k + j * dim;
    const double* q = s.q.data();
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    for (int64_t d = 0; d < dim; ++d, q += kRowGroup) {
      const double x = kj[d];
      a0 += q[0] * x;
      a1 += q[1] * x;
      a2 += q[2] * x;
      a3 += q[3] * x;
    }
    w0[j] = scaled_score(p, scale, a0);
    w1[j] = scaled_score(p, scale, a1);
    w2[j] = scaled_score(p, scale, a2);
    w3[j] = scaled_score(p, scale, a3);
  }
  // The keys whose V rows each row adds, weight 0 or not (0 * NaN is NaN):
  // its keys in reach [first, visible), none for a row with no attended key
  // (O = 0).
  int64_t end[kRowGroup];
  for (int r = 0; r < kRowGroup; ++r) {
    double* const w = w0 + r * nkv;
    bool attends = false;
    lse[r] = softmax_weights(p, b, h, rows[r], first[r], visible[r], visible_max, w, s.bias.data(), &attends);
    end[r] = attends ? visible[r] : first[r];
    if (v_scale != 1.0)
      for (int64_t j = 0; j < visible_max; ++j) w[j] *= v_scale;
  }

  // Keys every row adds go four lanes at a time, the others lane by lane,
  // each lane's in key order. Adding a weight 0 times a finite V changes no
  // bit: the accumulators start at +0, so they are never -0, and adding +-0
  // to a value other than -0 leaves it.
  std::fill(s.out.begin(), s.out.end(), 0.0);
  const int64_t shared_first = *std::max_element(first, first + kRowGroup);
  const int64_t shared_end = std::max(shared_first, *std::min_element(end, end + kRowGroup));
  auto add_lane = [&](int r, int64_t from, int64_t to) {
    const double* w = w0 + r * nkv;
    for (int64_t j = from; j < to; ++j) {
      const Kv* vj = v + j * dv;
      double* o = s.out.data() + r;
      for (int64_t d = 0; d < dv; ++d, o += kRowGroup) *o += w[j] * vj[d];
    }
  };
  for (int r = 0; r < kRowGroup; ++r) add_lane(r, first[r], std::min(end[r], shared_first));
  for (int64_t j = shared_first; j < shared_end; ++j) {
    const double c0 = w0[j], c1 = w1[j], c2 = w2[j], c3 = w3[j];
    const Kv* vj = v + j * dv;
    double* o = s.out.data();
    for (int64_t d = 0; d < dv; ++d, o += kRowGroup) {
      const double x = vj[d];
      o[0] += c0 * x;
      o[1] += c1 * x;
      o[2] += c2 * x;
      o[3] += c3 * x;
    }
  }
  for (int r = 0; r < kRowGroup; ++r) add_lane(r, std::max(first[r], shared_end), end[r]);
}

// Writes lane `lane` of s.out (row i, position r in the row selection).
void store_row(const AttentionProblem& p, const Destination& dst, int64_t row_count, int64_t b,
               int64_t h, int64_t r, int64_t i, const Scratch& s, int lane, double lse) {
  const int64_t dim = p.dv();
  const double* o = s.out.data() + lane;
  if (dst.f64) {
    double* out = dst.out + ((b * p.heads_q + h) * row_count + r) * dim;
    for (int64_t d = 0; d < dim; ++d) out[d] = o[d * kRowGroup];
    if (dst.lse != nullptr) dst.lse[(b * p.heads_q + h) * row_count + r] = lse;
    return;
  }
  const int64_t out_row = b * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2];
  for (int64_t d = 0; d < dim; ++d) store_element(p.dtype, p.o, out_row + d, o[d * kRowGroup]);
  if (p.lse != nullptr) {
    p.lse[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
        static_cast<float>(lse);
  }
}

template <class Kv>
void run(const AttentionProblem& p, RowSubset subset, int num_threads, const Destination& dst) {
  const int64_t row_count = subset.rows != nullptr ? subset.count : p.seq_q;
  if (p.batch <= 0 || p.heads_q <= 0 || row_count <= 0) return;
  auto row_at = [&](int64_t r) { return subset.rows != nullptr ? subset.rows[r] : r; };

  const int threads = resolve_threads(num_threads);
  const int64_t dim = p.head_dim, dv = p.dv(), nkv = p.seq_kv, group = p.group_size();
  // Enough items per block to balance the threads; whole row groups per chunk.
  const int64_t rows_per_item =
      ceil_div(ceil_div(group * row_count, int64_t{4} * threads), kRowGroup) * kRowGroup;
  const int64_t chunks = ceil_div(row_count, rows_per_item);
  const int64_t items = group * chunks;
  const int workers = static_cast<int>(std::min<int64_t>(threads, items));

  std::vector<Scratch> scratch(workers);
  for (Scratch& s : scratch) {
    s.q.resize(scratch_elements<double>(dim, kRowGroup));
    s.weight.resize(scratch_elements<double>(kRowGroup, nkv));
    s.bias.resize(scratch_elements<double>(nkv, 1));
    s.out.resize(scratch_elements<double>(dv, kRowGroup));
  }
  std::vector<Kv> k_block(scratch_elements<Kv>(nkv, dim)), v_block(scratch_elements<Kv>(nkv, dv));
  constexpr int64_t kElementsPerConversionSlice = int64_t{1} << 16;
  const int64_t slices = std::clamp<int64_t>(nkv * dim / kElementsPerConversionSlice, 1, threads);

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t kv_head = 0; kv_head < p.heads_kv; ++kv_head) {
      parallel_for(slices, threads, [&](int, int64_t slice) {
        for (int64_t j = nkv * slice / slices; j < nkv * (slice + 1) / slices; ++j) {
          convert_row(p.kv_dtype(), p.k, b * p.k_stride[0] + kv_head * p.k_stride[1] + j * p.k_stride[2], dim,
                      k_block.data() + j * dim);
          convert_row(p.kv_dtype(), p.v, b * p.v_stride[0] + kv_head * p.v_stride[1] + j * p.v_stride[2], dv,
                      v_block.data() + j * dv);
        }
      });
      parallel_for(items, workers, [&](int worker, int64_t item) {
        const int64_t h = kv_head * group + item / chunks;
        const int64_t first = item % chunks * rows_per_item;
        const int64_t last = std::min(row_count, first + rows_per_item);
        for (int64_t r0 = first; r0 < last; r0 += kRowGroup) {
          const int lanes = static_cast<int>(std::min<int64_t>(kRowGroup, last - r0));
          int64_t rows[kRowGroup];
          for (int lane = 0; lane < kRowGroup; ++lane) {
            rows[lane] = row_at(r0 + std::min(lane, lanes - 1));  // spare lanes repeat a row
          }
          double lse[kRowGroup];
          attend_row_group(p, b, h, k_block.data(), v_block.data(), rows, scratch[worker], lse);
          for (int lane = 0; lane < lanes; ++lane) {
            store_row(p, dst, row_count, b, h, r0 + lane, rows[lane], scratch[worker], lane,
                      lse[lane]);
          }
        }
      });
    }
  }
}

// K and V rows kept as float (exact) unless the inputs are f64.
void run_any(const AttentionProblem& p, RowSubset subset, int num_threads, const Destination& dst) {
  if (p.dtype == DType::f64) {
    run<double>(p, subset, num_threads, dst);
  } else {
    run<float>(p, subset, num_threads, dst);
  }
}

const void* advance(const void* base, DType dtype, int64_t elements) {
  return static_cast<const unsigned char*>(base) + elements * element_bytes(dtype);
}

// A serving call (docs/serving.md), one sequence at a time as the dense call
// of one batch entry it is: its rows of q, o and lse, its keys (a paged
// sequence's gathered into a dense copy first), its lengths and descales.
void run_sequences(const AttentionProblem& p, int num_threads, const Destination& dst) {
  const SequenceLayout& layout = p.sequences;
  const DType kv = p.kv_dtype();
  std::vector<unsigned char> k_pages, v_pages;  // a paged sequence's keys, [Hkv, Nkv_b, D] dense
  for (int64_t b = 0; b < p.batch; ++b) {
    const Sequence seq = sequence_at(layout, b);
    if (seq.seq_q == 0) continue;
    AttentionProblem one = p;
    one.sequences = SequenceLayout{};
    one.batch = 1;
    one.seq_q = seq.seq_q;
    one.seq_kv = seq.seq_kv;
    one.q = advance(p.q, p.dtype, query_row_offset(p.q_stride, seq, 0, 0));
    one.o = const_cast<void*>(advance(p.o, p.dtype, query_row_offset(p.o_stride, seq, 0, 0)));
    if (p.lse != nullptr) one.lse = p.lse + query_row_offset(p.lse_stride, seq, 0, 0);
    if (layout.paged()) {
      const int64_t bytes = element_bytes(kv);
      k_pages.resize(scratch_elements<unsigned char>(p.heads_kv * seq.seq_kv * p.head_dim, bytes));
      v_pages.resize(scratch_elements<unsigned char>(p.heads_kv * seq.seq_kv * p.dv(), bytes));
      for (int64_t h = 0; h < p.heads_kv; ++h)
        for (int64_t j = 0; j < seq.seq_kv; ++j) {
          std::memcpy(k_pages.data() + (h * seq.seq_kv + j) * p.head_dim * bytes,
                      advance(p.k, kv, key_row_offset(layout, p.k_stride, seq, b, h, j)), p.head_dim * bytes);
          std::memcpy(v_pages.data() + (h * seq.seq_kv + j) * p.dv() * bytes,
                      advance(p.v, kv, key_row_offset(layout, p.v_stride, seq, b, h, j)), p.dv() * bytes);
        }
      one.k = k_pages.data();
      one.v = v_pages.data();
      one.k_stride[1] = seq.seq_kv * p.head_dim, one.k_stride[2] = p.head_dim;
      one.v_stride[1] = seq.seq_kv * p.dv(), one.v_stride[2] = p.dv();
      one.k_stride[0] = one.v_stride[0] = 0;
    } else {
      one.k = advance(p.k, kv, key_row_offset(layout, p.k_stride, seq, b, 0, 0));
      one.v = advance(p.v, kv, key_row_offset(layout, p.v_stride, seq, b, 0, 0));
    }
    if (p.k_descale != nullptr) one.k_descale = p.k_descale + b * p.k_descale_stride[0];
    if (p.v_descale != nullptr) one.v_descale = p.v_descale + b * p.v_descale_stride[0];
    run_any(one, {}, num_threads, dst);
  }
}

}  // namespace

void cpu_attention_forward(const AttentionProblem& problem, RowSubset rows, int num_threads) {
  if (problem.sequences.active) return run_sequences(problem, num_threads, Destination{});
  run_any(problem, rows, num_threads, Destination{});
}

void cpu_attention_forward_f64(const AttentionProblem& problem, RowSubset rows, double* out,
                               double* lse, int num_threads) {
  run_any(problem, rows, num_threads, Destination{true, out, lse});
}

}  // namespace ffpa::detail
