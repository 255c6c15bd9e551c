// ffpa-fp8-accuracy: the accuracy table of docs/kernels/fp8_model.md. For
// each knob setting of the FP8 model (reference/fp8_quantization.hpp) and each
// input kind, the model's output against the fp64 reference: relative L2
// error and cosine similarity, at D = 128 and 512 (B=1, H=2, N=256, bf16).
// CPU only; a few seconds. With --gpu, also the library's FP8 path
// (ffpa::forward, Precision::fp8, on device 0) for the settings it serves:
// its error against the fp64 reference and against the model.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
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

// The settings the GPU path serves, as the public options (the others exist
// in the model only).
bool gpu_options(const Setting& s, ffpa::Options* options) {
  const QuantizationOptions& o = s.options;
  if (o.qk_format == QkFormat::unquantized || o.pv_format == PvFormat::unquantized) return false;
  options->precision = ffpa::Precision::fp8;
  options->causal = s.causal;
  options->fp8.qk_format = o.qk_format == QkFormat::int8 ? ffpa::Fp8QkFormat::int8 : ffpa::Fp8QkFormat::e4m3;
  options->fp8.qk_scales =
      o.qk_granularity == QkScaleGranularity::per_block ? ffpa::Fp8QkScales::per_block : ffpa::Fp8QkScales::per_thread_group;
  options->fp8.smooth_k = o.smooth_k;
  options->fp8.v_scales = o.v_granularity == VScaleGranularity::per_block ? ffpa::Fp8VScales::per_block
                                                                         : ffpa::Fp8VScales::per_channel;
  options->fp8.smooth_v = o.smooth_v;
  options->fp8.early_rows = o.n_early;
  return true;
}

// A host tensor's bytes on the device (exits on a CUDA failure: a tool).
void* to_device(const ffpa::testing::HostTensor& t) {
  void* device = nullptr;
  if (cudaMalloc(&device, t.bytes()) != cudaSuccess ||
      cudaMemcpy(device, t.tensor.data, t.bytes(), cudaMemcpyHostToDevice) != cudaSuccess) {
    std::fprintf(stderr, "ffpa-fp8-accuracy: CUDA copy failed\n");
    std::exit(2);
  }
  return device;
}

struct Measured {
  ffpa::testing::ErrorMetrics model;              // the model vs fp64
  std::optional<ffpa::testing::ErrorMetrics> gpu;  // the GPU path vs fp64
  std::optional<double> gpu_to_model;              // the GPU path vs the model (relative L2)
};

Measured measure(const Setting& s, InputKind kind, int64_t dim, bool gpu) {
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
  Measured m{ffpa::testing::error_metrics(got, want), std::nullopt, std::nullopt};
  ffpa::ForwardParams params;
  if (!gpu || !gpu_options(s, &params.options)) return m;
  const ffpa::DType dtype = p.dtype;
  ffpa::testing::HostTensor o = ffpa::testing::make_host_tensor(dtype, {p.batch, p.heads_q, p.seq_q, p.head_dim});
  void* q_device = to_device(in.q);
  void* k_device = to_device(in.k);
  void* v_device = to_device(in.v);
  void* o_device = to_device(o);
  params.q = ffpa::make_tensor(q_device, dtype, {p.batch, p.heads_q, p.seq_q, p.head_dim});
  params.k = ffpa::make_tensor(k_device, dtype, {p.batch, p.heads_kv, p.seq_kv, p.head_dim});
  params.v = ffpa::make_tensor(v_device, dtype, {p.batch, p.heads_kv, p.seq_kv, p.head_dim});
  params.o = ffpa::make_tensor(o_device, dtype, {p.batch, p.heads_q, p.seq_q, p.head_dim});
  params.options.scale = p.scale;
  const ffpa::Status status = ffpa::forward(params);
  if (!status.ok() || cudaMemcpy(o.tensor.data, o_device, o.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::fprintf(stderr, "ffpa-fp8-accuracy: the FP8 call failed: %s\n", status.message.c_str());
    std::exit(2);
  }
  for (void* d : {q_device, k_device, v_device, o_device}) cudaFree(d);
  std::vector<double> device_out(elements);
  size_t e = 0;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_q; ++i)
        for (int64_t d = 0; d < p.head_dim; ++d) device_out[e++] = ffpa::testing::element_as_double(o.tensor, {b, h, i, d});
  m.gpu = ffpa::testing::error_metrics(device_out, want);
  m.gpu_to_model = ffpa::testing::error_metrics(device_out, got).relative_l2;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const bool gpu = argc > 1 && std::strcmp(argv[1], "--gpu") == 0;
  if (argc > 1 && !gpu) {
    std::fprintf(stderr, "usage: ffpa-fp8-accuracy [--gpu]\n");
    return 2;
  }
  const int64_t dims[] = {128, 512};
  std::printf("FP8 model%s vs the fp64 reference, B=1 H=2 N=256 bf16, seed 1 (ffpa-fp8-accuracy%s)\n\n",
              gpu ? " and the GPU path" : "", gpu ? " --gpu" : "");
  if (gpu) {
    std::printf("| setting | inputs | D=128 model rel L2 | D=128 GPU rel L2 | D=128 GPU cosine | D=128 GPU vs model |"
                " D=512 model rel L2 | D=512 GPU rel L2 | D=512 GPU cosine | D=512 GPU vs model |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  } else {
    std::printf("| setting | inputs | D=128 rel L2 | D=128 cosine | D=512 rel L2 | D=512 cosine |\n");
    std::printf("|---|---|---|---|---|---|\n");
  }
  for (const Setting& s : settings()) {
    for (InputKind kind : {InputKind::randn, InputKind::llm_like}) {
      std::printf("| %s | %s |", s.name.c_str(), ffpa::testing::input_kind_name(kind));
      for (int64_t dim : dims) {
        const Measured m = measure(s, kind, dim, gpu);
        if (!gpu) {
          std::printf(" %.2e | %.6f |", m.model.relative_l2, m.model.cosine);
        } else if (m.gpu) {
          std::printf(" %.2e | %.2e | %.6f | %.2e |", m.model.relative_l2, m.gpu->relative_l2, m.gpu->cosine,
                      *m.gpu_to_model);
        } else {
          std::printf(" %.2e | - | - | - |", m.model.relative_l2);
        }
      }
      std::printf("\n");
    }
  }
  return 0;
}
