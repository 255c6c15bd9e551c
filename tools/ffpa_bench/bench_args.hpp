// The command line of ffpa-bench: what to run and how to measure it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench_problem.hpp"
#include "ffpa/ffpa.hpp"

namespace ffpa::bench {

struct BenchArgs {
  // Sizes left unset take the defaults of default_shape(): they depend on
  // whether the forward runs on a GPU or on the CPU reference.
  std::optional<int64_t> batch, heads_q, heads_kv, seq_q, seq_kv;
  std::vector<int64_t> head_dims;  // one entry (--head-dim) or a sweep (--dims); empty: default
  std::optional<int64_t> value_dim;  // --value-dim: D_v of every point; unset: D_v = D
  DType dtype = DType::bf16;
  Causal causal = Causal::none;
  MaskChoice mask = MaskChoice::none;
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  std::optional<uint64_t> data_seed;  // unset: a fresh seed for every run
  Layout layout = Layout::bhnd;
  Impl impl = Impl::automatic;
  // --kv-splits: the sm90 family's keys split into about this many ranges
  // (1: unsplit) instead of the library's plan, to measure the split rule.
  std::optional<int> kv_splits;
  bool device_inputs = false;  // --device-inputs: draw the inputs on the GPU (no check)
  Accumulation accumulation = Accumulation::f32;
  Precision precision = Precision::input;  // --precision fp8: the FP8 path, pre-pass included
  Fp8Options fp8;                          // --fp8-qk, --fp8-early-rows
  std::optional<float> scale;
  bool lse = false;
  // --backward: time ffpa::backward (dQ, dK, dV from the forward's o and lse)
  // instead of the forward; FLOPs 2.5x the forward's; no reference check.
  bool backward = false;
  // --packed: with --backward, the same tokens as a sequence batch (B packed
  // sequences of Nq queries and Nkv keys, cu_seqlens; --layout bnhd).
  bool packed = false;
  int warmup = 3;
  int iters = 10;
  int64_t check_rows = 16;  // 0: no check
  bool json = false;
  bool help = false;
  bool version = false;  // --version: print the version and exit
};

struct ParsedArgs {
  BenchArgs args;
  std::string error;  // empty when the command line is valid
};

ParsedArgs parse_args(int argc, const char* const* argv);

std::string usage_text();

// The command-line name of a choice ("bf16", "top_left", "key-bool", "sm80", ...).
const char* choice_name(DType value);
const char* choice_name(Causal value);
const char* choice_name(MaskChoice value);
const char* choice_name(Layout value);
const char* choice_name(Impl value);
const char* choice_name(Accumulation value);
const char* choice_name(Precision value);
const char* choice_name(Fp8QkFormat value);

// The shape of each point to run, in order: the given sizes, the others from
// the GPU default shape or, for the CPU reference, a small one.
std::vector<ProblemShape> point_shapes(const BenchArgs& args, bool small_default);

// Without a GPU (and without --impl cpu) a point runs on the CPU reference
// only up to this many FLOPs a call: the reference computes in fp64 at a few
// GFLOP/s on two cores, so such a point with its warm-up and timed calls
// takes seconds; a larger one runs at small_sizes() instead.
inline constexpr double kCpuFallbackFlops = 1e9;

// `asked` with the small CPU default's batch, heads and sequence lengths;
// its head dims (D, D_v) kept.
ProblemShape small_sizes(const ProblemShape& asked);

}  // namespace ffpa::bench
