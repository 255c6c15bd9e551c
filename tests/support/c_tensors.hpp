// The C ABI's view of a C++ tensor description, for tests that call both APIs
// with the same buffers. Header-only.
#pragma once

#include <cstring>

#include "ffpa/ffpa.h"
#include "ffpa/ffpa.hpp"

namespace ffpa::testing {

inline ffpa_tensor c_tensor(const Tensor& t) {
  ffpa_tensor c;
  std::memset(&c, 0, sizeof c);
  c.data = t.data;
  c.dtype = static_cast<int32_t>(t.dtype);
  c.rank = t.rank;
  for (int i = 0; i < 4; ++i) c.shape[i] = t.shape[i], c.stride[i] = t.stride[i];
  return c;
}

}  // namespace ffpa::testing
