// The GPU backward of a sequence batch (packed training: ffpa::backward with
// BackwardParams::sequences on device tensors; each case under impl auto,
// sm80_split_d and, where the library serves it, sm90_wgmma) against the CPU
// reference's gradients in double (support/serving_backward.hpp), on fresh
// random inputs: packed and batched sequences of odd lengths, empty ones and
// ones without keys, GQA, both causal alignments, windows, sinks and their
// gradient, seqused_k, the lse's gradient, D 64 to 1024 and D_qk != D_v.
// Gradients are poisoned with NaN first, and so are the d_o rows of no
// sequence: every row of a sequence must be written and finite, every other
// row untouched. A packed batch's gradients equal those of each sequence's
// own dense call bit for bit (padding-free training gives the padded step's
// gradients), and a faulty length (device data: the plan's verdict) writes
// nothing. The errors are printed ([ bwd serving ] lines). Seeds:
// FFPA_TEST_SEED mixed with the case name.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/device_tensor.hpp"
#include "support/serving_backward.hpp"

namespace ffpa::testing {
namespace {

// As the dense cases' (test_gpu_backward.cpp).
constexpr double kToleranceBf16 = 1e-2, kToleranceF16 = 3e-3;

struct ServingBackwardCase {
  std::string name;
  ServingCase shape;
  bool with_d_lse = false;
};

void PrintTo(const ServingBackwardCase& c, std::ostream* out) { *out << c.name; }

uint64_t case_seed(const std::string& name) {
  uint64_t seed = 0x5EEDull;
  if (const char* text = std::getenv("FFPA_TEST_SEED")) seed = std::strtoull(text, nullptr, 0);
  for (char ch : name) seed = seed * 1099511628211ull ^ static_cast<unsigned char>(ch);
  return seed;
}

std::vector<ServingBackwardCase> cases() {
  std::vector<ServingBackwardCase> all;
  auto add = [&](std::string name, DType dtype, int64_t dim, int64_t value_dim, std::vector<int64_t> seq_q,
                 std::vector<int64_t> seq_kv, auto&& adjust) {
    ServingCase c;
    c.dtype = dtype;
    c.dim = dim, c.value_dim = value_dim;
    c.seq_q = std::move(seq_q), c.seq_kv = std::move(seq_kv);
    c.causal = Causal::bottom_right;
    c.seed = case_seed(name);
    ServingBackwardCase bc{std::move(name), c, false};
    adjust(bc);
    all.push_back(bc);
  };
  const DType bf16 = DType::bf16, f16 = DType::f16;
  auto none = [](ServingBackwardCase&) {};
  add("Small_packed_gqa_d64", bf16, 64, 64, {70, 0, 5, 130, 9, 64}, {70, 9, 200, 130, 0, 64}, none);
  add("Small_packed_f16_d128_window_sinks_d_lse", f16, 128, 128, {100, 3, 66, 1}, {130, 70, 66, 40},
      [](ServingBackwardCase& c) {
        c.shape.window_left = 40, c.shape.sinks = true, c.with_d_lse = true;
      });
  add("Small_packed_no_causal_two_sided_window_d96", bf16, 96, 96, {90, 50, 7}, {90, 150, 33},
      [](ServingBackwardCase& c) {
        c.shape.causal = Causal::none, c.shape.window_left = 20, c.shape.window_right = 5;
      });
  add("Small_packed_seqused_mha_d40_dv72", f16, 40, 72, {33, 64, 1}, {17, 64, 80}, [](ServingBackwardCase& c) {
    c.shape.heads_q = c.shape.heads_kv = 3, c.shape.seqused = true, c.shape.causal = Causal::none;
  });
  add("Small_batched_top_left_d256_sinks", bf16, 256, 256, {40, 40, 40}, {75, 3, 0}, [](ServingBackwardCase& c) {
    c.shape.packed_q = false, c.shape.keys = KeyForm::batched, c.shape.causal = Causal::top_left;
    c.shape.sinks = true, c.with_d_lse = true;
  });
  add("Large_packed_d320_mqa", bf16, 320, 320, {300, 17, 129}, {333, 17, 300}, [](ServingBackwardCase& c) {
    c.shape.heads_q = 4, c.shape.heads_kv = 1;
  });
  add("Large_packed_d512_causal", bf16, 512, 512, {257, 65, 130}, {257, 65, 190}, none);
  add("Large_packed_mla_576_512_mqa_seqused", bf16, 576, 512, {130, 1, 70}, {200, 90, 70},
      [](ServingBackwardCase& c) {
        c.shape.heads_q = 8, c.shape.heads_kv = 1, c.shape.seqused = true;
      });
  add("Large_packed_d768_f16_window", f16, 768, 768, {150, 66}, {190, 66}, [](ServingBackwardCase& c) {
    c.shape.heads_q = c.shape.heads_kv = 2, c.shape.window_left = 100;
  });
  add("Large_packed_d1024_sinks", bf16, 1024, 1024, {130, 5, 64}, {190, 64, 64}, [](ServingBackwardCase& c) {
    c.shape.heads_q = 2, c.shape.heads_kv = 1, c.shape.sinks = true, c.with_d_lse = true;
  });
  return all;
}

// Device copies of a call's host tensors (same strides and gaps) and the call on them.
struct DeviceServingBackward {
  DeviceTensor q, k, v, o, lse, d_o, d_lse, d_q, d_k, d_v, sinks, d_sinks, cu_q, cu_k, used;
  SequenceBatch batch;
  BackwardParams params;

  void mirror(const ServingBackward& s) {
    params = s.params;
    if (s.params.sequences != nullptr) {
      batch = *s.params.sequences;
      params.sequences = &batch;
    }
    const ServingInputs& in = s.in;
    const HostTensor& v_buffer = in.v_buffer.tensor.data ? in.v_buffer : in.k_buffer;
    for (auto [host, view, device, param] :
         {std::tuple{&in.q, in.q.tensor, &q, &params.q}, std::tuple{&in.k_buffer, in.k, &k, &params.k},
          std::tuple{&v_buffer, in.v, &v, &params.v}, std::tuple{&in.o, in.o.tensor, &o, &params.o},
          std::tuple{&in.lse, in.lse.tensor, &lse, &params.lse}, std::tuple{&s.d_o, s.d_o.tensor, &d_o, &params.d_o},
          std::tuple{&s.d_lse, s.d_lse.tensor, &d_lse, &params.d_lse},
          std::tuple{&s.d_q, s.d_q.tensor, &d_q, &params.d_q}, std::tuple{&s.d_k, s.d_k.tensor, &d_k, &params.d_k},
          std::tuple{&s.d_v, s.d_v.tensor, &d_v, &params.d_v},
          std::tuple{&in.sinks, in.sinks.tensor, &sinks, &params.sinks},
          std::tuple{&s.d_sinks, s.d_sinks.tensor, &d_sinks, &params.d_sinks},
          std::tuple{&in.cu_q, in.cu_q.tensor, &cu_q, &batch.cu_seqlens_q},
          std::tuple{&in.cu_k, in.cu_k.tensor, &cu_k, &batch.cu_seqlens_k},
          std::tuple{&in.used, in.used.tensor, &used, &batch.seqused_k}}) {
      if (host->tensor.data == nullptr || param->data == nullptr) continue;
      ASSERT_NO_FATAL_FAILURE(mirror_to_device(*host, view, device));
      // The view's device copy, with the call's own shape (a dense call of one
      // sequence passes the view's first rows only).
      const Tensor called = *param;
      *param = device->tensor;
      for (int d = 0; d < 4; ++d) param->shape[d] = called.shape[d];
    }
  }

  void copy_back(ServingBackward& s, cudaStream_t stream) {
    ASSERT_NO_FATAL_FAILURE(copy_to_host(d_q, &s.d_q, stream));
    ASSERT_NO_FATAL_FAILURE(copy_to_host(d_k, &s.d_k, stream));
    ASSERT_NO_FATAL_FAILURE(copy_to_host(d_v, &s.d_v, stream));
    if (s.params.d_sinks.data) ASSERT_NO_FATAL_FAILURE(copy_to_host(d_sinks, &s.d_sinks, stream));
  }
};

// The call on the device under `impl`, in the workspace the size query
// reports (or, workspace false, stream-ordered memory), on a stream of its own.
void run_on_device(ServingBackward& s, Impl impl, bool workspace = true) {
  DeviceServingBackward device;
  ASSERT_NO_FATAL_FAILURE(device.mirror(s));
  device.params.options.impl = impl;
  cudaStream_t stream = nullptr;
  FFPA_ASSERT_CUDA(cudaStreamCreate(&stream));
  device.params.stream = stream;
  size_t bytes = 0;
  {
    const Status status = backward_workspace_size(device.params, &bytes);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  DeviceBuffer buffer;
  if (workspace && bytes > 0) {
    ASSERT_NO_FATAL_FAILURE(buffer.allocate(bytes));
    device.params.workspace = buffer.data(), device.params.workspace_bytes = bytes;
  }
  {
    const Status status = backward(device.params);
    ASSERT_TRUE(status.ok()) << status_name(status.code) << ": " << status.message;
  }
  ASSERT_NO_FATAL_FAILURE(device.copy_back(s, stream));
  FFPA_EXPECT_CUDA(cudaStreamDestroy(stream));
}

// Whether the library serves the case under `impl` (its own answer: the
// workspace query plans the call as backward() would).
bool serves(const ServingBackwardCase& c, Impl impl) {
  ServingBackward s;
  make_serving_backward(c.shape, c.with_d_lse, c.shape.sinks, &s);
  DeviceServingBackward device;
  device.mirror(s);
  device.params.options.impl = impl;
  size_t bytes = 0;
  return backward_workspace_size(device.params, &bytes).ok();
}

class GpuBackwardServing : public ::testing::TestWithParam<ServingBackwardCase> {};

TEST_P(GpuBackwardServing, GradientsMatchTheReference) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const ServingBackwardCase& c = GetParam();
  for (Impl impl : {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma}) {
    if (impl == Impl::sm90_wgmma && !serves(c, impl)) continue;
    const char* label = impl == Impl::automatic    ? "bwd serving auto"
                        : impl == Impl::sm80_split_d ? "bwd serving sm80"
                                                     : "bwd serving sm90";
    SCOPED_TRACE(label);
    ServingBackward s;
    ASSERT_NO_FATAL_FAILURE(make_serving_backward(c.shape, c.with_d_lse, c.shape.sinks, &s));
    const ServingGradients want = serving_reference_gradients(s);
    ASSERT_NO_FATAL_FAILURE(run_on_device(s, impl, impl != Impl::sm80_split_d));
    check_serving_gradients(s, want, c.shape.dtype == DType::bf16 ? kToleranceBf16 : kToleranceF16, label);
  }
}

// Each sequence's rows of a packed call's gradients against the same
// sequence's own dense call (q [1, Hq, Nq_b, D] and k, v [1, Hkv, Nkv_b, D]
// views of its rows) on the same implementation: the same bits.
TEST_P(GpuBackwardServing, APackedBatchGivesEachSequencesDenseGradients) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  const ServingBackwardCase& c = GetParam();
  if (!c.shape.packed_q || c.shape.keys != KeyForm::packed || c.shape.seqused) GTEST_SKIP() << "packed q and k only";
  for (Impl impl : {Impl::sm80_split_d, Impl::sm90_wgmma}) {
    if (impl == Impl::sm90_wgmma && !serves(c, impl)) continue;
    SCOPED_TRACE(impl == Impl::sm80_split_d ? "sm80_split_d" : "sm90_wgmma");
    ServingBackward packed;
    ASSERT_NO_FATAL_FAILURE(make_serving_backward(c.shape, c.with_d_lse, false, &packed));
    ASSERT_NO_FATAL_FAILURE(run_on_device(packed, impl));
    for (int64_t b = 0; b < c.shape.batch(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      // The dense call of sequence b alone: a one-sequence batch's tensors trimmed to its rows.
      ServingCase one = c.shape;
      one.seq_q = {c.shape.seq_q[b]};
      one.seq_kv = {c.shape.seq_kv[b]};
      ServingBackward dense;
      ASSERT_NO_FATAL_FAILURE(make_serving_backward(one, c.with_d_lse, false, &dense));
      auto rows = [](Tensor t, int64_t count) {
        t.shape[2] = count;
        return t;
      };
      const int64_t nq = one.seq_q[0], nkv = one.seq_kv[0];
      auto copy_rows = [](const Tensor& from, int64_t first, const Tensor& to, int64_t count) {
        for (int64_t h = 0; h < to.shape[1]; ++h)
          for (int64_t n = 0; n < count; ++n)
            for (int64_t d = 0; d < to.shape[3]; ++d)
              set_element(to, {0, h, n, d}, element_as_double(from, {0, h, first + n, d}));
      };
      // The packed call's inputs of sequence b, copied into the one-sequence call's buffers.
      copy_rows(packed.in.q.tensor, packed.in.q_begin[b], dense.in.q.tensor, nq);
      copy_rows(packed.in.o.tensor, packed.in.q_begin[b], dense.in.o.tensor, nq);
      copy_rows(packed.d_o.tensor, packed.in.q_begin[b], dense.d_o.tensor, nq);
      copy_rows(packed.in.k, packed.in.k_begin[b], dense.in.k, nkv);
      copy_rows(packed.in.v, packed.in.k_begin[b], dense.in.v, nkv);
      for (int64_t h = 0; h < c.shape.heads_q; ++h)
        for (int64_t n = 0; n < nq; ++n) {
          set_element(dense.in.lse.tensor, {0, h, n, 0}, element_as_double(packed.in.lse.tensor, {0, h, packed.in.q_begin[b] + n, 0}));
          if (c.with_d_lse)
            set_element(dense.d_lse.tensor, {0, h, n, 0}, element_as_double(packed.d_lse.tensor, {0, h, packed.in.q_begin[b] + n, 0}));
        }
      if (c.shape.sinks) dense.in.sinks = packed.in.sinks;
      // Dense: no sequence batch, the tensors' rows cut to the sequence's.
      dense.params.sequences = nullptr;
      for (Tensor* t : {&dense.params.q, &dense.params.o, &dense.params.d_o, &dense.params.d_q}) *t = rows(*t, nq);
      for (Tensor* t : {&dense.params.lse, &dense.params.d_lse}) *t = rows(*t, nq);
      for (Tensor* t : {&dense.params.k, &dense.params.v, &dense.params.d_k, &dense.params.d_v}) *t = rows(*t, nkv);
      if (c.shape.sinks) dense.params.sinks = dense.in.sinks.tensor;
      // A dense call without queries or keys is the dense suite's edge case (and compares nothing).
      if (nq == 0 || nkv == 0) continue;
      ASSERT_NO_FATAL_FAILURE(run_on_device(dense, impl));
      for (auto [from, own, first, count] :
           {std::tuple{&packed.d_q.tensor, &dense.d_q.tensor, packed.in.q_begin[b], nq},
            std::tuple{&packed.d_k.tensor, &dense.d_k.tensor, packed.in.k_begin[b], nkv},
            std::tuple{&packed.d_v.tensor, &dense.d_v.tensor, packed.in.k_begin[b], nkv}}) {
        int64_t differing = 0;
        for (int64_t h = 0; h < own->shape[1]; ++h)
          for (int64_t n = 0; n < count; ++n)
            for (int64_t d = 0; d < own->shape[3]; ++d)
              differing += element_as_double(*from, {0, h, first + n, d}) == element_as_double(*own, {0, h, n, d}) ? 0 : 1;
        EXPECT_EQ(differing, 0) << "elements of the packed call that differ from the sequence's dense call";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuBackwardServing, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<ServingBackwardCase>& info) { return info.param.name; });

// Device lengths that do not hold (the plan's data checks on the device):
// backward() returns ok (no host synchronization) and writes nothing.
TEST(GpuBackwardServingFaults, AFaultyLengthWritesNothing) {
  if (const auto& reason = gpu_unavailable_reason()) GTEST_SKIP() << *reason;
  for (Impl impl : {Impl::automatic, Impl::sm80_split_d}) {
    ServingCase c;
    c.dtype = DType::bf16;
    c.dim = c.value_dim = 64;
    c.seq_q = {70, 5};
    c.seq_kv = {70, 90};
    c.sinks = true;
    c.seed = 3;
    ServingBackward s;
    ASSERT_NO_FATAL_FAILURE(make_serving_backward(c, false, true, &s));
    static_cast<int32_t*>(s.in.cu_q.tensor.data)[1] = 99;  // past cu_seqlens_q[2] = 75: decreasing
    ASSERT_NO_FATAL_FAILURE(run_on_device(s, impl));
    for (const HostTensor* t : {&s.d_q, &s.d_k, &s.d_v}) {
      const Tensor& g = t->tensor;
      int64_t written = 0;
      for (int64_t e = 0; e < g.shape[0]; ++e)
        for (int64_t h = 0; h < g.shape[1]; ++h)
          for (int64_t n = 0; n < g.shape[2]; ++n)
            for (int64_t d = 0; d < g.shape[3]; ++d) written += std::isnan(element_as_double(g, {e, h, n, d})) ? 0 : 1;
      EXPECT_EQ(written, 0);
    }
    for (int64_t h = 0; h < c.heads_q; ++h) EXPECT_TRUE(std::isnan(element_as_double(s.d_sinks.tensor, {h, 0, 0, 0})));
  }
}

}  // namespace
}  // namespace ffpa::testing
