// A device this build cannot run kernels on (no kernel image for its
// architecture, PTX its driver cannot compile, a driver older than the
// library's CUDA runtime, a launch it cannot give its resources): the CUDA
// errors that say so become impl_unavailable, naming the implementation and
// what to do, never a launch error the caller cannot tell apart from a broken
// context; other errors stay cuda_error. device_support() says it up front.
// Without a GPU (CI) every GPU path meets a real case of it: no driver.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
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

// backward_route: the backward's analogue of device_support. Each bad argument
// has its status (naming the argument) and leaves *impl as it was; without a
// device every GPU impl is unavailable, with the reason.
constexpr Impl kUntouched = static_cast<Impl>(99);

TEST(BackwardRoute, BadArgumentsHaveTheirStatusAndWriteNothing) {
  using ffpa::DType;
  struct Bad {
    const char* what;
    int device;
    DType dtype;
    int64_t head_dim, value_dim;
    Impl requested;
    StatusCode want;
    const char* named;
  };
  const Bad cases[] = {
      {"cpu_reference", 0, DType::bf16, 512, 512, Impl::cpu_reference, StatusCode::invalid_option,
       "not a GPU implementation"},
      {"an impl out of range", 0, DType::bf16, 512, 512, static_cast<Impl>(42), StatusCode::invalid_option, "impl = 42"},
      {"a negative device", -1, DType::bf16, 512, 512, Impl::automatic, StatusCode::invalid_option, "device = -1"},
      {"D 7", 0, DType::bf16, 7, 7, Impl::automatic, StatusCode::unsupported_head_dim, "(D) = 7"},
      {"D 0", 0, DType::f16, 0, 64, Impl::automatic, StatusCode::unsupported_head_dim, "(D) = 0"},
      {"D 1032", 0, DType::bf16, 1032, 512, Impl::sm90_wgmma, StatusCode::unsupported_head_dim, "(D) = 1032"},
      {"Dv 12", 0, DType::bf16, 64, 12, Impl::automatic, StatusCode::unsupported_head_dim, "(Dv) = 12"},
      {"f32", 0, DType::f32, 64, 64, Impl::automatic, StatusCode::unsupported_dtype, "CPU reference only"},
      {"f64", 0, DType::f64, 64, 64, Impl::sm80_split_d, StatusCode::unsupported_dtype, "CPU reference only"},
      {"bool", 0, DType::boolean, 64, 64, Impl::automatic, StatusCode::unsupported_dtype, "q.dtype"},
      {"u8", 0, DType::u8, 64, 64, Impl::automatic, StatusCode::unsupported_dtype, "q.dtype"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.what);
    Impl impl = kUntouched;
    const Status status = ffpa::backward_route(c.device, c.dtype, c.head_dim, c.value_dim, c.requested, &impl);
    EXPECT_EQ(status.code, c.want) << status.message;
    EXPECT_TRUE(contains(status.message, c.named)) << status.message;
    EXPECT_EQ(impl, kUntouched);
  }
  EXPECT_EQ(ffpa::backward_route(0, ffpa::DType::bf16, 64, 64, Impl::automatic, nullptr).code,
            StatusCode::null_pointer);
}

TEST(BackwardRoute, TheCAbiHasTheSameStatusesAndMessages) {
  char message[256] = "";
  int32_t impl = 99;
  EXPECT_EQ(ffpa_backward_route(0, FFPA_DTYPE_BF16, 512, 512, FFPA_IMPL_AUTO, nullptr, message, sizeof message),
            FFPA_NULL_POINTER);
  EXPECT_TRUE(contains(message, "impl is null")) << message;
  EXPECT_EQ(ffpa_backward_route(0, FFPA_DTYPE_BF16, 512, 512, FFPA_IMPL_CPU_REFERENCE, &impl, message, sizeof message),
            FFPA_INVALID_OPTION);
  EXPECT_TRUE(contains(message, "not a GPU implementation")) << message;
  EXPECT_EQ(ffpa_backward_route(0, FFPA_DTYPE_BF16, 520, 1030, FFPA_IMPL_AUTO, &impl, message, sizeof message),
            FFPA_UNSUPPORTED_HEAD_DIM);
  EXPECT_TRUE(contains(message, "(Dv) = 1030")) << message;
  EXPECT_EQ(ffpa_backward_route(0, FFPA_DTYPE_F32, 64, 64, FFPA_IMPL_AUTO, &impl, message, sizeof message),
            FFPA_UNSUPPORTED_DTYPE);
  EXPECT_EQ(impl, 99);
}

TEST(BackwardRoute, WithoutADeviceEveryGpuImplIsUnavailableWithTheReason) {
  if (visible_devices() > 0) GTEST_SKIP() << "a CUDA device is visible";
  for (Impl requested : {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma}) {
    SCOPED_TRACE(label(requested));
    for (auto [head_dim, value_dim] : {std::pair<int64_t, int64_t>{64, 64}, {512, 512}, {576, 512}, {1024, 1024}}) {
      Impl impl = kUntouched;
      const Status status = ffpa::backward_route(0, ffpa::DType::bf16, head_dim, value_dim, requested, &impl);
      EXPECT_EQ(status.code, StatusCode::impl_unavailable) << status.message;
      EXPECT_TRUE(contains(status.message, std::string("impl ") + label(requested))) << status.message;
      EXPECT_TRUE(contains(status.message, "needs a CUDA device")) << status.message;
      EXPECT_EQ(impl, kUntouched);
    }
  }
  char message[256] = "";
  int32_t impl = 99;
  EXPECT_EQ(ffpa_backward_route(0, FFPA_DTYPE_F16, 128, 128, FFPA_IMPL_AUTO, &impl, message, sizeof message),
            FFPA_IMPL_UNAVAILABLE);
  EXPECT_TRUE(contains(message, "needs a CUDA device")) << message;
  EXPECT_EQ(impl, 99);
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
