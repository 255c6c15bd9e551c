// tune-split-d: measures candidate tile configurations of the sm80 split-D
// family on the current GPU, for the routing table in
// src/kernels/sm80_split_d/tiles.hpp. Each candidate is checked against the
// CPU reference on sampled rows before it is timed.
//
//   tune-split-d [--dims 320,512,1024] [--seq 8192] [--heads 32] [--batch 1]
//                [--causal] [--iters 10] [--only "out512 M4N2"]
// Prints one JSON object per (D, candidate) on stdout, a table on stderr.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/float16_bits.hpp"
#include "host/validate.hpp"
#include "kernels/sm80_split_d/launch.cuh"
#include "reference/cpu_attention.hpp"

namespace {

using namespace ffpa;
using namespace ffpa::detail;
using namespace ffpa::detail::sm80;

#define CHECK_CUDA(call)                                                                  \
  do {                                                                                    \
    const cudaError_t error_ = (call);                                                    \
    if (error_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(error_));         \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

struct Candidate {
  const char* name;
  int out_cols;
  Status (*launch)(const AttentionProblem&, int, cudaStream_t);
};

template <int kOut, int kRows, int kWM, int kWN, int kBN, int kPV, int kStages>
Status launch_bf16(const AttentionProblem& p, int splits, cudaStream_t stream) {
  return launch<
      Traits<__nv_bfloat16, false, kOut, kRows, kWM, kWN, kBN, kPV, kStages>>(p, splits,
                                                                                     stream);
}

const Candidate kCandidates[] = {
    {"out128 r16 M4N1 bn64 pv64 s4", 128, &launch_bf16<128, 16, 4, 1, 64, 64, 4>},
    {"out256 r16 M4N1 bn64 pv32 s4", 256, &launch_bf16<256, 16, 4, 1, 64, 32, 4>},
    {"out256 r32 M2N2 bn128 pv32 s4", 256, &launch_bf16<256, 32, 2, 2, 128, 32, 4>},
    {"out384 r16 M4N2 bn128 pv32 s4", 384, &launch_bf16<384, 16, 4, 2, 128, 32, 4>},
    {"out512 r16 M4N2 bn128 pv32 s4", 512, &launch_bf16<512, 16, 4, 2, 128, 32, 4>},
    {"out512 r32 M2N4 bn128 pv32 s4", 512, &launch_bf16<512, 32, 2, 4, 128, 32, 4>},
    {"out512 r32 M2N4 bn128 pv32 s3", 512, &launch_bf16<512, 32, 2, 4, 128, 32, 3>},
    {"out512 r32 M2N4 bn256 pv32 s3", 512, &launch_bf16<512, 32, 2, 4, 256, 32, 3>},
    {"out768 r16 M2N4 bn128 pv16 s4", 768, &launch_bf16<768, 16, 2, 4, 128, 16, 4>},
    {"out1024 r16 M2N4 bn128 pv16 s4", 1024, &launch_bf16<1024, 16, 2, 4, 128, 16, 4>},
    {"out1024 r32 M1N8 bn128 pv16 s4", 1024, &launch_bf16<1024, 32, 1, 8, 128, 16, 4>},
    {"out1024 r32 M1N8 bn256 pv16 s4", 1024, &launch_bf16<1024, 32, 1, 8, 256, 16, 4>},
};

__global__ void fill_uniform(__nv_bfloat16* data, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B9u ^ seed ^ static_cast<uint32_t>(i >> 32);
    x ^= x >> 16, x *= 0x85EBCA6Bu, x ^= x >> 13, x *= 0xC2B2AE35u, x ^= x >> 16;
    data[i] = __float2bfloat16(static_cast<float>(x) * (2.0f / 4294967296.0f) - 1.0f);
  }
}

std::vector<int> parse_list(const char* text) {
  std::vector<int> values;
  for (const char* s = text; *s;) {
    values.push_back(std::atoi(s));
    while (*s && *s != ',') ++s;
    if (*s == ',') ++s;
  }
  return values;
}

// Relative L2 error of `sampled` rows of head `h` against the CPU reference.
double check_rows(const AttentionProblem& device_problem, const std::vector<uint16_t>& q,
                  const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                  const std::vector<uint16_t>& o, int64_t head, const std::vector<int64_t>& rows) {
  const int64_t n_q = device_problem.seq_q, n_kv = device_problem.seq_kv,
                d = device_problem.head_dim;
  AttentionProblem host = device_problem;
  host.batch = 1, host.heads_q = 1, host.heads_kv = 1;
  host.q = q.data() + head * n_q * d;
  host.k = k.data() + head * n_kv * d;
  host.v = v.data() + head * n_kv * d;
  host.o = nullptr;
  host.lse = nullptr;
  std::vector<double> reference(rows.size() * d);
  cpu_attention_forward_f64(host, RowSubset{rows.data(), static_cast<int64_t>(rows.size())},
                            reference.data(), nullptr);
  double err = 0, norm = 0;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int64_t c = 0; c < d; ++c) {
      const double got = bf16_bits_to_float(o[(head * n_q + rows[r]) * d + c]);
      const double want = reference[r * d + c];
      if (std::isnan(got)) return INFINITY;
      err += (got - want) * (got - want);
      norm += want * want;
    }
  return std::sqrt(err / std::max(norm, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> dims = {320, 384, 512, 640, 768, 1024};
  int64_t seq = 8192, heads = 32, batch = 1;
  int iters = 10;
  bool causal = false;
  std::string only;  // run only candidates whose name contains this
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--dims") dims = parse_list(next());
    else if (arg == "--seq") seq = std::atoll(next());
    else if (arg == "--heads") heads = std::atoll(next());
    else if (arg == "--batch") batch = std::atoll(next());
    else if (arg == "--iters") iters = std::atoi(next());
    else if (arg == "--causal") causal = true;
    else if (arg == "--only") only = next();
    else {
      std::fprintf(stderr, "usage: tune-split-d [--dims a,b] [--seq N] [--heads H] [--batch B] "
                           "[--causal] [--iters N] [--only NAME]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  for (int d : dims) {
    const int64_t n = batch * heads * seq * d;
    __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    CHECK_CUDA(cudaMalloc(&q, n * 2));
    CHECK_CUDA(cudaMalloc(&k, n * 2));
    CHECK_CUDA(cudaMalloc(&v, n * 2));
    CHECK_CUDA(cudaMalloc(&o, n * 2));
    fill_uniform<<<1024, 256>>>(q, n, 1u + d);
    fill_uniform<<<1024, 256>>>(k, n, 2u + d);
    fill_uniform<<<1024, 256>>>(v, n, 3u + d);
    CHECK_CUDA(cudaGetLastError());
    std::vector<uint16_t> hq(n), hk(n), hv(n), ho(n);
    CHECK_CUDA(cudaMemcpy(hq.data(), q, n * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hk.data(), k, n * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(hv.data(), v, n * 2, cudaMemcpyDeviceToHost));

    ForwardParams params;
    params.q = make_tensor(q, DType::bf16, {batch, heads, seq, d});
    params.k = make_tensor(k, DType::bf16, {batch, heads, seq, d});
    params.v = make_tensor(v, DType::bf16, {batch, heads, seq, d});
    params.o = make_tensor(o, DType::bf16, {batch, heads, seq, d});
    params.options.causal = causal ? Causal::top_left : Causal::none;
    AttentionProblem problem;
    const Status valid = validate_forward(params, &problem);
    if (!valid.ok()) {
      std::fprintf(stderr, "invalid: %s\n", valid.message.c_str());
      return 2;
    }
    const double pairs = causal ? seq * (seq + 1) / 2.0 : double(seq) * seq;
    const double flops = 4.0 * batch * heads * pairs * d;
    const std::vector<int64_t> rows = {0, 1, seq / 3, seq / 2 + 7, seq - 1};

    for (const Candidate& c : kCandidates) {
      const int splits = (d + c.out_cols - 1) / c.out_cols;
      if (c.out_cols > 2 * d && d > 128) continue;  // far too much padding
      if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
      CHECK_CUDA(cudaMemset(o, 0xFF, n * 2));  // NaN poison
      Status st = c.launch(problem, splits, nullptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      if (!st.ok()) {
        std::fprintf(stderr, "D=%d %s: %s\n", d, c.name, st.message.c_str());
        continue;
      }
      CHECK_CUDA(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
      double err = 0;
      for (int64_t h : {int64_t{0}, heads - 1}) err = std::max(err, check_rows(problem, hq, hk, hv, ho, h, rows));

      cudaEvent_t start, stop;
      CHECK_CUDA(cudaEventCreate(&start));
      CHECK_CUDA(cudaEventCreate(&stop));
      for (int w = 0; w < 2; ++w) (void)c.launch(problem, splits, nullptr);
      std::vector<float> times;
      for (int it = 0; it < iters; ++it) {
        CHECK_CUDA(cudaEventRecord(start));
        (void)c.launch(problem, splits, nullptr);
        CHECK_CUDA(cudaEventRecord(stop));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
      }
      CHECK_CUDA(cudaEventDestroy(start));
      CHECK_CUDA(cudaEventDestroy(stop));
      std::sort(times.begin(), times.end());
      const double median = times[times.size() / 2];
      const double tflops = flops / (median * 1e-3) / 1e12;
      std::printf("{\"D\": %d, \"causal\": %s, \"seq\": %lld, \"heads\": %lld, \"candidate\": \"%s\", "
                  "\"splits\": %d, \"ms\": %.4f, \"min_ms\": %.4f, \"tflops\": %.1f, \"rel_l2\": %.3g}\n",
                  d, causal ? "true" : "false", (long long)seq, (long long)heads, c.name, splits,
                  median, times.front(), tflops, err);
      std::fprintf(stderr, "D=%4d %-28s x%d %9.3f ms %7.1f TFLOP/s err %.2e\n", d, c.name, splits,
                   median, tflops, err);
      std::fflush(stdout);
    }
    CHECK_CUDA(cudaFree(q));
    CHECK_CUDA(cudaFree(k));
    CHECK_CUDA(cudaFree(v));
    CHECK_CUDA(cudaFree(o));
  }
  return 0;
}
