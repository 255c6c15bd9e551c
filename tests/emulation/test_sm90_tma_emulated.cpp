// TMA's reduce-add of fp32 boxes (ptx.cuh's tma_reduce_add_4d) on the CPU
// emulator: tests/gpu_kernels/reduce_add.cuh's adds, the source the GPU test
// (test_tma_reduce_add.cu) runs, checked exactly (reduce_add_case.hpp).
#include "emulation/sm90_device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "emulation/sm90_tensor_maps.hpp"
#include "gpu_kernels/reduce_add_case.hpp"

namespace ffpa::testing {
namespace {

using namespace reduce_add;

alignas(1024) unsigned char boxes_smem[kBoxes * kBoxBytes];

TEST(EmulatedSm90Tma, ReduceAddsFp32BoxesSkippingWhatFallsOutside) {
  const std::vector<unsigned char> image = shared_image();
  std::memcpy(boxes_smem, image.data(), image.size());
  std::vector<float> tensor = initial_tensor();
  const CUtensorMap map = emulated_map(tensor_spec(tensor.data()));
  emulation::sm90::run_cta({0, 0, 0}, 128, boxes_smem, emulation::sm90::TmaLanding::at_wait,
                           [&] { add_boxes(0, &map, static_cast<int>(threadIdx.x)); });
  const std::vector<float> expected = expected_tensor();
  for (size_t i = 0; i < tensor.size(); ++i) {
    ASSERT_EQ(tensor[i], expected[i]) << "row " << i / kTensorCols << ", column " << i % kTensorCols;
  }
}

}  // namespace
}  // namespace ffpa::testing
