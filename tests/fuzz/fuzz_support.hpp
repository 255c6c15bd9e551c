// What the API fuzz driver's dense cases (api_fuzz.cpp) and serving cases
// (serving_cases.cpp) share: the tally of results and the C ABI form of the
// C++ parameters, so that each call runs through both APIs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "support/c_tensors.hpp"

namespace ffpa_fuzz {

// The results of one thread's cases.
struct Tally {
  int64_t cases = 0, failed = 0, reports = 0;
  bool case_failed = false, list = false;
  std::map<std::string, int64_t> statuses;
};

// A seed with this bit set draws a serving call (serving_cases.hpp); the
// others draw the dense calls the corpus was first recorded with.
inline constexpr uint64_t kServingSeedBit = uint64_t{1} << 62;

// Serving seeds in hex (the bit reads at a glance); --seed and the corpus
// take either form.
inline std::string seed_text(uint64_t seed) {
  char text[32];
  std::snprintf(text, sizeof text, (seed & kServingSeedBit) ? "0x%llx" : "%llu", static_cast<unsigned long long>(seed));
  return text;
}

// Records a failed check of the current case (the first 20 are printed).
inline void fail(Tally* tally, uint64_t seed, const std::string& fault, const std::string& what) {
  if (!tally->case_failed) ++tally->failed;
  tally->case_failed = true;
  if (++tally->reports <= 20)
    std::fprintf(stderr, "FAILED seed %s (fault '%s'): %s\n", seed_text(seed).c_str(), fault.c_str(), what.c_str());
}

using ffpa::testing::c_tensor;

inline ffpa_fp8_options c_fp8_options(const ffpa::Fp8Options& fp8) {
  ffpa_fp8_options c;
  std::memset(&c, 0, sizeof c);
  c.qk_format = static_cast<int32_t>(fp8.qk_format);
  c.qk_scales = static_cast<int32_t>(fp8.qk_scales);
  c.no_smooth_k = fp8.smooth_k ? 0 : 1;
  c.has_early_rows = fp8.early_rows.has_value() ? 1 : 0;
  c.early_rows = fp8.early_rows.value_or(0);
  c.v_scales = static_cast<int32_t>(fp8.v_scales);
  c.smooth_v = fp8.smooth_v ? 1 : 0;
  return c;
}

inline ffpa_fp8_kv_cache c_cache(const ffpa::Fp8KvCache& cache) {
  ffpa_fp8_kv_cache c;
  c.k_codes = c_tensor(cache.k_codes), c.k_scales = c_tensor(cache.k_scales), c.k_mean = c_tensor(cache.k_mean);
  c.v_codes = c_tensor(cache.v_codes), c.v_scales = c_tensor(cache.v_scales), c.v_mean = c_tensor(cache.v_mean);
  return c;
}

inline ffpa_options c_options(const ffpa::Options& o) {
  ffpa_options c;
  std::memset(&c, 0, sizeof c);
  c.has_scale = o.scale.has_value() ? 1 : 0;
  c.scale = o.scale.value_or(0.0f);
  c.causal = static_cast<int32_t>(o.causal);
  c.dropout_p = o.dropout_p;
  c.dropout_seed = o.dropout_seed;
  c.dropout_offset = o.dropout_offset;
  c.accumulation = static_cast<int32_t>(o.accumulation);
  c.impl = static_cast<int32_t>(o.impl);
  c.precision = static_cast<int32_t>(o.precision);
  c.fp8 = c_fp8_options(o.fp8);
  // The C ABI's window is off unless has_window says so (both bounds -1).
  c.has_window = o.window_left != -1 || o.window_right != -1 ? 1 : 0;
  c.window_left = o.window_left;
  c.window_right = o.window_right;
  c.softcap = o.softcap;
  return c;
}

inline ffpa_sequence_batch c_sequences(const ffpa::SequenceBatch& s) {
  ffpa_sequence_batch c;
  std::memset(&c, 0, sizeof c);
  c.cu_seqlens_q = c_tensor(s.cu_seqlens_q), c.cu_seqlens_k = c_tensor(s.cu_seqlens_k);
  c.block_table = c_tensor(s.block_table), c.seqused_k = c_tensor(s.seqused_k);
  c.max_seqlen_q = s.max_seqlen_q, c.max_seqlen_k = s.max_seqlen_k;
  return c;
}

// The C form of a forward call; params points into this object (not copyable).
struct CForward {
  ffpa_forward_params params;
  ffpa_fp8_kv_cache cache;
  ffpa_sequence_batch sequences;

  explicit CForward(const ffpa::ForwardParams& p) {
    std::memset(&params, 0, sizeof params);
    params.q = c_tensor(p.q), params.k = c_tensor(p.k), params.v = c_tensor(p.v), params.o = c_tensor(p.o);
    params.mask = c_tensor(p.mask), params.lse = c_tensor(p.lse);
    params.options = c_options(p.options);
    if (p.fp8_kv_cache != nullptr) {
      cache = c_cache(*p.fp8_kv_cache);
      params.fp8_kv_cache = &cache;
    }
    params.sinks = c_tensor(p.sinks);
    params.k_descale = c_tensor(p.k_descale), params.v_descale = c_tensor(p.v_descale);
    if (p.sequences != nullptr) {
      sequences = c_sequences(*p.sequences);
      params.sequences = &sequences;
    }
    params.sequence_plan = p.sequence_plan;
  }
  CForward(const CForward&) = delete;
  CForward& operator=(const CForward&) = delete;
};

// The C form of a backward call; params points into this object (not copyable).
struct CBackward {
  ffpa_backward_params params;
  ffpa_sequence_batch sequences;

  explicit CBackward(const ffpa::BackwardParams& p) {
    std::memset(&params, 0, sizeof params);
    params.q = c_tensor(p.q), params.k = c_tensor(p.k), params.v = c_tensor(p.v), params.o = c_tensor(p.o);
    params.lse = c_tensor(p.lse), params.mask = c_tensor(p.mask), params.d_o = c_tensor(p.d_o);
    params.d_q = c_tensor(p.d_q), params.d_k = c_tensor(p.d_k), params.d_v = c_tensor(p.d_v);
    params.d_mask = c_tensor(p.d_mask), params.d_lse = c_tensor(p.d_lse);
    params.options = c_options(p.options);
    if (p.sequences != nullptr) {
      sequences = c_sequences(*p.sequences);
      params.sequences = &sequences;
    }
    params.sinks = c_tensor(p.sinks), params.d_sinks = c_tensor(p.d_sinks);
  }
  CBackward(const CBackward&) = delete;
  CBackward& operator=(const CBackward&) = delete;
};

}  // namespace ffpa_fuzz
