#include "host/dispatch.hpp"

#include <algorithm>
#include <new>
#include <string>
#include <utility>

#include "host/cuda_status.hpp"
#include "host/fp8_forward.hpp"
#include "host/memory_space.hpp"
#include "host/serving_passes.hpp"
#include "host/validate_sequences.hpp"
#include "host/workspace.hpp"
#include "kernels/sm80_backward/family.hpp"
#include "kernels/sm90_backward/family.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/serving/plan.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "kernels/split_kv/combine.hpp"
#include "reference/cpu_attention.hpp"
#include "reference/cpu_attention_backward.hpp"

namespace ffpa::detail {
namespace {

const char* impl_name(Impl impl) {
  switch (impl) {
    case Impl::automatic: return "auto";
    case Impl::cpu_reference: return "cpu_reference";
    case Impl::sm80_split_d: return "sm80_split_d";
    case Impl::sm90_wgmma: return "sm90_wgmma";
  }
  return "unknown";
}

// f32 / f64 inputs and f64 masks (for checks in double, e.g. gradcheck): the
// CPU reference reads them, no kernel does.
Status reference_only_dtypes(const AttentionProblem& problem, Impl requested, MemorySpace space) {
  const bool wide_inputs = problem.dtype == DType::f32 || problem.dtype == DType::f64;
  if (!wide_inputs && problem.mask_kind != MaskKind::additive_f64) return {};
  const bool reference = space == MemorySpace::host && !problem.fp8 &&
                         (requested == Impl::cpu_reference || requested == Impl::automatic);
  if (reference) return {};
  return {StatusCode::unsupported_dtype,
          std::string(wide_inputs ? (problem.dtype == DType::f32 ? "q.dtype = f32" : "q.dtype = f64")
                                  : "mask.dtype = f64") +
              ": f32 and f64 inputs and f64 masks run on the CPU reference only (host tensors, impl auto or "
              "cpu_reference, the inputs' precision)"};
}

// Where the call's tensors live, an FP8 KV cache's with them (k and v may be
// null beside one: the cache holds them).
Status call_memory_space(const AttentionProblem& problem, const Fp8KvCache* kv_cache, MemorySpace* space) {
  if (kv_cache == nullptr) return common_memory_space(problem, space);
  const NamedPointer tensors[] = {{"q", problem.q},
                                  {"k", problem.k},
                                  {"v", problem.v},
                                  {"o", problem.o},
                                  {"mask", problem.mask},
                                  {"lse", problem.lse},
                                  {"fp8_kv_cache.k_codes", kv_cache->k_codes.data},
                                  {"fp8_kv_cache.k_scales", kv_cache->k_scales.data},
                                  {"fp8_kv_cache.k_mean", kv_cache->k_mean.data},
                                  {"fp8_kv_cache.v_codes", kv_cache->v_codes.data},
                                  {"fp8_kv_cache.v_scales", kv_cache->v_scales.data},
                                  {"fp8_kv_cache.v_mean", kv_cache->v_mean.data}};
  return common_memory_space(tensors, 12, space);
}

// What a GPU family does not serve yet of the serving semantics
// (docs/serving.md), which the CPU reference computes: an e4m3 KV cache is
// converted as it is loaded by sm80_split_d and sm90_wgmma (whose routing
// says which of its instances take one), by no other family.
Status gpu_serves_variant(const AttentionProblem& problem, Impl impl) {
  const char* what =
      problem.kv_e4m3 && impl != Impl::sm80_split_d && impl != Impl::sm90_wgmma ? "an e4m3 KV cache" : nullptr;
  if (what == nullptr) return {};
  return {StatusCode::impl_unavailable,
          std::string("impl ") + impl_name(impl) + " does not serve " + what + " yet (impl cpu_reference does)"};
}

Status plan_cpu_reference(MemorySpace space, KernelChoice* choice) {
  if (space != MemorySpace::host) {
    return {StatusCode::wrong_memory_space,
            "impl cpu_reference needs host pointers, but the tensors are in device memory"};
  }
  choice->impl = Impl::cpu_reference;
  return {};
}

struct DeviceInfo {
  int device = 0, major = 0, minor = 0;
  std::string compute_capability() const {
    return "device " + std::to_string(device) + " has " + std::to_string(major) + "." +
           std::to_string(minor);
  }
};

// "impl X needs a CUDA device: why there is none" for a failing device query.
Status no_device(Impl impl, cudaError_t error, const char* what) {
  (void)cudaGetLastError();
  if (!is_device_unavailable(error)) return cuda_status(error, what);
  return {StatusCode::impl_unavailable,
          std::string("impl ") + impl_name(impl) + " needs a CUDA device: " + driver_problem(error)};
}

Status compute_capability(Impl impl, DeviceInfo* info) {
  for (auto [value, attribute] : {std::pair{&info->major, cudaDevAttrComputeCapabilityMajor},
                                  std::pair{&info->minor, cudaDevAttrComputeCapabilityMinor}}) {
    if (const cudaError_t error = cudaDeviceGetAttribute(value, attribute, info->device);
        error != cudaSuccess) {
      return no_device(impl, error, "cudaDeviceGetAttribute");
    }
  }
  return {};
}

// The current device of a GPU implementation, once it is known that there is
// one and that the tensors live in device memory.
Status current_device(Impl impl, MemorySpace space, DeviceInfo* info) {
  if (const cudaError_t error = cudaGetDevice(&info->device); error != cudaSuccess) {
    return no_device(impl, error, "cudaGetDevice");
  }
  if (space != MemorySpace::device) {
    return {StatusCode::wrong_memory_space, std::string("impl ") + impl_name(impl) +
                                                " needs device pointers, but the tensors are in host memory"};
  }
  return compute_capability(impl, info);
}

// What each GPU family needs of a device whatever the call. Whether this
// build's kernels run there is asked of the runtime (the runnable checks).
Status sm80_capability(const DeviceInfo& info) {
  if (info.major >= 8) return {};
  return {StatusCode::impl_unavailable,
          "impl sm80_split_d needs compute capability 8.0 or newer; " + info.compute_capability()};
}

// The sm90 family runs sm_90a code: compute capability 9.0 exactly.
Status sm90_capability(const DeviceInfo& info) {
  if (info.major == 9 && info.minor == 0) return {};
  return {StatusCode::impl_unavailable,
          "impl sm90_wgmma needs compute capability 9.0; " + info.compute_capability()};
}

Status split_d_shared_memory_route(const AttentionProblem& problem, const DeviceInfo& info,
                                   sm80_split_d::Route* route) {
  int smem_limit = 0;
  if (const cudaError_t error = cudaDeviceGetAttribute(
          &smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, info.device);
      error != cudaSuccess) {
    return no_device(Impl::sm80_split_d, error, "cudaDeviceGetAttribute");
  }
  *route = sm80_split_d::route(problem.dv(), smem_limit);  // instances hold Dv columns of O; D is streamed
  if (route->out_cols == 0) {
    return {StatusCode::impl_unavailable,
            "impl sm80_split_d: no kernel of this build fits the " + std::to_string(smem_limit) +
                " bytes of shared memory per block of device " + std::to_string(info.device)};
  }
  return {};
}

Status plan_sm80_split_d(const AttentionProblem& problem, MemorySpace space,
                         KernelChoice* choice) {
  DeviceInfo info;
  if (Status status = current_device(Impl::sm80_split_d, space, &info); !status.ok()) return status;
  if (Status status = sm80_capability(info); !status.ok()) return status;
  if (Status status = gpu_serves_variant(problem, Impl::sm80_split_d); !status.ok()) return status;
  if (problem.seq_q > kMaxSequenceLength || problem.seq_kv > kMaxSequenceLength) {
    return {StatusCode::impl_unavailable,
            "impl sm80_split_d serves sequence lengths up to " + std::to_string(kMaxSequenceLength)};
  }
  sm80_split_d::Route route;
  if (Status status = split_d_shared_memory_route(problem, info, &route); !status.ok()) return status;
  if (Status status = sm80_split_d::runnable(problem, route, info.device); !status.ok()) return status;
  int sm_count = 0;
  if (const cudaError_t error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, info.device);
      error != cudaSuccess) {
    return no_device(Impl::sm80_split_d, error, "cudaDeviceGetAttribute");
  }
  choice->impl = Impl::sm80_split_d;
  choice->padded_head_dim = route.out_cols;
  choice->value_splits = route.value_splits;
  if (problem.sequences.active) {
    // A sequence batch of decode rows: its plan chooses the KV split on the
    // device from the batch's lengths (kv_splits 0, split_blocks: the slots).
    const int slots = sm80_split_d::sequence_split_slots(problem, route, sm_count);
    choice->kv_splits = slots > 0 ? 0 : 1;
    choice->split_blocks = slots;
    return {};
  }
  // Split-KV where the tiles leave SMs idle (decode).
  const KvSplits splits = sm80_split_d::plan_kv_splits(problem, route, sm_count);
  choice->kv_splits = splits.count;
  choice->split_blocks = static_cast<int32_t>(splits.keys_per_split / sm80_split_d::tile_shape(route.out_cols).block_n);
  return {};
}

// The choice's split-KV fields (its blocks of the tile's keys: sm90_wgmma::tile_shape).
void set_kv_splits(const KvSplits& splits, int block_keys, KernelChoice* choice) {
  choice->kv_splits = splits.count;
  choice->split_blocks = static_cast<int32_t>(splits.keys_per_split / block_keys);
}

Status plan_sm90_wgmma(const AttentionProblem& problem, MemorySpace space, KernelChoice* choice) {
  DeviceInfo info;
  if (Status status = current_device(Impl::sm90_wgmma, space, &info); !status.ok()) return status;
  if (Status status = sm90_capability(info); !status.ok()) return status;
  if (Status status = gpu_serves_variant(problem, Impl::sm90_wgmma); !status.ok()) return status;
  std::string reason;
  const sm90_wgmma::Instance* instance = sm90_wgmma::route(problem, &reason);
  if (instance == nullptr) {
    return {StatusCode::impl_unavailable, "impl sm90_wgmma does not serve this call: " + reason};
  }
  if (Status status = instance->runnable(problem.dtype, info.device); !status.ok()) return status;
  int sm_count = 0;
  if (const cudaError_t error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, info.device);
      error != cudaSuccess) {
    return no_device(Impl::sm90_wgmma, error, "cudaDeviceGetAttribute");
  }
  choice->impl = Impl::sm90_wgmma;
  choice->padded_head_dim = instance->head_dim;
  choice->value_splits = 1;
  const sm90_wgmma::TilePlan tiles = sm90_wgmma::plan_tiles(problem, instance->head_dim, sm_count);
  choice->heads_per_tile = tiles.heads_per_tile;
  set_kv_splits(tiles.splits, tiles.tile.keys, choice);
  if (tiles.split_slots > 0) {
    // A sequence batch whose plan chooses its KV splits on the device.
    choice->kv_splits = 0;
    choice->split_blocks = tiles.split_slots;
  }
  choice->short_rows = tiles.short_rows;
  choice->short_heads_per_tile = tiles.short_heads_per_tile;
  choice->short_split_slots = tiles.short_split_slots;
  return {};
}

// Precision::fp8: the pre-pass and the sm90 family's FP8 kernel (either impl
// naming it: automatic or sm90_wgmma).
Status plan_fp8(const AttentionProblem& problem, Impl requested, MemorySpace space, KernelChoice* choice) {
  if (requested != Impl::automatic && requested != Impl::sm90_wgmma) {
    return {StatusCode::impl_unavailable,
            std::string("precision fp8 runs on impl sm90_wgmma only, not ") + impl_name(requested)};
  }
  DeviceInfo info;
  Status status = current_device(Impl::sm90_wgmma, space, &info);
  if (status.ok()) status = sm90_capability(info);
  if (status.ok()) status = gpu_serves_variant(problem, Impl::sm90_wgmma);
  if (status.ok()) status = check_fp8(problem, problem.quantization);
  if (!status.ok()) {
    status.message = "precision fp8: " + status.message;
    return status;
  }
  std::string reason;
  const sm90_wgmma::Fp8Instance* instance = sm90_wgmma::route_fp8(problem, &reason);
  choice->impl = Impl::sm90_wgmma;
  choice->precision = Precision::fp8;
  choice->padded_head_dim = instance->head_dim;
  return {};
}

// Device pointers under Impl::automatic: the sm90 family where it serves the
// call and is measured faster (docs/kernels/sm90_wgmma.md), else split-D.
Status plan_automatic_device(const AttentionProblem& problem, KernelChoice* choice) {
  // H200, N = 8192, bf16 (docs/kernels/sm90_wgmma.md): D = 128 split-D 218 vs
  // sm90's column split 137 TFLOP/s; D = 256 split-D 249 vs sm90 451. The
  // row split wherever it runs the call (H100, N 8192: D 64 397 vs split-D
  // 164, D 128 625 vs 148; docs/kernels/sm90_small_d_plan.md's log).
  // D_qk != D_v by the wider head dim (the sm90 instance it takes): MLA 576 /
  // 512 prefill 242 vs split-D 221 TFLOP/s, its decode (B 64, Hq 128 packed)
  // 0.66 vs 0.67 ms, 192 / 128 causal 192 vs 180 (docs/perf/h200-2026-12-01g/mla_ab.jsonl).
  constexpr int64_t kSm90MinHeadDim = 129;
  const int64_t width = sm90_wgmma::instance_width(problem);
  if ((width >= kSm90MinHeadDim || sm90_wgmma::runs_row_split(problem, static_cast<int>(width))) &&
      plan_sm90_wgmma(problem, MemorySpace::device, choice).ok()) {
    return {};
  }
  (void)cudaGetLastError();
  return plan_sm80_split_d(problem, MemorySpace::device, choice);
}

}  // namespace

std::string kernel_name(const AttentionProblem& problem, const KernelChoice& choice) {
  switch (choice.impl) {
    case Impl::cpu_reference: return "cpu_reference<f64>";
    case Impl::sm80_split_d: {
      std::string name = sm80_split_d::kernel_name(
          problem, sm80_split_d::Route{static_cast<int>(choice.padded_head_dim), choice.value_splits});
      if (choice.kv_splits > 1) name += ",kv_splits" + std::to_string(choice.kv_splits);
      if (choice.kv_splits == 0) name += ",kv_splits planned";  // by the sequence plan
      return name;
    }
    case Impl::sm90_wgmma:
      if (choice.precision == Precision::fp8) return sm90_wgmma::fp8_kernel_name(problem, static_cast<int>(choice.padded_head_dim));
      for (int i = 0; i < sm90_wgmma::kInstanceCount; ++i) {
        if (sm90_wgmma::kInstances[i].head_dim != choice.padded_head_dim) continue;
        std::string name = sm90_wgmma::kernel_name(problem, sm90_wgmma::kInstances[i]);
        if (choice.short_rows > 0) {  // a mixed batch's first pass
          name.insert(name.size() - 1, ",rows<=" + std::to_string(choice.short_rows) + " first in heads" +
                                           std::to_string(choice.short_heads_per_tile));
        }
        if (choice.heads_per_tile > 1) name.insert(name.size() - 1, ",heads" + std::to_string(choice.heads_per_tile));
        if (choice.kv_splits > 1) name.insert(name.size() - 1, ",kv_splits" + std::to_string(choice.kv_splits));
        if (choice.kv_splits == 0) name.insert(name.size() - 1, ",kv_splits planned");  // by the sequence plan
        return name;
      }
      break;
    case Impl::automatic: break;
  }
  return "none";
}

Status plan_forward(const AttentionProblem& problem, Impl requested, KernelChoice* choice, const Fp8KvCache* kv_cache) {
  *choice = KernelChoice{};
  MemorySpace space = MemorySpace::host;
  if (Status status = call_memory_space(problem, kv_cache, &space); !status.ok()) return status;
  if (Status status = reference_only_dtypes(problem, requested, space); !status.ok()) return status;
  if (problem.fp8) return plan_fp8(problem, requested, space, choice);
  switch (requested) {
    case Impl::cpu_reference: return plan_cpu_reference(space, choice);
    case Impl::sm80_split_d: return plan_sm80_split_d(problem, space, choice);
    case Impl::sm90_wgmma: return plan_sm90_wgmma(problem, space, choice);
    case Impl::automatic:
      return space == MemorySpace::host ? plan_cpu_reference(space, choice)
                                        : plan_automatic_device(problem, choice);
  }
  return {StatusCode::invalid_option,
          "options.impl = " + std::to_string(static_cast<int>(requested)) + " is not an Impl"};
}

namespace {

// What device_support checks on the current device, `info.device`.
Status device_check(Impl impl, DeviceInfo info) {
  if (Status status = compute_capability(impl, &info); !status.ok()) return status;
  if (impl == Impl::sm90_wgmma) {
    if (Status status = sm90_capability(info); !status.ok()) return status;
    if (sm90_wgmma::kInstanceCount == 0) {
      return {StatusCode::impl_unavailable,
              "impl sm90_wgmma: this build has no sm_90a kernels (CMAKE_CUDA_ARCHITECTURES without 90)"};
    }
    return sm90_wgmma::kInstances[0].runnable(DType::bf16, info.device);
  }
  // sm80_split_d, and automatic, which runs it wherever the sm90 family does not serve.
  if (Status status = sm80_capability(info); !status.ok()) return status;
  AttentionProblem smallest;  // the head dim the smallest instance serves
  smallest.head_dim = kMinHeadDim;
  sm80_split_d::Route route;
  if (Status status = split_d_shared_memory_route(smallest, info, &route); !status.ok()) return status;
  return sm80_split_d::runnable(smallest, route, info.device);
}

bool is_gpu_impl(Impl impl) {
  return impl == Impl::automatic || impl == Impl::sm80_split_d || impl == Impl::sm90_wgmma;
}

// The arguments device_support and backward_route share: a GPU impl, a device ordinal.
Status check_gpu_query(int device, Impl impl) {
  if (!is_gpu_impl(impl)) {
    return {StatusCode::invalid_option,
            "impl = " + std::to_string(static_cast<int>(impl)) +
                " is not a GPU implementation (automatic, sm80_split_d or sm90_wgmma)"};
  }
  if (device < 0) {
    return {StatusCode::invalid_option,
            "device = " + std::to_string(device) + " is not a device ordinal"};
  }
  return {};
}

// Runs `query(info)` with CUDA device `device` current (info.device = device),
// then restores the calling thread's current device: the frame of the queries
// a binding asks once per device (device_support, backward_route).
// impl_unavailable naming `impl` without a device, invalid_option for an
// ordinal past the visible devices.
template <class Query>
Status on_device(int device, Impl impl, Query&& query) {
  int count = 0;
  if (const cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return no_device(impl, error, "cudaGetDeviceCount");
  }
  if (device >= count) {
    return {StatusCode::invalid_option, "device = " + std::to_string(device) + ", but " +
                                            std::to_string(count) + " CUDA devices are visible"};
  }
  int previous = 0;
  if (const cudaError_t error = cudaGetDevice(&previous); error != cudaSuccess) {
    return no_device(impl, error, "cudaGetDevice");
  }
  if (previous != device) {
    if (const cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
      return no_device(impl, error, "cudaSetDevice");
    }
  }
  DeviceInfo info;
  info.device = device;
  Status status = query(info);
  if (previous != device) {
    if (const cudaError_t error = cudaSetDevice(previous); error != cudaSuccess) {
      (void)cudaGetLastError();
      if (status.ok()) status = cuda_status(error, "cudaSetDevice (restoring the current device)");
    }
  }
  return status;
}

}  // namespace

Status device_support(int device, Impl impl) {
  if (Status status = check_gpu_query(device, impl); !status.ok()) return status;
  return on_device(device, impl, [impl](const DeviceInfo& info) {
    Status status = device_check(impl, info);
    if (!status.ok() && impl == Impl::automatic && status.code == StatusCode::impl_unavailable) {
      status.message = "impl auto: no GPU kernel of this build runs on device " + std::to_string(info.device) +
                       ": " + status.message;
    }
    return status;
  });
}

Status with_kv_splits(const AttentionProblem& problem, int wanted, KernelChoice* choice) {
  if (choice->impl != Impl::sm90_wgmma && choice->impl != Impl::sm80_split_d) {
    return {StatusCode::invalid_option, std::string("KV splits are planned by impl sm90_wgmma and sm80_split_d, not ") +
                                            impl_name(choice->impl)};
  }
  if (wanted < 1 || wanted > kMaxKvSplits) {
    return {StatusCode::invalid_option, std::to_string(wanted) + " KV splits: expected 1 to " +
                                            std::to_string(kMaxKvSplits)};
  }
  if (choice->impl == Impl::sm90_wgmma) {
    const int keys = sm90_wgmma::tile_shape(problem, static_cast<int>(choice->padded_head_dim)).keys;
    set_kv_splits(kv_splits_of(problem.seq_kv, wanted, keys), keys, choice);
  } else {
    const int block_n = sm80_split_d::tile_shape(static_cast<int>(choice->padded_head_dim)).block_n;
    const KvSplits splits = kv_splits_of(problem.seq_kv, wanted, block_n);
    choice->kv_splits = splits.count;
    choice->split_blocks = static_cast<int32_t>(splits.keys_per_split / block_n);
  }
  choice->kernel = kernel_name(problem, *choice);
  return {};
}

namespace {

// A serving call's plans on a GPU family (one a pass: host/serving_passes.hpp)
// come first in its workspace, on a 256-byte boundary; the family's own
// temporary memory follows.
int64_t serving_plan_bytes(const AttentionProblem& problem, const KernelChoice& choice) {
  if (!problem.sequences.active || problem.sequences.plan != nullptr || choice.impl == Impl::cpu_reference) return 0;
  return (serving_passes(problem, choice).plan_bytes + 255) / 256 * 256;
}

// Whether a call writes split-KV partial rows: a dense call split, or a
// sequence batch with a pass whose plan may split (kv_splits 0, or a mixed
// batch's first pass).
bool writes_partials(const AttentionProblem& problem, const KernelChoice& choice) {
  if (!problem.sequences.active) return choice.kv_splits != 1;
  return choice.impl != Impl::cpu_reference && (choice.kv_splits == 0 || choice.short_split_slots > 0);
}

// Split-KV's partial rows: a dense call's splits x B x Hq x Nq rows; a
// sequence batch's the most a pass's plan can place (the passes run one
// after the other, so they share them).
split_kv::PartialLayout call_partial_layout(const AttentionProblem& problem, const KernelChoice& choice) {
  if (problem.sequences.active) {
    const ServingPasses passes = serving_passes(problem, choice);
    int64_t rows = 0;
    for (int i = 0; i < passes.count; ++i) {
      rows = std::max(rows, serving::max_partial_rows(problem, passes.pass[i].tiling, passes.pass[i].rows));
    }
    return split_kv::partial_layout_of_rows(problem, rows);
  }
  return split_kv::partial_layout(problem, choice.kv_splits);
}

}  // namespace

int64_t workspace_bytes(const AttentionProblem& problem, const KernelChoice& choice, const Fp8KvCache* kv_cache) {
  if (choice.precision == Precision::fp8) {
    return static_cast<int64_t>(fp8_workspace_bytes(problem, problem.quantization, kv_cache));
  }
  return serving_plan_bytes(problem, choice) +
         (writes_partials(problem, choice) ? call_partial_layout(problem, choice).bytes : 0);
}

namespace {

// Precision::fp8: the pre-pass's buffers in the workspace, then the kernels.
Status run_fp8(const AttentionProblem& problem, const Fp8KvCache* kv_cache, void* workspace, size_t workspace_size,
               cudaStream_t stream) {
  const size_t bytes = fp8_workspace_bytes(problem, problem.quantization, kv_cache);
  Workspace memory(workspace, workspace_size, stream);
  void* base = nullptr;
  if (Status status = memory.acquire(bytes, "fp8", &base); !status.ok()) return status;
  return memory.release(fp8_forward(problem, problem.quantization, base, bytes, stream, kv_cache));
}

// Split-KV's partial rows of `layout` (O, then the row states) from `memory`.
struct PartialRows {
  float* o = nullptr;
  RowSoftmaxState* states = nullptr;
};
Status acquire_partial_rows(Workspace& memory, const split_kv::PartialLayout& layout, PartialRows* rows) {
  void* partials = nullptr;
  if (Status status = memory.acquire(static_cast<size_t>(layout.bytes), "split-KV's partial rows", &partials);
      !status.ok()) {
    return status;
  }
  unsigned char* const base = static_cast<unsigned char*>(partials);
  rows->o = reinterpret_cast<float*>(base + layout.o_offset);
  rows->states = reinterpret_cast<RowSoftmaxState*>(base + layout.states_offset);
  return {};
}

// A call's split-KV: the partial rows in the caller's workspace, or in stream-ordered
// memory freed after the combine; `run_splits(partial_o, partial_states)`
// launches the family's kernel on them, then the combine merges them
// (`programmatic`: as the kernel's programmatic dependent, Hopper's PDL). A
// sequence batch (kv_splits 0): where its plan split the keys and placed the rows.
template <class RunSplits>
Status run_split_kv(const AttentionProblem& problem, const KernelChoice& choice, bool programmatic, void* workspace,
                    size_t workspace_size, cudaStream_t stream, RunSplits&& run_splits) {
  const split_kv::PartialLayout layout = call_partial_layout(problem, choice);
  const int kv_splits = choice.kv_splits;
  Workspace memory(workspace, workspace_size, stream);
  PartialRows rows;
  if (Status status = acquire_partial_rows(memory, layout, &rows); !status.ok()) return status;
  Status status = run_splits(rows.o, rows.states);
  if (status.ok()) {
    status = split_kv::launch_combine(problem, {rows.o, rows.states, kv_splits}, programmatic, stream);
  }
  return memory.release(status);
}

Status run_sm80_split_kv(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                         size_t workspace_size, cudaStream_t stream) {
  const sm80_split_d::Route route{static_cast<int>(choice.padded_head_dim), choice.value_splits};
  return run_split_kv(problem, choice, /*programmatic=*/false, workspace, workspace_size, stream,
                      [&](float* partial_o, RowSoftmaxState* partial_states) {
                        sm80_split_d::SplitLaunch split;
                        if (problem.sequences.active) {
                          split.split_slots = choice.split_blocks;  // the plan's split
                        } else {
                          split.kv_splits = choice.kv_splits;
                          split.keys_per_split = static_cast<int64_t>(choice.split_blocks) *
                                                 sm80_split_d::tile_shape(route.out_cols).block_n;
                        }
                        split.partial_o = partial_o;
                        split.partial_states = partial_states;
                        return sm80_split_d::run(problem, route, split, stream);
                      });
}

Status run_sm90_split_kv(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                         size_t workspace_size, cudaStream_t stream) {
  return run_split_kv(problem, choice, /*programmatic=*/true, workspace, workspace_size, stream,
                      [&](float* partial_o, RowSoftmaxState* partial_states) {
                        sm90_wgmma::TileLaunch tiles;
                        tiles.heads_per_tile = choice.heads_per_tile;
                        tiles.splits = choice.kv_splits;
                        tiles.split_blocks = choice.split_blocks;
                        tiles.partial_o = partial_o;
                        tiles.partial_states = partial_states;
                        return sm90_wgmma::run(problem, static_cast<int>(choice.padded_head_dim), tiles, stream);
                      });
}

// A serving call on sm90_wgmma: each pass's launch over its own plan (at its
// offset of the plan buffer), in order on the stream, a split pass followed
// by its combine (the kernel's programmatic dependent). The split passes
// share one region of partial rows, sized for the larger: the next pass's
// kernel starts after the combine that read them (stream order; the kernels
// are not launched as programmatic dependents).
Status run_sm90_passes(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                       size_t workspace_size, cudaStream_t stream) {
  const ServingPasses passes = serving_passes(problem, choice);
  const split_kv::PartialLayout layout =
      writes_partials(problem, choice) ? call_partial_layout(problem, choice) : split_kv::PartialLayout{};
  Workspace memory(workspace, workspace_size, stream);
  PartialRows rows;
  if (Status status = acquire_partial_rows(memory, layout, &rows); !status.ok()) return status;
  Status status;
  for (int i = 0; i < passes.count && status.ok(); ++i) {
    const ServingPass& pass = passes.pass[i];
    const AttentionProblem planned = pass_problem(problem, pass, problem.sequences.plan);
    sm90_wgmma::TileLaunch tiles;
    tiles.heads_per_tile = pass.tiling.heads_per_tile;
    tiles.split_slots = pass.tiling.split_slots;
    tiles.pass = pass.rows;
    if (tiles.split_slots > 0) tiles.partial_o = rows.o, tiles.partial_states = rows.states;
    status = sm90_wgmma::run(planned, static_cast<int>(choice.padded_head_dim), tiles, stream);
    if (status.ok() && tiles.split_slots > 0) {
      status = split_kv::launch_combine(planned, {tiles.partial_o, tiles.partial_states, 0, pass.rows},
                                        /*programmatic=*/true, stream);
    }
  }
  return memory.release(status);
}

}  // namespace

namespace {

Status run_planned(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                   size_t workspace_size, cudaStream_t stream, const Fp8KvCache* kv_cache);

// A serving call on a GPU family: its plans (one a pass) into the
// workspace's first bytes (no host synchronization: the kernels read the
// verdict and the tiles from them), then the family's run with the rest of
// the workspace.
Status run_serving(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                   size_t workspace_size, cudaStream_t stream) {
  const int64_t plan_bytes = serving_plan_bytes(problem, choice);
  Workspace memory(workspace, workspace_size, stream);
  void* plan = nullptr;
  if (Status status = memory.acquire(static_cast<size_t>(plan_bytes), "the serving plan", &plan); !status.ok()) {
    return status;
  }
  Status status = launch_plans(problem, serving_passes(problem, choice), plan, stream);
  if (status.ok()) {
    AttentionProblem planned = problem;
    planned.sequences.plan = plan;
    const bool given = workspace != nullptr;
    status = run_planned(planned, choice, given ? static_cast<unsigned char*>(workspace) + plan_bytes : nullptr,
                         given ? workspace_size - static_cast<size_t>(plan_bytes) : 0, stream, nullptr);
  }
  return memory.release(status);
}

}  // namespace

Status run_forward(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                   size_t workspace_size, cudaStream_t stream, const Fp8KvCache* kv_cache) {
  if (problem.sequences.active && problem.sequences.plan == nullptr && choice.impl != Impl::cpu_reference) {
    return run_serving(problem, choice, workspace, workspace_size, stream);
  }
  return run_planned(problem, choice, workspace, workspace_size, stream, kv_cache);
}

namespace {

Status run_planned(const AttentionProblem& problem, const KernelChoice& choice, void* workspace,
                   size_t workspace_size, cudaStream_t stream, const Fp8KvCache* kv_cache) {
  switch (choice.impl) {
    case Impl::cpu_reference:
      if (Status status = check_sequence_data(problem); !status.ok()) return status;
      try {
        cpu_attention_forward(problem);
      } catch (const std::bad_alloc&) {
        return {StatusCode::out_of_memory,
                "impl cpu_reference: out of host memory for the converted K/V of one head"};
      }
      return {};
    case Impl::sm80_split_d:
      if (choice.kv_splits != 1) return run_sm80_split_kv(problem, choice, workspace, workspace_size, stream);
      return sm80_split_d::run(
          problem, sm80_split_d::Route{static_cast<int>(choice.padded_head_dim), choice.value_splits}, {},
          stream);
    case Impl::sm90_wgmma:
      if (choice.precision == Precision::fp8) return run_fp8(problem, kv_cache, workspace, workspace_size, stream);
      if (problem.sequences.active) return run_sm90_passes(problem, choice, workspace, workspace_size, stream);
      if (choice.kv_splits != 1) return run_sm90_split_kv(problem, choice, workspace, workspace_size, stream);
      return sm90_wgmma::run(problem, static_cast<int>(choice.padded_head_dim),
                             sm90_wgmma::TileLaunch{choice.heads_per_tile}, stream);
    case Impl::automatic: break;
  }
  return {StatusCode::impl_unavailable,
          std::string("no runner for impl ") + impl_name(choice.impl)};
}

}  // namespace

// --- the backward ------------------------------------------------------------------

namespace {

// The tensors of a backward call, for the memory-space check.
Status backward_memory_space(const BackwardProblem& b, MemorySpace* space) {
  const AttentionProblem& f = b.forward;
  const NamedPointer tensors[] = {{"q", f.q},         {"k", f.k},         {"v", f.v},         {"o", f.o},
                                  {"mask", f.mask},   {"lse", f.lse},     {"d_o", b.d_o},     {"d_q", b.d_q},
                                  {"d_k", b.d_k},     {"d_v", b.d_v},     {"d_mask", b.d_mask}, {"d_lse", b.d_lse}};
  return common_memory_space(tensors, static_cast<int>(sizeof tensors / sizeof tensors[0]), space);
}

}  // namespace

namespace {

// What the GPU backward kernels do not serve yet, which the CPU reference computes.
Status gpu_backward_serves(const BackwardProblem& problem, Impl requested) {
  const char* what = problem.forward.softcap > 0.0f ? "a logit softcap" : nullptr;
  if (what == nullptr) return {};
  return {StatusCode::impl_unavailable, std::string("impl ") + impl_name(requested) + ": the GPU backward does not serve " +
                                            what + " yet (impl cpu_reference does)"};
}

// plan_backward's choice for a call on device tensors, on the current device
// `info` (its compute capability read): the portable kernels where they run,
// and in their place the sm90 kernels where those serve the call (impl
// sm90_wgmma asks for them, auto takes them when they can run). backward_route
// asks this same plan for its representative call.
Status plan_backward_on_device(const BackwardProblem& problem, Impl requested, const DeviceInfo& info,
                               BackwardChoice* choice) {
  if (Status status = sm80_capability(info); !status.ok()) return status;
  if (Status status = gpu_backward_serves(problem, requested); !status.ok()) return status;
  if (Status status = sm80_backward::check(problem); !status.ok()) return status;
  if (Status status = sm80_backward::runnable(problem.forward.dtype, info.device); !status.ok()) return status;
  choice->impl = Impl::sm80_split_d;
  if (requested == Impl::sm80_split_d) return {};
  Status sm90 = sm90_capability(info);
  std::string reason;
  const sm90_backward::Instance* instance = sm90.ok() ? sm90_backward::route(problem, &reason) : nullptr;
  if (sm90.ok() && instance == nullptr) {
    sm90 = {StatusCode::impl_unavailable, "impl sm90_wgmma does not serve this backward: " + reason};
  }
  if (sm90.ok()) sm90 = instance->runnable(problem.forward.dtype, info.device);
  // Auto takes every instance: each is measured faster than the portable
  // kernels (H200: 4.2-5.4x at D 320-1024, 2.9x at MLA 576 / 512 with one KV
  // head; sm90_backward.md).
  if (sm90.ok()) {
    choice->impl = Impl::sm90_wgmma;
    choice->sm90_gradients = instance->launch;
    return {};
  }
  if (requested == Impl::sm90_wgmma) return sm90;
  return {};
}

}  // namespace

Status plan_backward(const BackwardProblem& problem, Impl requested, BackwardChoice* choice) {
  *choice = BackwardChoice{};
  MemorySpace space = MemorySpace::host;
  if (Status status = backward_memory_space(problem, &space); !status.ok()) return status;
  if (Status status = reference_only_dtypes(problem.forward, requested, space); !status.ok()) return status;
  switch (requested) {
    case Impl::cpu_reference: {
      KernelChoice forward_choice;
      if (Status status = plan_cpu_reference(space, &forward_choice); !status.ok()) return status;
      choice->impl = Impl::cpu_reference;
      return {};
    }
    case Impl::sm90_wgmma: break;  // its kernels after the portable preprocess (plan_backward_on_device)
    case Impl::automatic:
      if (space == MemorySpace::host) {
        choice->impl = Impl::cpu_reference;
        return {};
      }
      break;
    case Impl::sm80_split_d: break;
  }
  DeviceInfo info;
  if (Status status = current_device(Impl::sm80_split_d, space, &info); !status.ok()) return status;
  return plan_backward_on_device(problem, requested, info, choice);
}

Status backward_route(const BackwardProblem& problem, int device, Impl requested, Impl* impl) {
  if (Status status = check_gpu_query(device, requested); !status.ok()) return status;
  // f32 / f64 inputs: the CPU reference only, as plan_backward says of device tensors.
  if (Status status = reference_only_dtypes(problem.forward, requested, MemorySpace::device); !status.ok()) {
    return status;
  }
  BackwardChoice choice;
  const Status status = on_device(device, requested, [&](DeviceInfo info) {
    if (Status capability = compute_capability(Impl::sm80_split_d, &info); !capability.ok()) return capability;
    return plan_backward_on_device(problem, requested, info, &choice);
  });
  if (status.ok()) *impl = choice.impl;
  return status;
}

size_t backward_workspace_bytes(const BackwardProblem& problem, const BackwardChoice& choice) {
  return choice.impl == Impl::cpu_reference ? 0 : sm80_backward::workspace_bytes(problem);
}

Status run_backward(const BackwardProblem& problem, const BackwardChoice& choice, void* workspace,
                    size_t workspace_size, cudaStream_t stream) {
  if (choice.impl == Impl::cpu_reference) {
    if (Status status = check_sequence_data(problem.forward); !status.ok()) return status;
    try {
      cpu_attention_backward(problem);
    } catch (const std::bad_alloc&) {
      return {StatusCode::out_of_memory, "impl cpu_reference: out of host memory for the backward's fp64 buffers"};
    }
    return {};
  }
  const sm80_backward::GradientRunner gradients = choice.sm90_gradients;
  const size_t bytes = sm80_backward::workspace_bytes(problem);
  if (bytes == 0) return sm80_backward::run(problem, nullptr, stream, gradients);
  Workspace memory(workspace, workspace_size, stream);
  void* delta = nullptr;
  if (Status status = memory.acquire(bytes, "the backward's delta", &delta); !status.ok()) return status;
  return memory.release(sm80_backward::run(problem, delta, stream, gradients));
}

}  // namespace ffpa::detail
