// An additive mask's gradient, last step: the dense fp32 sum the dQ kernel
// accumulated (kernels/common/score_gradients.cuh: add_to_mask_gradient) converted to the
// mask's dtype and written through d_mask's strides. One thread an element.
#pragma once

#include <cstdint>

namespace ffpa::detail::sm80_backward {

struct MaskGradientArgs {
  const float* sum;     // dense [shape]
  void* d_mask;
  int64_t shape[4];     // the mask's (1 where it broadcasts)
  int64_t stride[4];    // d_mask's, in elements
  int64_t elements;
};

template <class MaskElement>
__global__ void __launch_bounds__(256) mask_gradient_kernel(const MaskGradientArgs args) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (e >= args.elements) return;
  int64_t rest = e, offset = 0;
#pragma unroll
  for (int d = 3; d >= 0; --d) {
    offset += rest % args.shape[d] * args.stride[d];
    rest /= args.shape[d];
  }
  static_cast<MaskElement*>(args.d_mask)[offset] = static_cast<MaskElement>(args.sum[e]);
}

}  // namespace ffpa::detail::sm80_backward
