// The RS wgmma (A in registers) and the A fragment taken from S's
// accumulators (a_fragment.cuh) on the CPU emulator: the product of
// tests/gpu_kernels/p_in_registers.cuh, the same source the GPU test
// (test_wgmma_rs.cu) runs, checked against an fp64 product.
#include "emulation/sm90_device_shim.hpp"  // first: the CUDA built-ins as the emulator's

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu_kernels/p_in_registers_case.hpp"

namespace ffpa::testing {
namespace {

using namespace p_in_registers;

alignas(1024) unsigned char rs_smem[128 * 1024];

// One product of for_each_product, checked against the fp64 one.
struct ExpectProduct {
  template <class Element, int kKeys, int kValueCols, bool kTransposeV>
  void run(uint64_t seed) const {
    SCOPED_TRACE((product_name<kKeys, kValueCols, kTransposeV>()));
    const Case c = make_case<Element>(seed, kKeys, kValueCols);
    const std::vector<unsigned char> image = shared_image<Element, kKeys, kValueCols, kTransposeV>(c);
    ASSERT_LE(image.size(), sizeof rs_smem);
    std::memcpy(rs_smem, image.data(), image.size());
    std::vector<float> s(static_cast<size_t>(kRows * kKeys)), o(static_cast<size_t>(kRows * kValueCols));
    emulation::sm90::run_cta({0, 0, 0}, 128, rs_smem, emulation::sm90::TmaLanding::at_issue, [&] {
      p_in_registers_product<Element, kKeys, kValueCols, kTransposeV>(0, static_cast<int>(threadIdx.x), s.data(),
                                                                       o.data());
    });
    EXPECT_TRUE(matches<Element>(c, s, o));
  }
};

TEST(EmulatedSm90Wgmma, MultipliesPFromTheRegistersOfS) {
  for_each_product(ExpectProduct{});
}

}  // namespace
}  // namespace ffpa::testing
