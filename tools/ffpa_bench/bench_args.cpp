#include "bench_args.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>

namespace ffpa::bench {
namespace {

// The default point: on a GPU the headline shape of the project's benchmark,
// on the CPU reference one small enough to finish in moments.
constexpr ProblemShape kGpuDefault{1, 32, 32, 8192, 8192, 512};
constexpr ProblemShape kCpuDefault{1, 2, 2, 128, 128, 128};

std::optional<int64_t> parse_integer(const std::string& text, int64_t min, int64_t max) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < min || value > max) return std::nullopt;
  return value;
}

std::optional<uint64_t> parse_unsigned(const std::string& text) {
  if (text.empty() || text[0] == '-') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 0);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return value;
}

std::optional<float> parse_float(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const float value = std::strtof(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(value)) return std::nullopt;
  return value;
}

// The command-line names of each choice, shared by parsing and printing.
template <typename Enum>
struct Choice {
  const char* name;
  Enum value;
};

constexpr Choice<DType> kDTypes[] = {{"bf16", DType::bf16}, {"f16", DType::f16}};
constexpr Choice<Causal> kCausals[] = {
    {"none", Causal::none}, {"top_left", Causal::top_left}, {"bottom_right", Causal::bottom_right}};
constexpr Choice<MaskChoice> kMasks[] = {
    {"none", MaskChoice::none},         {"key-bool", MaskChoice::key_bool},
    {"key-add", MaskChoice::key_add},   {"row-bool", MaskChoice::row_bool},
    {"full-add", MaskChoice::full_add}, {"full-bool", MaskChoice::full_bool},
    {"full-add-f32", MaskChoice::full_add_f32}};
constexpr Choice<Layout> kLayouts[] = {{"bhnd", Layout::bhnd}, {"bnhd", Layout::bnhd}};
constexpr Choice<Impl> kImpls[] = {
    {"auto", Impl::automatic}, {"cpu", Impl::cpu_reference}, {"sm80", Impl::sm80_split_d},
    {"sm90", Impl::sm90_wgmma}};
constexpr Choice<Accumulation> kAccumulations[] = {{"f32", Accumulation::f32}, {"f16", Accumulation::f16}};
constexpr Choice<Precision> kPrecisions[] = {{"input", Precision::input}, {"fp8", Precision::fp8}};
constexpr Choice<Fp8QkFormat> kFp8QkFormats[] = {{"int8", Fp8QkFormat::int8}, {"e4m3", Fp8QkFormat::e4m3}};

template <typename Enum, size_t N>
const char* name_in(const Choice<Enum> (&choices)[N], Enum value) {
  for (const Choice<Enum>& choice : choices)
    if (choice.value == value) return choice.name;
  return "unknown";
}

// Parses an option's value into BenchArgs; returns the error message, or "".
using Handler = std::function<std::string(const std::string& text)>;

// Out: T, or std::optional<T>.
template <typename T, typename Out>
std::string store(std::optional<T> parsed, Out* out, const std::string& option, const char* expected) {
  if (!parsed) return "invalid value for " + option + ": expected " + expected;
  *out = *parsed;
  return {};
}

// Int: an integer type, or std::optional of one.
template <typename Int>
Handler integer_option(Int* out, const char* option, int64_t min) {
  return [out, option, min](const std::string& text) {
    const std::string expected = "an integer >= " + std::to_string(min);
    const auto value = parse_integer(text, min, std::numeric_limits<int32_t>::max());
    if (value) *out = static_cast<Int>(*value);
    return value ? std::string() : "invalid value for " + std::string(option) + ": expected " + expected;
  };
}

template <typename Enum, size_t N>
Handler choice_option(Enum* out, const char* option, const Choice<Enum> (&choices)[N]) {
  return [out, option, &choices](const std::string& text) {
    std::string names;
    for (const Choice<Enum>& choice : choices) {
      if (text == choice.name) {
        *out = choice.value;
        return std::string();
      }
      names += std::string(names.empty() ? "" : ", ") + choice.name;
    }
    return "invalid value for " + std::string(option) + ": expected one of " + names;
  };
}

Handler head_dims_option(BenchArgs* args, bool list) {
  return [args, list](const std::string& text) -> std::string {
    const char* option = list ? "--dims" : "--head-dim";
    if (!args->head_dims.empty()) return "give --head-dim or --dims once, not both";
    size_t begin = 0;
    while (true) {
      const size_t comma = list ? text.find(',', begin) : std::string::npos;
      const auto dim = parse_integer(text.substr(begin, comma - begin), 1, 1 << 20);
      if (!dim) return std::string("invalid value for ") + option + ": expected " +
                       (list ? "a comma-separated list of integers >= 1" : "an integer >= 1");
      args->head_dims.push_back(*dim);
      if (comma == std::string::npos) return {};
      begin = comma + 1;
    }
  };
}

std::map<std::string, Handler> value_options(BenchArgs* a) {
  return {
      {"--batch", integer_option(&a->batch, "--batch", 1)},
      {"--heads-q", integer_option(&a->heads_q, "--heads-q", 1)},
      {"--heads-kv", integer_option(&a->heads_kv, "--heads-kv", 1)},
      {"--seq-q", integer_option(&a->seq_q, "--seq-q", 1)},
      {"--seq-kv", integer_option(&a->seq_kv, "--seq-kv", 1)},
      {"--head-dim", head_dims_option(a, false)},
      {"--dims", head_dims_option(a, true)},
      {"--value-dim", integer_option(&a->value_dim, "--value-dim", 1)},
      {"--dtype", choice_option(&a->dtype, "--dtype", kDTypes)},
      {"--causal", choice_option(&a->causal, "--causal", kCausals)},
      {"--mask", choice_option(&a->mask, "--mask", kMasks)},
      {"--dropout",
       [a](const std::string& t) {
         return store(parse_float(t), &a->dropout_p, "--dropout", "a number (p in [0, 1))");
       }},
      {"--seed",
       [a](const std::string& t) {
         return store(parse_unsigned(t), &a->dropout_seed, "--seed", "an unsigned integer");
       }},
      {"--data-seed",
       [a](const std::string& t) {
         return store(parse_unsigned(t), &a->data_seed, "--data-seed", "an unsigned integer");
       }},
      {"--layout", choice_option(&a->layout, "--layout", kLayouts)},
      {"--impl", choice_option(&a->impl, "--impl", kImpls)},
      {"--accum", choice_option(&a->accumulation, "--accum", kAccumulations)},
      {"--precision", choice_option(&a->precision, "--precision", kPrecisions)},
      {"--fp8-qk", choice_option(&a->fp8.qk_format, "--fp8-qk", kFp8QkFormats)},
      {"--fp8-early-rows",
       [a](const std::string& t) {
         return store(parse_unsigned(t), &a->fp8.early_rows, "--fp8-early-rows", "a multiple of 64");
       }},
      {"--scale",
       [a](const std::string& t) { return store(parse_float(t), &a->scale, "--scale", "a finite number"); }},
      {"--warmup", integer_option(&a->warmup, "--warmup", 0)},
      {"--iters", integer_option(&a->iters, "--iters", 1)},
      {"--check-rows", integer_option(&a->check_rows, "--check-rows", 0)},
      {"--kv-splits", integer_option(&a->kv_splits, "--kv-splits", 1)},
  };
}

}  // namespace

ParsedArgs parse_args(int argc, const char* const* argv) {
  ParsedArgs parsed;
  BenchArgs& args = parsed.args;
  const std::map<std::string, Handler> options = value_options(&args);
  const std::map<std::string, bool*> flags = {
      {"--lse", &args.lse}, {"--backward", &args.backward}, {"--packed", &args.packed}, {"--json", &args.json},
      {"--help", &args.help},
      {"-h", &args.help},
      {"--device-inputs", &args.device_inputs},
      {"--version", &args.version}};

  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i], value;
    const size_t equals = name.find('=');
    const bool inline_value = name.rfind("--", 0) == 0 && equals != std::string::npos;
    if (inline_value) {
      value = name.substr(equals + 1);
      name.resize(equals);
    }
    if (const auto flag = flags.find(name); flag != flags.end() && !inline_value) {
      *flag->second = true;
      continue;
    }
    const auto option = options.find(name);
    if (option == options.end()) {
      parsed.error = "unknown option: " + std::string(argv[i]);
      return parsed;
    }
    if (!inline_value) {
      if (i + 1 >= argc) {
        parsed.error = "missing value for " + name;
        return parsed;
      }
      value = argv[++i];
    }
    parsed.error = option->second(value);
    if (!parsed.error.empty()) return parsed;
  }
  if (args.device_inputs && args.check_rows > 0 && !args.backward) {
    parsed.error = "--device-inputs: the reference check needs the inputs on the host; pass --check-rows 0";
  }
  if (args.packed && !args.backward) parsed.error = "--packed times the backward of a sequence batch: add --backward";
  if (args.packed) args.layout = Layout::bnhd;  // the packed rows are a [B, N, H, D] buffer
  return parsed;
}

const char* choice_name(DType value) { return name_in(kDTypes, value); }
const char* choice_name(Causal value) { return name_in(kCausals, value); }
const char* choice_name(MaskChoice value) { return name_in(kMasks, value); }
const char* choice_name(Layout value) { return name_in(kLayouts, value); }
const char* choice_name(Impl value) { return name_in(kImpls, value); }
const char* choice_name(Accumulation value) { return name_in(kAccumulations, value); }
const char* choice_name(Precision value) { return name_in(kPrecisions, value); }
const char* choice_name(Fp8QkFormat value) { return name_in(kFp8QkFormats, value); }

std::vector<ProblemShape> point_shapes(const BenchArgs& args, bool small_default) {
  const ProblemShape& fallback = small_default ? kCpuDefault : kGpuDefault;
  ProblemShape shape;
  shape.batch = args.batch.value_or(fallback.batch);
  shape.heads_q = args.heads_q.value_or(fallback.heads_q);
  shape.heads_kv = args.heads_kv.value_or(shape.heads_q);
  shape.seq_q = args.seq_q.value_or(fallback.seq_q);
  shape.seq_kv = args.seq_kv.value_or(shape.seq_q);
  std::vector<ProblemShape> shapes;
  for (int64_t dim : args.head_dims.empty() ? std::vector<int64_t>{fallback.head_dim} : args.head_dims) {
    shape.head_dim = dim;
    shape.value_dim = args.value_dim.value_or(dim);
    shapes.push_back(shape);
  }
  return shapes;
}

ProblemShape small_sizes(const ProblemShape& asked) {
  ProblemShape shape = kCpuDefault;
  shape.head_dim = asked.head_dim;
  shape.value_dim = asked.value_dim;
  return shape;
}

std::string usage_text() {
  return R"(usage: ffpa-bench [options]

Runs one attention forward through ffpa (or a sweep over D) and prints its
time, TFLOP/s, the kernel that ran, its error against the CPU reference on
sampled rows and the device memory it used beyond its inputs and outputs.
Without a CUDA device it runs the CPU reference instead, in seconds: on the
asked shape where that is small, else on a small one (B 1, Hq 2, Nq 128, the
asked D) that it names; --impl cpu runs the asked shape there however long.

Shape: q [B,Hq,Nq,D], k [B,Hkv,Nkv,D], v [B,Hkv,Nkv,Dv], o [B,Hq,Nq,Dv]
  --batch B              batch size (default 1)
  --heads-q H            query heads (default 32; 2 on the CPU reference)
  --heads-kv H           key/value heads, must divide Hq (default Hq)
  --seq-q N              query rows (default 8192; 128 on the CPU reference)
  --seq-kv N             key rows (default Nq)
  --head-dim D           head dim, a multiple of 8 in [8, 1024]
                         (default 512; 128 on the CPU reference)
  --dims D1,D2,...       sweep over D: one point each, a progress line per point
  --value-dim Dv         v's and o's head dim, a multiple of 8 in [8, 1024]
                         (default D; MLA: --head-dim 576 --value-dim 512)

Data and options
  --dtype bf16|f16       q, k, v and o dtype (default bf16)
  --layout bhnd|bnhd     bhnd: contiguous [B,H,N,D] buffers; bnhd: [B,N,H,D]
                         buffers (FlashAttention layout) seen through strides
  --causal none|top_left|bottom_right
                         top_left: row i attends keys j <= i (SDPA is_causal);
                         bottom_right: j <= i + Nkv - Nq (FlashAttention)
  --mask KIND            none (default) or
                           key-bool      [B,1,1,Nkv] boolean (true = attend)
                           key-add       [B,1,1,Nkv] additive, dtype of q
                           row-bool      [B,1,Nq,Nkv] boolean
                           full-add      [B,Hq,Nq,Nkv] additive, dtype of q
                           full-bool     [B,Hq,Nq,Nkv] boolean
                           full-add-f32  [B,Hq,Nq,Nkv] additive, f32
                         boolean masks are true with probability 3/4,
                         additive ones uniform in [-1, 1]
  --dropout P            dropout probability in [0, 1) (default 0)
  --seed S               dropout seed (default 0)
  --data-seed S          seed of the random inputs (default: fresh each run)
  --scale S              softmax scale (default 1/sqrt(D))
  --accum f32|f16        accumulation precision; f16 needs --dtype f16
  --precision input|fp8  fp8: Q K^T and P V on 8-bit tensor cores, the library
                         quantizing q, k and v (sm90 family; the pre-pass is
                         part of the timed call)
  --fp8-qk int8|e4m3     fp8: the Q and K codes (default int8)
  --fp8-early-rows N     fp8: hybrid rows computed in the inputs' precision, a
                         multiple of 64 (default 256 with --causal, else 0)
  --lse                  also write the log-sum-exp and check it
  --backward             time the backward instead (ffpa::backward: dQ, dK and dV
                         from the forward's o and lse, o standing in for dO);
                         FLOPs 2.5x the forward's; one input set; not checked
                         against the reference (the test suites check gradients)
  --packed               with --backward: the same tokens as a sequence batch
                         (packed training: B sequences of Nq queries and Nkv
                         keys packed back to back with cu_seqlens; --layout
                         bnhd), against the dense point's time at equal tokens
  --impl auto|cpu|sm80|sm90  implementation (default auto); cpu runs the CPU
                         reference on host memory, on the sizes given (the
                         small default shape for the others)
  --kv-splits N          split the keys into about N ranges (1: unsplit) instead
                         of the library's plan (sm90 family only): measures the
                         split rule against other counts

Measurement
  --warmup N             untimed calls before timing (default 3)
  --iters N              timed calls; median, min and max reported (default 10)
  --check-rows N         query rows compared with the fp64 CPU reference, spread
                         over Nq with the first and last (default 16; 0: no check)
  --device-inputs        draw the random inputs on the GPU (same values, no host
                         copy: for inputs of many GB); needs --check-rows 0
  --json                 one JSON object per point on stdout, text on stderr
  --version              the library's version
  --help, -h             this text

Inputs are uniform in [-1, 1], in enough copies to exceed twice the L2 cache,
rotated between calls. The output is poisoned with NaN before the checked call.

Exit status: 0 every point ran and passed its check; 1 a check failed (NaN in
the output, or relative L2 error above 1e-2 for bf16 or f16 accumulation,
5e-3 for f16, 5e-2 for fp8, or an lse error above 1e-3 relative, 2e-2 for
fp8); 2 a bad command line or a
failing ffpa or CUDA call.
)";
}

}  // namespace ffpa::bench
