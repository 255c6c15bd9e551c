// A split-KV launch of the split-D kernel (host and device): how many splits
// of the keys, how many keys each (whole KV blocks of the instance), and where
// the partial rows go (kernels/split_kv/combine.hpp's layout). The default is
// no split: O and LSE written directly. A sequence batch's split is its
// plan's (split_slots > 0: the plan chose it on the device for that many CTA
// slots; kv_splits stays 1).
#pragma once

#include <cstdint>

#include "kernels/common/softmax_state.hpp"

namespace ffpa::detail::sm80_split_d {

struct SplitLaunch {
  int kv_splits = 1;
  int64_t keys_per_split = 0;  // a multiple of the instance's block_n
  float* partial_o = nullptr;
  RowSoftmaxState* partial_states = nullptr;
  int split_slots = 0;
};

}  // namespace ffpa::detail::sm80_split_d
