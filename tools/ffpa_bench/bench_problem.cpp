#include "bench_problem.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "common/float16_bits.hpp"
#include "random_stream.hpp"

namespace ffpa::bench {
namespace {

constexpr size_t kSetAlignment = 256;  // cudaMalloc's alignment, kept inside the slab

size_t align_up(size_t bytes) { return (bytes + kSetAlignment - 1) / kSetAlignment * kSetAlignment; }

void fill_range(unsigned char* data, DType dtype, uint64_t stream, int64_t begin, int64_t end) {
  const size_t size = testing::dtype_size(dtype);
  for (int64_t e = begin; e < end; ++e) {
    const uint64_t bits = element_bits(stream, e);
    unsigned char* element = data + static_cast<size_t>(e) * size;
    if (dtype == DType::boolean) {
      *element = bool_element(bits) ? 1 : 0;
      continue;
    }
    const float value = uniform_element(bits);
    if (dtype == DType::f32) {
      std::memcpy(element, &value, size);
    } else {
      const uint16_t h =
          dtype == DType::f16 ? detail::float_to_half_bits(value) : detail::float_to_bf16_bits(value);
      std::memcpy(element, &h, size);
    }
  }
}

// Fills a dense buffer of `count` elements; large buffers on all cores.
void fill_random(void* data, DType dtype, int64_t count, uint64_t stream) {
  constexpr int64_t kElementsPerThread = int64_t{1} << 20;
  const int64_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const int64_t threads = std::min(hardware, count / kElementsPerThread + 1);
  auto* bytes = static_cast<unsigned char*>(data);
  if (threads == 1) {
    fill_range(bytes, dtype, stream, 0, count);
    return;
  }
  std::vector<std::thread> workers;
  const int64_t chunk = (count + threads - 1) / threads;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = std::min(count, t * chunk), end = std::min(count, begin + chunk);
    workers.emplace_back(fill_range, bytes, dtype, stream, begin, end);
  }
  for (std::thread& worker : workers) worker.join();
}

// [B, H, N, D] in the given layout (bnhd: a [B, N, H, D] buffer, permuted).
Tensor describe_bhnd(DType dtype, int64_t b, int64_t h, int64_t n, int64_t d, Layout layout) {
  if (layout == Layout::bhnd) return make_tensor(nullptr, dtype, {b, h, n, d});
  Tensor t = make_tensor(nullptr, dtype, {b, n, h, d});
  std::swap(t.shape[1], t.shape[2]);
  std::swap(t.stride[1], t.stride[2]);
  return t;
}

void* at_offset(void* base, size_t offset) { return static_cast<unsigned char*>(base) + offset; }

}  // namespace

int64_t element_count(const Tensor& t) {
  if (t.rank == 0) return 0;
  int64_t n = 1;
  for (int32_t d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

std::string shape_text(const ProblemShape& s) {
  return "B=" + std::to_string(s.batch) + " Hq=" + std::to_string(s.heads_q) + " Hkv=" + std::to_string(s.heads_kv) +
         " Nq=" + std::to_string(s.seq_q) + " Nkv=" + std::to_string(s.seq_kv) + " D=" + std::to_string(s.head_dim) +
         (s.dv() != s.head_dim ? " Dv=" + std::to_string(s.dv()) : std::string());
}

double attended_pairs(const ProblemShape& shape, Causal causal) {
  if (causal == Causal::none) return static_cast<double>(shape.seq_q) * static_cast<double>(shape.seq_kv);
  const int64_t shift = causal == Causal::bottom_right ? shape.seq_kv - shape.seq_q : 0;
  double pairs = 0;
  for (int64_t i = 0; i < shape.seq_q; ++i)  // row i attends keys 0 .. i + shift
    pairs += static_cast<double>(std::clamp<int64_t>(i + shift + 1, 0, shape.seq_kv));
  return pairs;
}

double forward_flops(const ProblemShape& shape, Causal causal) {
  const double pairs = causal != Causal::none && shape.seq_q == shape.seq_kv
                           ? static_cast<double>(shape.seq_q) * static_cast<double>(shape.seq_kv) / 2
                           : attended_pairs(shape, causal);
  return 2.0 * static_cast<double>(shape.batch) * static_cast<double>(shape.heads_q) *
         static_cast<double>(shape.head_dim + shape.dv()) * pairs;
}

PointTensors describe_tensors(const ProblemShape& s, DType dtype, Layout layout, MaskChoice mask,
                              bool with_lse) {
  PointTensors t;
  t.q = describe_bhnd(dtype, s.batch, s.heads_q, s.seq_q, s.head_dim, layout);
  t.k = describe_bhnd(dtype, s.batch, s.heads_kv, s.seq_kv, s.head_dim, layout);
  t.v = describe_bhnd(dtype, s.batch, s.heads_kv, s.seq_kv, s.dv(), layout);
  t.o = describe_bhnd(dtype, s.batch, s.heads_q, s.seq_q, s.dv(), layout);
  switch (mask) {
    case MaskChoice::none: break;
    case MaskChoice::key_bool: t.mask = make_tensor(nullptr, DType::boolean, {s.batch, 1, 1, s.seq_kv}); break;
    case MaskChoice::key_add: t.mask = make_tensor(nullptr, dtype, {s.batch, 1, 1, s.seq_kv}); break;
    case MaskChoice::row_bool:
      t.mask = make_tensor(nullptr, DType::boolean, {s.batch, 1, s.seq_q, s.seq_kv});
      break;
    case MaskChoice::full_add:
      t.mask = make_tensor(nullptr, dtype, {s.batch, s.heads_q, s.seq_q, s.seq_kv});
      break;
    case MaskChoice::full_bool:
      t.mask = make_tensor(nullptr, DType::boolean, {s.batch, s.heads_q, s.seq_q, s.seq_kv});
      break;
    case MaskChoice::full_add_f32:
      t.mask = make_tensor(nullptr, DType::f32, {s.batch, s.heads_q, s.seq_q, s.seq_kv});
      break;
  }
  if (with_lse) t.lse = make_tensor(nullptr, DType::f32, {s.batch, s.heads_q, s.seq_q});
  return t;
}

size_t buffer_bytes(const Tensor& t) {
  return static_cast<size_t>(element_count(t)) * testing::dtype_size(t.dtype);
}

InputSlab plan_input_slab(const PointTensors& t, size_t min_total_bytes) {
  InputSlab slab;
  slab.q_offset = 0;
  slab.k_offset = slab.q_offset + align_up(buffer_bytes(t.q));
  slab.v_offset = slab.k_offset + align_up(buffer_bytes(t.k));
  slab.mask_offset = slab.v_offset + align_up(buffer_bytes(t.v));
  slab.set_bytes = std::max(kSetAlignment, slab.mask_offset + align_up(buffer_bytes(t.mask)));
  slab.sets = static_cast<int64_t>(min_total_bytes / slab.set_bytes) + 1;
  return slab;
}

void fill_inputs(void* slab, const InputSlab& layout, const PointTensors& t, uint64_t seed) {
  const std::pair<const Tensor*, size_t> inputs[] = {
      {&t.q, layout.q_offset}, {&t.k, layout.k_offset}, {&t.v, layout.v_offset}, {&t.mask, layout.mask_offset}};
  for (int64_t set = 0; set < layout.sets; ++set) {
    void* base = at_offset(slab, static_cast<size_t>(set) * layout.set_bytes);
    uint64_t input_index = 0;
    for (const auto& [tensor, offset] : inputs) {
      const uint64_t stream = input_stream(seed, set, input_index++);
      fill_random(at_offset(base, offset), tensor->dtype, element_count(*tensor), stream);
    }
  }
}

PointTensors bind_tensors(const PointTensors& tensors, const InputSlab& layout, void* slab,
                          int64_t set, void* o, void* lse) {
  PointTensors bound = tensors;
  void* base = at_offset(slab, static_cast<size_t>(set) * layout.set_bytes);
  bound.q.data = at_offset(base, layout.q_offset);
  bound.k.data = at_offset(base, layout.k_offset);
  bound.v.data = at_offset(base, layout.v_offset);
  if (tensors.mask.rank != 0) bound.mask.data = at_offset(base, layout.mask_offset);
  bound.o.data = o;
  if (tensors.lse.rank != 0) bound.lse.data = lse;
  return bound;
}

HostBuffer::HostBuffer(size_t bytes) {
  const size_t rounded = align_up(std::max<size_t>(bytes, 1));
  data_.reset(std::aligned_alloc(kSetAlignment, rounded));
  if (!data_) throw std::bad_alloc();
}

}  // namespace ffpa::bench
