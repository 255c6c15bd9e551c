// Dispatch: the head-dim routing table of the split-D family, kernel naming,
// and the choice of implementation from the call's options and memory space.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "ffpa/ffpa.hpp"
#include "kernels/sm80/split_d.hpp"
#include "support/host_tensors.hpp"

namespace {

using namespace ffpa;
using ffpa::detail::sm80::kSplitDInstanceCount;
using ffpa::detail::sm80::kSplitDInstances;
using ffpa::detail::sm80::route_split_d;
using ffpa::detail::sm80::split_d_tile;
using ffpa::testing::make_host_tensor;

TEST(SplitDRouting, InstancesAreAscendingMultiplesOf64) {
  ASSERT_GT(kSplitDInstanceCount, 0);
  for (int i = 0; i < kSplitDInstanceCount; ++i) {
    EXPECT_EQ(kSplitDInstances[i].out_cols % 64, 0);
    if (i > 0) EXPECT_GT(kSplitDInstances[i].out_cols, kSplitDInstances[i - 1].out_cols);
  }
}

constexpr int kH200SharedMemory = 232448;  // bytes per block, opt-in
constexpr int kSm86SharedMemory = 101376;  // sm86, sm89, sm120

// Every head dim of the spec's range is served: by the smallest instance that
// holds it (padding), or by splitting Dv over the largest one.
TEST(SplitDRouting, EveryHeadDimIsServed) {
  const int largest = kSplitDInstances[kSplitDInstanceCount - 1].out_cols;
  for (int d = 8; d <= 1024; d += 8) {
    const auto route = route_split_d(d, kH200SharedMemory);
    SCOPED_TRACE("D = " + std::to_string(d));
    ASSERT_GE(route.value_splits, 1);
    EXPECT_GE(route.out_cols * route.value_splits, d);
    EXPECT_LT(route.out_cols * (route.value_splits - 1), d) << "a split with no column of D";
    if (d <= largest) {
      EXPECT_EQ(route.value_splits, 1);
      for (int i = 0; i < kSplitDInstanceCount; ++i) {
        if (kSplitDInstances[i].out_cols >= d) {
          EXPECT_EQ(route.out_cols, kSplitDInstances[i].out_cols) << "not the smallest instance";
          break;
        }
      }
    } else {
      EXPECT_EQ(route.out_cols, largest);
    }
  }
}

// On parts with ~99 KB of shared memory per block only the instances that fit
// serve, splitting Dv where needed; every head dim still has a route.
TEST(SplitDRouting, SmallSharedMemoryFallsBackToInstancesThatFit) {
  using ffpa::detail::sm80::split_d_smem_layout;
  for (int d = 8; d <= 1024; d += 8) {
    const auto route = route_split_d(d, kSm86SharedMemory);
    SCOPED_TRACE("D = " + std::to_string(d));
    ASSERT_GT(route.out_cols, 0);
    EXPECT_LE(split_d_smem_layout(split_d_tile(route.out_cols)).total_bytes, kSm86SharedMemory);
    EXPECT_GE(route.out_cols * route.value_splits, d);
  }
  EXPECT_EQ(route_split_d(512, 1024).out_cols, 0) << "nothing fits 1 KB";
}

TEST(SplitDRouting, TilesKeepTheOAccumulatorInRegisters) {
  for (int i = 0; i < kSplitDInstanceCount; ++i) {
    const auto tile = split_d_tile(kSplitDInstances[i].out_cols);
    // fp32 O costs warp_rows * out_cols / warps_n / 32 registers per thread.
    const int o_registers = tile.warp_rows * tile.out_cols / tile.warps_n / 32;
    EXPECT_LE(o_registers, 128) << "out_cols " << tile.out_cols;
    EXPECT_EQ(tile.out_cols, kSplitDInstances[i].out_cols);
  }
}

struct HostCall {
  ffpa::testing::HostTensor q, k, v, o;
  ForwardParams params;
};

HostCall host_call(int64_t d, DType dtype = DType::bf16) {
  HostCall c;
  c.q = make_host_tensor(dtype, {1, 2, 5, d});
  c.k = make_host_tensor(dtype, {1, 2, 7, d});
  c.v = make_host_tensor(dtype, {1, 2, 7, d});
  c.o = make_host_tensor(dtype, {1, 2, 5, d});
  c.params.q = c.q.tensor;
  c.params.k = c.k.tensor;
  c.params.v = c.v.tensor;
  c.params.o = c.o.tensor;
  return c;
}

TEST(Dispatch, AutomaticOnHostPointersIsTheCpuReference) {
  HostCall c = host_call(64);
  KernelChoice choice;
  ASSERT_TRUE(select_kernel(c.params, &choice).ok());
  EXPECT_EQ(choice.impl, Impl::cpu_reference);
  EXPECT_NE(choice.kernel.find("cpu_reference"), std::string::npos);
}

bool has_cuda_device() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

// Without a device the GPU implementation is unavailable; with one, host
// pointers are the wrong memory space. Either way nothing runs.
TEST(Dispatch, ExplicitGpuImplOnHostPointersIsRefused) {
  HostCall c = host_call(64);
  c.params.options.impl = Impl::sm80_split_d;
  KernelChoice choice;
  const Status status = select_kernel(c.params, &choice);
  EXPECT_EQ(status.code,
            has_cuda_device() ? StatusCode::wrong_memory_space : StatusCode::impl_unavailable);
  EXPECT_NE(status.message.find("sm80_split_d"), std::string::npos);
  EXPECT_EQ(forward(c.params).code, status.code);
}

TEST(Dispatch, UnknownImplIsAnInvalidOption) {
  HostCall c = host_call(64);
  c.params.options.impl = static_cast<Impl>(42);
  KernelChoice choice;
  EXPECT_EQ(select_kernel(c.params, &choice).code, StatusCode::invalid_option);
}

TEST(Dispatch, SelectKernelNeedsAnOutput) {
  HostCall c = host_call(64);
  EXPECT_EQ(select_kernel(c.params, nullptr).code, StatusCode::null_pointer);
}

TEST(Dispatch, CompiledHeadDimsListsTheInstances) {
  const std::string list = compiled_head_dims();
  for (int i = 0; i < kSplitDInstanceCount; ++i) {
    EXPECT_NE(list.find(std::to_string(kSplitDInstances[i].out_cols)), std::string::npos);
  }
}

TEST(Dispatch, WorkspaceIsNotNeeded) {
  HostCall c = host_call(64);
  size_t bytes = 1;
  ASSERT_TRUE(workspace_size(c.params, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
}

}  // namespace
