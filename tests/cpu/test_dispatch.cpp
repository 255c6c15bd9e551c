// Dispatch: the head-dim routing tables of the split-D and sm90 families,
// kernel naming, and the choice of implementation from the call's options and
// memory space.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "kernels/sm80_split_d/family.hpp"
#include "kernels/sm90_backward/family.hpp"
#include "kernels/sm90_wgmma/family.hpp"
#include "support/host_tensors.hpp"

namespace {

using namespace ffpa;
namespace split_d = ffpa::detail::sm80_split_d;
using split_d::kInstanceCount;
using split_d::kInstances;
using split_d::tile_shape;
using ffpa::testing::make_host_tensor;

TEST(SplitDRouting, InstancesAreAscendingMultiplesOf64) {
  ASSERT_GT(kInstanceCount, 0);
  for (int i = 0; i < kInstanceCount; ++i) {
    EXPECT_EQ(kInstances[i].out_cols % 64, 0);
    if (i > 0) EXPECT_GT(kInstances[i].out_cols, kInstances[i - 1].out_cols);
  }
}

constexpr int kH200SharedMemory = 232448;  // bytes per block, opt-in
constexpr int kSm86SharedMemory = 101376;  // sm86, sm89, sm120

// Every head dim of the spec's range is served: by the smallest instance that
// holds it (padding), or by splitting Dv over the largest one.
TEST(SplitDRouting, EveryHeadDimIsServed) {
  const int largest = kInstances[kInstanceCount - 1].out_cols;
  for (int d = 8; d <= 1024; d += 8) {
    const auto route = split_d::route(d, kH200SharedMemory);
    SCOPED_TRACE("D = " + std::to_string(d));
    ASSERT_GE(route.value_splits, 1);
    EXPECT_GE(route.out_cols * route.value_splits, d);
    EXPECT_LT(route.out_cols * (route.value_splits - 1), d) << "a split with no column of D";
    if (d <= largest) {
      EXPECT_EQ(route.value_splits, 1);
      for (int i = 0; i < kInstanceCount; ++i) {
        if (kInstances[i].out_cols >= d) {
          EXPECT_EQ(route.out_cols, kInstances[i].out_cols) << "not the smallest instance";
          break;
        }
      }
    } else {
      EXPECT_EQ(route.out_cols, largest);
    }
  }
}

// On parts with ~99 KB of shared memory per block only the instances that fit
// serve, splitting Dv where needed; every head dim still has a route.
TEST(SplitDRouting, SmallSharedMemoryFallsBackToInstancesThatFit) {
  using split_d::smem_layout;
  for (int d = 8; d <= 1024; d += 8) {
    const auto route = split_d::route(d, kSm86SharedMemory);
    SCOPED_TRACE("D = " + std::to_string(d));
    ASSERT_GT(route.out_cols, 0);
    EXPECT_LE(smem_layout(tile_shape(route.out_cols)).total_bytes, kSm86SharedMemory);
    EXPECT_GE(route.out_cols * route.value_splits, d);
  }
  EXPECT_EQ(split_d::route(512, 1024).out_cols, 0) << "nothing fits 1 KB";
}

TEST(SplitDRouting, TilesKeepTheOAccumulatorInRegisters) {
  for (int i = 0; i < kInstanceCount; ++i) {
    const auto tile = tile_shape(kInstances[i].out_cols);
    // fp32 O costs warp_rows * out_cols / warps_n / 32 registers per thread.
    const int o_registers = tile.warp_rows * tile.out_cols / tile.warps_n / 32;
    EXPECT_LE(o_registers, 128) << "out_cols " << tile.out_cols;
    EXPECT_EQ(tile.out_cols, kInstances[i].out_cols);
  }
}

struct HostCall {
  ffpa::testing::HostTensor q, k, v, o;
  ForwardParams params;
};

HostCall host_call(int64_t d, DType dtype = DType::bf16) {
  HostCall c;
  c.q = make_host_tensor(dtype, {1, 2, 5, d});
  c.k = make_host_tensor(dtype, {1, 2, 7, d});
  c.v = make_host_tensor(dtype, {1, 2, 7, d});
  c.o = make_host_tensor(dtype, {1, 2, 5, d});
  c.params.q = c.q.tensor;
  c.params.k = c.k.tensor;
  c.params.v = c.v.tensor;
  c.params.o = c.o.tensor;
  return c;
}

// --- sm90 family: what it serves and why it declines ------------------------------

// A contiguous [1, 8, 1000, D] bf16 problem (device pointers are not needed:
// routing reads shapes, strides and alignment only).
ffpa::detail::AttentionProblem sm90_problem(int64_t head_dim) {
  ffpa::detail::AttentionProblem p;
  p.batch = 1, p.heads_q = p.heads_kv = 8, p.seq_q = p.seq_kv = 1000, p.head_dim = head_dim;
  alignas(16) static unsigned char buffer[16];
  p.q = p.k = p.v = buffer;
  p.o = buffer;
  for (int64_t* stride : {p.q_stride, p.k_stride, p.v_stride, p.o_stride}) {
    stride[2] = head_dim, stride[1] = 1000 * head_dim, stride[0] = 8 * 1000 * head_dim;
  }
  return p;
}

TEST(Sm90Routing, ServesEachHeadDimWithTheSmallestInstanceThatHoldsIt) {
  if (ffpa::detail::sm90_wgmma::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  const int largest =
      ffpa::detail::sm90_wgmma::kInstances[ffpa::detail::sm90_wgmma::kInstanceCount - 1].head_dim;
  for (int d = 8; d <= largest; d += 8) {
    SCOPED_TRACE("D = " + std::to_string(d));
    std::string reason;
    const auto* instance = ffpa::detail::sm90_wgmma::route(sm90_problem(d), &reason);
    ASSERT_NE(instance, nullptr) << reason;
    EXPECT_GE(instance->head_dim, d);
    for (int i = 0; i < ffpa::detail::sm90_wgmma::kInstanceCount; ++i) {
      const int other = ffpa::detail::sm90_wgmma::kInstances[i].head_dim;
      if (other >= d) EXPECT_GE(other, instance->head_dim) << "a smaller instance holds D";
    }
  }
}

TEST(Sm90Routing, DeclinesWithAReason) {
  if (ffpa::detail::sm90_wgmma::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  std::string reason;
  const int largest =
      ffpa::detail::sm90_wgmma::kInstances[ffpa::detail::sm90_wgmma::kInstanceCount - 1].head_dim;
  if (largest < 1024) {  // a head dim the library takes but this build's family does not
    const int above = largest + 8;
    EXPECT_EQ(ffpa::detail::sm90_wgmma::route(sm90_problem(above), &reason), nullptr);
    EXPECT_NE(reason.find("head dim " + std::to_string(above)), std::string::npos) << reason;
  }

  auto f16_accumulation = sm90_problem(512);
  f16_accumulation.dtype = DType::f16;
  f16_accumulation.accumulation = Accumulation::f16;
  EXPECT_EQ(ffpa::detail::sm90_wgmma::route(f16_accumulation, &reason), nullptr);
  EXPECT_NE(reason.find("fp16 accumulation"), std::string::npos) << reason;

  auto odd_rows = sm90_problem(512);
  odd_rows.k_stride[2] = 516;  // 1032-byte rows: not a multiple of 16 bytes
  EXPECT_EQ(ffpa::detail::sm90_wgmma::route(odd_rows, &reason), nullptr);
  EXPECT_NE(reason.find("TMA"), std::string::npos) << reason;

  // D_qk != D_v: the instance of the wider head dim; the FP8 kernels decline it.
  auto mla = sm90_problem(576);  // absorbed MLA: D_qk 576, D_v 512
  mla.value_dim = 512;
  if (const auto* instance = ffpa::detail::sm90_wgmma::route(mla, &reason)) {
    EXPECT_GE(instance->head_dim, 576);
  } else {
    EXPECT_NE(reason.find("head dim 576"), std::string::npos) << reason;  // a build without an instance that wide
  }
  EXPECT_EQ(ffpa::detail::sm90_wgmma::route_fp8(mla, &reason), nullptr);
  EXPECT_NE(reason.find("D_qk != D_v"), std::string::npos) << reason;
  auto wide_value = sm90_problem(64);
  wide_value.value_dim = 1000;
  if (const auto* wide = ffpa::detail::sm90_wgmma::route(wide_value, &reason)) {
    EXPECT_GE(wide->head_dim, 1000);
  } else {
    EXPECT_NE(reason.find("head dim 1000"), std::string::npos) << reason;  // a build without D 1024
  }
}

// A batch of 4 decode rows over a paged [num_blocks, Hkv, page_size, D] cache
// (HND, contiguous pages) of the given page size.
ffpa::detail::AttentionProblem sm90_paged_problem(int64_t head_dim, int64_t page_size) {
  ffpa::detail::AttentionProblem p = sm90_problem(head_dim);
  p.batch = 4, p.seq_q = 1;
  alignas(16) static int32_t table[4 * 64];
  ffpa::detail::SequenceLayout& s = p.sequences;
  s.active = true;
  s.queries_per_sequence = 1;
  s.block_table = table;
  s.max_blocks = 64;
  s.block_table_stride[0] = 64, s.block_table_stride[1] = 1;
  s.page_size = page_size;
  s.num_blocks = 1000;
  p.seq_kv = s.max_blocks * page_size;
  for (int64_t* stride : {p.k_stride, p.v_stride}) {
    stride[2] = head_dim, stride[1] = page_size * head_dim, stride[0] = 8 * page_size * head_dim;
  }
  for (int64_t* stride : {p.q_stride, p.o_stride}) stride[2] = head_dim, stride[1] = head_dim, stride[0] = 8 * head_dim;
  return p;
}

// Any page size: the producer warpgroup gathers the page sizes TMA cannot
// box (not multiples of 8) and, by the measured threshold, those whose
// boxes would hold 8 rows; TMA loads a box per page of the multiples of 16.
// The kernel's name says which.
TEST(Sm90Routing, ServesEveryPageSizeGatheringSmallOnes) {
  namespace sm90 = ffpa::detail::sm90_wgmma;
  for (int64_t page : {1, 2, 3, 5, 7, 8, 24, 63, 65, 72, 100, 250}) {
    EXPECT_TRUE(sm90::gathers_pages(page)) << "page size " << page;
  }
  for (int64_t page : {16, 48, 64, 80, 128, 256, 4096}) EXPECT_FALSE(sm90::gathers_pages(page)) << "page size " << page;
  if (sm90::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  for (int64_t page : {1, 3, 5, 16, 64, 100, 256}) {
    SCOPED_TRACE("page size " + std::to_string(page));
    const ffpa::detail::AttentionProblem p = sm90_paged_problem(256, page);
    std::string reason;
    const sm90::Instance* instance = sm90::route(p, &reason);
    ASSERT_NE(instance, nullptr) << reason;
    const std::string name = sm90::kernel_name(p, *instance);
    EXPECT_EQ(name.find(",paged-gather") != std::string::npos, sm90::gathers_pages(page)) << name;
  }
}

// The page-group variant (Traits::kPageGroups) takes a TMA-loaded paged
// cache where the instance holds D and Dv exactly and K's and V's maps fold
// the KV head alike: HND (into the pages) and NHD (into the chunks), not a
// padded head stride, a gathered page size, D_qk != D_v, D below the
// instance's, an e4m3 cache, or an instance without the variant. The
// kernel's name says so.
TEST(Sm90Routing, LoadsPagesInKeyGroupsWhereTheInstanceHoldsDExactly) {
  namespace sm90 = ffpa::detail::sm90_wgmma;
  for (int head_dim : {256, 512}) {
    SCOPED_TRACE("D " + std::to_string(head_dim));
    ASSERT_TRUE(sm90::takes_page_groups(head_dim));
    const ffpa::detail::AttentionProblem hnd = sm90_paged_problem(head_dim, 16);
    EXPECT_TRUE(sm90::loads_page_groups(hnd, head_dim));
    ffpa::detail::AttentionProblem nhd = hnd;  // [num_blocks, page_size, Hkv, D]
    for (int64_t* stride : {nhd.k_stride, nhd.v_stride}) {
      stride[2] = nhd.heads_kv * head_dim, stride[1] = head_dim, stride[0] = 16 * nhd.heads_kv * head_dim;
    }
    EXPECT_TRUE(sm90::loads_page_groups(nhd, head_dim));
    ffpa::detail::AttentionProblem padded = nhd;  // heads 2 D apart: neither fold holds
    for (int64_t* stride : {padded.k_stride, padded.v_stride}) {
      stride[2] = 2 * nhd.heads_kv * head_dim, stride[1] = 2 * head_dim, stride[0] = 32 * nhd.heads_kv * head_dim;
    }
    EXPECT_FALSE(sm90::loads_page_groups(padded, head_dim));
    EXPECT_FALSE(sm90::loads_page_groups(sm90_paged_problem(head_dim, 8), head_dim));  // gathered
    ffpa::detail::AttentionProblem narrow_value = hnd;
    narrow_value.value_dim = head_dim - 64;
    EXPECT_FALSE(sm90::loads_page_groups(narrow_value, head_dim));
    EXPECT_FALSE(sm90::loads_page_groups(sm90_paged_problem(head_dim - 64, 16), head_dim));
    ffpa::detail::AttentionProblem codes = hnd;
    codes.kv_e4m3 = true;
    EXPECT_FALSE(sm90::loads_page_groups(codes, head_dim));
    EXPECT_FALSE(sm90::loads_page_groups(sm90_problem(head_dim), head_dim));  // dense
    std::string reason;
    if (const sm90::Instance* instance = sm90::route(hnd, &reason); instance && instance->head_dim == head_dim) {
      EXPECT_NE(sm90::kernel_name(hnd, *instance).find(",page-groups>"), std::string::npos);
      EXPECT_EQ(sm90::kernel_name(narrow_value, *instance).find("page-groups"), std::string::npos);
    }
  }
  EXPECT_FALSE(sm90::takes_page_groups(128));
  EXPECT_FALSE(sm90::loads_page_groups(sm90_paged_problem(128, 16), 128));
}

// The gather keeps a row's place in the cache in one 32-bit word of 16-byte
// units (its row table): a gathered cache of 64 GiB or more is left to sm80_split_d,
// with a reason; TMA boxes (page 64) address it as before.
TEST(Sm90Routing, LeavesAGatheredCacheOf64GiBToAnotherFamily) {
  namespace sm90 = ffpa::detail::sm90_wgmma;
  ffpa::detail::AttentionProblem p = sm90_paged_problem(256, 1);
  EXPECT_TRUE(sm90::gather_units_fit(p));
  const int64_t units = int64_t{1} << 32;  // a page stride of 2^32 16-byte units: block 1 is past the limit
  for (int64_t* stride : {p.k_stride, p.v_stride}) stride[0] = units * 8;
  p.sequences.num_blocks = 2;
  EXPECT_FALSE(sm90::gather_units_fit(p));
  p.sequences.num_blocks = 1;  // only block 0: rows within one page
  EXPECT_TRUE(sm90::gather_units_fit(p));
  p.sequences.num_blocks = 2;
  if (sm90::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  std::string reason;
  EXPECT_EQ(sm90::route(p, &reason), nullptr);
  EXPECT_NE(reason.find("64 GiB"), std::string::npos) << reason;
  ffpa::detail::AttentionProblem boxed = sm90_paged_problem(256, 64);
  for (int64_t* stride : {boxed.k_stride, boxed.v_stride}) stride[0] = units * 8;
  boxed.sequences.num_blocks = 2;
  EXPECT_NE(sm90::route(boxed, &reason), nullptr) << reason;
}

// The cluster kernels (D > 512) do not gather pages (traits.cuh: their dense
// D 1024 ran slower with the gather's code): a gathered page size goes to
// sm80_split_d with a reason, TMA page sizes stay.
TEST(Sm90Routing, LeavesAGatheredCacheAboveD512ToAnotherFamily) {
  namespace sm90 = ffpa::detail::sm90_wgmma;
  if (sm90::kInstanceCount == 0 || sm90::kInstances[sm90::kInstanceCount - 1].head_dim <= 512) {
    GTEST_SKIP() << "no sm90 instance above D 512 in this build";
  }
  std::string reason;
  EXPECT_EQ(sm90::route(sm90_paged_problem(1024, 1), &reason), nullptr);
  EXPECT_NE(reason.find("above D 512"), std::string::npos) << reason;
  EXPECT_NE(sm90::route(sm90_paged_problem(1024, 16), &reason), nullptr) << reason;
  EXPECT_NE(sm90::route(sm90_paged_problem(512, 1), &reason), nullptr) << reason;
}

// An e4m3 cache goes to the smallest instance that carries the e4m3-cache
// variant (takes_cache_codes) and holds D, whatever its page size (the
// converters copy every cache themselves); above D 512 and with dropout to
// another family, with a reason.
TEST(Sm90Routing, SendsAnE4m3CacheToTheInstancesThatTakeCodes) {
  namespace sm90 = ffpa::detail::sm90_wgmma;
  if (sm90::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  for (int64_t dim : {64, 128, 208, 256, 320, 448, 512}) {
    for (int64_t page : {1, 16}) {
      ffpa::detail::AttentionProblem p = sm90_paged_problem(dim, page);
      p.kv_e4m3 = true;
      const sm90::Instance* want = nullptr;
      for (int i = 0; i < sm90::kInstanceCount && want == nullptr; ++i) {
        if (sm90::kInstances[i].head_dim >= dim && sm90::takes_cache_codes(sm90::kInstances[i].head_dim)) {
          want = &sm90::kInstances[i];
        }
      }
      std::string reason;
      const sm90::Instance* got = sm90::route(p, &reason);
      EXPECT_EQ(got, want) << "D " << dim << " page " << page << ": " << reason;
      if (got == nullptr) {
        EXPECT_NE(reason.find("e4m3"), std::string::npos) << reason;
      } else {
        EXPECT_NE(sm90::kernel_name(p, *got).find(",e4m3-cache>"), std::string::npos) << sm90::kernel_name(p, *got);
      }
    }
  }
  ffpa::detail::AttentionProblem dropout = sm90_paged_problem(256, 16);
  dropout.kv_e4m3 = true;
  dropout.dropout_p = 0.1f;
  std::string reason;
  EXPECT_EQ(sm90::route(dropout, &reason), nullptr);
  if (sm90::kInstances[sm90::kInstanceCount - 1].head_dim > 512) {
    ffpa::detail::AttentionProblem wide = sm90_paged_problem(1024, 16);
    wide.kv_e4m3 = true;
    EXPECT_EQ(sm90::route(wide, &reason), nullptr);
    EXPECT_NE(reason.find("above D 512"), std::string::npos) << reason;
  }
}

// --- sm90 backward: what it serves and why it declines ---------------------------

ffpa::detail::BackwardProblem sm90_backward_problem(int64_t head_dim, int64_t value_dim = 0) {
  ffpa::detail::BackwardProblem b;
  b.forward = sm90_problem(head_dim);
  b.forward.value_dim = value_dim;
  alignas(16) static unsigned char buffer[16];
  b.d_o = b.d_q = b.d_k = b.d_v = buffer;
  for (int64_t* stride : {b.d_o_stride, b.d_q_stride, b.d_k_stride, b.d_v_stride}) {
    for (int i = 0; i < 3; ++i) stride[i] = b.forward.q_stride[i];
  }
  return b;
}

TEST(Sm90BackwardRouting, ServesEachHeadDimWithTheSmallestInstanceThatHoldsIt) {
  namespace bwd = ffpa::detail::sm90_backward;
  if (bwd::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  const int largest = bwd::kInstances[bwd::kInstanceCount - 1].head_dim;
  // What a binding reads from ffpa_library_info: the first listed head dim as wide as D serves it.
  const std::vector<int32_t> listed = ffpa::library_info().sm90_backward_head_dims;
  for (int d = 8; d <= largest; d += 8) {
    SCOPED_TRACE("D = " + std::to_string(d));
    std::string reason;
    const bwd::Instance* instance = bwd::route(sm90_backward_problem(d), &reason);
    ASSERT_NE(instance, nullptr) << reason;
    EXPECT_GE(instance->head_dim, d);
    for (int i = 0; i < bwd::kInstanceCount; ++i) {
      if (bwd::kInstances[i].head_dim >= d) EXPECT_GE(bwd::kInstances[i].head_dim, instance->head_dim);
    }
    const auto first = std::find_if(listed.begin(), listed.end(), [d](int32_t head_dim) { return head_dim >= d; });
    ASSERT_NE(first, listed.end());
    EXPECT_EQ(instance->head_dim, *first);
  }
  std::string reason;
  const bwd::Instance* mla = bwd::route(sm90_backward_problem(576, 512), &reason);  // the wider head dim decides
  if (mla != nullptr) EXPECT_GE(mla->head_dim, 576);
  if (largest < 1024) {
    EXPECT_EQ(bwd::route(sm90_backward_problem(largest + 8), &reason), nullptr);
    EXPECT_NE(reason.find("D and Dv up to " + std::to_string(largest)), std::string::npos) << reason;
  }
}

TEST(Sm90BackwardRouting, DeclinesWithAReason) {
  namespace bwd = ffpa::detail::sm90_backward;
  if (bwd::kInstanceCount == 0) GTEST_SKIP() << "built without sm_90a";
  std::string reason;
  auto f32 = sm90_backward_problem(64);
  f32.forward.dtype = DType::f32;
  EXPECT_EQ(bwd::route(f32, &reason), nullptr);
  EXPECT_NE(reason.find("f16 and bf16"), std::string::npos) << reason;

  auto odd_rows = sm90_backward_problem(256);
  odd_rows.d_o_stride[2] = 260;  // 520-byte rows of dO: not a multiple of 16 bytes
  EXPECT_EQ(bwd::route(odd_rows, &reason), nullptr);
  EXPECT_NE(reason.find("TMA"), std::string::npos) << reason;

  auto odd_gradient = sm90_backward_problem(256);
  odd_gradient.d_k_stride[1] = 1001;  // an odd head stride: the gradients are written in pairs
  EXPECT_EQ(bwd::route(odd_gradient, &reason), nullptr);
  EXPECT_NE(reason.find("even strides"), std::string::npos) << reason;
}

// Which calls run the kernels that start S at the mask (family.hpp's
// starts_s_at_mask): masks read by key pairs whose rows differ, any such mask
// in a cluster (D > 512), never with dropout or a scale without a finite inverse.
TEST(Sm90Routing, MaskInSKernelsServeRowMasksAndClusterMasks) {
  using ffpa::detail::MaskKind;
  using ffpa::detail::sm90_wgmma::starts_s_at_mask;
  auto masked = [](int64_t row_stride) {
    auto p = sm90_problem(512);
    p.mask_kind = MaskKind::additive_bf16;
    p.mask_key_pairs = true;
    p.mask_stride[2] = row_stride;
    p.mask_stride[3] = 1;
    p.scale = 0.0625f;
    return p;
  };
  EXPECT_TRUE(starts_s_at_mask(masked(1000), 512)) << "a full mask";
  EXPECT_FALSE(starts_s_at_mask(masked(0), 512)) << "a [B,1,1,Nkv] mask is read from L1 in the softmax";
  EXPECT_TRUE(starts_s_at_mask(masked(0), 1024)) << "a key mask in a cluster";
  EXPECT_FALSE(starts_s_at_mask(sm90_problem(512), 1024)) << "no mask";
  auto odd = masked(1000);
  odd.mask_key_pairs = false;
  EXPECT_FALSE(starts_s_at_mask(odd, 512)) << "a mask read element by element";
  auto dropout = masked(1000);
  dropout.dropout_p = 0.1f;
  EXPECT_FALSE(starts_s_at_mask(dropout, 1024)) << "dropout kernels add the mask in the softmax";
  auto tiny_scale = masked(1000);
  tiny_scale.scale = 1e-45f;  // 1 / scale is infinite
  EXPECT_FALSE(starts_s_at_mask(tiny_scale, 1024));
  auto packed = masked(1000);  // decode at GQA 4: packed tiles add the mask in the softmax
  packed.heads_q = 32, packed.heads_kv = 8, packed.seq_q = 1;
  EXPECT_FALSE(starts_s_at_mask(packed, 1024));
}

// The sm90 family's tiles for decode (routing.cpp's plan_tiles): one sequence
// fills the H200's 132 SMs with whole splits; a cluster tile takes two SMs;
// tiles that fill the device are not split; GQA groups are packed into one
// tile per KV head (and then split), prefill is not packed.
TEST(Sm90Routing, PlanTilesPacksGqaAndFillsTheDeviceForDecode) {
  using ffpa::detail::sm90_wgmma::plan_tiles;
  auto decode = [](int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q, int64_t seq_kv, int64_t dim) {
    auto p = sm90_problem(dim);
    p.batch = batch, p.heads_q = heads_q, p.heads_kv = heads_kv, p.seq_q = seq_q, p.seq_kv = seq_kv;
    return p;
  };
  const auto d512 = plan_tiles(decode(1, 32, 32, 1, 8192, 512), 512, 132);
  EXPECT_EQ(d512.heads_per_tile, 1);
  EXPECT_EQ(d512.splits.count, 4);
  EXPECT_EQ(d512.splits.keys_per_split, 2048);
  EXPECT_EQ(plan_tiles(decode(1, 32, 32, 1, 8192, 1024), 1024, 132).splits.count, 2);  // 64 clusters of 2
  EXPECT_EQ(plan_tiles(decode(8, 32, 32, 1, 8192, 512), 512, 132).splits.count, 1);    // 256 tiles
  EXPECT_EQ(plan_tiles(decode(1, 32, 32, 1, 128, 512), 512, 132).splits.count, 1);     // one KV block
  EXPECT_EQ(plan_tiles(decode(1, 32, 32, 1, 200, 512), 512, 132).splits.count, 2);     // 128 + 72 keys
  const auto gqa = plan_tiles(decode(8, 32, 8, 1, 8192, 512), 512, 132);  // decode-b8-gqa32-8
  EXPECT_EQ(gqa.heads_per_tile, 4);
  EXPECT_EQ(gqa.splits.count, 2);  // 64 tiles of 4 heads, 2 splits of 4096 keys
  const auto specdec = plan_tiles(decode(4, 32, 8, 4, 8192, 512), 512, 132);  // specdec-b4-q4-gqa32-8
  EXPECT_EQ(specdec.heads_per_tile, 4);
  EXPECT_EQ(specdec.splits.count, 4);  // 32 tiles of 4 heads x 16 rows
  EXPECT_EQ(plan_tiles(decode(1, 32, 8, 4096, 4096, 512), 512, 132).heads_per_tile, 1);
}

TEST(Sm90Routing, ExplicitImplOnHostPointersIsRefused) {
  HostCall c = host_call(64);
  c.params.options.impl = Impl::sm90_wgmma;
  KernelChoice choice;
  const Status status = select_kernel(c.params, &choice);
  EXPECT_TRUE(status.code == StatusCode::impl_unavailable ||
              status.code == StatusCode::wrong_memory_space)
      << status_name(status.code);
  EXPECT_NE(status.message.find("sm90_wgmma"), std::string::npos) << status.message;
  EXPECT_EQ(forward(c.params).code, status.code);
}

TEST(Dispatch, AutomaticOnHostPointersIsTheCpuReference) {
  HostCall c = host_call(64);
  KernelChoice choice;
  ASSERT_TRUE(select_kernel(c.params, &choice).ok());
  EXPECT_EQ(choice.impl, Impl::cpu_reference);
  EXPECT_NE(choice.kernel.find("cpu_reference"), std::string::npos);
}

bool has_cuda_device() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

// Without a device the GPU implementation is unavailable; with one, host
// pointers are the wrong memory space. Either way nothing runs.
TEST(Dispatch, ExplicitGpuImplOnHostPointersIsRefused) {
  HostCall c = host_call(64);
  c.params.options.impl = Impl::sm80_split_d;
  KernelChoice choice;
  const Status status = select_kernel(c.params, &choice);
  EXPECT_EQ(status.code,
            has_cuda_device() ? StatusCode::wrong_memory_space : StatusCode::impl_unavailable);
  EXPECT_NE(status.message.find("sm80_split_d"), std::string::npos);
  EXPECT_EQ(forward(c.params).code, status.code);
}

// B, Hq or Nq = 0 is a no-op that succeeds whatever impl is asked for, and
// select_kernel says the same as forward (hostile-input finding 3: it
// returned impl_unavailable where forward succeeded).
TEST(Dispatch, EmptyProblemsSelectWhatForwardDoes) {
  for (Impl impl : {Impl::automatic, Impl::cpu_reference, Impl::sm80_split_d, Impl::sm90_wgmma}) {
    for (int empty_dim : {0, 1, 2}) {  // B, Hq, Nq
      int64_t q_shape[4] = {1, 2, 5, 64}, kv_shape[4] = {1, 2, 7, 64};
      q_shape[empty_dim] = 0;
      if (empty_dim == 0) kv_shape[0] = 0;
      HostCall c;
      c.q = make_host_tensor(DType::bf16, {q_shape[0], q_shape[1], q_shape[2], q_shape[3]});
      c.k = make_host_tensor(DType::bf16, {kv_shape[0], kv_shape[1], kv_shape[2], kv_shape[3]});
      c.v = make_host_tensor(DType::bf16, {kv_shape[0], kv_shape[1], kv_shape[2], kv_shape[3]});
      c.o = make_host_tensor(DType::bf16, {q_shape[0], q_shape[1], q_shape[2], q_shape[3]});
      c.params.q = c.q.tensor, c.params.k = c.k.tensor, c.params.v = c.v.tensor, c.params.o = c.o.tensor;
      c.params.options.impl = impl;
      SCOPED_TRACE("impl " + std::to_string(static_cast<int>(impl)) + ", empty dim " + std::to_string(empty_dim));
      KernelChoice choice;
      const Status selected = select_kernel(c.params, &choice);
      EXPECT_TRUE(selected.ok()) << status_name(selected.code) << ": " << selected.message;
      EXPECT_NE(choice.kernel.find("empty"), std::string::npos) << choice.kernel;
      EXPECT_EQ(forward(c.params).code, selected.code);
    }
  }
}

// f32 / f64 inputs and f64 masks run on the CPU reference only: auto and
// cpu_reference on host tensors plan it, a GPU impl or FP8 is unsupported_dtype
// with the reason, and forward says the same.
TEST(Dispatch, WideDtypesRunOnTheCpuReferenceOnly) {
  for (DType dtype : {DType::f32, DType::f64}) {
    HostCall c = host_call(64, dtype);
    SCOPED_TRACE(dtype == DType::f32 ? "f32" : "f64");
    for (Impl impl : {Impl::automatic, Impl::cpu_reference}) {
      c.params.options.impl = impl;
      KernelChoice choice;
      ASSERT_TRUE(select_kernel(c.params, &choice).ok());
      EXPECT_EQ(choice.impl, Impl::cpu_reference);
    }
    for (Impl impl : {Impl::sm80_split_d, Impl::sm90_wgmma}) {
      c.params.options.impl = impl;
      KernelChoice choice;
      const Status status = select_kernel(c.params, &choice);
      EXPECT_EQ(status.code, StatusCode::unsupported_dtype) << status.message;
      EXPECT_NE(status.message.find("CPU reference only"), std::string::npos) << status.message;
      EXPECT_EQ(forward(c.params).code, StatusCode::unsupported_dtype);
    }
    c.params.options.impl = Impl::automatic;
    c.params.options.precision = Precision::fp8;
    KernelChoice choice;
    EXPECT_EQ(select_kernel(c.params, &choice).code, StatusCode::unsupported_dtype);
  }
  HostCall c = host_call(64);  // bf16 inputs, an f64 mask
  ffpa::testing::HostTensor mask = make_host_tensor(DType::f64, {1, 1, 5, 7});
  c.params.mask = mask.tensor;
  c.params.options.impl = Impl::sm90_wgmma;
  KernelChoice choice;
  const Status status = select_kernel(c.params, &choice);
  EXPECT_EQ(status.code, StatusCode::unsupported_dtype) << status.message;
  EXPECT_NE(status.message.find("mask.dtype = f64"), std::string::npos) << status.message;
}

TEST(Dispatch, UnknownImplIsAnInvalidOption) {
  HostCall c = host_call(64);
  c.params.options.impl = static_cast<Impl>(42);
  KernelChoice choice;
  EXPECT_EQ(select_kernel(c.params, &choice).code, StatusCode::invalid_option);
}

TEST(Dispatch, SelectKernelNeedsAnOutput) {
  HostCall c = host_call(64);
  EXPECT_EQ(select_kernel(c.params, nullptr).code, StatusCode::null_pointer);
}

TEST(Dispatch, CompiledHeadDimsListsTheInstances) {
  const std::string list = compiled_head_dims();
  for (int i = 0; i < kInstanceCount; ++i) {
    EXPECT_NE(list.find(std::to_string(kInstances[i].out_cols)), std::string::npos);
  }
}

TEST(Dispatch, WorkspaceIsNotNeeded) {
  HostCall c = host_call(64);
  size_t bytes = 1;
  ASSERT_TRUE(workspace_size(c.params, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
}

}  // namespace
