// The FP8 KV cache's entry points: its layout, and quantizing k and v into
// one (validate, locate, run: the CPU model on host tensors, the pre-pass's
// K/V kernels on device tensors).
#include <string>

#include "ffpa/ffpa.hpp"
#include "host/fp8_kv_cache.hpp"
#include "host/memory_space.hpp"
#include "host/validate.hpp"

namespace ffpa {
namespace {

// Where the call's tensors live: the first present one decides, the others
// must be there too (an empty tensor may be null). False in *any when every
// pointer is null (an empty call: nothing to read or write).
Status kv_memory_space(const Fp8QuantizeKvParams& p, detail::MemorySpace* space, bool* any) {
  const detail::NamedPointer all[] = {{"k", p.k.data},
                                      {"v", p.v.data},
                                      {"cache.k_codes", p.cache.k_codes.data},
                                      {"cache.k_scales", p.cache.k_scales.data},
                                      {"cache.k_mean", p.cache.k_mean.data},
                                      {"cache.v_codes", p.cache.v_codes.data},
                                      {"cache.v_scales", p.cache.v_scales.data},
                                      {"cache.v_mean", p.cache.v_mean.data}};
  detail::NamedPointer present[8];
  int count = 0;
  for (const detail::NamedPointer& tensor : all)
    if (tensor.pointer != nullptr) present[count++] = tensor;
  *any = count > 0;
  if (count == 0) return {};
  return detail::common_memory_space(present, count, space);
}

}  // namespace

Status fp8_kv_cache_layout(int64_t batch, int64_t heads_kv, int64_t seq_kv, int64_t head_dim, const Fp8Options& fp8,
                           Fp8KvCache* layout) {
  if (layout == nullptr) return {StatusCode::null_pointer, "layout is null"};
  const int64_t sizes[3] = {batch, heads_kv, seq_kv};
  const char* names[3] = {"batch", "heads_kv", "seq_kv"};
  for (int i = 0; i < 3; ++i) {
    if (sizes[i] < 0) return {StatusCode::invalid_option, std::string(names[i]) + " = " + std::to_string(sizes[i]) + " is negative"};
  }
  if (head_dim < detail::kMinHeadDim || head_dim > detail::kMaxHeadDim || head_dim % detail::kHeadDimMultiple != 0) {
    return {StatusCode::unsupported_head_dim, "head_dim = " + std::to_string(head_dim) +
                                                  " is not supported; D must be a multiple of " +
                                                  std::to_string(detail::kHeadDimMultiple) + " in [" +
                                                  std::to_string(detail::kMinHeadDim) + ", " +
                                                  std::to_string(detail::kMaxHeadDim) + "]"};
  }
  if (seq_kv > detail::kMaxSequenceLength) {
    return {StatusCode::invalid_option, "seq_kv = " + std::to_string(seq_kv) + " is above " +
                                            std::to_string(detail::kMaxSequenceLength) +
                                            ", the longest sequence the GPU implementations serve"};
  }
  if (Status status = detail::validate_fp8_knobs(fp8, "fp8"); !status.ok()) return status;
  Fp8KvCache result;
  if (!detail::fp8_kv_cache_layout(batch, heads_kv, seq_kv, head_dim, head_dim, detail::quantization_options(fp8, 0),
                                   &result)) {
    return {StatusCode::invalid_option, "the FP8 KV cache of K [" + std::to_string(batch) + ", " +
                                            std::to_string(heads_kv) + ", " + std::to_string(seq_kv) + ", " +
                                            std::to_string(head_dim) + "] would have 2^63 elements or more"};
  }
  *layout = result;
  return {};
}

Status fp8_quantize_kv_workspace_size(const Fp8QuantizeKvParams& params, size_t* bytes) {
  if (bytes == nullptr) return {StatusCode::null_pointer, "bytes is null"};
  detail::AttentionProblem problem;
  if (Status status = detail::validate_fp8_quantize_kv(params, &problem); !status.ok()) return status;
  detail::MemorySpace space = detail::MemorySpace::host;
  bool any = false;
  if (Status status = kv_memory_space(params, &space, &any); !status.ok()) return status;
  *bytes = any && space == detail::MemorySpace::device
               ? detail::fp8_quantize_kv_workspace_bytes(problem, problem.quantization)
               : 0;
  return {};
}

Status fp8_quantize_kv(const Fp8QuantizeKvParams& params) {
  detail::AttentionProblem problem;
  if (Status status = detail::validate_fp8_quantize_kv(params, &problem); !status.ok()) return status;
  detail::MemorySpace space = detail::MemorySpace::host;
  bool any = false;
  if (Status status = kv_memory_space(params, &space, &any); !status.ok()) return status;
  if (!any || problem.batch == 0 || problem.heads_kv == 0) return {};  // nothing to write
  if (space == detail::MemorySpace::host) {
    return detail::fp8_quantize_kv_on_host(problem, problem.quantization, params.cache);
  }
  return detail::fp8_quantize_kv_on_device(problem, problem.quantization, params.cache, params.workspace,
                                           params.workspace_bytes, params.stream);
}

}  // namespace ffpa
