// Host time of the C-side parts of one small ffpa_forward (B1 H1 Nq1 Nkv16 D512 bf16, impl auto) and
// of the CUDA calls it makes, with the GPU held by a spin kernel so that only the host is timed (timing
// launches back to back without the hold measures the GPU once the launch queue fills:
// docs/perf/h200-2026-11-30-dropout/). Against a build's shared library:
//   nvcc -O2 -std=c++17 -arch=sm_90 -Iinclude -Ibuild/include bench/host_launch_parts.cu \
//        -Lbuild -l:libffpa.so -lcuda -o host_launch_parts && LD_LIBRARY_PATH=build ./host_launch_parts
// Results: docs/perf/h200-2026-12-01b/host_parts_c.txt.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include "ffpa/ffpa.h"

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// Microseconds per call of f over n calls queued behind ~0.2 s of spinning.
static double host_us(const std::function<void()>& f, int n) {
  for (int i = 0; i < 50; ++i) f();
  cudaDeviceSynchronize();
  spin<<<1, 1>>>(400000000LL);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / n;
  cudaDeviceSynchronize();
  return us;
}

static ffpa_tensor bf16_tensor(void* data, int rows) {
  ffpa_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = FFPA_DTYPE_BF16;
  t.rank = 4;
  const int64_t shape[4] = {1, 1, rows, 512}, stride[4] = {rows * 512, rows * 512, 512, 1};
  for (int i = 0; i < 4; ++i) t.shape[i] = shape[i], t.stride[i] = stride[i];
  return t;
}

int main() {
  if (cuInit(0) != CUDA_SUCCESS) return 1;
  void *q, *k, *v, *o;
  for (void** buffer : {&q, &k, &v, &o}) {
    if (cudaMalloc(buffer, 1 << 20) != cudaSuccess) return 1;
  }
  ffpa_forward_params p;
  std::memset(&p, 0, sizeof p);
  p.q = bf16_tensor(q, 1), p.k = bf16_tensor(k, 16), p.v = bf16_tensor(v, 16), p.o = bf16_tensor(o, 1);
  p.options.impl = FFPA_IMPL_AUTO;
  char message[512];
  if (ffpa_forward(&p, message, sizeof message) != FFPA_OK) {
    std::printf("ffpa_forward failed: %s\n", message);
    return 1;
  }
  size_t bytes = 0;
  cudaPointerAttributes attributes;
  unsigned int memory_type = 0;
  int ordinal = 0, device = 0, major = 0;
  CUpointer_attribute both[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  void* both_values[2] = {&memory_type, &ordinal};
  const struct {
    const char* name;
    std::function<void()> call;
  } parts[] = {
      {"ffpa_forward", [&] { ffpa_forward(&p, message, sizeof message); }},
      {"ffpa_workspace_size (validate + plan)", [&] { ffpa_workspace_size(&p, &bytes, message, sizeof message); }},
      {"cudaPointerGetAttributes", [&] { cudaPointerGetAttributes(&attributes, q); }},
      {"cuPointerGetAttributes (type, ordinal)",
       [&] { cuPointerGetAttributes(2, both, both_values, reinterpret_cast<CUdeviceptr>(q)); }},
      {"cudaGetDevice", [&] { cudaGetDevice(&device); }},
      {"cudaDeviceGetAttribute (cc major)",
       [&] { cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0); }},
      {"empty kernel <<<>>>", [&] { spin<<<1, 1>>>(0); }},
  };
  constexpr int kRounds = 5, kParts = sizeof parts / sizeof parts[0];
  double best[kParts];
  for (int r = 0; r < kRounds; ++r) {
    for (int i = 0; i < kParts; ++i) {
      const double us = host_us(parts[i].call, 500);
      if (r == 0 || us < best[i]) best[i] = us;
    }
  }
  for (int i = 0; i < kParts; ++i) std::printf("%-42s %7.3f us (best of %d)\n", parts[i].name, best[i], kRounds);
  return 0;
}
