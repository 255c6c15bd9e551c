#include "bench_report.hpp"

#include <algorithm>
#include <string>

#include "json_writer.hpp"

namespace ffpa::bench {
namespace {

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string human_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? std::to_string(bytes) + " B" : format("%.1f ", value) + units[unit];
}

double tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

// "D=512 B=1 Hq=32 ... bf16 bhnd causal=none mask=none ... impl=auto".
std::string describe_point(const BenchArgs& args, const ProblemShape& s) {
  std::string text = "D=" + std::to_string(s.head_dim) +
                     (s.dv() != s.head_dim ? " Dv=" + std::to_string(s.dv()) : std::string()) +
                     " B=" + std::to_string(s.batch) +
                     " Hq=" + std::to_string(s.heads_q) + " Hkv=" + std::to_string(s.heads_kv) +
                     " Nq=" + std::to_string(s.seq_q) + " Nkv=" + std::to_string(s.seq_kv) + " " +
                     choice_name(args.dtype) + " " + choice_name(args.layout) +
                     " causal=" + choice_name(args.causal) + " mask=" + choice_name(args.mask);
  if (args.dropout_p > 0) text += " dropout=" + format("%g", args.dropout_p);
  if (args.accumulation != Accumulation::f32) text += std::string(" accum=") + choice_name(args.accumulation);
  if (args.precision == Precision::fp8) {
    text += std::string(" precision=fp8 qk=") + choice_name(args.fp8.qk_format);
    if (args.fp8.early_rows) text += " early_rows=" + std::to_string(*args.fp8.early_rows);
  }
  if (args.scale) text += " scale=" + format("%g", *args.scale);
  if (args.lse) text += " lse";
  if (args.backward) text += " backward";
  return text + " impl=" + choice_name(args.impl);
}

}  // namespace

size_t MemoryResult::extra() const { return std::max({workspace, pool_used_high, free_drop}); }

void print_text(std::FILE* out, const BenchArgs& args, const PointResult& r) {
  std::fprintf(out, "%s on %s\n", describe_point(args, r.shape).c_str(), r.device.c_str());
  std::string details = std::string("impl ") + choice_name(r.kernel.impl);
  if (r.kernel.padded_head_dim > 0) details += ", padded D " + std::to_string(r.kernel.padded_head_dim);
  if (r.kernel.value_splits > 1) details += ", " + std::to_string(r.kernel.value_splits) + " value splits";
  if (args.kv_splits) details += ", KV splits forced (--kv-splits " + std::to_string(*args.kv_splits) + ")";
  std::fprintf(out, "  kernel  %s (%s)\n", r.kernel.kernel.c_str(), details.c_str());
  std::fprintf(out, "  time    %.4f ms median, %.4f min, %.4f max (%d calls after %d warm-up, %lld input set%s)\n",
               r.timing.median_ms, r.timing.min_ms, r.timing.max_ms, args.iters, args.warmup,
               static_cast<long long>(r.input_sets), r.input_sets == 1 ? "" : "s");
  std::fprintf(out, "  rate    %.4g TFLOP/s at the median (%.4g at the min), %.4g FLOP\n",
               tflops(r.flops, r.timing.median_ms), tflops(r.flops, r.timing.min_ms), r.flops);
  if (const auto& c = r.check) {
    std::string lse;
    if (c->lse_max_error) lse = ", lse max error " + format("%.3g", *c->lse_max_error);
    std::fprintf(out, "  check   %lld rows per head vs the fp64 CPU reference: rel L2 %.3g, max abs %.3g%s, NaN %lld -> %s (tolerance %g)\n",
                 static_cast<long long>(c->rows), c->rel_l2, c->max_abs, lse.c_str(),
                 static_cast<long long>(c->nan_count), c->passed ? "pass" : "FAIL", c->tolerance);
  } else {
    std::fprintf(out, "  check   skipped (%s)\n",
                 args.backward ? "--backward: the test suites check the gradients" : "--check-rows 0");
  }
  if (const auto& m = r.memory) {
    std::fprintf(out, "  memory  %s beyond inputs and outputs (workspace %s, pool high-water %s, free-memory drop %s)\n",
                 human_bytes(m->extra()).c_str(), human_bytes(m->workspace).c_str(),
                 human_bytes(m->pool_used_high).c_str(), human_bytes(m->free_drop).c_str());
  }
  std::fflush(out);
}

std::string to_json(const BenchArgs& args, const PointResult& r) {
  JsonWriter json;
  json.begin_object();
  json.key("tool").string("ffpa-bench").key("version").string(version());
  json.key("device").string(r.device).key("point").integer(r.index).key("points").integer(r.count);
  json.key("batch").integer(r.shape.batch).key("heads_q").integer(r.shape.heads_q);
  json.key("heads_kv").integer(r.shape.heads_kv).key("seq_q").integer(r.shape.seq_q);
  json.key("seq_kv").integer(r.shape.seq_kv).key("head_dim").integer(r.shape.head_dim);
  json.key("value_dim").integer(r.shape.dv());
  json.key("dtype").string(choice_name(args.dtype)).key("layout").string(choice_name(args.layout));
  json.key("causal").string(choice_name(args.causal)).key("mask").string(choice_name(args.mask));
  json.key("dropout").number(args.dropout_p).key("dropout_seed").unsigned_integer(args.dropout_seed);
  json.key("scale");
  if (args.scale) json.number(*args.scale); else json.null();
  json.key("accum").string(choice_name(args.accumulation)).key("lse").boolean(args.lse);
  json.key("backward").boolean(args.backward);
  json.key("precision").string(choice_name(args.precision));
  json.key("impl_requested").string(choice_name(args.impl));
  json.key("impl").string(choice_name(r.kernel.impl)).key("kernel").string(r.kernel.kernel);
  json.key("padded_head_dim").integer(r.kernel.padded_head_dim).key("value_splits").integer(r.kernel.value_splits);
  json.key("heads_per_tile").integer(r.kernel.heads_per_tile).key("kv_splits").integer(r.kernel.kv_splits);
  json.key("kv_splits_forced").boolean(args.kv_splits.has_value());
  json.key("data_seed").unsigned_integer(r.data_seed).key("input_sets").integer(r.input_sets);
  json.key("warmup").integer(args.warmup).key("iters").integer(args.iters);
  json.key("flops").number(r.flops);
  json.key("time_ms").begin_object();
  json.key("median").number(r.timing.median_ms).key("min").number(r.timing.min_ms).key("max").number(r.timing.max_ms);
  json.end_object();
  json.key("tflops").begin_object();
  json.key("median").number(tflops(r.flops, r.timing.median_ms)).key("max").number(tflops(r.flops, r.timing.min_ms));
  json.end_object();
  json.key("check");
  if (const auto& c = r.check) {
    json.begin_object().key("rows").integer(c->rows).key("rel_l2").number(c->rel_l2).key("max_abs").number(c->max_abs);
    json.key("lse_max_error");
    if (c->lse_max_error) json.number(*c->lse_max_error); else json.null();
    json.key("nan_count").integer(c->nan_count).key("tolerance").number(c->tolerance).key("passed").boolean(c->passed);
    json.end_object();
  } else {
    json.null();
  }
  json.key("memory");
  if (const auto& m = r.memory) {
    json.begin_object().key("extra_device_bytes").unsigned_integer(m->extra());
    json.key("workspace_bytes").unsigned_integer(m->workspace).key("pool_used_high_bytes").unsigned_integer(m->pool_used_high);
    json.key("free_drop_bytes").unsigned_integer(m->free_drop).end_object();
  } else {
    json.null();
  }
  json.end_object();
  return json.text();
}

}  // namespace ffpa::bench
