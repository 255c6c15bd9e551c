#include "host/self_aliasing.hpp"

#include <algorithm>
#include <utility>

namespace ffpa::detail {
namespace {

int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }  // b > 0

constexpr int64_t kMaxSearch = int64_t{1} << 24;

// The search with `outer` enumerated over the differences its stride can
// take (|d * stride| within the others' reach plus width), `middle` over its
// whole range, and `inner` solved: the indices of dims[]. Differences are
// taken with the first nonzero of (outer, middle, inner) positive (d and -d
// are the same pair of elements).
Aliasing search(const Dim (&d)[3], int outer, int middle, int inner, int64_t width) {
  const Dim z = d[outer], y = d[middle], x = d[inner];
  const int64_t reach_xy = (x.size - 1) * x.stride + (y.size - 1) * y.stride;
  const int64_t z_max = std::min(z.size - 1, (reach_xy + width - 1) / z.stride);
  for (int64_t dz = 0; dz <= z_max; ++dz) {
    for (int64_t dy = dz == 0 ? 0 : 1 - y.size; dy < y.size; ++dy) {
      const int64_t t = dz * z.stride + dy * y.stride;
      // dx with |t + dx * x.stride| < width and |dx| < x.size.
      const int64_t x_low = std::max(floor_div(-width - t, x.stride) + 1, 1 - x.size);
      const int64_t x_high = std::min(ceil_div(width - t, x.stride) - 1, x.size - 1);
      if (x_low > x_high) continue;
      if (dz != 0 || dy != 0 || x_high >= 1) return Aliasing::found;
    }
  }
  return Aliasing::none;
}

}  // namespace

Aliasing find_self_aliasing(const Dim (&all_dims)[3], int64_t width) {
  // Dims of size 1 take no difference; a stand-in of size 1 keeps three.
  Dim d[3] = {{1, 1}, {1, 1}, {1, 1}};
  int n = 0;
  for (const Dim& dim : all_dims) {
    if (dim.size == 0) return Aliasing::none;
    if (dim.size > 1) {
      if (dim.stride == 0) return Aliasing::found;
      d[n++] = dim;
    }
  }
  for (int i = 1; i < n; ++i)  // by stride (n <= 3: an insertion sort)
    for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; --j) std::swap(d[j], d[j - 1]);
  int64_t reach = width - 1;
  bool nested = true;
  for (int i = 0; i < n && nested; ++i) {
    nested = d[i].stride > reach;
    reach += d[i].stride * (d[i].size - 1);
  }
  if (nested) return Aliasing::none;

  // The cheapest of the six assignments of roles, by its step count.
  int best[3] = {0, 1, 2};
  int64_t best_steps = -1;
  int order[3] = {0, 1, 2};
  do {
    const Dim z = d[order[0]], y = d[order[1]], x = d[order[2]];
    const int64_t reach_xy = (x.size - 1) * x.stride + (y.size - 1) * y.stride;
    const int64_t z_count = std::min(z.size - 1, (reach_xy + width - 1) / z.stride) + 1;
    // Both factors are below 2^62 / stride; compare without overflow.
    const int64_t y_count = 2 * y.size - 1;
    const int64_t steps = z_count > kMaxSearch / y_count ? kMaxSearch + 1 : z_count * y_count;
    if (best_steps < 0 || steps < best_steps) {
      best_steps = steps;
      std::copy(order, order + 3, best);
    }
  } while (std::next_permutation(order, order + 3));
  if (best_steps > kMaxSearch) return Aliasing::undecided;
  return search(d, best[0], best[1], best[2], width);
}

}  // namespace ffpa::detail
