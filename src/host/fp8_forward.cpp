#include "host/fp8_forward.hpp"

#include <cstdint>
#include <string>

#include "common/quantization_scales.hpp"
#include "host/fp8_kv_cache.hpp"
#include "kernels/fp8_prepass/prepass.hpp"
#include "kernels/fp8_prepass/workspace.hpp"
#include "kernels/sm90_wgmma/family.hpp"

namespace ffpa::detail {

namespace {

fp8_prepass::Regions workspace_regions(const Fp8KvCache* kv_cache) {
  return kv_cache != nullptr ? fp8_prepass::Regions::queries : fp8_prepass::Regions::all;
}

}  // namespace

size_t fp8_workspace_bytes(const AttentionProblem& problem, const QuantizationOptions& options,
                           const Fp8KvCache* kv_cache) {
  return fp8_prepass::WorkspaceLayout::of(problem, options, workspace_regions(kv_cache)).bytes;
}

Status check_fp8(const AttentionProblem& problem, const QuantizationOptions& options) {
  std::string reason;
  if (sm90_wgmma::route_fp8(problem, &reason) == nullptr) {
    return {StatusCode::impl_unavailable, "fp8: " + reason};
  }
  if (options.n_early < 0 || options.n_early % kQuantQueryBlock != 0) {
    return {StatusCode::invalid_option, "fp8: n_early (" + std::to_string(options.n_early) +
                                            " hybrid rows) must be a non-negative multiple of " +
                                            std::to_string(kQuantQueryBlock) + ", the tile's rows"};
  }
  return fp8_prepass::check_prepass(problem, options);
}

Status fp8_forward(const AttentionProblem& problem, const QuantizationOptions& options, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream, const Fp8KvCache* kv_cache) {
  if (Status status = check_fp8(problem, options); !status.ok()) return status;
  const fp8_prepass::WorkspaceLayout layout =
      fp8_prepass::WorkspaceLayout::of(problem, options, workspace_regions(kv_cache));
  if (workspace_bytes < layout.bytes) {
    return {StatusCode::workspace_too_small, "fp8: the call needs " + std::to_string(layout.bytes) +
                                                 " bytes of workspace, " + std::to_string(workspace_bytes) + " given"};
  }
  if (layout.bytes > 0 && workspace == nullptr) return {StatusCode::null_pointer, "fp8: no workspace"};
  if (reinterpret_cast<uintptr_t>(workspace) % fp8_prepass::WorkspaceLayout::kAlignment != 0) {
    return {StatusCode::misaligned, "fp8: the workspace must start on a 256-byte boundary"};
  }
  fp8_prepass::QuantizedBuffers buffers = layout.bind(workspace);
  if (kv_cache != nullptr) {
    // K and V are quantized already: only Q (and its LSE terms from the cache's k_mean).
    bind_kv_cache(*kv_cache, &buffers);
    if (Status status = fp8_prepass::launch_quantize_q(problem, options, buffers, stream); !status.ok()) return status;
  } else if (Status status = fp8_prepass::launch_prepass(problem, options, buffers, stream); !status.ok()) {
    return status;
  }
  if (problem.batch * problem.heads_q * problem.seq_q == 0) return {};
  std::string reason;
  if (buffers.first_row > 0) {
    // Hybrid rows: the 16-bit kernel's own tiles, exactly what the call
    // would compute without FP8 for those rows.
    const sm90_wgmma::Instance* instance = sm90_wgmma::route(problem, &reason);
    if (instance == nullptr) return {StatusCode::impl_unavailable, "fp8: hybrid rows: " + reason};
    sm90_wgmma::TileLaunch tiles;
    tiles.row_block_count = static_cast<int>(ceil_div(buffers.first_row, sm90_wgmma::kTileRows));  // Nq's last too
    if (Status status = instance->launch(problem, tiles, stream); !status.ok()) return status;
  }
  if (buffers.rows == 0) return {};
  return sm90_wgmma::route_fp8(problem, &reason)->launch(problem, options, buffers, stream);
}

}  // namespace ffpa::detail
