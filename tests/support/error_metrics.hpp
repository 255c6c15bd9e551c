// How far an attention output is from the reference's, over all elements:
// relative L2 error, cosine similarity and the largest absolute difference
// (the figures of the FP8 accuracy table, docs/kernels/fp8_model.md).
// Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace ffpa::testing {

struct ErrorMetrics {
  double relative_l2 = 0.0;  // ||got - want|| / ||want||
  double cosine = 1.0;       // <got, want> / (||got|| ||want||)
  double max_abs = 0.0;      // max |got - want|
};

inline ErrorMetrics error_metrics(const std::vector<double>& got, const std::vector<double>& want) {
  double diff2 = 0.0, got2 = 0.0, want2 = 0.0, dot = 0.0;
  ErrorMetrics m;
  for (size_t e = 0; e < want.size(); ++e) {
    const double d = got[e] - want[e];
    diff2 += d * d;
    got2 += got[e] * got[e];
    want2 += want[e] * want[e];
    dot += got[e] * want[e];
    m.max_abs = std::max(m.max_abs, std::fabs(d));
  }
  m.relative_l2 = want2 > 0.0 ? std::sqrt(diff2 / want2) : std::sqrt(diff2);
  m.cosine = got2 > 0.0 && want2 > 0.0 ? dot / std::sqrt(got2 * want2) : (got2 == want2 ? 1.0 : 0.0);
  return m;
}

}  // namespace ffpa::testing
