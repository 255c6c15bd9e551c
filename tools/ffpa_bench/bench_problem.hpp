// One benchmark point as data: its sizes, the descriptions of its tensors, its
// FLOP count, and the random inputs, in as many copies ("sets") as it takes
// to exceed the L2 cache, so that rotating through them times memory, not L2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "ffpa/ffpa.hpp"
#include "support/host_tensors.hpp"

namespace ffpa::bench {

using testing::Layout;

// The optional mask (the help text describes each).
enum class MaskChoice { none, key_bool, key_add, row_bool, full_add, full_bool, full_add_f32 };

struct ProblemShape {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  int64_t value_dim = 0;  // v's and o's head dim (D_v); 0: the head dim
  int64_t dv() const { return value_dim > 0 ? value_dim : head_dim; }
};

// "B=1 Hq=32 Hkv=32 Nq=8192 Nkv=8192 D=512" (and " Dv=..." when it differs).
std::string shape_text(const ProblemShape& shape);

// Number of (i, j) pairs the causal alignment lets attend, per batch and head
// (masks are not counted: they do not change the work of the kernels).
double attended_pairs(const ProblemShape& shape, Causal causal);

// 2 * B * Hq * (D + D_v) * pairs (4 * B * Hq * D * pairs when D_v == D). With causal and Nq == Nkv the pairs count as
// Nq * Nkv / 2, the convention of published attention benchmarks.
double forward_flops(const ProblemShape& shape, Causal causal);

// Shapes and strides of every tensor of a point, with null data pointers.
// An absent mask or lse has rank 0.
struct PointTensors {
  Tensor q, k, v, o, mask, lse;
};

PointTensors describe_tensors(const ProblemShape& shape, DType dtype, Layout layout,
                              MaskChoice mask, bool with_lse);

// Bytes of the dense buffer behind a described tensor (0 for an absent one).
size_t buffer_bytes(const Tensor& t);

// Where the inputs of every set live in one buffer: set s starts at
// s * set_bytes; q, k, v and the mask sit at their offsets inside a set.
struct InputSlab {
  int64_t sets = 1;
  size_t set_bytes = 0;
  size_t q_offset = 0, k_offset = 0, v_offset = 0, mask_offset = 0;
  size_t total_bytes() const { return static_cast<size_t>(sets) * set_bytes; }
};

// Enough sets that together they exceed min_total_bytes; one at least.
InputSlab plan_input_slab(const PointTensors& tensors, size_t min_total_bytes);

// Elements of a tensor (0 for an absent one, rank 0).
int64_t element_count(const Tensor& t);

// Fills every set with fresh values: q, k, v and additive masks uniform in
// [-1, 1], boolean masks true with probability 3/4. Deterministic in `seed`.
void fill_inputs(void* slab, const InputSlab& layout, const PointTensors& tensors, uint64_t seed);

// `tensors` with q, k, v and mask pointing into set `set` of the slab at
// `slab`, and o, lse at the given outputs (lse only when described).
PointTensors bind_tensors(const PointTensors& tensors, const InputSlab& layout, void* slab,
                          int64_t set, void* o, void* lse);

// Host memory aligned for any tensor (validation wants 16 bytes), uninitialised.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes);
  void* get() const { return data_.get(); }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data_;
};

}  // namespace ffpa::bench
