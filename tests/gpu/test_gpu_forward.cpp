// ffpa_gpu_tests: every GPU path of forward() against the fp64 CPU reference,
// on fresh random inputs, with NaN-poisoned outputs and row gaps.
//
// Each parameterized case runs Impl::automatic, Impl::sm80_split_d and (on an
// sm_90 device) Impl::sm90_wgmma and checks, for each: no NaN anywhere in o or lse, the gaps between padded rows
// still poisoned, rows with no attended key exactly 0 with lse = -inf, the
// relative L2 error of o over the checked rows (bf16 <= 1e-2, f16 <= 5e-3), no
// row much worse than that, and |lse - ref| <= 2e-3 * max(1, |ref|).
//
// Test names say "Small" (Nq, Nkv <= 129: the compute-sanitizer pass runs
// --gtest_filter=*Small*) or "Large". Seeds come from the test name and how
// often it ran in this process (--gtest_repeat), mixed with the environment
// variable FFPA_TEST_SEED when set; a failure prints the seed. Without a usable
// GPU every test is skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "gpu/device_tensor.hpp"
#include "gpu/forward_case.hpp"
#include "host/validate.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "reference/cpu_attention.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::testing {
namespace {

constexpr Impl kGpuImpls[] = {Impl::automatic, Impl::sm80_split_d, Impl::sm90_wgmma};

// Relative L2 error of o against the fp64 reference, over all checked rows.
double o_tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 5e-3; }
// A single row may be this much worse than the whole; its norm is floored at
// kRowNormFloor * sqrt(D) so that rows dropped to zero do not divide by zero.
constexpr double kRowToleranceFactor = 5.0;
constexpr double kRowNormFloor = 1e-4;
constexpr double kLseTolerance = 2e-3;  // |lse - ref| <= kLseTolerance * max(1, |ref|)

const char* impl_label(Impl impl) {
  switch (impl) {
    case Impl::automatic: return "automatic";
    case Impl::cpu_reference: return "cpu_reference";
    case Impl::sm80_split_d: return "sm80_split_d";
    case Impl::sm90_wgmma: return "sm90_wgmma";
  }
  return "unknown";
}

std::string status_text(const Status& status) {
  return std::string(status_name(status.code)) + ": " + status.message;
}

// --- environment, seeds -----------------------------------------------------------

// Whether device 0 runs the sm90 family at all (compute capability 9.0 and a
// build with sm_90a kernels).
bool device_runs_sm90() {
  static const bool runs = [] {
    int major = 0, minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess;
    (void)cudaGetLastError();
    return ok && major == 9 && minor == 0 && detail::sm90_wgmma::kInstanceCount > 0;
  }();
  return runs;
}


uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (unsigned char ch : text) hash = (hash ^ ch) * 0x100000001B3ull;
  return hash;
}

struct TestSeed {
  uint64_t value;
  std::string note;  // how to reproduce it
};

// A seed of its own for the running test: its full name, the number of times
// it ran before in this process, and FFPA_TEST_SEED.
TestSeed fresh_test_seed() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  static std::map<std::string, uint64_t> runs_so_far;  // --gtest_repeat runs a test again
  const uint64_t run = runs_so_far[name]++;
  const char* base_text = std::getenv("FFPA_TEST_SEED");
  const uint64_t base = base_text != nullptr ? std::strtoull(base_text, nullptr, 0) : 0;
  const uint64_t value = derive_seed(fnv1a(name) ^ splitmix64(base), run);
  std::ostringstream note;
  note << "seed 0x" << std::hex << value << std::dec << " (run " << run << " of " << name
       << ", FFPA_TEST_SEED=" << base << ")";
  return {value, note.str()};
}

// --- reference --------------------------------------------------------------------------

// fp64 results for the checked rows: o [B, Hq, R, D], lse [B, Hq, R].
struct Reference {
  std::vector<int64_t> rows;
  std::vector<double> o, lse;
};

// Validates the call on the host copies (the same problem the GPU gets) and
// runs the CPU reference on the checked rows.
void compute_reference(const ForwardCase& c, const HostProblem& host, uint64_t seed,
                       Reference* ref) {
  detail::AttentionProblem problem;
  const Status status = detail::validate_forward(host_params(host), &problem);
  ASSERT_TRUE(status.ok()) << "the host copy of the call does not validate: "
                           << status_text(status);
  ref->rows = checked_rows(c, derive_seed(seed, seed_checked_rows));
  const auto count = static_cast<int64_t>(ref->rows.size());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ref->o.assign(static_cast<size_t>(c.batch * c.heads_q * count * c.head_dim), nan);
  ref->lse.assign(static_cast<size_t>(c.batch * c.heads_q * count), nan);
  detail::cpu_attention_forward_f64(problem, {ref->rows.data(), count}, ref->o.data(),
                                    ref->lse.data());
}

// --- device ----------------------------------------------------------------------------

struct DeviceInputs {
  DeviceTensor q, k, v, mask;
};

void upload_inputs(const HostProblem& host, DeviceInputs* device) {
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.q.buffer, host.q.view, &device->q));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.k.buffer, host.k.view, &device->k));
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.v.buffer, host.v.view, &device->v));
  if (host.mask.present()) {
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.mask.buffer, host.mask.view, &device->mask));
  }
}

class OwnedStream {
 public:
  void create() { FFPA_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~OwnedStream() {
    if (stream_ != nullptr) {
      FFPA_EXPECT_CUDA(cudaStreamDestroy(stream_));
    }
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

std::string describe(const KernelChoice& choice) {
  return std::string(impl_label(choice.impl)) + " " + choice.kernel + " (padded D " +
         std::to_string(choice.padded_head_dim) + ", value splits " +
         std::to_string(choice.value_splits) + ")";
}

// --- checks ----------------------------------------------------------------------------

std::string index_text(const std::array<int64_t, 4>& index, int32_t rank) {
  std::string text = "[";
  for (int32_t d = 0; d < rank; ++d) text += (d ? ", " : "") + std::to_string(index[d]);
  return text + "]";
}

// No NaN in the tensor (all of it, not only the checked rows).
void expect_no_nan(const Tensor& t, const char* name) {
  int64_t count = 0;
  std::array<int64_t, 4> first{};
  for_each_index(t, [&](const std::array<int64_t, 4>& index) {
    if (std::isnan(element_as_double(t, index)) && count++ == 0) first = index;
  });
  EXPECT_EQ(count, 0) << name << " has " << count << " NaN elements, the first at "
                      << index_text(first, t.rank);
}

// Every element of the buffer outside the view still holds the NaN poison.
void expect_gaps_poisoned(const HostView& t, const char* name) {
  int64_t written = 0;
  std::array<int64_t, 4> first{};
  for_each_gap_element(t, [&](const std::array<int64_t, 4>& index) {
    if (!std::isnan(element_as_double(t.buffer.tensor, index)) && written++ == 0) first = index;
  });
  EXPECT_EQ(written, 0) << written << " elements of " << name
                        << "'s buffer outside the tensor were written, the first at buffer index "
                        << index_text(first, t.buffer.tensor.rank);
}

// Every element of the buffer still holds the NaN poison.
void expect_untouched(const HostTensor& t, const char* name) {
  int64_t written = 0;
  for_each_index(t.tensor, [&](const std::array<int64_t, 4>& index) {
    if (!std::isnan(element_as_double(t.tensor, index))) ++written;
  });
  EXPECT_EQ(written, 0) << written << " elements of " << name << " were written";
}

// o and lse of the checked rows against the reference; logs the errors.
void expect_matches_reference(const ForwardCase& c, const HostProblem& result,
                              const Reference& ref, Impl impl) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t count = static_cast<int64_t>(ref.rows.size()), dim = c.head_dim;
  double error2 = 0.0, reference2 = 0.0, worst_row = 0.0, worst_lse = 0.0;
  std::string worst_row_at, first_nonzero_empty, first_bad_lse;
  int64_t empty_rows = 0, nonzero_empty_rows = 0, bad_lse = 0;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads_q; ++h) {
      for (int64_t r = 0; r < count; ++r) {
        const int64_t i = ref.rows[static_cast<size_t>(r)];
        const auto row = static_cast<size_t>((b * c.heads_q + h) * count + r);
        const double* expected = &ref.o[row * static_cast<size_t>(dim)];
        const double expected_lse = ref.lse[row];
        const std::string at = "(b, h, i) = (" + std::to_string(b) + ", " + std::to_string(h) +
                               ", " + std::to_string(i) + ")";
        if (result.lse.present()) {
          const double lse = element_as_double(result.lse.view, {b, h, i, 0});
          const double lse_error = std::abs(lse - expected_lse);  // NaN when both are -inf
          const bool good =
              expected_lse == -inf
                  ? lse == -inf
                  : lse_error <= kLseTolerance * std::max(1.0, std::abs(expected_lse));
          if (expected_lse != -inf && !(lse_error <= worst_lse)) worst_lse = lse_error;
          if (!good && bad_lse++ == 0)
            first_bad_lse = at + ": lse " + std::to_string(lse) + ", reference " +
                            std::to_string(expected_lse);
        }
        if (expected_lse == -inf) {  // no attended key: o must be exactly 0
          ++empty_rows;
          for (int64_t d = 0; d < dim; ++d) {
            const double value = element_as_double(result.o.view, {b, h, i, d});
            if (value != 0.0) {
              if (nonzero_empty_rows++ == 0)
                first_nonzero_empty = at + ", d = " + std::to_string(d) + ": " + std::to_string(value);
              break;
            }
          }
          continue;
        }
        double row_error2 = 0.0, row_reference2 = 0.0;
        for (int64_t d = 0; d < dim; ++d) {
          const double diff = element_as_double(result.o.view, {b, h, i, d}) - expected[d];
          row_error2 += diff * diff;
          row_reference2 += expected[d] * expected[d];
        }
        error2 += row_error2;
        reference2 += row_reference2;
        const double row_norm_floor = kRowNormFloor * std::sqrt(static_cast<double>(dim));
        const double row_error =
            std::sqrt(row_error2) / std::max(std::sqrt(row_reference2), row_norm_floor);
        if (!(row_error <= worst_row)) {  // also takes NaN
          worst_row = row_error;
          worst_row_at = at;
        }
      }
    }
  }

  const double tolerance = o_tolerance(c.dtype);
  const double error = reference2 > 0.0 ? std::sqrt(error2 / reference2) : std::sqrt(error2);
  ::testing::Test::RecordProperty(std::string("relative_l2_") + impl_label(impl),
                                  std::to_string(error));
  std::cout << "[ error    ] " << impl_label(impl) << ": o relative L2 " << error << " (tolerance "
            << tolerance << "), worst row " << worst_row << ", lse max abs error " << worst_lse
            << ", " << empty_rows << " rows without keys" << std::endl;
  EXPECT_LE(error, tolerance) << "relative L2 error of o over " << count << " rows x "
                              << c.batch * c.heads_q << " heads (D = " << dim
                              << "); worst row " << worst_row << " at " << worst_row_at;
  EXPECT_LE(worst_row, kRowToleranceFactor * tolerance)
      << "relative L2 error of one row of o, at " << worst_row_at;
  EXPECT_EQ(nonzero_empty_rows, 0) << "rows with no attended key must be exactly 0; first at "
                                   << first_nonzero_empty;
  EXPECT_EQ(bad_lse, 0) << "lse differs from the reference; first at " << first_bad_lse;
  if (expects_empty_rows(c)) {
    EXPECT_GT(empty_rows, 0) << "test setup: no checked row is without attended keys";
  }
}

// --- one case ------------------------------------------------------------------------

// Runs the call with `impl` on `stream` (outputs poisoned first) and checks it.
void run_and_compare(const ForwardCase& c, HostProblem* host, const DeviceInputs& inputs,
                     const Reference& ref, Impl impl, cudaStream_t stream) {
  DeviceTensor o, lse;
  fill_nan(host->o.buffer);
  ASSERT_NO_FATAL_FAILURE(mirror_to_device(host->o.buffer, host->o.view, &o));
  if (host->lse.present()) {
    fill_nan(host->lse.buffer);
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host->lse.buffer, host->lse.view, &lse));
  }
  // Copies from pageable memory may still be in flight, and a non-blocking
  // stream does not wait for them.
  FFPA_ASSERT_CUDA(cudaDeviceSynchronize());

  ForwardParams params = host_params(*host);
  params.q = inputs.q.tensor;
  params.k = inputs.k.tensor;
  params.v = inputs.v.tensor;
  params.mask = inputs.mask.tensor;
  params.o = o.tensor;
  params.lse = lse.tensor;
  params.options.impl = impl;
  params.stream = stream;

  KernelChoice choice;
  const Status selected = select_kernel(params, &choice);
  // Whether the family serves the call is the library's own routing
  // (select_kernel), never restated here; a refusal must name the family and
  // hold for forward too, which then writes nothing.
  if (impl == Impl::sm90_wgmma && !selected.ok()) {
    EXPECT_EQ(selected.code, StatusCode::impl_unavailable) << status_text(selected);
    EXPECT_NE(selected.message.find("sm90_wgmma"), std::string::npos) << selected.message;
    EXPECT_EQ(forward(params).code, StatusCode::impl_unavailable);
    return;
  }
  ASSERT_TRUE(selected.ok()) << "select_kernel: " << status_text(selected);
  const std::string kernel = describe(choice);
  SCOPED_TRACE("impl " + std::string(impl_label(impl)) + " runs " + kernel);
  ::testing::Test::RecordProperty(std::string("kernel_") + impl_label(impl), kernel);
  std::cout << "[ kernel   ] " << impl_label(impl) << " -> " << kernel << std::endl;

  const Status status = forward(params);
  ASSERT_TRUE(status.ok()) << "forward: " << status_text(status);
  ASSERT_NO_FATAL_FAILURE(copy_to_host(o, &host->o.buffer, stream));
  if (host->lse.present()) {
    ASSERT_NO_FATAL_FAILURE(copy_to_host(lse, &host->lse.buffer, stream));
  }

  expect_no_nan(host->o.view, "o");
  expect_gaps_poisoned(host->o, "o");
  if (host->lse.present()) {
    expect_no_nan(host->lse.view, "lse");
    expect_gaps_poisoned(host->lse, "lse");
  }
  expect_matches_reference(c, *host, ref, impl);
}

// Fresh inputs, the reference once, then every GPU impl.
void check_case(const ForwardCase& c, cudaStream_t stream) {
  const TestSeed seed = fresh_test_seed();
  SCOPED_TRACE(seed.note);
  HostProblem host = make_host_problem(c, seed.value);
  Reference ref;
  ASSERT_NO_FATAL_FAILURE(compute_reference(c, host, seed.value, &ref));
  DeviceInputs inputs;
  ASSERT_NO_FATAL_FAILURE(upload_inputs(host, &inputs));
  for (Impl impl : kGpuImpls) {
    ASSERT_NO_FATAL_FAILURE(run_and_compare(c, &host, inputs, ref, impl, stream));
  }
}

// --- cases -------------------------------------------------------------------------------

constexpr DType f16 = DType::f16, bf16 = DType::bf16;
constexpr Causal top_left = Causal::top_left, bottom_right = Causal::bottom_right;

// Nq, Nkv <= 129; head dims 8, 40, 72, 128, 200, 520, 1024.
std::vector<ForwardCase> small_cases() {
  std::vector<ForwardCase> cases = {
      // Shapes and head dims (padded inside, or split across CTAs above the
      // largest instantiation).
      shape_case(f16, 1, 1, 1, 1, 1, 8),
      shape_case(bf16, 1, 2, 2, 1, 7, 40),
      shape_case(f16, 2, 2, 1, 7, 129, 72),
      shape_case(bf16, 1, 2, 2, 129, 7, 128),
      shape_case(f16, 1, 2, 2, 63, 63, 200),
      shape_case(bf16, 2, 1, 1, 129, 129, 520),
      shape_case(f16, 1, 1, 1, 1, 129, 1024),
      shape_case(bf16, 1, 2, 2, 129, 63, 1024),
      shape_case(f16, 1, 2, 2, 129, 1, 520),
      shape_case(bf16, 1, 1, 1, 7, 7, 8),
      // GQA ratios 2, 8 and Hq (1 is everywhere else).
      shape_case(f16, 1, 8, 4, 63, 129, 72),
      shape_case(bf16, 1, 16, 2, 63, 129, 128),
      shape_case(bf16, 2, 8, 1, 129, 63, 72),
      shape_case(f16, 1, 4, 1, 7, 129, 200),
      // Causal alignments with Nq < Nkv, Nq > Nkv and Nq == Nkv.
      shape_case(f16, 1, 2, 2, 7, 129, 72).with_causal(top_left),
      shape_case(f16, 1, 2, 1, 129, 7, 128).with_causal(top_left),
      shape_case(bf16, 1, 2, 1, 7, 129, 128).with_causal(bottom_right),
      shape_case(bf16, 1, 2, 2, 129, 7, 72).with_causal(bottom_right),
      shape_case(f16, 1, 2, 2, 129, 63, 1024).with_causal(bottom_right),
      shape_case(bf16, 1, 2, 2, 63, 129, 520).with_causal(top_left),
      shape_case(bf16, 1, 2, 2, 1, 129, 40).with_causal(bottom_right),
      shape_case(f16, 1, 2, 2, 129, 129, 8).with_causal(top_left),
      // Every key masked out.
      shape_case(bf16, 1, 2, 1, 63, 129, 72).with_mask(DType::boolean, MaskShape::keys, true),
      shape_case(f16, 2, 2, 1, 7, 63, 128).with_mask(DType::f32, MaskShape::keys, true),
      // Dropout.
      shape_case(f16, 1, 2, 2, 63, 129, 72).with_dropout(0.1f),
      shape_case(bf16, 1, 2, 1, 129, 63, 128).with_causal(top_left).with_dropout(0.5f),
      shape_case(bf16, 2, 2, 2, 7, 129, 520)
          .with_causal(bottom_right)
          .with_mask(DType::boolean, MaskShape::batch_rows, true)
          .with_dropout(0.1f),
      shape_case(f16, 1, 2, 2, 129, 129, 1024).with_dropout(0.5f),
      // fp16 accumulation.
      shape_case(f16, 1, 2, 2, 63, 129, 72).with_f16_accumulation(),
      shape_case(f16, 1, 2, 1, 129, 129, 520).with_causal(bottom_right).with_f16_accumulation(),
      shape_case(f16, 1, 2, 2, 7, 63, 1024).with_dropout(0.1f).with_f16_accumulation(),
      // Strided layouts.
      shape_case(bf16, 1, 4, 2, 63, 129, 72).with_layout(Layout::bnhd),
      shape_case(f16, 1, 2, 2, 129, 63, 128).with_row_pad(8),
      shape_case(bf16, 2, 2, 1, 7, 129, 200)
          .with_causal(top_left)
          .with_mask(DType::f16, MaskShape::batch_rows, true)
          .with_layout(Layout::bnhd)
          .with_row_pad(8),
      shape_case(f16, 1, 4, 2, 129, 129, 1024).with_layout(Layout::bnhd),
      // A large scale (sharp softmax), and no lse requested.
      shape_case(bf16, 1, 2, 2, 63, 129, 72).with_scale(1.0f),
      shape_case(f16, 1, 2, 2, 63, 63, 128).without_lse(),
  };
  // Every mask dtype with every mask shape, rows masked out where the mask
  // has rows (the last batch for [B,1,1,Nkv]). An odd Nkv makes every mask
  // row but [1,1,1,Nkv]'s start off a key-pair boundary (the kernels read it
  // element by element); an even one lets them read key pairs, up to a
  // ragged last block (130 keys).
  const DType mask_dtypes[] = {DType::boolean, DType::f16, DType::bf16, DType::f32};
  const MaskShape mask_shapes[] = {MaskShape::keys, MaskShape::batch_keys, MaskShape::batch_rows,
                                   MaskShape::full, MaskShape::stride0_view};
  const int64_t dims[] = {8, 72, 128, 200};
  const Causal causals[] = {Causal::none, top_left, bottom_right};
  int n = 0;
  for (const bool pair_aligned : {false, true}) {
    for (DType mask_dtype : mask_dtypes) {
      for (MaskShape mask_shape : mask_shapes) {
        const bool long_keys = n % 2 == 0;
        const int64_t short_side = pair_aligned ? 64 : 63, long_side = pair_aligned ? 130 : 129;
        cases.push_back(shape_case(n % 2 ? bf16 : f16, 2, 2, 1, long_keys ? short_side : long_side,
                                   long_keys ? long_side : short_side, dims[n % 4])
                            .with_causal(causals[n % 3])
                            .with_mask(mask_dtype, mask_shape, mask_shape != MaskShape::keys));
        ++n;
      }
    }
  }
  return cases;
}

// At least one of Nq, Nkv >= 777; B * Hq small, so that the reference stays
// cheap (rows are sampled for Nq >= 777).
std::vector<ForwardCase> large_cases() {
  std::vector<ForwardCase> cases = {
      // 8191 x 8191 for both dtypes.
      shape_case(f16, 1, 2, 2, 8191, 8191, 128),
      shape_case(bf16, 1, 2, 1, 8191, 8191, 1024).with_causal(bottom_right),
      shape_case(f16, 1, 2, 1, 8191, 8191, 520).with_causal(top_left),
      shape_case(bf16, 1, 2, 2, 8191, 8191, 64)
          .with_causal(top_left)
          .with_mask(DType::boolean, MaskShape::keys, false)
          .with_dropout(0.1f),
      // Causal alignments with Nq < Nkv and Nq > Nkv.
      shape_case(f16, 1, 2, 1, 777, 8191, 256).with_causal(top_left),
      shape_case(bf16, 1, 2, 1, 777, 8191, 256).with_causal(bottom_right),
      shape_case(bf16, 1, 2, 2, 8191, 777, 128).with_causal(top_left),
      shape_case(f16, 1, 2, 2, 8191, 777, 512).with_causal(bottom_right),
      shape_case(bf16, 1, 2, 2, 129, 8191, 768).with_causal(bottom_right),
      shape_case(f16, 1, 2, 2, 8191, 129, 40).with_causal(top_left),
      // GQA ratios Hq, 2, 8.
      shape_case(bf16, 1, 8, 1, 777, 777, 128),
      shape_case(f16, 1, 8, 4, 777, 8191, 64),
      shape_case(bf16, 2, 16, 2, 777, 129, 320),
      // Masks.
      shape_case(bf16, 1, 2, 1, 777, 8191, 128)
          .with_mask(DType::boolean, MaskShape::batch_rows, true),
      shape_case(f16, 1, 2, 2, 777, 777, 256)
          .with_causal(top_left)
          .with_mask(DType::f32, MaskShape::full, true),
      shape_case(f16, 1, 2, 1, 8191, 8191, 72)
          .with_causal(bottom_right)
          .with_mask(DType::f16, MaskShape::keys, false),
      shape_case(bf16, 2, 2, 2, 8191, 777, 72).with_mask(DType::bf16, MaskShape::batch_keys, true),
      shape_case(bf16, 1, 2, 1, 777, 777, 512)
          .with_causal(top_left)
          .with_mask(DType::boolean, MaskShape::stride0_view, true),
      // Masks read by key pairs with whole KV blocks: the sm90 kernels that
      // start S at the mask (kMaskInS), one CTA and a cluster, every mask
      // dtype, with a ragged last block added in the softmax.
      shape_case(f16, 1, 2, 2, 777, 1024, 512).with_mask(DType::f32, MaskShape::full, true),
      shape_case(bf16, 1, 2, 2, 129, 300, 1024).with_causal(top_left).with_mask(DType::f16, MaskShape::full, true),
      shape_case(f16, 2, 2, 1, 65, 258, 640).with_causal(bottom_right).with_mask(DType::boolean, MaskShape::keys, true),
      shape_case(bf16, 2, 2, 2, 129, 256, 320).with_mask(DType::bf16, MaskShape::batch_rows, true),
      // Dropout.
      shape_case(f16, 1, 2, 1, 777, 8191, 128).with_dropout(0.1f),
      shape_case(bf16, 1, 2, 2, 8191, 777, 1000).with_causal(bottom_right).with_dropout(0.5f),
      shape_case(f16, 1, 2, 2, 777, 777, 392)
          .with_mask(DType::bf16, MaskShape::batch_rows, true)
          .with_dropout(0.5f),
      // fp16 accumulation.
      shape_case(f16, 1, 2, 1, 777, 8191, 128).with_f16_accumulation(),
      shape_case(f16, 1, 2, 2, 8191, 777, 1024).with_causal(top_left).with_f16_accumulation(),
      shape_case(f16, 1, 2, 2, 8191, 8191, 64).with_f16_accumulation(),
      // Strided layouts.
      shape_case(bf16, 1, 4, 2, 8191, 777, 128).with_layout(Layout::bnhd),
      shape_case(f16, 1, 2, 1, 777, 8191, 200).with_row_pad(8),
      shape_case(bf16, 1, 8, 2, 777, 777, 1024).with_layout(Layout::bnhd).with_row_pad(8),
  };
  // Every head dim of the list for both dtypes, over rotating shapes.
  const int64_t dims[] = {8, 40, 64, 72, 128, 200, 256, 320, 392, 512, 520, 640, 768, 1000, 1024};
  const int64_t shapes[][2] = {{777, 777}, {777, 8191}, {8191, 777}, {129, 8191},
                               {8191, 129}, {1, 8191},  {8191, 7}};
  int n = 0;
  for (int64_t dim : dims) {
    for (DType dtype : {f16, bf16}) {
      const auto& shape = shapes[n % 7];
      cases.push_back(shape_case(dtype, 1, 2, 1 + n % 2, shape[0], shape[1], dim));
      ++n;
    }
  }
  return cases;
}

// Decode and speculative decode (Nq in {1, 2, 4, 7, 16}) against long and odd
// KV lengths: the sm90 family splits the keys (split-KV) and packs the query
// heads of a GQA group into one tile (kernels/common/split_kv.hpp), so each
// feature is crossed with packing (groups of 1 to 64 heads, 3 and 6 packing 1
// and 2) and with both kinds of tile (one CTA, a cluster above D = 512).
std::vector<ForwardCase> decode_cases() {
  return {
      shape_case(bf16, 2, 8, 2, 1, 8191, 512),
      shape_case(f16, 1, 8, 1, 2, 3001, 320).with_causal(bottom_right),
      shape_case(bf16, 1, 16, 2, 4, 4099, 512)
          .with_causal(bottom_right)
          .with_mask(DType::bf16, MaskShape::full, true),
      shape_case(f16, 2, 8, 2, 7, 2047, 1024).with_mask(DType::boolean, MaskShape::batch_rows, true),
      shape_case(bf16, 1, 8, 1, 16, 1537, 512).with_dropout(0.2f),
      shape_case(bf16, 1, 12, 4, 1, 5000, 512),
      shape_case(f16, 1, 12, 2, 3, 777, 320)
          .with_layout(Layout::bnhd)
          .with_mask(DType::f32, MaskShape::full, true),
      shape_case(bf16, 1, 4, 1, 1, 1, 512),
      shape_case(bf16, 1, 4, 2, 2, 100003, 512).with_causal(bottom_right),
      shape_case(f16, 1, 8, 2, 1, 20000, 1024).with_dropout(0.1f),
      shape_case(bf16, 1, 64, 1, 1, 3000, 512),
      shape_case(bf16, 1, 8, 2, 4, 1001, 512)
          .with_causal(bottom_right)
          .with_mask(DType::f16, MaskShape::keys, true),
      shape_case(f16, 1, 8, 2, 1, 4096, 512).with_row_pad(8).without_lse(),
      shape_case(bf16, 2, 4, 2, 16, 3000, 320).with_mask(DType::boolean, MaskShape::full, true),
      shape_case(f16, 1, 8, 2, 7, 6000, 768)
          .with_causal(bottom_right)
          .with_mask(DType::bf16, MaskShape::batch_keys, true)
          .with_dropout(0.3f),
  };
}

// --- tests -----------------------------------------------------------------------------

class GpuForward : public ::testing::TestWithParam<ForwardCase> {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  }
};

TEST_P(GpuForward, MatchesCpuReference) { check_case(GetParam(), nullptr); }

std::string param_name(const ::testing::TestParamInfo<ForwardCase>& info) {
  return case_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Small, GpuForward, ::testing::ValuesIn(small_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Large, GpuForward, ::testing::ValuesIn(large_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(Decode, GpuForward, ::testing::ValuesIn(decode_cases()), param_name);

class GpuForwardSmall : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  }
};

TEST_F(GpuForwardSmall, NonDefaultStream) {
  OwnedStream stream;
  ASSERT_NO_FATAL_FAILURE(stream.create());
  check_case(shape_case(bf16, 2, 4, 2, 129, 129, 128)
                 .with_causal(bottom_right)
                 .with_mask(DType::boolean, MaskShape::batch_rows, true),
             stream.get());
}

// B = 0 or Nq = 0: success, and the (poisoned) outputs keep every byte.
TEST_F(GpuForwardSmall, EmptyBatchOrQueriesWritesNothing) {
  constexpr size_t kBufferBytes = 4096;  // holds every tensor below
  constexpr int64_t heads_q = 4, heads_kv = 2, seq_kv = 7, dim = 64;
  struct Sizes {
    int64_t batch, seq_q;
  };
  for (const Sizes sizes : {Sizes{0, 63}, Sizes{2, 0}}) {
    for (Impl impl : kGpuImpls) {
      SCOPED_TRACE("B = " + std::to_string(sizes.batch) + ", Nq = " + std::to_string(sizes.seq_q) +
                   ", impl " + impl_label(impl));
      DeviceBuffer q, k, v, o, mask, lse;
      for (DeviceBuffer* buffer : {&q, &k, &v, &o, &mask, &lse}) {
        ASSERT_NO_FATAL_FAILURE(buffer->allocate(kBufferBytes));
        FFPA_ASSERT_CUDA(cudaMemset(buffer->data(), 0xFF, kBufferBytes));  // NaN in f16 and f32
      }
      ForwardParams params;
      params.q = make_tensor(q.data(), f16, {sizes.batch, heads_q, sizes.seq_q, dim});
      params.k = make_tensor(k.data(), f16, {sizes.batch, heads_kv, seq_kv, dim});
      params.v = make_tensor(v.data(), f16, {sizes.batch, heads_kv, seq_kv, dim});
      params.o = make_tensor(o.data(), f16, {sizes.batch, heads_q, sizes.seq_q, dim});
      params.mask = make_tensor(mask.data(), DType::boolean, {sizes.batch, 1, sizes.seq_q, seq_kv});
      params.lse = make_tensor(lse.data(), DType::f32, {sizes.batch, heads_q, sizes.seq_q});
      params.options.causal = bottom_right;
      params.options.dropout_p = 0.1f;
      params.options.impl = impl;

      const Status status = forward(params);
      EXPECT_TRUE(status.ok()) << status_text(status);
      FFPA_ASSERT_CUDA(cudaDeviceSynchronize());
      for (const DeviceBuffer* buffer : {&o, &lse}) {
        std::vector<unsigned char> bytes(kBufferBytes);
        FFPA_ASSERT_CUDA(cudaMemcpy(bytes.data(), buffer->data(), kBufferBytes, cudaMemcpyDeviceToHost));
        int64_t written = 0;
        for (unsigned char byte : bytes) written += byte != 0xFF;
        EXPECT_EQ(written, 0) << (buffer == &o ? "o" : "lse") << ": " << written
                              << " bytes were written";
      }
    }
  }
}

// The suite decides whether sm90_wgmma serves a case by asking select_kernel;
// this keeps that from passing vacuously: on a device that runs the family,
// a plain bf16 call at each compiled head dim is served by that instance.
TEST_F(GpuForwardSmall, Sm90WgmmaServesEveryCompiledHeadDim) {
  if (!device_runs_sm90()) GTEST_SKIP() << "device 0 does not run sm_90a kernels, or the build has none";
  for (int i = 0; i < detail::sm90_wgmma::kInstanceCount; ++i) {
    const int64_t dim = detail::sm90_wgmma::kInstances[i].head_dim;
    SCOPED_TRACE("D = " + std::to_string(dim));
    DeviceBuffer q, k, v, o;
    for (DeviceBuffer* buffer : {&q, &k, &v, &o}) ASSERT_NO_FATAL_FAILURE(buffer->allocate(2 * 64 * dim * 2));
    ForwardParams params;
    params.q = make_tensor(q.data(), bf16, {1, 2, 64, dim});
    params.k = make_tensor(k.data(), bf16, {1, 2, 64, dim});
    params.v = make_tensor(v.data(), bf16, {1, 2, 64, dim});
    params.o = make_tensor(o.data(), bf16, {1, 2, 64, dim});
    params.options.impl = Impl::sm90_wgmma;
    KernelChoice choice;
    const Status status = select_kernel(params, &choice);
    ASSERT_TRUE(status.ok()) << status_text(status);
    EXPECT_EQ(choice.padded_head_dim, dim);
  }
}

// The device the suite runs on runs this build's kernels: device_support says
// so for automatic and sm80_split_d, and for sm90_wgmma exactly where the
// family runs; an ordinal past the visible devices is an invalid option; the
// query leaves the current device as it found it.
TEST_F(GpuForwardSmall, DeviceSupportAgreesWithTheDevice) {
  int device = -1, count = 0;
  FFPA_ASSERT_CUDA(cudaGetDevice(&device));
  FFPA_ASSERT_CUDA(cudaGetDeviceCount(&count));
  const Status automatic = device_support(device, Impl::automatic);
  EXPECT_TRUE(automatic.ok()) << status_text(automatic);
  const Status split_d = device_support(device, Impl::sm80_split_d);
  EXPECT_TRUE(split_d.ok()) << status_text(split_d);
  const Status sm90 = device_support(device, Impl::sm90_wgmma);
  EXPECT_EQ(sm90.ok(), device_runs_sm90()) << status_text(sm90);
  if (!sm90.ok()) EXPECT_EQ(sm90.code, StatusCode::impl_unavailable);
  EXPECT_EQ(device_support(count, Impl::automatic).code, StatusCode::invalid_option);
  for (int other = 0; other < count; ++other) {
    const Status status = device_support(other, Impl::automatic);
    EXPECT_TRUE(status.ok() || status.code == StatusCode::impl_unavailable) << status_text(status);
  }
  int after = -1;
  FFPA_ASSERT_CUDA(cudaGetDevice(&after));
  EXPECT_EQ(after, device);
}

// An explicit GPU impl never falls back to another one for host pointers.
TEST_F(GpuForwardSmall, ExplicitSm80SplitDWithHostPointersIsWrongMemorySpace) {
  const ForwardCase c = shape_case(bf16, 1, 2, 1, 7, 63, 64)
                            .with_mask(DType::boolean, MaskShape::batch_rows, false);
  const TestSeed seed = fresh_test_seed();
  SCOPED_TRACE(seed.note);
  HostProblem host = make_host_problem(c, seed.value);
  ForwardParams params = host_params(host);
  params.options.impl = Impl::sm80_split_d;
  const Status status = forward(params);
  EXPECT_EQ(status.code, StatusCode::wrong_memory_space) << status_text(status);
  EXPECT_FALSE(status.message.empty());
  expect_untouched(host.o.buffer, "o");
  expect_untouched(host.lse.buffer, "lse");
}

// o in host memory, everything else on the device: an error for every impl,
// and neither output is written.
TEST_F(GpuForwardSmall, HostOutputWithDeviceInputsIsWrongMemorySpace) {
  const ForwardCase c = shape_case(f16, 1, 2, 2, 63, 63, 128);
  const TestSeed seed = fresh_test_seed();
  SCOPED_TRACE(seed.note);
  HostProblem host = make_host_problem(c, seed.value);
  DeviceInputs inputs;
  ASSERT_NO_FATAL_FAILURE(upload_inputs(host, &inputs));
  for (Impl impl : kGpuImpls) {
    SCOPED_TRACE(std::string("impl ") + impl_label(impl));
    DeviceTensor lse;
    ASSERT_NO_FATAL_FAILURE(mirror_to_device(host.lse.buffer, host.lse.view, &lse));
    ForwardParams params = host_params(host);
    params.q = inputs.q.tensor;
    params.k = inputs.k.tensor;
    params.v = inputs.v.tensor;
    params.lse = lse.tensor;
    params.options.impl = impl;
    const Status status = forward(params);
    EXPECT_EQ(status.code, StatusCode::wrong_memory_space) << status_text(status);
    FFPA_ASSERT_CUDA(cudaDeviceSynchronize());
    expect_untouched(host.o.buffer, "o");
    HostTensor lse_after = host.lse.buffer;
    ASSERT_NO_FATAL_FAILURE(copy_to_host(lse, &lse_after, nullptr));
    expect_untouched(lse_after, "lse");
  }
}

class GpuForwardLarge : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_unavailable_reason()) GTEST_SKIP() << *gpu_unavailable_reason();
  }
};

// Tensors with more than 2^31 elements: q and o have a batch stride of
// 2^31 + 64 elements, so batch 1 starts past element 2^31 (only the rows in use
// are copied; the buffers are ~4.3 GB each). A 32-bit offset anywhere shows up
// as a wrong batch 1 or a fault.
TEST_F(GpuForwardLarge, OffsetsBeyond2To31Elements) {
  constexpr int64_t kBatchStride = (int64_t{1} << 31) + 64;
  constexpr int64_t batch = 2, seq_q = 100, seq_kv = 300, dim = 128;
  const TestSeed seed = fresh_test_seed();
  SCOPED_TRACE(seed.note);
  HostTensor q = make_host_tensor(DType::bf16, {batch, 1, seq_q, dim});
  HostTensor k = make_host_tensor(DType::bf16, {batch, 1, seq_kv, dim});
  HostTensor v = make_host_tensor(DType::bf16, {batch, 1, seq_kv, dim});
  HostTensor o = make_host_tensor(DType::bf16, {batch, 1, seq_q, dim});
  fill_uniform(q, derive_seed(seed.value, 1), -2.0f, 2.0f);
  fill_uniform(k, derive_seed(seed.value, 2), -1.0f, 1.0f);
  fill_uniform(v, derive_seed(seed.value, 3), -1.0f, 1.0f);

  const size_t rows_bytes = seq_q * dim * 2;  // one batch of q or o
  const size_t big_bytes = static_cast<size_t>(kBatchStride) * 2 + rows_bytes;
  DeviceBuffer q_dev, o_dev, k_dev, v_dev;
  ASSERT_NO_FATAL_FAILURE(q_dev.allocate(big_bytes));
  ASSERT_NO_FATAL_FAILURE(o_dev.allocate(big_bytes));
  ASSERT_NO_FATAL_FAILURE(k_dev.allocate(k.bytes()));
  ASSERT_NO_FATAL_FAILURE(v_dev.allocate(v.bytes()));
  auto batch_address = [&](const DeviceBuffer& buffer, int64_t b) {
    return static_cast<unsigned char*>(buffer.data()) + b * kBatchStride * 2;
  };
  for (int64_t b = 0; b < batch; ++b) {
    FFPA_ASSERT_CUDA(cudaMemcpy(batch_address(q_dev, b),
                                static_cast<unsigned char*>(q.tensor.data) + b * rows_bytes,
                                rows_bytes, cudaMemcpyHostToDevice));
    FFPA_ASSERT_CUDA(cudaMemset(batch_address(o_dev, b), 0xFF, rows_bytes));  // NaN poison
  }
  FFPA_ASSERT_CUDA(cudaMemcpy(k_dev.data(), k.tensor.data, k.bytes(), cudaMemcpyHostToDevice));
  FFPA_ASSERT_CUDA(cudaMemcpy(v_dev.data(), v.tensor.data, v.bytes(), cudaMemcpyHostToDevice));

  ForwardParams device_params;
  device_params.q = make_tensor(q_dev.data(), DType::bf16, {batch, 1, seq_q, dim});
  device_params.o = make_tensor(o_dev.data(), DType::bf16, {batch, 1, seq_q, dim});
  device_params.q.stride[0] = device_params.o.stride[0] = kBatchStride;
  device_params.k = make_tensor(k_dev.data(), DType::bf16, {batch, 1, seq_kv, dim});
  device_params.v = make_tensor(v_dev.data(), DType::bf16, {batch, 1, seq_kv, dim});
  device_params.options.causal = Causal::bottom_right;
  const Status status = forward(device_params);
  ASSERT_TRUE(status.ok()) << status_text(status);
  for (int64_t b = 0; b < batch; ++b) {
    FFPA_ASSERT_CUDA(cudaMemcpy(static_cast<unsigned char*>(o.tensor.data) + b * rows_bytes,
                                batch_address(o_dev, b), rows_bytes, cudaMemcpyDeviceToHost));
  }

  ForwardParams host_params;
  host_params.q = q.tensor;
  host_params.k = k.tensor;
  host_params.v = v.tensor;
  host_params.o = o.tensor;
  host_params.options.causal = Causal::bottom_right;
  detail::AttentionProblem problem;
  ASSERT_TRUE(detail::validate_forward(host_params, &problem).ok());
  std::vector<double> ref(static_cast<size_t>(batch * seq_q * dim));
  detail::cpu_attention_forward_f64(problem, {}, ref.data(), nullptr);
  for (int64_t b = 0; b < batch; ++b) {
    double err = 0, norm = 0;
    for (int64_t i = 0; i < seq_q * dim; ++i) {
      const double got = element_as_double(o.tensor, {b, 0, i / dim, i % dim});
      ASSERT_FALSE(std::isnan(got)) << "batch " << b << " element " << i << " not written";
      const double want = ref[static_cast<size_t>(b * seq_q * dim + i)];
      err += (got - want) * (got - want);
      norm += want * want;
    }
    EXPECT_LE(std::sqrt(err / norm), o_tolerance(DType::bf16)) << "batch " << b;
  }
}

}  // namespace
}  // namespace ffpa::testing
