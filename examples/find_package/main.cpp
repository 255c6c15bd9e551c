// Computes one small attention through the installed library: on the CPU
// reference when the inputs are host memory (no GPU needed).
#include <ffpa/ffpa.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

uint16_t to_bf16(float f) {  // truncation is enough for example inputs
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace

int main() {
  const int64_t b = 1, h = 2, n = 16, d = 64;
  std::vector<uint16_t> q(b * h * n * d), k(q.size()), v(q.size()), o(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = to_bf16(std::sin(0.1f * i));
    k[i] = to_bf16(std::cos(0.07f * i));
    v[i] = to_bf16(std::sin(0.03f * i + 1.0f));
  }
  ffpa::ForwardParams params;
  params.q = ffpa::make_tensor(q.data(), ffpa::DType::bf16, {b, h, n, d});
  params.k = ffpa::make_tensor(k.data(), ffpa::DType::bf16, {b, h, n, d});
  params.v = ffpa::make_tensor(v.data(), ffpa::DType::bf16, {b, h, n, d});
  params.o = ffpa::make_tensor(o.data(), ffpa::DType::bf16, {b, h, n, d});
  params.options.causal = ffpa::Causal::top_left;
  const ffpa::Status status = ffpa::forward(params);
  if (!status.ok()) {
    std::fprintf(stderr, "ffpa::forward: %s: %s\n", ffpa::status_name(status.code),
                 status.message.c_str());
    return 1;
  }
  std::printf("ffpa %s: forward ok, head dims compiled: %s\n", ffpa::version(),
              ffpa::compiled_head_dims().c_str());
  return 0;
}
