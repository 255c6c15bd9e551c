// The causal limit, the window and the mask of one query row (score_terms.hpp).
#include "reference/score_terms.hpp"

#include <algorithm>
#include <limits>

#include "common/float16_bits.hpp"

namespace ffpa::detail {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

template <class Element>
const Element* offset_ptr(const void* base, int64_t elements) {
  return static_cast<const Element*>(base) + elements;
}

}  // namespace

int64_t visible_keys(const AttentionProblem& p, int64_t i) { return attended_keys(p, i, p.seq_q, p.seq_kv).end; }

void mask_bias(const AttentionProblem& p, int64_t b, int64_t h, int64_t i, int64_t n, double* bias) {
  const int64_t row = b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2];
  const int64_t step = p.mask_stride[3];
  switch (p.mask_kind) {
    case MaskKind::none: std::fill(bias, bias + n, 0.0); return;
    case MaskKind::boolean: {
      const uint8_t* m = offset_ptr<uint8_t>(p.mask, row);
      for (int64_t j = 0; j < n; ++j) bias[j] = m[j * step] != 0 ? 0.0 : kNegInf;
      return;
    }
    case MaskKind::additive_f16: {
      const uint16_t* m = offset_ptr<uint16_t>(p.mask, row);
      for (int64_t j = 0; j < n; ++j) bias[j] = half_bits_to_float(m[j * step]);
      return;
    }
    case MaskKind::additive_bf16: {
      const uint16_t* m = offset_ptr<uint16_t>(p.mask, row);
      for (int64_t j = 0; j < n; ++j) bias[j] = bf16_bits_to_float(m[j * step]);
      return;
    }
    case MaskKind::additive_f32: {
      const float* m = offset_ptr<float>(p.mask, row);
      for (int64_t j = 0; j < n; ++j) bias[j] = m[j * step];
      return;
    }
    case MaskKind::additive_f64: {
      const double* m = offset_ptr<double>(p.mask, row);
      for (int64_t j = 0; j < n; ++j) bias[j] = m[j * step];
      return;
    }
  }
}

}  // namespace ffpa::detail
