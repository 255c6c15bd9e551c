// A device this build cannot run kernels on (no kernel image for its
// architecture, PTX its driver cannot compile, a driver older than the
// library's CUDA runtime, a launch it cannot give its resources): the CUDA
// errors that say so become impl_unavailable, naming the implementation and
// what to do, never a launch error the caller cannot tell apart from a broken
// context; other errors stay cuda_error. device_support() says it up front.
// Without a GPU (CI) every GPU path meets a real case of it: no driver.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"
#include "host/cuda_status.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm90_wgmma/family.hpp"

namespace {

using ffpa::Impl;
using ffpa::Status;
using ffpa::StatusCode;
using ffpa::detail::device_status;
using ffpa::detail::is_device_unavailable;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

constexpr cudaError_t kDeviceUnavailableErrors[] = {
    cudaErrorNoDevice,
    cudaErrorInsufficientDriver,
    cudaErrorCallRequiresNewerDriver,
    cudaErrorSystemDriverMismatch,
    cudaErrorCompatNotSupportedOnDevice,
    cudaErrorInvalidDeviceFunction,
    cudaErrorNoKernelImageForDevice,
    cudaErrorInvalidKernelImage,
    cudaErrorInvalidPtx,
    cudaErrorUnsupportedPtxVersion,
    cudaErrorJitCompilerNotFound,
    cudaErrorJitCompilationDisabled,
    cudaErrorLaunchOutOfResources,
    cudaErrorInvalidClusterSize,
};

TEST(DeviceStatus, ErrorsOfADeviceThatCannotRunTheKernelAreImplUnavailable) {
  for (cudaError_t error : kDeviceUnavailableErrors) {
    SCOPED_TRACE(cudaGetErrorName(error));
    EXPECT_TRUE(is_device_unavailable(error));
    const Status status = device_status(error, "sm80_split_d", "cudaLaunchKernel");
    EXPECT_EQ(status.code, StatusCode::impl_unavailable);
    EXPECT_TRUE(contains(status.message, "impl sm80_split_d")) << status.message;
    EXPECT_TRUE(contains(status.message, "cudaLaunchKernel")) << status.message;
    EXPECT_TRUE(contains(status.message, cudaGetErrorName(error))) << status.message;
  }
}

TEST(DeviceStatus, EachReasonSaysWhatToDo) {
  EXPECT_TRUE(contains(device_status(cudaErrorNoKernelImageForDevice, "sm80_split_d", "launch").message,
                       "CMAKE_CUDA_ARCHITECTURES"));
  EXPECT_TRUE(contains(device_status(cudaErrorUnsupportedPtxVersion, "sm80_split_d", "launch").message,
                       "update the driver"));
  EXPECT_TRUE(contains(device_status(cudaErrorLaunchOutOfResources, "sm90_wgmma", "launch").message,
                       "registers"));
  EXPECT_TRUE(contains(device_status(cudaErrorNoDevice, "sm90_wgmma", "launch").message,
                       "no CUDA device"));
}

// Errors of the call's own work or of a broken (sticky) context are not a
// device this build cannot serve: nobody should quietly run something else.
TEST(DeviceStatus, OtherErrorsStayCudaErrors) {
  for (cudaError_t error : {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMemoryAllocation,
                            cudaErrorInvalidValue, cudaErrorInvalidConfiguration,
                            cudaErrorLaunchTimeout, cudaErrorIllegalInstruction}) {
    SCOPED_TRACE(cudaGetErrorName(error));
    EXPECT_FALSE(is_device_unavailable(error));
    const Status status = device_status(error, "sm80_split_d", "cudaLaunchKernel");
    EXPECT_EQ(status.code, StatusCode::cuda_error);
    EXPECT_TRUE(contains(status.message, cudaGetErrorName(error))) << status.message;
  }
  EXPECT_TRUE(device_status(cudaSuccess, "sm80_split_d", "cudaLaunchKernel").ok());
}

TEST(DeviceStatus, AnInsufficientDriverSaysWhichDriver) {
  int driver = -1;
  ASSERT_EQ(cudaDriverGetVersion(&driver), cudaSuccess);
  const std::string problem = ffpa::detail::driver_problem(cudaErrorInsufficientDriver);
  if (driver == 0) {
    EXPECT_EQ(problem, "no CUDA driver is installed");
  } else {
    EXPECT_TRUE(contains(problem, "update the driver")) << problem;
  }
}

int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

const char* label(Impl impl) {
  return impl == Impl::automatic ? "auto" : impl == Impl::sm80_split_d ? "sm80_split_d" : "sm90_wgmma";
}

TEST(DeviceSupport, OnlyGpuImplsAndDeviceOrdinalsAreAsked) {
  EXPECT_EQ(ffpa::device_support(0, Impl::cpu_reference).code, StatusCode::invalid_option);
  EXPECT_EQ(ffpa::device_support(0, static_cast<Impl>(42)).code, StatusCode::invalid_option);
  EXPECT_EQ(ffpa::device_support(-1, Impl::automatic).code, StatusCode::invalid_option);
  char message[256] = "";
  EXPECT_EQ(ffpa_device_support(0, FFPA_IMPL_CPU_REFERENCE, message, sizeof message), FFPA_INVALID_OPTION);
  EXPECT_TRUE(contains(message, "not a GPU implementation")) << message;
}

TEST(DeviceSupport, WithoutADeviceEveryGpuImplIsUnavailableWithTheReason) {
  if (visible_devices() > 0) GTEST_SKIP() << "a CUDA device is visible";
  for (Impl impl : {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma}) {
    SCOPED_TRACE(label(impl));
    const Status status = ffpa::device_support(0, impl);
    EXPECT_EQ(status.code, StatusCode::impl_unavailable) << status.message;
    EXPECT_TRUE(contains(status.message, std::string("impl ") + label(impl))) << status.message;
    EXPECT_TRUE(contains(status.message, "needs a CUDA device")) << status.message;
  }
  char message[256] = "";
  EXPECT_EQ(ffpa_device_support(0, FFPA_IMPL_AUTO, message, sizeof message), FFPA_IMPL_UNAVAILABLE);
  EXPECT_TRUE(contains(message, "needs a CUDA device")) << message;
}

TEST(DeviceSupport, AnOrdinalPastTheVisibleDevicesIsAnInvalidOption) {
  const int count = visible_devices();
  if (count == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_EQ(ffpa::device_support(count, Impl::automatic).code, StatusCode::invalid_option);
}

// The kernel probes the routing asks (cudaFuncGetAttributes on the kernel a
// call would run): where no device can load an image, each says so as
// impl_unavailable, for every compiled instance and dtype.
TEST(DeviceSupport, KernelProbesWithoutADeviceAreImplUnavailable) {
  if (visible_devices() > 0) GTEST_SKIP() << "a CUDA device is visible";
  namespace split_d = ffpa::detail::sm80_split_d;
  namespace sm90 = ffpa::detail::sm90_wgmma;
  for (int i = 0; i < split_d::kInstanceCount; ++i) {
    using ffpa::Accumulation, ffpa::DType;
    for (auto [dtype, accumulation] : {std::pair{DType::bf16, Accumulation::f32},
                                       std::pair{DType::f16, Accumulation::f32},
                                       std::pair{DType::f16, Accumulation::f16}}) {
      const Status status = split_d::kInstances[i].runnable(dtype, accumulation, 0);
      EXPECT_EQ(status.code, StatusCode::impl_unavailable) << status.message;
      EXPECT_TRUE(contains(status.message, "impl sm80_split_d")) << status.message;
      EXPECT_TRUE(contains(status.message, "cudaFuncGetAttributes")) << status.message;
    }
  }
  for (int i = 0; i < sm90::kInstanceCount; ++i) {
    for (ffpa::DType dtype : {ffpa::DType::bf16, ffpa::DType::f16}) {
      const Status status = sm90::kInstances[i].runnable(dtype, 0);
      EXPECT_EQ(status.code, StatusCode::impl_unavailable) << status.message;
      EXPECT_TRUE(contains(status.message, "impl sm90_wgmma")) << status.message;
    }
  }
}

}  // namespace
