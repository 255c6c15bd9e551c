// ffpa_library_info_get and ffpa::library_info(): the values are the library's
// own (the detail:: constants validation uses, the generated instance tables,
// the CMake architecture list), the C and C++ views agree, validation accepts
// exactly the head dims reported, and each bad argument has its status.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm90_backward/family.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "support/host_tensors.hpp"

namespace {

ffpa_library_info queried_info() {
  ffpa_library_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  char message[256] = "";
  EXPECT_EQ(ffpa_library_info_get(&info, message, sizeof message), FFPA_OK) << message;
  return info;
}

std::vector<int32_t> as_vector(const int32_t* values, int32_t count) {
  return std::vector<int32_t>(values, values + count);
}

TEST(LibraryInfo, LimitsAreValidationsConstants) {
  const ffpa::LibraryInfo info = ffpa::library_info();
  EXPECT_EQ(info.min_head_dim, ffpa::detail::kMinHeadDim);
  EXPECT_EQ(info.max_head_dim, ffpa::detail::kMaxHeadDim);
  EXPECT_EQ(info.head_dim_multiple, ffpa::detail::kHeadDimMultiple);
  EXPECT_EQ(info.max_sequence_length, ffpa::detail::kMaxSequenceLength);
}

TEST(LibraryInfo, HeadDimsAreTheInstanceTables) {
  const ffpa::LibraryInfo info = ffpa::library_info();
  std::vector<int32_t> split_d, sm90;
  for (int i = 0; i < ffpa::detail::sm80_split_d::kInstanceCount; ++i)
    split_d.push_back(ffpa::detail::sm80_split_d::kInstances[i].out_cols);
  for (int i = 0; i < ffpa::detail::sm90_wgmma::kInstanceCount; ++i)
    sm90.push_back(ffpa::detail::sm90_wgmma::kInstances[i].head_dim);
  EXPECT_EQ(info.split_d_head_dims, split_d);
  EXPECT_EQ(info.sm90_wgmma_head_dims, sm90);  // empty without sm_90a
  EXPECT_FALSE(split_d.empty());
  std::vector<int32_t> fp8;
  for (int i = 0; i < ffpa::detail::sm90_wgmma::kFp8InstanceCount; ++i)
    fp8.push_back(ffpa::detail::sm90_wgmma::kFp8Instances[i].head_dim);
  EXPECT_EQ(info.sm90_fp8_head_dims, fp8);
  if (sm90.empty()) EXPECT_TRUE(fp8.empty());  // the FP8 kernels are the sm90 family's
}

// The sm90 backward's instances, in the order its route walks them: a binding
// takes the first one as wide as max(D, Dv) (test_dispatch.cpp's Sm90BackwardRouting).
TEST(LibraryInfo, Sm90BackwardHeadDimsAreTheFamilysInstancesAscending) {
  const ffpa::LibraryInfo info = ffpa::library_info();
  namespace bwd = ffpa::detail::sm90_backward;
  std::vector<int32_t> backward;
  for (int i = 0; i < bwd::kInstanceCount; ++i) backward.push_back(bwd::kInstances[i].head_dim);
  EXPECT_EQ(info.sm90_backward_head_dims, backward);  // empty without sm_90a
  EXPECT_EQ(std::adjacent_find(backward.begin(), backward.end(), std::greater_equal<int32_t>()), backward.end())
      << "strictly ascending";
  for (int32_t d : backward) EXPECT_TRUE(d % 128 == 0 && d <= info.max_head_dim) << d;
}

TEST(LibraryInfo, ArchitecturesAreTheCMakeList) {
  const ffpa::LibraryInfo info = ffpa::library_info();
  EXPECT_EQ(info.cuda_architectures, (std::vector<int32_t>{FFPA_CUDA_ARCHITECTURE_LIST}));
  bool has_sm90 = false;
  for (int32_t arch : info.cuda_architectures) has_sm90 |= arch == 90;
  // The sm90 family (sm_90a code) is built only when the list targets sm_90.
  if (!info.sm90_wgmma_head_dims.empty()) EXPECT_TRUE(has_sm90);
  if (!has_sm90) EXPECT_TRUE(info.sm90_backward_head_dims.empty());  // count 0: no sm90 backward
}

TEST(LibraryInfo, VersionFieldsSpellTheVersionString) {
  const ffpa::LibraryInfo info = ffpa::library_info();
  EXPECT_EQ(info.version, ffpa_version());
  std::ostringstream spelled;
  spelled << info.version_major << '.' << info.version_minor << '.' << info.version_patch;
  EXPECT_EQ(spelled.str(), ffpa_version());
}

// The header's macros are what the library reports: a program compiled against
// one version's headers can check the library it loads.
TEST(LibraryInfo, HeaderVersionMacrosAreTheLibrarysVersion) {
  const ffpa::LibraryInfo info = ffpa::library_info();
  EXPECT_STREQ(FFPA_VERSION_STRING, ffpa_version());
  EXPECT_EQ(FFPA_VERSION_MAJOR, info.version_major);
  EXPECT_EQ(FFPA_VERSION_MINOR, info.version_minor);
  EXPECT_EQ(FFPA_VERSION_PATCH, info.version_patch);
  EXPECT_EQ(FFPA_VERSION, info.version_major * 10000 + info.version_minor * 100 + info.version_patch);
}

TEST(LibraryInfo, CAbiAgreesWithCpp) {
  const ffpa::LibraryInfo cpp = ffpa::library_info();
  const ffpa_library_info c = queried_info();
  EXPECT_EQ(c.struct_size, sizeof c);
  ASSERT_NE(c.version, nullptr);
  EXPECT_STREQ(c.version, ffpa_version());
  EXPECT_EQ(c.version_major, cpp.version_major);
  EXPECT_EQ(c.version_minor, cpp.version_minor);
  EXPECT_EQ(c.version_patch, cpp.version_patch);
  EXPECT_EQ(c.min_head_dim, cpp.min_head_dim);
  EXPECT_EQ(c.max_head_dim, cpp.max_head_dim);
  EXPECT_EQ(c.head_dim_multiple, cpp.head_dim_multiple);
  EXPECT_EQ(c.max_sequence_length, cpp.max_sequence_length);
  EXPECT_EQ(as_vector(c.cuda_architectures, c.cuda_architecture_count), cpp.cuda_architectures);
  EXPECT_EQ(as_vector(c.split_d_head_dims, c.split_d_head_dim_count), cpp.split_d_head_dims);
  EXPECT_EQ(as_vector(c.sm90_wgmma_head_dims, c.sm90_wgmma_head_dim_count),
            cpp.sm90_wgmma_head_dims);
  EXPECT_EQ(as_vector(c.sm90_fp8_head_dims, c.sm90_fp8_head_dim_count), cpp.sm90_fp8_head_dims);
  EXPECT_EQ(as_vector(c.sm90_backward_head_dims, c.sm90_backward_head_dim_count), cpp.sm90_backward_head_dims);
}

// ffpa_workspace_size validates without running: the status of head dim d.
ffpa_status validate_head_dim(int64_t d) {
  using ffpa::testing::make_host_tensor;
  const ffpa::DType dtype = ffpa::DType::bf16;
  ffpa::testing::HostTensor q = make_host_tensor(dtype, {1, 2, 3, d}),
                            k = make_host_tensor(dtype, {1, 2, 5, d}),
                            v = make_host_tensor(dtype, {1, 2, 5, d}),
                            o = make_host_tensor(dtype, {1, 2, 3, d});
  ffpa::ForwardParams p;
  p.q = q.tensor;
  p.k = k.tensor;
  p.v = v.tensor;
  p.o = o.tensor;
  size_t bytes = 0;
  return static_cast<ffpa_status>(ffpa::workspace_size(p, &bytes).code);
}

TEST(LibraryInfo, ValidationAcceptsExactlyTheReportedHeadDims) {
  const ffpa_library_info info = queried_info();
  const int32_t lo = info.min_head_dim, hi = info.max_head_dim, step = info.head_dim_multiple;
  EXPECT_EQ(validate_head_dim(lo), FFPA_OK);
  EXPECT_EQ(validate_head_dim(lo + step), FFPA_OK);
  EXPECT_EQ(validate_head_dim(hi), FFPA_OK);
  EXPECT_EQ(validate_head_dim(lo - step), FFPA_UNSUPPORTED_HEAD_DIM);
  EXPECT_EQ(validate_head_dim(hi + step), FFPA_UNSUPPORTED_HEAD_DIM);
  if (step > 1) EXPECT_EQ(validate_head_dim(lo + step / 2), FFPA_UNSUPPORTED_HEAD_DIM);
}

TEST(LibraryInfo, NullInfoIsANullPointer) {
  char message[64] = "";
  EXPECT_EQ(ffpa_library_info_get(nullptr, message, sizeof message), FFPA_NULL_POINTER);
  EXPECT_STREQ(message, "info is null");
  EXPECT_EQ(ffpa_library_info_get(nullptr, nullptr, 0), FFPA_NULL_POINTER);
}

TEST(LibraryInfo, SmallStructSizeIsRejectedAndTouchesNothing) {
  // The previous version's struct ended before the sm90 backward list: its callers are rejected too.
  const size_t before_sm90_backward = offsetof(ffpa_library_info, sm90_backward_head_dim_count);
  for (size_t size : {size_t{0}, sizeof(size_t), before_sm90_backward, sizeof(ffpa_library_info) - 1}) {
    ffpa_library_info info;
    std::memset(&info, 0x5a, sizeof info);
    info.struct_size = size;
    const ffpa_library_info before = info;
    char message[256] = "";
    EXPECT_EQ(ffpa_library_info_get(&info, message, sizeof message), FFPA_INVALID_OPTION) << size;
    EXPECT_NE(std::string(message).find("struct_size = " + std::to_string(size)),
              std::string::npos)
        << message;
    EXPECT_EQ(std::memcmp(&info, &before, sizeof info), 0) << size;
  }
}

TEST(LibraryInfo, BytesPastThisVersionAreLeftAlone) {
  // What a newer header's larger struct looks like to this library.
  struct Grown {
    ffpa_library_info info;
    unsigned char newer_fields[32];
  } grown;
  std::memset(&grown, 0x5a, sizeof grown);
  grown.info.struct_size = sizeof grown;
  EXPECT_EQ(ffpa_library_info_get(&grown.info, nullptr, 0), FFPA_OK);
  EXPECT_EQ(grown.info.struct_size, sizeof grown);
  EXPECT_EQ(grown.info.max_head_dim, ffpa::detail::kMaxHeadDim);
  for (unsigned char byte : grown.newer_fields) EXPECT_EQ(byte, 0x5a);
}

}  // namespace
