// A seeded random driver over the C ABI and the C++ API on host pointers, for
// a build under AddressSanitizer and UndefinedBehaviorSanitizer
// (-DFFPA_SANITIZE=ON). Each case draws a valid call, then perhaps one fault
// (a null pointer, a wrong rank, shape, dtype, stride, alignment, overlap,
// option or impl), runs it through both APIs and checks:
//   - the C and C++ statuses are equal;
//   - a call without a fault succeeds, and a call with one is refused;
//   - a refused call leaves every input and output byte untouched;
//   - select_kernel and workspace_size agree with forward;
//   - a successful call equals an independent fp64 reference (written here,
//     from the spec: masks, both causal alignments, GQA, dropout, LSE, Dv != D);
//   - with its lse, the call's backward (half the time with a gradient of the lse
//     too) gives the same status and the same
//     gradient bits through both APIs;
//   - in a sixth of the valid calls (drawn from a third generator), K and V
//     go through fp8_quantize_kv (both APIs: the same status and cache bytes,
//     k and v untouched) and the call runs with precision fp8 and that FP8 KV
//     cache, valid or with one fault: a valid one is refused by planning
//     (FP8 runs on GPU tensors only), a broken one with its own status, and
//     neither writes anything.
// Seeds with bit 62 set (kServingSeedBit, printed in hex) draw serving calls
// instead: a SequenceBatch, window, softcap, sinks, an e4m3 KV cache, with
// their own faults and checks (serving_cases.hpp); the random run alternates
// the two kinds.
//
//   ffpa_api_fuzz [--seconds N] [--seed S] [--cases N] [--corpus FILE] [--list] [--threads N] [--version]
// The corpus is a list of seeds (one a line, '#' comments) run first. Prints
// the statuses seen and a closing "N passed, N failed" line; exits 1 on any
// failed check. --list prints each case's seed, status and fault (to grow
// the corpus). --threads N runs the random cases from N threads at once (for
// the ThreadSanitizer build, -DFFPA_SANITIZE=thread).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/float16_bits.hpp"
#include "common/philox.hpp"
#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "fuzz/fuzz_support.hpp"
#include "fuzz/serving_cases.hpp"
#include "support/fp8_kv_cache.hpp"
#include "support/host_tensors.hpp"

namespace {

using ffpa::Causal;
using ffpa::DType;
using ffpa::ForwardParams;
using ffpa::Impl;
using ffpa::Status;
using ffpa::StatusCode;
using ffpa::Tensor;
using ffpa::testing::c_tensor;
using ffpa::testing::HostTensor;
using ffpa::testing::Layout;
using ffpa_fuzz::c_cache;
using ffpa_fuzz::c_fp8_options;
using ffpa_fuzz::CBackward;
using ffpa_fuzz::CForward;
using ffpa_fuzz::seed_text;
using ffpa_fuzz::Tally;

// One drawn call: the buffers it owns and its parameters.
struct Case {
  int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 1, seq_kv = 1, dim = 8;
  int64_t value_dim = 8;  // Dv of v and o (D_qk != D_v in a fifth of the calls)
  DType dtype = DType::bf16;
  HostTensor q, k, v, o, mask, lse;
  bool has_mask = false, has_lse = false;
  std::array<bool, 4> mask_broadcast{};
  ForwardParams params;
  std::string fault;  // empty: a valid call
  // An FP8 KV cache the call runs with (its fault, if any, in cache_fault and
  // the status it must get in cache_status).
  ffpa::testing::HostKvCache cache;
  ffpa::Fp8KvCache cache_view;
  bool has_cache = false;
  std::string cache_fault;
  StatusCode cache_status = StatusCode::ok;
};

// `side` draws what was added after the corpus (tests/fuzz/corpus.txt) was
// recorded, so that its seeds still replay the calls they were found with.
Case draw_valid(std::mt19937_64& rng, std::mt19937_64& side) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  Case c;
  c.batch = pick(0, 4) == 0 ? 0 : pick(1, 2);
  c.heads_kv = pick(1, 3);
  c.heads_q = c.heads_kv * pick(1, 3);
  c.seq_q = pick(0, 5) == 0 ? 0 : pick(1, 9);
  c.seq_kv = pick(0, 5) == 0 ? 0 : pick(1, 11);
  c.dim = 8 * pick(1, 9);
  c.value_dim = std::uniform_int_distribution<int64_t>(0, 4)(side) == 0
                    ? 8 * std::uniform_int_distribution<int64_t>(1, 9)(side)
                    : c.dim;
  c.dtype = pick(0, 1) ? DType::bf16 : DType::f16;
  // One call in eight in f32 or f64, the CPU reference's own dtypes (from the side generator).
  if (side() % 8 == 0) c.dtype = side() % 2 ? DType::f64 : DType::f32;
  const Layout q_layout = pick(0, 1) ? Layout::bhnd : Layout::bnhd;
  const Layout kv_layout = pick(0, 1) ? Layout::bhnd : Layout::bnhd;
  c.q = ffpa::testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim}, q_layout);
  c.k = ffpa::testing::make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim}, kv_layout);
  c.v = ffpa::testing::make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.value_dim}, kv_layout);
  c.o = ffpa::testing::make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.value_dim}, q_layout);
  const uint64_t seed = rng();
  ffpa::testing::fill_uniform(c.q, seed, -2.0f, 2.0f);
  ffpa::testing::fill_uniform(c.k, seed + 1, -2.0f, 2.0f);
  ffpa::testing::fill_uniform(c.v, seed + 2, -1.0f, 1.0f);
  ffpa::testing::fill_nan(c.o);
  ForwardParams& p = c.params;
  p.q = c.q.tensor, p.k = c.k.tensor, p.v = c.v.tensor, p.o = c.o.tensor;
  c.has_mask = pick(0, 2) == 0;
  if (c.has_mask) {
    const int kind = static_cast<int>(pick(0, 2));
    const DType mask_dtype = kind == 0 ? DType::boolean : kind == 1 ? c.dtype : DType::f32;
    c.mask = ffpa::testing::make_host_tensor(mask_dtype, {c.batch, c.heads_q, c.seq_q, c.seq_kv});
    ffpa::testing::fill_uniform(c.mask, seed + 3, -3.0f, 1.0f);
    c.mask_broadcast = {pick(0, 1) == 1, pick(0, 1) == 1, pick(0, 1) == 1, pick(0, 3) == 0};
    p.mask = ffpa::testing::broadcast_view(c.mask, c.mask_broadcast);
  }
  c.has_lse = pick(0, 1) == 1;
  if (c.has_lse) {
    c.lse = ffpa::testing::make_host_lse(c.batch, c.heads_q, c.seq_q);
    ffpa::testing::fill_nan(c.lse);
    p.lse = c.lse.tensor;
  }
  p.options.causal = static_cast<Causal>(pick(0, 2));
  if (pick(0, 2) == 0) p.options.scale = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  if (pick(0, 3) == 0) {
    p.options.dropout_p = std::uniform_real_distribution<float>(0.0f, 0.9f)(rng);
    p.options.dropout_seed = rng(), p.options.dropout_offset = rng();
  }
  if (c.dtype == DType::f16 && pick(0, 3) == 0) p.options.accumulation = ffpa::Accumulation::f16;
  p.options.impl = pick(0, 1) ? Impl::automatic : Impl::cpu_reference;
  return c;
}

bool is_empty(const Case& c) { return c.batch == 0 || c.heads_q == 0 || c.seq_q == 0; }

// One fault that validation or dispatch must refuse.
void inject_fault(Case& c, std::mt19937_64& rng) {
  ForwardParams& p = c.params;
  Tensor* tensors[4] = {&p.q, &p.k, &p.v, &p.o};
  Tensor& t = *tensors[rng() % 4];
  switch (rng() % 10) {
    case 0: p.o.data = nullptr, p.o.shape[0] = std::max<int64_t>(p.o.shape[0], 1), c.fault = "null o"; break;
    case 1: t.rank = static_cast<int32_t>(rng() % 2 ? 3 : 5), c.fault = "rank"; break;
    case 2: t.shape[3] += 8, c.fault = "head dim mismatch"; break;
    case 3: t.dtype = t.dtype == DType::bf16 ? DType::f16 : DType::bf16, c.fault = "dtype mismatch"; break;
    case 4: t.stride[3] = 2, c.fault = "last-dim stride"; break;
    case 5: p.q.data = static_cast<unsigned char*>(p.q.data) + 2, c.fault = "misaligned q"; break;
    case 6: p.options.dropout_p = (rng() % 2) ? 1.0f : -0.25f, c.fault = "dropout p"; break;
    case 7: p.options.impl = static_cast<Impl>(4 + rng() % 100), c.fault = "impl value"; break;
    case 8: p.options.scale = std::nanf(""), c.fault = "scale NaN"; break;
    default: p.options.impl = Impl::sm80_split_d, c.fault = "GPU impl on host pointers"; break;
  }
}

void fail(Tally* tally, uint64_t seed, const Case& c, const std::string& what) {
  ffpa_fuzz::fail(tally, seed, c.fault, what);
}

// K and V through fp8_quantize_kv (the C++ API, then the C ABI into a second
// cache: the same status and bytes), then the call switched to precision fp8
// with that cache, valid or with one fault drawn from `rng`. False when the
// FP8 format does not take this call's K and V (Dv != D): no cache then.
bool attach_cache(Case& c, std::mt19937_64& rng, uint64_t seed, Tally* tally) {
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  ForwardParams& p = c.params;
  ffpa::Fp8Options& fp8 = p.options.fp8;
  fp8.qk_format = static_cast<ffpa::Fp8QkFormat>(pick(0, 1));
  fp8.qk_scales = static_cast<ffpa::Fp8QkScales>(pick(0, 1));
  fp8.smooth_k = pick(0, 2) != 0;
  fp8.v_scales = static_cast<ffpa::Fp8VScales>(pick(0, 1));
  fp8.smooth_v = p.options.dropout_p == 0.0f && pick(0, 2) == 0;
  const int64_t early = pick(0, 3);
  if (early == 1) fp8.early_rows = 0;
  if (early == 2) fp8.early_rows = 64 * pick(1, 4);
  const bool with_means = pick(0, 1) == 1;  // absent where the knob is off
  c.cache = ffpa::testing::make_host_kv_cache(c.batch, c.heads_kv, c.seq_kv, c.dim, fp8, true);
  c.cache.with_k_mean = with_means || fp8.smooth_k;
  c.cache.with_v_mean = with_means || fp8.smooth_v;
  ffpa::testing::HostKvCache c_side = c.cache;
  const std::vector<unsigned char> k0 = c.k.storage, v0 = c.v.storage;

  ffpa::Fp8QuantizeKvParams q;
  q.k = p.k, q.v = p.v, q.cache = c.cache.view(), q.fp8 = fp8;
  const Status cpp = ffpa::fp8_quantize_kv(q);
  ffpa_fp8_quantize_kv_params cq;
  std::memset(&cq, 0, sizeof cq);
  cq.k = c_tensor(q.k), cq.v = c_tensor(q.v), cq.cache = c_cache(c_side.view()), cq.fp8 = c_fp8_options(fp8);
  char message[512] = {};
  const ffpa_status cs = ffpa_fp8_quantize_kv(&cq, message, sizeof message);
  if (static_cast<int>(cs) != static_cast<int>(cpp.code))
    fail(tally, seed, c, std::string("fp8_quantize_kv: C status ") + ffpa_status_name(cs) + " != C++ " +
                             ffpa::status_name(cpp.code));
  if (c.k.storage != k0 || c.v.storage != v0) fail(tally, seed, c, "fp8_quantize_kv wrote k or v");
  if (c.cache.bytes() != c_side.bytes()) fail(tally, seed, c, "fp8_quantize_kv: C and C++ caches differ");
  const bool served = c.value_dim == c.dim;
  if (cpp.ok() != served)
    fail(tally, seed, c, "fp8_quantize_kv: " + std::string(ffpa::status_name(cpp.code)) + ": " + cpp.message);
  if (!cpp.ok()) {
    fp8 = ffpa::Fp8Options{};
    return false;
  }

  p.options.precision = ffpa::Precision::fp8;
  p.options.accumulation = ffpa::Accumulation::f32;  // FP8 accumulates in f32 (f16 is its own status)
  c.cache_view = c.cache.view();
  p.fp8_kv_cache = &c.cache_view;
  c.has_cache = true;
  const int64_t resolved_early = fp8.early_rows.value_or(p.options.causal != Causal::none ? 256 : 0);
  if (resolved_early == 0 && pick(0, 1) == 1) p.k.data = p.v.data = nullptr;  // the cache holds them
  if (pick(0, 1) == 0) return true;  // valid

  ffpa::Fp8KvCache& v = c.cache_view;
  ffpa::Tensor* tensors[6] = {&v.k_codes, &v.k_scales, &v.k_mean, &v.v_codes, &v.v_scales, &v.v_mean};
  ffpa::Tensor& t = *tensors[rng() % 6];
  const bool has_data = t.data != nullptr;
  switch (rng() % 8) {
    case 0:
      p.options.precision = ffpa::Precision::input;
      c.cache_fault = "cache without precision fp8", c.cache_status = StatusCode::invalid_option;
      break;
    case 1:
      if (!has_data) return true;  // an absent mean: no fault to put there
      t.dtype = t.dtype == DType::u8 ? DType::f32 : DType::u8;
      c.cache_fault = "cache dtype", c.cache_status = StatusCode::unsupported_dtype;
      break;
    case 2:
      if (!has_data) return true;
      t.shape[t.rank - 1] += 16;
      c.cache_fault = "cache shape", c.cache_status = StatusCode::shape_mismatch;
      break;
    case 3:
      if (!has_data || t.shape[0] * t.shape[1] < 2) return true;  // a stride of a size-1 dim is not read
      (t.shape[1] > 1 ? t.stride[1] : t.stride[0]) += 16;
      c.cache_fault = "cache stride", c.cache_status = StatusCode::invalid_stride;
      break;
    case 4: {
      if (!has_data) return true;
      int64_t count = 1;
      for (int32_t d = 0; d < t.rank; ++d) count *= t.shape[d];
      if (count == 0) return true;  // never read: any address
      t.data = static_cast<char*>(t.data) + (&t == &v.k_scales ? 2 : 4);
      c.cache_fault = "cache alignment", c.cache_status = StatusCode::misaligned;
      break;
    }
    case 5:
      if (c.cache_view.v_codes.shape[2] * c.cache_view.v_codes.shape[3] == 0) return true;
      v.v_codes.data = p.o.data;  // o's bytes are 16-byte aligned
      c.cache_fault = "cache overlaps o", c.cache_status = StatusCode::output_overlaps_input;
      break;
    case 6:
      if (c.cache_view.k_codes.shape[2] == 0) return true;  // empty: may be null
      v.k_codes.data = nullptr;
      c.cache_fault = "cache null codes", c.cache_status = StatusCode::null_pointer;
      break;
    default:
      if (resolved_early == 0 || p.k.data == nullptr || c.seq_kv == 0) return true;  // an empty k may be null
      p.k.data = nullptr;  // hybrid rows read k
      c.cache_fault = "k null with hybrid rows", c.cache_status = StatusCode::null_pointer;
      break;
  }
  return true;
}

// fp64 reference of row i of head h of batch b, from the spec.
void reference_row(const Case& c, int64_t b, int64_t h, int64_t i, std::vector<double>* o, double* lse) {
  const ForwardParams& p = c.params;
  using ffpa::testing::element_as_double;
  const int64_t kv_h = h / (c.heads_q / c.heads_kv);
  const double scale = p.options.scale.value_or(1.0 / std::sqrt(static_cast<double>(c.dim)));
  const int64_t shift = p.options.causal == Causal::bottom_right ? c.seq_kv - c.seq_q : 0;
  std::vector<double> score(c.seq_kv, -INFINITY);
  double max_score = -INFINITY;
  for (int64_t j = 0; j < c.seq_kv; ++j) {
    if (p.options.causal != Causal::none && j > i + shift) continue;
    double s = 0.0;
    for (int64_t d = 0; d < c.dim; ++d)
      s += element_as_double(p.q, {b, h, i, d}) * element_as_double(p.k, {b, kv_h, j, d});
    s *= scale;
    if (c.has_mask) {
      const double m = element_as_double(p.mask, {b, h, i, j});
      if (p.mask.dtype == DType::boolean) {
        if (m == 0.0) continue;
      } else {
        s += m;
      }
    }
    score[j] = s;
    max_score = std::max(max_score, s);
  }
  o->assign(c.value_dim, 0.0);
  double sum = 0.0;
  if (max_score == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  for (double& s : score) s = s == -INFINITY ? 0.0 : std::exp(s - max_score), sum += s;
  *lse = max_score + std::log(sum);
  const uint32_t threshold = ffpa::detail::dropout_threshold(p.options.dropout_p);
  // 1 / (1 - p) rounded to the inputs' dtype, as the library scales kept values.
  const float exact_scale = static_cast<float>(1.0 / (1.0 - static_cast<double>(p.options.dropout_p)));
  const double keep_scale =
      p.options.dropout_p <= 0.0f         ? 1.0
      : p.q.dtype == ffpa::DType::bf16 ? ffpa::detail::bf16_bits_to_float(ffpa::detail::float_to_bf16_bits(exact_scale))
      : p.q.dtype == ffpa::DType::f16  ? ffpa::detail::half_bits_to_float(ffpa::detail::float_to_half_bits(exact_scale))
                                       : exact_scale;
  for (int64_t j = 0; j < c.seq_kv; ++j) {
    if (score[j] == 0.0) continue;
    if (p.options.dropout_p > 0.0f &&
        !ffpa::detail::dropout_keep(p.options.dropout_seed, p.options.dropout_offset, b * c.heads_q + h, c.seq_q,
                                    c.seq_kv, i, j, threshold))
      continue;
    for (int64_t d = 0; d < c.value_dim; ++d)
      (*o)[d] += score[j] / sum * keep_scale * element_as_double(p.v, {b, kv_h, j, d});
  }
}

// The backward of a valid forward call with its lse: the C ABI and the C++
// API agree on the status and, when it runs, on every gradient bit; inputs
// are never written.
void check_backward(uint64_t seed, const Case& c, std::mt19937_64& rng, Tally* tally) {
  using ffpa::testing::make_host_tensor;
  HostTensor d_o = make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.value_dim});
  ffpa::testing::fill_uniform(d_o, rng(), -1.0f, 1.0f);
  HostTensor grads[2][3];
  ffpa::BackwardParams p;
  p.q = c.params.q, p.k = c.params.k, p.v = c.params.v, p.o = c.params.o, p.lse = c.params.lse;
  p.mask = c.params.mask, p.options = c.params.options, p.d_o = d_o.tensor;
  // Half the calls also differentiate a loss that reads the lse.
  HostTensor d_lse;
  if (rng() % 2 == 0) {
    d_lse = ffpa::testing::make_host_lse(c.batch, c.heads_q, c.seq_q);
    ffpa::testing::fill_uniform(d_lse, rng(), -1.0f, 1.0f);
    p.d_lse = d_lse.tensor;
  }
  Status statuses[2];
  for (int api = 0; api < 2; ++api) {
    grads[api][0] = make_host_tensor(c.dtype, {c.batch, c.heads_q, c.seq_q, c.dim});
    grads[api][1] = make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.dim});
    grads[api][2] = make_host_tensor(c.dtype, {c.batch, c.heads_kv, c.seq_kv, c.value_dim});
    for (HostTensor& g : grads[api]) ffpa::testing::fill_nan(g);
    p.d_q = grads[api][0].tensor, p.d_k = grads[api][1].tensor, p.d_v = grads[api][2].tensor;
    if (api == 0) {
      statuses[0] = ffpa::backward(p);
    } else {
      const CBackward cp(p);
      char message[512] = {};
      statuses[1].code = static_cast<StatusCode>(ffpa_backward(&cp.params, message, sizeof message));
    }
  }
  if (statuses[0].code != statuses[1].code)
    fail(tally, seed, c, std::string("backward: C status ") + ffpa::status_name(statuses[1].code) + " != C++ " +
                             ffpa::status_name(statuses[0].code));
  const bool expected_ok = c.params.options.accumulation == ffpa::Accumulation::f32;
  if (statuses[0].ok() != expected_ok)
    fail(tally, seed, c, "backward: " + std::string(ffpa::status_name(statuses[0].code)) + ": " + statuses[0].message);
  for (int g = 0; g < 3; ++g)
    if (grads[0][g].storage != grads[1][g].storage) fail(tally, seed, c, "backward: C and C++ gradients differ");
}

void run_dense_case(uint64_t seed, Tally* tally) {
  std::mt19937_64 rng(seed), side(seed ^ 0x9E3779B97F4A7C15ull);
  Case c = draw_valid(rng, side);
  // Faults go into non-empty calls: an empty one (B, Hq or Nq = 0) is a
  // no-op that may, for example, have null pointers.
  const bool faulty = !is_empty(c) && rng() % 3 == 0;
  if (faulty) inject_fault(c, rng);
  ++tally->cases;
  tally->case_failed = false;
  std::mt19937_64 cache_rng(seed ^ 0xC2B2AE3D27D4EB4Full);  // a third stream: the corpus replays the rest
  const bool sixteen_bit = c.dtype == DType::bf16 || c.dtype == DType::f16;  // the FP8 format quantizes these
  if (!faulty && !is_empty(c) && cache_rng() % 6 == 0 && sixteen_bit) attach_cache(c, cache_rng, seed, tally);
  const std::vector<std::vector<unsigned char>> cache0 = c.cache.bytes();

  // Snapshots of every buffer, to prove a refused call writes nothing and no
  // call writes an input.
  const std::vector<unsigned char> q0 = c.q.storage, k0 = c.k.storage, v0 = c.v.storage, m0 = c.mask.storage;
  const std::vector<unsigned char> o0 = c.o.storage, l0 = c.lse.storage;

  ffpa::KernelChoice choice;
  const Status selected = ffpa::select_kernel(c.params, &choice);
  size_t bytes = 1;
  const Status sized = ffpa::workspace_size(c.params, &bytes);
  const Status cpp = ffpa::forward(c.params);
  const std::vector<unsigned char> o_cpp = c.o.storage, l_cpp = c.lse.storage;
  c.o.storage = o0, c.lse.storage = l0;
  const CForward cp(c.params);
  char message[512] = {};
  const ffpa_status cs = ffpa_forward(&cp.params, message, sizeof message);
  tally->statuses[ffpa::status_name(cpp.code)]++;
  if (tally->list)
    std::printf("%s %s %s%s\n", seed_text(seed).c_str(), ffpa::status_name(cpp.code), c.fault.c_str(),
                c.has_cache ? (" fp8 kv cache" + (c.cache_fault.empty() ? "" : ": " + c.cache_fault)).c_str() : "");

  if (static_cast<int>(cs) != static_cast<int>(cpp.code))
    fail(tally, seed, c, std::string("C status ") + ffpa_status_name(cs) + " != C++ " + ffpa::status_name(cpp.code));
  if (c.q.storage != q0 || c.k.storage != k0 || c.v.storage != v0 || c.mask.storage != m0)
    fail(tally, seed, c, "an input was written");
  if (selected.code != cpp.code) fail(tally, seed, c, std::string("select_kernel said ") + ffpa::status_name(selected.code));
  const bool dispatch_refusal = cpp.code == StatusCode::impl_unavailable || cpp.code == StatusCode::wrong_memory_space;
  if (!dispatch_refusal && sized.code != cpp.code)
    fail(tally, seed, c, std::string("workspace_size said ") + ffpa::status_name(sized.code));
  if (c.has_cache) {
    // FP8 runs on GPU tensors only: a valid cache gets planning's refusal, a
    // broken one its own status; neither call writes anything.
    if (c.cache_fault.empty() ? !dispatch_refusal : cpp.code != c.cache_status)
      fail(tally, seed, c, "fp8 kv cache" + (c.cache_fault.empty() ? std::string() : " (" + c.cache_fault + ")") + ": " +
                               ffpa::status_name(cpp.code) + ": " + cpp.message);
    if (o_cpp != o0 || l_cpp != l0 || c.o.storage != o0 || c.lse.storage != l0 || c.cache.bytes() != cache0)
      fail(tally, seed, c, "a call with an fp8 kv cache wrote something");
    return;
  }
  if (faulty == cpp.ok()) {
    fail(tally, seed, c, faulty ? "a faulty call succeeded" : "a valid call failed: " + cpp.message);
    return;
  }
  if (!cpp.ok()) {
    if (o_cpp != o0 || l_cpp != l0 || c.o.storage != o0 || c.lse.storage != l0)
      fail(tally, seed, c, "a refused call wrote its output");
    return;
  }
  if (o_cpp != c.o.storage || l_cpp != c.lse.storage) fail(tally, seed, c, "C and C++ outputs differ");
  if (c.has_lse) check_backward(seed, c, side, tally);
  if (is_empty(c)) return;
  const double tolerance = c.params.options.accumulation == ffpa::Accumulation::f16 ? 3e-2 : 1.6e-2;
  std::vector<double> ref;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        double lse = 0.0;
        reference_row(c, b, h, i, &ref, &lse);
        for (int64_t d = 0; d < c.value_dim; ++d) {
          const double got = ffpa::testing::element_as_double(c.params.o, {b, h, i, d});
          if (!(std::fabs(got - ref[d]) <= tolerance * (1.0 + std::fabs(ref[d])))) {
            fail(tally, seed, c, "o[" + std::to_string(b) + "," + std::to_string(h) + "," + std::to_string(i) + "," +
                                     std::to_string(d) + "] = " + std::to_string(got) + ", reference " +
                                     std::to_string(ref[d]));
            return;
          }
        }
        if (c.has_lse) {
          const double got = ffpa::testing::element_as_double(c.params.lse, {b, h, i, 0});
          const bool both_empty = got == -INFINITY && lse == -INFINITY;
          if (!both_empty && !(std::fabs(got - lse) <= 1e-3 * (1.0 + std::fabs(lse)))) {
            fail(tally, seed, c, "lse " + std::to_string(got) + ", reference " + std::to_string(lse));
            return;
          }
        }
      }
}

void run_case(uint64_t seed, Tally* tally) {
  if (seed & ffpa_fuzz::kServingSeedBit) {
    ffpa_fuzz::run_serving_case(seed, tally);
  } else {
    run_dense_case(seed, tally);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10.0;
  uint64_t base = std::random_device{}();
  int64_t max_cases = -1;
  int threads = 1;
  std::string corpus;
  Tally tally;
  for (int a = 1; a < argc; ++a) {
    const std::string flag = argv[a];
    if (flag == "--list") {
      tally.list = true;
      continue;
    }
    if (flag == "--version") {
      std::printf("ffpa_api_fuzz %s\n", ffpa::version());
      return 0;
    }
    const char* value = a + 1 < argc ? argv[++a] : nullptr;
    if (value != nullptr && flag == "--seconds") {
      seconds = std::atof(value);
    } else if (value != nullptr && flag == "--seed") {
      base = std::strtoull(value, nullptr, 0);
    } else if (value != nullptr && flag == "--cases") {
      max_cases = std::atoll(value);
    } else if (value != nullptr && flag == "--corpus") {
      corpus = value;
    } else if (value != nullptr && flag == "--threads") {
      threads = std::max(1, std::atoi(value));
    } else {
      std::fprintf(stderr, "usage: ffpa_api_fuzz [--seconds N] [--seed S] [--cases N] [--corpus FILE] [--list] [--threads N] [--version]\n");
      return 2;
    }
  }
  if (!corpus.empty()) {
    std::ifstream in(corpus);
    if (!in) {
      std::fprintf(stderr, "ffpa_api_fuzz: cannot read %s\n", corpus.c_str());
      return 2;
    }
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      run_case(std::strtoull(line.c_str(), nullptr, 0), &tally);
    }
  }
  std::printf("ffpa_api_fuzz: seed base %llu, %.0f s, %d thread(s)\n", static_cast<unsigned long long>(base),
              seconds, threads);
  const auto start = std::chrono::steady_clock::now();
  // Thread w takes cases w, w + threads, ...; each its own tally. Case n's
  // seed is base + n, a serving seed for odd n.
  std::vector<Tally> tallies(threads);
  for (Tally& t : tallies) t.list = tally.list;
  auto work = [&](int w) {
    for (uint64_t n = w;; n += threads) {
      if (max_cases >= 0 && static_cast<int64_t>(n) >= max_cases) break;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) break;
      run_case((base + n) | (n % 2 == 1 ? ffpa_fuzz::kServingSeedBit : 0), &tallies[w]);
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < threads; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& t : pool) t.join();
  for (const Tally& t : tallies) {
    tally.cases += t.cases, tally.failed += t.failed;
    for (const auto& [name, count] : t.statuses) tally.statuses[name] += count;
  }
  for (const auto& [name, count] : tally.statuses) std::printf("  %-26s %lld\n", name.c_str(), static_cast<long long>(count));
  std::printf("%lld passed, %lld failed\n", static_cast<long long>(tally.cases - tally.failed),
              static_cast<long long>(tally.failed));
  return tally.failed == 0 ? 0 : 1;
}
