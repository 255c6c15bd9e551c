// Constants of the log2-domain softmax, host and device: scores are scaled by
// log2(e) once so that every exponential is an exp2, and LSE goes back to the
// natural log with ln(2).
#pragma once

namespace ffpa::detail {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// The FP8 path stores P as e4m3(448 p), 448 the largest e4m3 (p <= 1 after
// the max subtraction uses the whole range): log2(448) joins the exponent.
constexpr float kLog2PScale = 8.807354922057604f;

}  // namespace ffpa::detail
