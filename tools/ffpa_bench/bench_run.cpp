#include "bench_run.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_problem.hpp"
#include "bench_report.hpp"
#include "device_fill.hpp"
#include "host/dispatch.hpp"
#include "host/validate.hpp"
#include "reference/cpu_attention.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::bench {
namespace {

// A failing ffpa or CUDA call: the point cannot be measured (exit status 2).
class CallFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check_cuda(cudaError_t error, const std::string& call) {
  if (error != cudaSuccess)
    throw CallFailure(call + " failed: " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
}
#define BENCH_CUDA(call) check_cuda((call), #call)

// Releases cannot throw: a failing one is reported and the run goes on.
void warn_cuda(cudaError_t error, const char* call) {
  if (error != cudaSuccess)
    std::fprintf(stderr, "ffpa-bench: warning: %s failed: %s (%s)\n", call, cudaGetErrorName(error),
                 cudaGetErrorString(error));
}

void check_ffpa(const Status& status, const char* call) {
  if (!status.ok())
    throw CallFailure(std::string(call) + " failed: " + status_name(status.code) + ": " + status.message);
}

struct CudaFree {
  void operator()(void* p) const { warn_cuda(cudaFree(p), "cudaFree"); }
};
using DeviceMemory = std::unique_ptr<void, CudaFree>;

DeviceMemory device_alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes > 0) check_cuda(cudaMalloc(&p, bytes), "cudaMalloc(" + std::to_string(bytes) + " bytes)");
  return DeviceMemory(p);
}

struct StreamDestroy {
  void operator()(cudaStream_t s) const { warn_cuda(cudaStreamDestroy(s), "cudaStreamDestroy"); }
};
using Stream = std::unique_ptr<CUstream_st, StreamDestroy>;

struct EventDestroy {
  void operator()(cudaEvent_t e) const { warn_cuda(cudaEventDestroy(e), "cudaEventDestroy"); }
};
using Event = std::unique_ptr<CUevent_st, EventDestroy>;

Event make_event() {
  cudaEvent_t event = nullptr;
  BENCH_CUDA(cudaEventCreate(&event));
  return Event(event);
}

struct Device {
  int id = 0;
  std::string name;
  size_t l2_bytes = 0;
  std::string summary;  // name, architecture, SMs, L2
};

// The current CUDA device, or nothing (with the reason) when there is none.
std::optional<Device> find_device(std::string* why_not) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    // The runtime says "insufficient driver" also when there is no driver at
    // all; the driver's version (0: none) tells the two apart.
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (error == cudaSuccess) {
      *why_not = "the NVIDIA driver finds no GPU";
    } else if (driver == 0) {
      *why_not = "no NVIDIA driver on this machine";
    } else if (error == cudaErrorInsufficientDriver) {
      *why_not = "the NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
                 std::to_string(driver % 1000 / 10) + ", older than this build's runtime";
    } else {
      *why_not = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + ", " + cudaGetErrorString(error);
    }
    (void)cudaGetLastError();  // nothing to clear on later calls
    return std::nullopt;
  }
  Device device;
  BENCH_CUDA(cudaGetDevice(&device.id));
  cudaDeviceProp properties{};
  BENCH_CUDA(cudaGetDeviceProperties(&properties, device.id));
  int l2_bytes = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device.id));
  device.name = properties.name;
  device.l2_bytes = static_cast<size_t>(l2_bytes);
  device.summary = device.name + " (sm_" + std::to_string(properties.major) + std::to_string(properties.minor) +
                   ", " + std::to_string(properties.multiProcessorCount) + " SMs, " +
                   std::to_string(l2_bytes >> 20) + " MiB L2)";
  return device;
}

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return {n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2, ms.front(), ms.back()};
}

ForwardParams make_params(const PointTensors& t, const BenchArgs& args, Impl impl, cudaStream_t stream) {
  ForwardParams p;
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.o = t.o;
  p.mask = t.mask;
  p.lse = t.lse;
  p.options.scale = args.scale;
  p.options.causal = args.causal;
  p.options.dropout_p = args.dropout_p;
  p.options.dropout_seed = args.dropout_seed;
  p.options.accumulation = args.accumulation;
  p.options.precision = args.precision;
  p.options.fp8 = args.fp8;
  p.options.impl = impl;
  p.stream = stream;
  return p;
}

// `count` query rows spread evenly over [0, seq_q), the first and the last
// among them; every row when there are no more than `count`.
std::vector<int64_t> sample_rows(int64_t seq_q, int64_t count) {
  std::vector<int64_t> rows;
  if (count >= seq_q) {
    for (int64_t i = 0; i < seq_q; ++i) rows.push_back(i);
  } else if (count == 1) {
    rows.push_back(0);
  } else {
    for (int64_t r = 0; r < count; ++r) rows.push_back(r * (seq_q - 1) / (count - 1));
  }
  return rows;
}

// Tolerances of the GPU tests on the relative L2 error against fp64.
// FP8: 8-bit P and V (docs/kernels/fp8_model.md: 3.5-5e-2 on these inputs).
double tolerance_for(const BenchArgs& args) {
  if (args.precision == Precision::fp8) return 5e-2;
  return args.dtype == DType::f16 && args.accumulation == Accumulation::f32 ? 5e-3 : 1e-2;
}
// On |lse - ref| / max(1, |ref|).
double lse_tolerance_for(const BenchArgs& args) { return args.precision == Precision::fp8 ? 2e-2 : 1e-3; }

// NaN elements in the dense buffer behind `t`.
int64_t count_nan(const Tensor& t) {
  const size_t size = testing::dtype_size(t.dtype), count = buffer_bytes(t) / size;
  const auto* bytes = static_cast<const unsigned char*>(t.data);
  int64_t nan = 0;
  for (size_t e = 0; e < count; ++e) {
    if (t.dtype == DType::f32) {
      float value;
      std::memcpy(&value, bytes + e * size, size);
      nan += std::isnan(value);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes + e * size, size);
      nan += (bits & 0x7FFFu) > (t.dtype == DType::f16 ? 0x7C00u : 0x7F80u);
    }
  }
  return nan;
}

// NaN-propagating maximum, so that a NaN error fails the check.
double max_or_nan(double a, double b) { return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b); }

double lse_error(double got, double ref) {
  if (std::isinf(ref)) return got == ref ? 0.0 : std::numeric_limits<double>::infinity();
  return std::abs(got - ref) / std::max(1.0, std::abs(ref));
}

// Compares o (and lse) of `host` (host copies of the inputs and the outputs)
// with the fp64 CPU reference on sampled rows of every batch and head.
CheckResult check_against_reference(const ForwardParams& host, const BenchArgs& args) {
  detail::AttentionProblem problem;
  check_ffpa(detail::validate_forward(host, &problem), "ffpa::detail::validate_forward (host copies)");
  const std::vector<int64_t> rows = sample_rows(problem.seq_q, args.check_rows);
  const int64_t count = static_cast<int64_t>(rows.size()), batch = problem.batch,
                heads = problem.heads_q, dim = problem.dv();
  const bool with_lse = host.lse.data != nullptr;
  std::vector<double> ref_o(static_cast<size_t>(batch * heads * count * dim));
  std::vector<double> ref_lse(with_lse ? static_cast<size_t>(batch * heads * count) : 0);
  detail::cpu_attention_forward_f64(problem, {rows.data(), count}, ref_o.data(),
                                    with_lse ? ref_lse.data() : nullptr);

  CheckResult check;
  check.rows = count;
  check.tolerance = tolerance_for(args);
  double diff_squares = 0, ref_squares = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < count; ++r) {
        const size_t row = static_cast<size_t>((b * heads + h) * count + r);
        for (int64_t d = 0; d < dim; ++d) {
          const double ref = ref_o[row * dim + d];
          const double diff = testing::element_as_double(host.o, {b, h, rows[r], d}) - ref;
          diff_squares += diff * diff;
          ref_squares += ref * ref;
          check.max_abs = max_or_nan(check.max_abs, std::abs(diff));
        }
        if (with_lse) {
          const double got = testing::element_as_double(host.lse, {b, h, rows[r], 0});
          check.lse_max_error = max_or_nan(check.lse_max_error.value_or(0), lse_error(got, ref_lse[row]));
        }
      }
  // Every sampled row fully masked gives a zero reference: report the absolute error.
  check.rel_l2 = ref_squares > 0 ? std::sqrt(diff_squares / ref_squares) : std::sqrt(diff_squares);
  check.nan_count = count_nan(host.o) + (with_lse ? count_nan(host.lse) : 0);
  check.passed = check.nan_count == 0 && check.rel_l2 <= check.tolerance &&
                 (!check.lse_max_error || *check.lse_max_error <= lse_tolerance_for(args));
  return check;
}

// --backward: the backward of a forward call (its o and lse written), o
// standing in for dO (a tensor of its shape and dtype; the kernels' time does
// not depend on its values), the gradients into d_q, d_k, d_v (q's, k's and
// v's descriptions over the given buffers).
BackwardParams make_backward_params(const ForwardParams& f, void* d_q, void* d_k, void* d_v) {
  BackwardParams b;
  b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = f.lse, b.mask = f.mask;
  b.d_o = f.o;
  b.d_q = f.q, b.d_k = f.k, b.d_v = f.v;
  b.d_q.data = d_q, b.d_k.data = d_k, b.d_v.data = d_v;
  b.options = f.options;
  b.stream = f.stream;
  return b;
}

// --packed: the backward of the same tokens as a sequence batch. The
// [B, N, H, D] buffers (--layout bnhd) seen as packed [1, H, B N, D] rows
// with cu_seqlens {0, N, 2 N, ...}, and the lse [B, H, N] laid out as the
// packed [1, H, B N] (strides N, B N, 1), so that the dense forward writes
// what the packed backward reads.
struct PackedSequences {
  std::vector<int32_t> offsets;  // cu_seqlens_q, then cu_seqlens_k: [B + 1] each
  SequenceBatch batch;
};

void lse_as_packed(Tensor* lse) {
  lse->stride[2] = 1;
  lse->stride[0] = lse->shape[2];
  lse->stride[1] = lse->shape[0] * lse->shape[2];
}

// A [B, H, N, ...] view of rows n at stride[2] with stride[0] = N stride[2]
// (a bnhd buffer, or the lse above) as [1, H, B N, ...].
Tensor packed_rows(Tensor t) {
  if (t.stride[0] != t.shape[2] * t.stride[2]) throw CallFailure("--packed: the rows of a batch entry must follow the last one's");
  t.shape[2] *= t.shape[0];
  t.shape[0] = 1;
  t.stride[0] = t.shape[2] * t.stride[2];
  return t;
}

// The packed call of the dense backward `dense` (its lse laid out by
// lse_as_packed), its offsets in `packed` (to copy where the call's tensors
// live: `offsets` when not null, else the host vector).
BackwardParams packed_backward(const BackwardParams& dense, PackedSequences* packed, int32_t* offsets) {
  const int64_t batch = dense.q.shape[0], seq_q = dense.q.shape[2], seq_kv = dense.k.shape[2];
  packed->offsets.clear();
  for (int64_t b = 0; b <= batch; ++b) packed->offsets.push_back(static_cast<int32_t>(b * seq_q));
  for (int64_t b = 0; b <= batch; ++b) packed->offsets.push_back(static_cast<int32_t>(b * seq_kv));
  int32_t* const cu = offsets != nullptr ? offsets : packed->offsets.data();
  packed->batch.cu_seqlens_q = make_tensor(cu, DType::i32, {batch + 1});
  packed->batch.cu_seqlens_k = make_tensor(cu + batch + 1, DType::i32, {batch + 1});
  packed->batch.max_seqlen_q = seq_q;
  packed->batch.max_seqlen_k = seq_kv;
  BackwardParams p = dense;
  for (Tensor* t : {&p.q, &p.k, &p.v, &p.o, &p.lse, &p.d_o, &p.d_q, &p.d_k, &p.d_v}) *t = packed_rows(*t);
  p.sequences = &packed->batch;
  return p;
}

// The described tensors and their random inputs in host memory.
struct HostInputs {
  PointTensors tensors;
  InputSlab slab;
  HostBuffer buffer;
};

// The tensors and the slab's layout; no host copy (inputs drawn on the device).
HostInputs describe_inputs(const BenchArgs& args, const ProblemShape& shape, size_t min_total_bytes) {
  const PointTensors tensors = describe_tensors(shape, args.dtype, args.layout, args.mask, args.lse || args.backward);
  return HostInputs{tensors, plan_input_slab(tensors, min_total_bytes), HostBuffer(0)};
}

HostInputs make_host_inputs(const BenchArgs& args, const ProblemShape& shape, size_t min_total_bytes,
                            uint64_t seed) {
  HostInputs inputs = describe_inputs(args, shape, min_total_bytes);
  inputs.buffer = HostBuffer(inputs.slab.total_bytes());
  fill_inputs(inputs.buffer.get(), inputs.slab, inputs.tensors, seed);
  return inputs;
}

// Times `iters` calls (call(i) issues call i on the stream) with CUDA events
// around each, lowering *lowest_free to the least free device memory seen.
template <class Call>
std::vector<double> time_on_stream(cudaStream_t stream, int iters, size_t* lowest_free, Call&& call) {
  const Event start = make_event(), stop = make_event();
  std::vector<double> ms;
  size_t free_now = 0, total = 0;
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(start.get(), stream));
    call(i);
    BENCH_CUDA(cudaEventRecord(stop.get(), stream));
    BENCH_CUDA(cudaEventSynchronize(stop.get()));
    float elapsed = 0;
    BENCH_CUDA(cudaEventElapsedTime(&elapsed, start.get(), stop.get()));
    ms.push_back(elapsed);
    BENCH_CUDA(cudaMemGetInfo(&free_now, &total));
    *lowest_free = std::min(*lowest_free, free_now);
  }
  return ms;
}

// --backward on the GPU: the forward once (o, lse), then the backward timed.
PointResult time_backward_on_device(const BenchArgs& args, cudaStream_t stream, ForwardParams forward_params,
                                    PointResult result) {
  if (args.packed) lse_as_packed(&forward_params.lse);
  check_ffpa(ffpa::forward(forward_params), "ffpa::forward");
  const DeviceMemory d_q = device_alloc(buffer_bytes(forward_params.q)), d_k = device_alloc(buffer_bytes(forward_params.k)),
                     d_v = device_alloc(buffer_bytes(forward_params.v));
  BackwardParams params = make_backward_params(forward_params, d_q.get(), d_k.get(), d_v.get());
  PackedSequences packed;
  DeviceMemory offsets;
  if (args.packed) {
    offsets = device_alloc(2 * (static_cast<size_t>(params.q.shape[0]) + 1) * sizeof(int32_t));
    params = packed_backward(params, &packed, static_cast<int32_t*>(offsets.get()));
    BENCH_CUDA(cudaMemcpy(offsets.get(), packed.offsets.data(), packed.offsets.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
  }
  MemoryResult memory;
  check_ffpa(backward_workspace_size(params, &memory.workspace), "ffpa::backward_workspace_size");
  const DeviceMemory workspace = device_alloc(memory.workspace);
  params.workspace = workspace.get(), params.workspace_bytes = memory.workspace;
  // The forward's choice (padded D, splits) says nothing of the backward's kernels.
  result.kernel = KernelChoice{};
  result.kernel.impl = args.impl;
  result.kernel.kernel = args.packed ? "ffpa::backward (packed sequences)" : "ffpa::backward";
  result.input_sets = 1;
  for (int n = 0; n < args.warmup; ++n) check_ffpa(ffpa::backward(params), "ffpa::backward (warm-up)");
  BENCH_CUDA(cudaStreamSynchronize(stream));
  size_t free_before = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_before, &total));
  size_t lowest_free = free_before;
  std::vector<double> ms = time_on_stream(stream, args.iters, &lowest_free,
                                          [&](int) { check_ffpa(ffpa::backward(params), "ffpa::backward"); });
  memory.free_drop = free_before - lowest_free;
  result.memory = memory;
  result.timing = summarize(std::move(ms));
  return result;
}

PointResult run_on_device(const BenchArgs& args, const Device& device, cudaStream_t stream, PointResult result) {
  // Together the input sets exceed twice the L2, so rotating through them times HBM, not L2.
  const HostInputs in = args.device_inputs ? describe_inputs(args, result.shape, 2 * device.l2_bytes)
                                           : make_host_inputs(args, result.shape, 2 * device.l2_bytes, result.data_seed);
  result.input_sets = in.slab.sets;
  const DeviceMemory inputs = device_alloc(in.slab.total_bytes());
  if (args.device_inputs) {
    BENCH_CUDA(fill_inputs_on_device(inputs.get(), in.slab, in.tensors, result.data_seed, stream));
  } else {
    BENCH_CUDA(cudaMemcpyAsync(inputs.get(), in.buffer.get(), in.slab.total_bytes(), cudaMemcpyHostToDevice, stream));
  }
  const size_t o_bytes = buffer_bytes(in.tensors.o), lse_bytes = buffer_bytes(in.tensors.lse);
  const DeviceMemory o = device_alloc(o_bytes), lse = device_alloc(lse_bytes);
  // The workspace a call uses (split-KV's partial rows), allocated once as a
  // framework's caching allocator would hand it out: without one the library
  // takes stream-ordered memory per call, which the default pool returns to
  // the driver at every synchronization of this loop.
  DeviceMemory workspace;
  size_t workspace_bytes = 0;
  const auto call = [&](int64_t n) {  // call n reads input set n mod sets
    ForwardParams params = make_params(
        bind_tensors(in.tensors, in.slab, inputs.get(), n % in.slab.sets, o.get(), lse.get()), args, args.impl, stream);
    params.workspace = workspace.get();
    params.workspace_bytes = workspace_bytes;
    return params;
  };
  check_ffpa(select_kernel(call(0), &result.kernel), "ffpa::select_kernel");
  MemoryResult memory;
  check_ffpa(workspace_size(call(0), &memory.workspace), "ffpa::workspace_size");
  // --kv-splits: the library's plan with another split count, run as
  // ffpa::forward runs a plan (validate, then run_forward).
  const auto forward = [&](const ForwardParams& params) -> Status {
    if (!args.kv_splits) return ffpa::forward(params);
    detail::AttentionProblem problem;
    if (Status status = detail::validate_forward(params, &problem); !status.ok()) return status;
    return detail::run_forward(problem, result.kernel, params.workspace, params.workspace_bytes, params.stream);
  };
  if (args.kv_splits) {
    detail::AttentionProblem problem;
    check_ffpa(detail::validate_forward(call(0), &problem), "ffpa::detail::validate_forward");
    check_ffpa(detail::with_kv_splits(problem, *args.kv_splits, &result.kernel), "--kv-splits");
    memory.workspace = static_cast<size_t>(detail::workspace_bytes(problem, result.kernel));
  }
  if (memory.workspace > 0) {
    workspace = device_alloc(memory.workspace);
    workspace_bytes = memory.workspace;
  }

  if (args.backward) return time_backward_on_device(args, stream, call(0), std::move(result));

  if (args.check_rows > 0) {
    // 0xFF bytes are NaN in f16, bf16 and f32: any element left unwritten shows.
    BENCH_CUDA(cudaMemsetAsync(o.get(), 0xFF, o_bytes, stream));
    if (lse_bytes > 0) BENCH_CUDA(cudaMemsetAsync(lse.get(), 0xFF, lse_bytes, stream));
    check_ffpa(forward(call(0)), "ffpa::forward");
    const HostBuffer host_o(o_bytes), host_lse(lse_bytes);
    BENCH_CUDA(cudaMemcpyAsync(host_o.get(), o.get(), o_bytes, cudaMemcpyDeviceToHost, stream));
    if (lse_bytes > 0) BENCH_CUDA(cudaMemcpyAsync(host_lse.get(), lse.get(), lse_bytes, cudaMemcpyDeviceToHost, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    const PointTensors host = bind_tensors(in.tensors, in.slab, in.buffer.get(), 0, host_o.get(), host_lse.get());
    result.check = check_against_reference(make_params(host, args, Impl::cpu_reference, nullptr), args);
  }

  for (int n = 0; n < args.warmup; ++n) check_ffpa(forward(call(n)), "ffpa::forward (warm-up)");
  BENCH_CUDA(cudaStreamSynchronize(stream));

  cudaMemPool_t pool = nullptr;
  BENCH_CUDA(cudaDeviceGetDefaultMemPool(&pool, device.id));
  uint64_t pool_used_high = 0;  // setting the high-water mark to 0 resets it
  BENCH_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &pool_used_high));
  size_t free_before = 0, total = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_before, &total));
  size_t lowest_free = free_before;

  // Each timed call's parameters made before the timing: the events bracket the launch alone.
  std::vector<ForwardParams> timed;
  for (int i = 0; i < args.iters; ++i) timed.push_back(call(args.warmup + i));
  std::vector<double> ms = time_on_stream(stream, args.iters, &lowest_free, [&](int i) {
    check_ffpa(forward(timed[static_cast<size_t>(i)]), "ffpa::forward");
  });
  BENCH_CUDA(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &pool_used_high));
  memory.pool_used_high = pool_used_high;
  memory.free_drop = free_before - lowest_free;
  result.memory = memory;
  result.timing = summarize(std::move(ms));
  return result;
}

// The host's wall time of `iters` calls after `warmup` untimed ones; a call
// that takes over a second reports its time on stderr (a long run on the CPU
// reference shows its progress).
template <class Call>
Timing time_on_host(int warmup, int iters, Call&& call) {
  std::vector<double> ms;
  for (int n = 0; n < warmup + iters; ++n) {
    const auto start = std::chrono::steady_clock::now();
    call();
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > 1000.0)
      std::fprintf(stderr, "  %s call %d/%d: %.1f s\n", n < warmup ? "warm-up" : "timed",
                   n < warmup ? n + 1 : n - warmup + 1, n < warmup ? warmup : iters, elapsed * 1e-3);
    if (n >= warmup) ms.push_back(elapsed);
  }
  return summarize(std::move(ms));
}

PointResult run_on_host(const BenchArgs& args, PointResult result) {
  if (args.kv_splits) throw CallFailure("--kv-splits: the CPU reference has no KV splits (the sm90 family plans them)");
  if (args.device_inputs) throw CallFailure("--device-inputs: no GPU to draw them on");
  const HostInputs in = make_host_inputs(args, result.shape, 0, result.data_seed);
  const size_t o_bytes = buffer_bytes(in.tensors.o), lse_bytes = buffer_bytes(in.tensors.lse);
  const HostBuffer o(o_bytes), lse(lse_bytes);
  const ForwardParams params = make_params(bind_tensors(in.tensors, in.slab, in.buffer.get(), 0, o.get(), lse.get()),
                                           args, Impl::cpu_reference, nullptr);
  check_ffpa(select_kernel(params, &result.kernel), "ffpa::select_kernel");
  if (args.backward) {  // the CPU reference's backward: the reference itself, nothing to check against
    ForwardParams forward_params = params;
    if (args.packed) lse_as_packed(&forward_params.lse);
    check_ffpa(forward(forward_params), "ffpa::forward");
    const HostBuffer d_q(buffer_bytes(params.q)), d_k(buffer_bytes(params.k)), d_v(buffer_bytes(params.v));
    PackedSequences packed;
    BackwardParams backward_params = make_backward_params(forward_params, d_q.get(), d_k.get(), d_v.get());
    if (args.packed) backward_params = packed_backward(backward_params, &packed, nullptr);
    result.kernel.kernel = args.packed ? "ffpa::backward (CPU reference, packed sequences)" : "ffpa::backward (CPU reference)";
    result.timing = time_on_host(args.warmup, args.iters,
                                 [&] { check_ffpa(backward(backward_params), "ffpa::backward"); });
    return result;
  }
  if (args.check_rows > 0) {
    std::memset(o.get(), 0xFF, o_bytes);  // NaN in every float dtype
    std::memset(lse.get(), 0xFF, lse_bytes);
    check_ffpa(forward(params), "ffpa::forward");
    result.check = check_against_reference(params, args);
  }
  result.timing = time_on_host(args.warmup, args.iters, [&] { check_ffpa(forward(params), "ffpa::forward"); });
  return result;
}

// The forward calls a point makes: the checked one, the warm-up, the timed ones.
int forward_calls(const BenchArgs& args) { return (args.check_rows > 0 ? 1 : 0) + args.warmup + args.iters; }

// Without a GPU the forward runs on the CPU reference, which the user did not
// ask for: it must take seconds, so points above kCpuFallbackFlops run at
// small sizes, and the note says which shape runs instead of which.
void note_cpu_fallback(std::FILE* text, const std::string& why_no_device, const BenchArgs& args,
                       std::vector<ProblemShape>* shapes) {
  double most = 0;
  const ProblemShape* largest = nullptr;
  for (const ProblemShape& shape : *shapes) {
    const double flops = forward_flops(shape, args.causal) * (args.backward ? 2.5 : 1.0);
    if (flops > most) most = flops, largest = &shape;
  }
  const char* elsewhere = "on a machine with a GPU the same command times the GPU kernels on the asked shape";
  if (most <= kCpuFallbackFlops) {
    std::fprintf(text, "no GPU: %s. Running the CPU reference on the asked shape instead (seconds); %s.\n",
                 why_no_device.c_str(), elsewhere);
    return;
  }
  const ProblemShape asked = *largest;
  for (ProblemShape& shape : *shapes) shape = small_sizes(shape);
  std::fprintf(text,
               "no GPU: %s. The asked shape %s (%.3g GFLOP a call, %d calls) would take minutes or more on the "
               "CPU reference; running the CPU reference on %s instead (the asked head dims, small sizes; "
               "seconds). --impl cpu runs the asked shape on the CPU reference; %s.\n",
               why_no_device.c_str(), shape_text(asked).c_str(), most * 1e-9, forward_calls(args),
               shape_text(small_sizes(asked)).c_str(), elsewhere);
}

// --impl cpu runs the shape asked, however large: the note gives its work.
void note_cpu_work(std::FILE* text, const BenchArgs& args, const std::vector<ProblemShape>& shapes) {
  for (const ProblemShape& shape : shapes) {
    const double flops = forward_flops(shape, args.causal) * (args.backward ? 2.5 : 1.0);
    if (flops > kCpuFallbackFlops) {
      std::fprintf(text,
                   "note: %s on the CPU reference: %.3g GFLOP a call, %d calls, at a few GFLOP/s; each call "
                   "taking over a second reports its time on stderr (--warmup 0 --iters 1: one call).\n",
                   shape_text(shape).c_str(), flops * 1e-9, forward_calls(args));
    }
  }
}

}  // namespace

int run_benchmarks(const BenchArgs& args) {
  std::FILE* text = args.json ? stderr : stdout;  // --json keeps stdout for the JSON lines
  try {
    std::string why_no_device;
    const std::optional<Device> device = find_device(&why_no_device);
    if (!device && (args.impl == Impl::sm80_split_d || args.impl == Impl::sm90_wgmma))
      throw CallFailure("no CUDA device (" + why_no_device + "): --impl " +
                        (args.impl == Impl::sm80_split_d ? "sm80" : "sm90") + " needs one");
    const bool on_host = !device || args.impl == Impl::cpu_reference;
    // Without a GPU the shapes start as the ones a GPU would run (the asked
    // ones); --impl cpu fills what is not given from the small default.
    std::vector<ProblemShape> shapes = point_shapes(args, args.impl == Impl::cpu_reference);
    if (!device && args.impl == Impl::automatic) note_cpu_fallback(text, why_no_device, args, &shapes);
    if (args.impl == Impl::cpu_reference) note_cpu_work(text, args, shapes);
    std::fprintf(text, "ffpa-bench %s on %s\n", version(),
                 on_host ? "the CPU reference (host memory)" : device->summary.c_str());

    Stream stream;
    if (!on_host) {
      cudaStream_t created = nullptr;
      BENCH_CUDA(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
      stream.reset(created);
    }
    std::random_device entropy;
    bool all_passed = true;
    for (size_t i = 0; i < shapes.size(); ++i) {
      std::fflush(text);  // keeps the progress line after the text before it
      std::fprintf(stderr, "[%zu/%zu] D=%lld ...\n", i + 1, shapes.size(),
                   static_cast<long long>(shapes[i].head_dim));
      PointResult result;
      result.index = static_cast<int>(i + 1);
      result.count = static_cast<int>(shapes.size());
      result.device = on_host ? "CPU reference" : device->name;
      result.shape = shapes[i];
      result.flops = forward_flops(shapes[i], args.causal) * (args.backward ? 2.5 : 1.0);
      result.data_seed = args.data_seed.value_or(entropy());
      result = on_host ? run_on_host(args, std::move(result))
                       : run_on_device(args, *device, stream.get(), std::move(result));
      print_text(text, args, result);
      if (args.json) {
        std::printf("%s\n", to_json(args, result).c_str());
        std::fflush(stdout);
      }
      if (result.check && !result.check->passed) all_passed = false;
    }
    return all_passed ? 0 : 1;
  } catch (const CallFailure& failure) {
    std::fprintf(stderr, "ffpa-bench: %s\n", failure.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ffpa-bench: out of host memory\n");
    return 2;
  }
}

}  // namespace ffpa::bench
