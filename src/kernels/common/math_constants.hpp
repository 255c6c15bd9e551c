// Constants of the log2-domain softmax, host and device: scores are scaled by
// log2(e) once so that every exponential is an exp2, and LSE goes back to the
// natural log with ln(2).
#pragma once

namespace ffpa::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace ffpa::detail
