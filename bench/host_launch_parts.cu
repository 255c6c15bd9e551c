// The parts of one sm90 d512 launch, timed as 20000 calls back to back. Caution: the calls
// queue faster than this tiny kernel runs, so past the queue's depth the figures are the GPU's
// time per kernel (9.4 us for ours, 3 us for an empty one), not the host's
// (docs/perf/h200-2026-11-30-dropout/: measure the host with the GPU held by a sleep kernel).
// Originally: why launching the sm90 d512 kernel seemed to cost 9.5 us of host time against 3.8 us for an
// empty kernel with the same parameters (docs/perf/h200-2026-11-30-masks/): variants that
// isolate shared memory, threads, the carveout hint and the driver API. Built against a
// build's static library (sm_90a; the H200 runs it):
//   nvcc -O2 -std=c++17 -arch=sm_90a -Iinclude -Isrc -Ibuild/include bench/host_launch_parts.cu \
//        build/libffpa_static.a -lcuda -o host_launch_parts && ./host_launch_parts
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <functional>
#include "ffpa/ffpa.hpp"
#include "host/dispatch.hpp"
#include "host/validate.hpp"
#include "kernels/sm90_wgmma/launch.cuh"

using namespace ffpa::detail;
using namespace ffpa::detail::sm90_wgmma;
using T512 = InstanceTraits<512>::type<__nv_bfloat16>;

static double us(const std::function<void()>& f, int n = 20000) {
  for (int i = 0; i < 500; ++i) f();
  cudaDeviceSynchronize();
  auto t = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  double e = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / n;
  cudaDeviceSynchronize();
  return e;
}
__global__ void dummy() {}
__global__ void __launch_bounds__(384, 1) dummy_smem(const __grid_constant__ Args a, const __grid_constant__ CUtensorMap m0,
    const __grid_constant__ CUtensorMap m1, const __grid_constant__ CUtensorMap m2, const __grid_constant__ CUtensorMap m3) {
  extern __shared__ char smem[];
  if (threadIdx.x == 1000) smem[0] = 0;
}
__global__ void dummy_big(const __grid_constant__ Args a, const __grid_constant__ CUtensorMap m0, const __grid_constant__ CUtensorMap m1,
                          const __grid_constant__ CUtensorMap m2, const __grid_constant__ CUtensorMap m3) {}

int main() {
  void *q, *k, *v, *o;
  cudaMalloc(&q, 1 << 20); cudaMalloc(&k, 1 << 20); cudaMalloc(&v, 1 << 20); cudaMalloc(&o, 1 << 20);
  cudaStream_t stream; cudaStreamCreate(&stream);
  ffpa::ForwardParams p;
  p.q = ffpa::make_tensor(q, ffpa::DType::bf16, {1, 1, 1, 512});
  p.k = ffpa::make_tensor(k, ffpa::DType::bf16, {1, 1, 16, 512});
  p.v = ffpa::make_tensor(v, ffpa::DType::bf16, {1, 1, 16, 512});
  p.o = ffpa::make_tensor(o, ffpa::DType::bf16, {1, 1, 1, 512});
  p.stream = stream;
  AttentionProblem problem;
  validate_forward(p, &problem);
  const auto shapes = attention_tensor_shapes(problem);
  CUtensorMap maps[4];
  std::printf("%-40s %7.2f us\n", "forward (C++ API)", us([&] { ffpa::forward(p); }));
  std::printf("%-40s %7.2f us\n", "launch<T512> (this TU)", us([&] { launch<T512>(problem, stream); }));
  const int box_rows[4] = {64, 128, 64, 64};
  std::printf("%-40s %7.2f us\n", "4 x encode_tensor_map", us([&] { for (int i = 0; i < 4; ++i) encode_tensor_map(shapes[i], box_rows[i], &maps[i]); }));
  std::printf("%-40s %7.2f us\n", "cudaFuncSetAttribute(forward_kernel)", us([&] {
    cudaFuncSetAttribute(forward_kernel<T512>, cudaFuncAttributeMaxDynamicSharedMemorySize, T512::kSmemBytes); }));
  Args args{}; args.p = problem; args.row_blocks = 1; args.scale_log2 = problem.scale * 1.4426950408889634f;
  cudaLaunchConfig_t config{}; config.gridDim = dim3(1); config.blockDim = dim3(T512::kThreads);
  config.dynamicSmemBytes = T512::kSmemBytes; config.stream = stream;
  std::printf("%-40s %7.2f us\n", "cudaLaunchKernelEx(forward_kernel)", us([&] {
    cudaLaunchKernelEx(&config, forward_kernel<T512>, args, maps[0], maps[1], maps[2], maps[3]); }));
  cudaLaunchConfig_t c2 = config; c2.dynamicSmemBytes = 0; c2.blockDim = dim3(32);
  std::printf("%-40s %7.2f us\n", "cudaLaunchKernelEx(dummy, same params)", us([&] {
    cudaLaunchKernelEx(&c2, dummy_big, args, maps[0], maps[1], maps[2], maps[3]); }));
  std::printf("%-40s %7.2f us\n", "dummy<<<1,32,0,s>>>", us([&] { dummy<<<1, 32, 0, stream>>>(); }));
  cudaFuncSetAttribute(dummy_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, T512::kSmemBytes);
  cudaLaunchConfig_t c3 = config;
  std::printf("%-40s %7.2f us\n", "dummy, 384 threads, 231 KB smem", us([&] {
    cudaLaunchKernelEx(&c3, dummy_smem, args, maps[0], maps[1], maps[2], maps[3]); }));
  c3.dynamicSmemBytes = 0;
  std::printf("%-40s %7.2f us\n", "dummy, 384 threads, no smem", us([&] {
    cudaLaunchKernelEx(&c3, dummy_smem, args, maps[0], maps[1], maps[2], maps[3]); }));
  cudaFuncSetAttribute(forward_kernel<T512>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  std::printf("%-40s %7.2f us\n", "forward_kernel, carveout hint 100", us([&] {
    cudaLaunchKernelEx(&config, forward_kernel<T512>, args, maps[0], maps[1], maps[2], maps[3]); }));
  cudaFunction_t function = nullptr;
  cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(forward_kernel<T512>));
  void* kernel_args[] = {&args, &maps[0], &maps[1], &maps[2], &maps[3]};
  std::printf("%-40s %7.2f us\n", "cuLaunchKernel(forward_kernel)", us([&] {
    cuLaunchKernel(reinterpret_cast<CUfunction>(function), 1, 1, 1, T512::kThreads, 1, 1, T512::kSmemBytes,
                   reinterpret_cast<CUstream>(stream), kernel_args, nullptr); }));
  cudaFuncAttributes attributes{};
  cudaFuncGetAttributes(&attributes, forward_kernel<T512>);
  std::printf("forward_kernel: %d regs, %zu B local, %d max threads, binary %d, ptx %d\n", attributes.numRegs,
              attributes.localSizeBytes, attributes.maxThreadsPerBlock, attributes.binaryVersion, attributes.ptxVersion);
  std::printf("%-40s %7.2f us\n", "forward (C++ API) again", us([&] { ffpa::forward(p); }));
  std::printf("sizeof(Args) %zu, smem %d\n", sizeof(Args), T512::kSmemBytes);
  return 0;
}
