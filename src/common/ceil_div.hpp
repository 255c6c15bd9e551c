// ceil(a / b) for a >= 0 and b > 0, host and device: how many blocks of b
// cover a. (host/self_aliasing.cpp keeps its own, defined for negative a.)
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace ffpa::detail {

FFPA_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace ffpa::detail
