// ffpa-fp8-accuracy: the accuracy table of docs/kernels/fp8_model.md. For
// each knob setting of the FP8 model (reference/fp8_quantization.hpp) and each
// input kind, the model's output against the fp64 reference: relative L2
// error and cosine similarity, at D = 128 and 512 (B=1, H=2, N=256, bf16).
// CPU only; a few seconds.
#include <cstdio>
#include <string>
#include <vector>

#include "reference/cpu_attention.hpp"
#include "reference/fp8_quantization.hpp"
#include "support/accuracy_inputs.hpp"
#include "support/error_metrics.hpp"

namespace {

using ffpa::Causal;
using ffpa::detail::PvFormat;
using ffpa::detail::QkFormat;
using ffpa::detail::QkScaleGranularity;
using ffpa::detail::QuantizationOptions;
using ffpa::detail::VScaleGranularity;
using ffpa::testing::InputKind;

struct Setting {
  std::string name;
  QuantizationOptions options;
  Causal causal = Causal::none;
};

std::vector<Setting> settings() {
  std::vector<Setting> list;
  auto add = [&](const char* name, auto change, Causal causal = Causal::none) {
    Setting s{name, QuantizationOptions{}, causal};
    change(s.options);
    list.push_back(s);
  };
  add("defaults (int8 QK per thread group, smooth-K, e4m3 P and V, V per channel)", [](QuantizationOptions&) {});
  add("no smooth-K", [](QuantizationOptions& o) { o.smooth_k = false; });
  add("QK int8 per block", [](QuantizationOptions& o) { o.qk_granularity = QkScaleGranularity::per_block; });
  add("QK e4m3 per block", [](QuantizationOptions& o) {
    o.qk_format = QkFormat::e4m3;
    o.qk_granularity = QkScaleGranularity::per_block;
  });
  add("QK e4m3 per thread group", [](QuantizationOptions& o) { o.qk_format = QkFormat::e4m3; });
  add("QK e4m3 per block, no smooth-K", [](QuantizationOptions& o) {
    o.qk_format = QkFormat::e4m3;
    o.qk_granularity = QkScaleGranularity::per_block;
    o.smooth_k = false;
  });
  add("V per block", [](QuantizationOptions& o) { o.v_granularity = VScaleGranularity::per_block; });
  add("smooth-V", [](QuantizationOptions& o) { o.smooth_v = true; });
  add("QK only (P, V exact)", [](QuantizationOptions& o) { o.pv_format = PvFormat::unquantized; });
  add("QK e4m3 per block only (P, V exact)", [](QuantizationOptions& o) {
    o.qk_format = QkFormat::e4m3;
    o.qk_granularity = QkScaleGranularity::per_block;
    o.pv_format = PvFormat::unquantized;
  });
  add("P, V only (QK exact)", [](QuantizationOptions& o) { o.qk_format = QkFormat::unquantized; });
  add("causal", [](QuantizationOptions&) {}, Causal::top_left);
  add("causal, n_early = 64", [](QuantizationOptions& o) { o.n_early = 64; }, Causal::top_left);
  return list;
}

ffpa::testing::ErrorMetrics measure(const Setting& s, InputKind kind, int64_t dim) {
  ffpa::testing::AccuracyCase c;
  c.dim = dim;
  c.kind = kind;
  c.causal = s.causal;
  const ffpa::testing::AccuracyInputs in = ffpa::testing::make_accuracy_inputs(c);
  const auto& p = in.problem;
  const size_t elements = static_cast<size_t>(p.batch * p.heads_q * p.seq_q * p.head_dim);
  std::vector<double> want(elements), got(elements);
  ffpa::detail::cpu_attention_forward_f64(p, {}, want.data(), nullptr);
  const auto quantized = ffpa::detail::quantize_attention_inputs(p, s.options);
  ffpa::detail::cpu_attention_quantized_f64(p, quantized, got.data(), nullptr);
  return ffpa::testing::error_metrics(got, want);
}

}  // namespace

int main() {
  const int64_t dims[] = {128, 512};
  std::printf("FP8 model vs the fp64 reference, B=1 H=2 N=256 bf16, seed 1 (ffpa-fp8-accuracy)\n\n");
  std::printf("| setting | inputs | D=128 rel L2 | D=128 cosine | D=512 rel L2 | D=512 cosine |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Setting& s : settings()) {
    for (InputKind kind : {InputKind::randn, InputKind::llm_like}) {
      std::printf("| %s | %s |", s.name.c_str(), ffpa::testing::input_kind_name(kind));
      for (int64_t dim : dims) {
        const ffpa::testing::ErrorMetrics m = measure(s, kind, dim);
        std::printf(" %.2e | %.6f |", m.relative_l2, m.cosine);
      }
      std::printf("\n");
    }
  }
  return 0;
}
