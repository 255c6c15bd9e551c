// Where NaN inputs must show in a forward's and a backward's results, and
// where they may, by spec.md's "Non-finite inputs" rules, read off a problem's
// (host) inputs: for the tests that put NaN into q, k, v or the mask and
// compare with a run without them. Each element is expected bit-identical to
// that run (same), NaN (nan), or either: a kernel computes whole KV blocks, so
// a NaN of a key outside a row's reach (its causal limit, its window) may
// reach the row through P = 0 (0 x NaN on the tensor cores) or its mask
// element (added after the limit's -inf), where the CPU reference never adds
// that key (`window` = 0: the reference's exact rules). Dense calls.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "reference/element_io.hpp"
#include "reference/score_terms.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {

enum class Expect : uint8_t { same, nan, either };

// Keys outside a row's reach that a kernel may load with it: a tile's rows
// (at most 128) and a KV block's keys (at most 128) beyond either end.
constexpr int64_t kKernelKeyWindow = 256;

struct ForwardExpectation {
  std::vector<Expect> o;    // [B][Hq][Nq][Dv]
  std::vector<Expect> lse;  // [B][Hq][Nq]
  std::vector<detail::KeyRange> reach;  // [B][Hq][Nq]: the row's keys before the mask
  std::vector<uint8_t> empty;           // [B][Hq][Nq]: no attended key (O = 0)
  int64_t nan_rows = 0, nan_elements = 0;  // of o: rows wholly NaN, elements NaN
};

// The keys a kernel may load with a row beside its reach (within `window` of
// either end); for a row with no attended key also the reach itself.
struct LoadedKeys {
  int64_t first, end;  // [first, end) holds them and the reach
  detail::KeyRange reach;
  bool outside(int64_t j) const { return j >= first && j < end && (j < reach.first || j >= reach.end); }
};

inline LoadedKeys loaded_keys(const detail::KeyRange& reach, int64_t nkv, int64_t window) {
  if (window == 0) return {reach.first, reach.end, reach};
  return {std::max<int64_t>(0, reach.first - window), std::min(nkv, reach.end + window), reach};
}

// NaN positions of one (batch, kv head)'s K rows and V elements.
struct KeyValueNans {
  std::vector<uint8_t> key;    // [Nkv]: K row j holds a NaN
  std::vector<uint8_t> value;  // [Nkv][Dv]
  bool any_value(int64_t j, int64_t dv) const {
    for (int64_t c = 0; c < dv; ++c)
      if (value[j * dv + c]) return true;
    return false;
  }
};

inline KeyValueNans key_value_nans(const detail::AttentionProblem& p, int64_t b, int64_t g) {
  const int64_t nkv = p.seq_kv, dim = p.head_dim, dv = p.dv();
  KeyValueNans n;
  n.key.assign(nkv, 0);
  n.value.assign(nkv * dv, 0);
  for (int64_t j = 0; j < nkv; ++j) {
    for (int64_t d = 0; d < dim; ++d)
      if (std::isnan(detail::load_element(p.dtype, p.k, b * p.k_stride[0] + g * p.k_stride[1] + j * p.k_stride[2] + d)))
        n.key[j] = 1;
    for (int64_t c = 0; c < dv; ++c)
      n.value[j * dv + c] =
          std::isnan(detail::load_element(p.dtype, p.v, b * p.v_stride[0] + g * p.v_stride[1] + j * p.v_stride[2] + c));
  }
  return n;
}

inline ForwardExpectation expect_forward_nans(const detail::AttentionProblem& p, int64_t window) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q, dv = p.dv(), nkv = p.seq_kv;
  ForwardExpectation e;
  e.o.assign(rows * dv, Expect::same);
  e.lse.assign(rows, Expect::same);
  e.reach.assign(rows, {});
  e.empty.assign(rows, 0);
  std::vector<double> bias(nkv);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t g = 0; g < p.heads_kv; ++g) {
      const KeyValueNans kv = key_value_nans(p, b, g);
      for (int64_t h = g * p.group_size(); h < (g + 1) * p.group_size(); ++h) {
        for (int64_t i = 0; i < p.seq_q; ++i) {
          const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
          const detail::KeyRange reach = detail::attended_keys(p, i, p.seq_q, nkv);
          const LoadedKeys loaded = loaded_keys(reach, nkv, window);
          detail::mask_bias(p, b, h, i, loaded.end, bias.data());
          bool q_nan = false;
          for (int64_t d = 0; d < p.head_dim; ++d)
            q_nan |= std::isnan(
                detail::load_element(p.dtype, p.q, b * p.q_stride[0] + h * p.q_stride[1] + i * p.q_stride[2] + d));
          bool any_nan_score = false, any_attended = false, mask_nan_loaded = false;
          for (int64_t j = reach.first; j < reach.end; ++j) {
            const bool nan_score = q_nan || kv.key[j] || std::isnan(bias[j]);
            any_nan_score |= nan_score;
            any_attended |= nan_score || bias[j] != -INFINITY;
          }
          // A kernel adds the mask after the limits' -inf: a mask NaN outside
          // the reach, in a block the row's tile computes, is NaN.
          for (int64_t j = loaded.first; j < loaded.end; ++j) mask_nan_loaded |= loaded.outside(j) && std::isnan(bias[j]);
          e.reach[row] = reach;
          e.empty[row] = !any_attended;
          Expect* const o = e.o.data() + row * dv;
          if (mask_nan_loaded && !any_nan_score) {
            std::fill(o, o + dv, Expect::either);
            e.lse[row] = Expect::either;
            continue;
          }
          if (!any_attended) continue;  // O = 0, LSE = -inf, whatever V holds
          if (any_nan_score) {
            std::fill(o, o + dv, Expect::nan);
            e.lse[row] = Expect::nan;
            ++e.nan_rows;
            continue;
          }
          for (int64_t c = 0; c < dv; ++c) {
            for (int64_t j = reach.first; j < reach.end && o[c] != Expect::nan; ++j)
              if (kv.value[j * dv + c]) o[c] = Expect::nan;
            for (int64_t j = loaded.first; j < loaded.end && o[c] == Expect::same; ++j)
              if (loaded.outside(j) && kv.value[j * dv + c]) o[c] = Expect::either;
          }
        }
      }
    }
  }
  for (const Expect x : e.o) e.nan_elements += x == Expect::nan ? 1 : 0;
  return e;
}

struct BackwardExpectation {
  std::vector<Expect> d_q;  // [B][Hq][Nq][D]
  std::vector<Expect> d_k;  // [B][Hkv][Nkv][D]
  std::vector<Expect> d_v;  // [B][Hkv][Nkv][Dv]
};

// The backward of the forward `fwd` describes (its o and lse, d_o finite):
// a row whose O holds a NaN has delta NaN, so dS of each key in its reach is
// NaN: dQ of the row and dK of those keys; a row whose LSE is NaN has every
// P of its reach NaN: dV of those keys too. A kernel also multiplies the P =
// 0 of a key outside a row's reach (in its blocks; of every loaded key for a
// row with no attended key), and its tiles' zero-filled rows past Nq, by that
// key's NaN dP or K: either, within `window`.
inline BackwardExpectation expect_backward_nans(const detail::AttentionProblem& p, const ForwardExpectation& fwd,
                                                int64_t window) {
  const int64_t dim = p.head_dim, dv = p.dv(), nkv = p.seq_kv;
  BackwardExpectation e;
  e.d_q.assign(p.batch * p.heads_q * p.seq_q * dim, Expect::same);
  e.d_k.assign(p.batch * p.heads_kv * nkv * dim, Expect::same);
  e.d_v.assign(p.batch * p.heads_kv * nkv * dv, Expect::same);
  std::vector<double> bias(nkv);
  auto raise = [](Expect* first, int64_t n, Expect to) {
    for (Expect* x = first; x < first + n; ++x)
      if (to == Expect::nan || *x == Expect::same) *x = to;
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t g = 0; g < p.heads_kv; ++g) {
      const KeyValueNans kv = key_value_nans(p, b, g);
      Expect* const d_k = e.d_k.data() + (b * p.heads_kv + g) * nkv * dim;
      Expect* const d_v = e.d_v.data() + (b * p.heads_kv + g) * nkv * dv;
      for (int64_t h = g * p.group_size(); h < (g + 1) * p.group_size(); ++h) {
        for (int64_t i = 0; i < p.seq_q; ++i) {
          const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
          const detail::KeyRange reach = fwd.reach[row];
          const Expect* const o = fwd.o.data() + row * dv;
          const bool o_nan = std::find(o, o + dv, Expect::nan) != o + dv;
          const bool o_either = std::find(o, o + dv, Expect::either) != o + dv;
          const bool lse_nan = fwd.lse[row] == Expect::nan;
          Expect* const d_q = e.d_q.data() + row * dim;
          const LoadedKeys loaded = loaded_keys(reach, nkv, window);
          // Keys a kernel loads with the row but the row does not attend:
          // outside its reach, or every loaded key of a row with none.
          auto loose = [&](int64_t j) { return loaded.outside(j) || (window > 0 && fwd.empty[row] && j >= loaded.first && j < loaded.end); };
          detail::mask_bias(p, b, h, i, loaded.end, bias.data());
          for (int64_t j = loaded.first; j < loaded.end; ++j) {
            const bool in_reach = j >= reach.first && j < reach.end;
            if (in_reach && o_nan) {
              raise(d_k + j * dim, dim, Expect::nan);
              if (lse_nan) raise(d_v + j * dv, dv, Expect::nan);
            }
            if (!in_reach && (o_nan || o_either)) {  // P = exp2(-inf - NaN) and dS of its loaded keys
              raise(d_k + j * dim, dim, Expect::either);
              if (lse_nan) raise(d_v + j * dv, dv, Expect::either);
            }
            if (in_reach && o_either) raise(d_k + j * dim, dim, Expect::either);
            if (!in_reach && std::isnan(bias[j])) {  // a mask NaN past the limits: that score, P and dS NaN
              raise(d_q, dim, Expect::either);
              raise(d_k + j * dim, dim, Expect::either);
              raise(d_v + j * dv, dv, Expect::either);
            }
            // A loaded key the row does not attend (P = 0), and the tile's
            // zero-filled rows past Nq (0 x NaN scores): a V NaN makes dS =
            // 0 x NaN (dQ, the key's dK), a K NaN the score and P NaN (dQ,
            // the key's dK and dV).
            if (loose(j) && (kv.key[j] || kv.any_value(j, dv))) {
              raise(d_q, dim, Expect::either);
              raise(d_k + j * dim, dim, Expect::either);
              if (kv.key[j]) raise(d_v + j * dv, dv, Expect::either);
            }
          }
          if (o_nan) raise(d_q, dim, Expect::nan);
          if (o_either) raise(d_q, dim, Expect::either);
        }
      }
    }
  }
  return e;
}

// The NaNs the tests put into a forward's inputs, each where it reaches some
// rows and not others: q row Nq/2 of the last batch and head; k row
// 2 Nkv / 3 of batch 0, kv head 0 (past the causal limit of the first rows);
// v element (Nkv / 4, Dv - 2) of the last batch and kv head; with an additive
// mask one element of its last row. Tensors are the logical views (strides).
inline void put_nans(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask) {
  const double nan = std::nan("");
  auto at = [](const Tensor& t, int64_t a, int64_t b, int64_t c, int64_t d) {
    return std::array<int64_t, 4>{std::min(a, t.shape[0] - 1), std::min(b, t.shape[1] - 1),
                                  std::min(c, t.shape[2] - 1), std::min(d, t.shape[3] - 1)};
  };
  set_element(q, at(q, q.shape[0] - 1, q.shape[1] - 1, q.shape[2] / 2, q.shape[3] / 3), nan);
  set_element(k, at(k, 0, 0, 2 * k.shape[2] / 3, 1), nan);
  set_element(v, at(v, v.shape[0] - 1, v.shape[1] - 1, v.shape[2] / 4, v.shape[3] - 2), nan);
  if (mask != nullptr && mask->data != nullptr && mask->dtype != DType::boolean)
    set_element(*mask, at(*mask, 0, 0, mask->shape[2] - 1, mask->shape[3] / 2), nan);
}

// Elements of `got` (the run with NaN inputs) off `expect`: not NaN where
// nan, not equal to `clean` (the run without them) where same. Prints the
// first few, tagged `what`.
inline int64_t count_off(const std::vector<Expect>& expect, const std::vector<double>& got,
                         const std::vector<double>& clean, const char* what) {
  int64_t off = 0;
  for (size_t e = 0; e < expect.size(); ++e) {
    const bool bad = expect[e] == Expect::nan ? !std::isnan(got[e]) : expect[e] == Expect::same && got[e] != clean[e];
    if (bad && off++ < 5) {
      std::printf("  %s element %zu: got %g, clean %g, expected %s\n", what, e, got[e], clean[e],
                  expect[e] == Expect::nan ? "NaN" : "the clean value");
    }
  }
  return off;
}

}  // namespace ffpa::testing
