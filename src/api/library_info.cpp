// ffpa::library_info(): what this build serves, read from the single sources:
// the head-dim and sequence limits from common/attention_problem.hpp (what
// validation and routing use), the instance head dims from the CMake-generated
// registries, the architectures from a compile definition CMake sets for this
// file, the version from <ffpa/version.h>.
#include <cstdint>
#include <iterator>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm90_backward/family.hpp"
#include "kernels/sm90_wgmma/family.hpp"

#if !defined(FFPA_CUDA_ARCHITECTURE_LIST)
#error "CMake sets FFPA_CUDA_ARCHITECTURE_LIST for this file"
#endif

namespace ffpa {
namespace {

// 10 * major + minor of each compiled architecture, ascending (from FFPA_CUDA_ARCHITECTURES).
constexpr int32_t kCudaArchitectures[] = {FFPA_CUDA_ARCHITECTURE_LIST};

}  // namespace

LibraryInfo library_info() {
  LibraryInfo info;
  info.version = version();
  info.version_major = FFPA_VERSION_MAJOR;
  info.version_minor = FFPA_VERSION_MINOR;
  info.version_patch = FFPA_VERSION_PATCH;
  info.min_head_dim = static_cast<int32_t>(detail::kMinHeadDim);
  info.max_head_dim = static_cast<int32_t>(detail::kMaxHeadDim);
  info.head_dim_multiple = static_cast<int32_t>(detail::kHeadDimMultiple);
  info.max_sequence_length = detail::kMaxSequenceLength;
  info.cuda_architectures.assign(std::begin(kCudaArchitectures), std::end(kCudaArchitectures));
  for (int i = 0; i < detail::sm80_split_d::kInstanceCount; ++i)
    info.split_d_head_dims.push_back(detail::sm80_split_d::kInstances[i].out_cols);
  for (int i = 0; i < detail::sm90_wgmma::kInstanceCount; ++i)
    info.sm90_wgmma_head_dims.push_back(detail::sm90_wgmma::kInstances[i].head_dim);
  for (int i = 0; i < detail::sm90_wgmma::kFp8InstanceCount; ++i)
    info.sm90_fp8_head_dims.push_back(detail::sm90_wgmma::kFp8Instances[i].head_dim);
  for (int i = 0; i < detail::sm90_backward::kInstanceCount; ++i)
    info.sm90_backward_head_dims.push_back(detail::sm90_backward::kInstances[i].head_dim);
  return info;
}

}  // namespace ffpa
