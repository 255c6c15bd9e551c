// Running and checking the API fuzz driver's serving calls (serving_cases.hpp):
//   - the C and C++ statuses are equal (forward, workspace_size,
//     check_sequences, sequence_plan_size);
//   - a valid call succeeds, writes exactly its sequences' rows of o and lse
//     (every other byte keeps its poison) and matches the fp64 reference
//     (serving_reference.hpp);
//   - a call with a fault is refused with the fault's own status and writes
//     nothing; no call writes an input;
//   - select_kernel and workspace_size agree with forward, except for a fault
//     in the lengths or block ids, which they cannot see (they succeed) and
//     check_sequences reports;
//   - with its lse, the call's backward (sinks with d_sinks, d_lse half the
//     time) gives the same status and gradient bits through both APIs, writes
//     exactly the rows of the sequences (finite) and d_sinks as the spec's
//     formula from o and lse says; a paged or e4m3 call's is refused.
#include "fuzz/serving_cases.hpp"

#include <cmath>
#include <functional>
#include <set>

namespace ffpa_fuzz {
namespace {

using ffpa::DType;
using ffpa::Status;
using ffpa::StatusCode;
using ffpa::Tensor;
using ffpa::testing::HostTensor;

std::vector<std::vector<unsigned char>> snapshot(const std::vector<HostTensor*>& tensors) {
  std::vector<std::vector<unsigned char>> bytes;
  for (const HostTensor* t : tensors) bytes.push_back(t->storage);
  return bytes;
}

// The byte offset in buffer's storage of element index of t, a view into it.
int64_t storage_offset(const HostTensor& buffer, const Tensor& t, std::array<int64_t, 4> index) {
  int64_t element = 0;
  for (int32_t d = 0; d < t.rank; ++d) element += index[d] * t.stride[d];
  return static_cast<const unsigned char*>(t.data) - buffer.storage.data() + element * element_bytes(t.dtype);
}

// Rows (entry, row) of a [entries, heads, rows, width] view t into buffer.
using RowSet = std::set<std::array<int64_t, 2>>;

// Whether `now` (buffer's bytes after a call) equals `before` outside the
// rows `written` of t (every head, `width` columns); with `finite`, whether
// those rows hold finite values.
bool only_rows_written(const HostTensor& buffer, const Tensor& t, const std::vector<unsigned char>& before,
                       const std::vector<unsigned char>& now, const RowSet& written, bool finite = false) {
  std::vector<unsigned char> outside = now;
  const int64_t width = t.rank == 4 ? t.shape[3] : 1, bytes = element_bytes(t.dtype);
  for (const auto& [entry, row] : written)
    for (int64_t h = 0; h < t.shape[1]; ++h)
      for (int64_t d = 0; d < width; ++d) {
        const int64_t at = storage_offset(buffer, t, {entry, h, row, d});
        if (finite && !std::isfinite(read_element(t, {entry, h, row, d}))) return false;
        std::copy(before.begin() + at, before.begin() + at + bytes, outside.begin() + at);
      }
  return outside == before;
}

RowSet query_rows(const ServingCase& c) {
  RowSet rows;
  for (const SequenceRows& r : c.reference.sequences)
    for (int64_t i = 0; i < r.seq_q; ++i) rows.insert({r.q_entry, r.q_first + i});
  return rows;
}

RowSet key_rows(const ServingCase& c) {
  RowSet rows;
  for (const SequenceRows& r : c.reference.sequences) rows.insert(r.keys.begin(), r.keys.end());
  return rows;
}

// A buffer's bytes from its 16-byte aligned start (two buffers' slack may differ).
std::vector<unsigned char> payload(const HostTensor& t) {
  const auto address = reinterpret_cast<uintptr_t>(t.storage.data());
  return {t.storage.begin() + static_cast<int64_t>((16 - address % 16) % 16), t.storage.end()};
}

std::string name(StatusCode code) { return ffpa::status_name(code); }

// A dense, NaN-poisoned tensor of t's logical shape and dtype.
HostTensor poisoned_like(const Tensor& t) {
  HostTensor g = ffpa::testing::make_host_tensor(t.dtype, {t.shape[0], t.shape[1], t.shape[2], t.rank == 4 ? t.shape[3] : 1});
  if (t.rank == 3) {
    g.tensor.rank = 3;
    g.tensor.stride[0] = t.shape[1] * t.shape[2], g.tensor.stride[1] = t.shape[2], g.tensor.stride[2] = 1;
  }
  ffpa::testing::fill_nan(g);
  return g;
}

using Fail = std::function<void(const std::string&)>;

// The backward of a valid forward call with its lse (serving_cases.hpp's list).
void check_backward(ServingCase& c, std::mt19937_64& rng, const Fail& failed) {
  const ffpa::ForwardParams& f = c.params;
  HostTensor d_o = poisoned_like(f.o), d_lse;
  ffpa::testing::fill_uniform(d_o, rng(), -1.0f, 1.0f);
  ffpa::BackwardParams p;
  p.q = f.q, p.k = f.k, p.v = f.v, p.o = f.o, p.lse = f.lse, p.options = f.options, p.sequences = f.sequences;
  p.sinks = f.sinks, p.d_o = d_o.tensor;
  if (rng() % 2 == 0) {
    d_lse = poisoned_like(f.lse);
    ffpa::testing::fill_uniform(d_lse, rng(), -1.0f, 1.0f);
    p.d_lse = d_lse.tensor;
  }
  const bool with_d_sinks = f.sinks.data && rng() % 2 == 0;
  std::vector<HostTensor*> inputs = c.inputs();
  for (HostTensor* t : {&c.o, &c.lse, &d_o, &d_lse}) inputs.push_back(t);
  const auto inputs0 = snapshot(inputs);

  HostTensor grads[2][4];  // d_q, d_k, d_v, d_sinks through each API
  std::vector<unsigned char> poison[2][4];
  Status status[2];
  for (int api = 0; api < 2; ++api) {
    grads[api][0] = poisoned_like(f.q), grads[api][1] = poisoned_like(f.k), grads[api][2] = poisoned_like(f.v);
    grads[api][3] = ffpa::testing::host_tensor_detail::allocate(DType::f32, 1, &c.heads_q);
    ffpa::testing::fill_nan(grads[api][3]);
    for (int g = 0; g < 4; ++g) poison[api][g] = grads[api][g].storage;
    p.d_q = grads[api][0].tensor, p.d_k = grads[api][1].tensor, p.d_v = grads[api][2].tensor;
    p.d_sinks = with_d_sinks ? grads[api][3].tensor : Tensor{};
    if (api == 0) {
      status[0] = ffpa::backward(p);
    } else {
      const CBackward cp(p);
      char message[512] = {};
      status[1].code = static_cast<StatusCode>(ffpa_backward(&cp.params, message, sizeof message));
    }
  }
  const StatusCode expected = c.keys == KeyForm::paged && !c.dense ? StatusCode::invalid_option
                              : c.e4m3                             ? StatusCode::unsupported_dtype
                              : f.options.accumulation != ffpa::Accumulation::f32 ? StatusCode::unsupported_accumulation
                                                                                   : StatusCode::ok;
  if (status[0].code != status[1].code)
    failed("backward: C status " + name(status[1].code) + " != C++ " + name(status[0].code));
  if (status[0].code != expected)
    failed("backward: " + name(status[0].code) + " (expected " + name(expected) + "): " + status[0].message);
  if (snapshot(inputs) != inputs0) failed("backward wrote an input");
  if (!status[0].ok()) {
    for (int api = 0; api < 2; ++api)
      for (int g = 0; g < 4; ++g)
        if (grads[api][g].storage != poison[api][g]) failed("a refused backward wrote a gradient");
    return;
  }
  for (int g = 0; g < 4; ++g)
    if (payload(grads[0][g]) != payload(grads[1][g])) failed("backward: C and C++ gradients differ");
  // Exactly the sequences' rows: their queries in d_q, the keys they use in d_k and d_v.
  const RowSet queries = query_rows(c), keys = key_rows(c);
  static const char* const kNames[3] = {"d_q", "d_k", "d_v"};
  for (int g = 0; g < 3; ++g)
    if (!only_rows_written(grads[0][g], grads[0][g].tensor, poison[0][g], grads[0][g].storage, g == 0 ? queries : keys,
                           /*finite=*/true))
      failed(std::string("backward: ") + kNames[g] + ": a row of the sequences not finite, or another row written");
  if (!with_d_sinks) return;
  // d_sinks[h] = -sum over the sequences' rows i of exp(sink_h - lse_i) (d_o_i . o_i - d_lse_i).
  const bool wide = c.dtype == DType::f32 || c.dtype == DType::f64;
  for (int64_t h = 0; h < c.heads_q; ++h) {
    const double sink = read_element(f.sinks, {h, 0, 0, 0});
    double want = 0.0, magnitude = 0.0;
    for (const SequenceRows& r : c.reference.sequences)
      for (int64_t i = 0; i < r.seq_q; ++i) {
        const std::array<int64_t, 4> row{r.q_entry, h, r.q_first + i, 0};
        double dot = 0.0, size = 0.0;
        for (int64_t d = 0; d < c.value_dim; ++d) {
          const double a = read_element(d_o.tensor, {row[0], h, row[2], d}), b = read_element(f.o, {row[0], h, row[2], d});
          dot += a * b, size += std::fabs(a * b);
        }
        const double g = p.d_lse.data ? read_element(p.d_lse, row) : 0.0;
        const double weight = std::exp(sink - read_element(f.lse, row));
        want -= weight * (dot - g), magnitude += weight * (size + std::fabs(g));
      }
    const double got = read_element(grads[0][3].tensor, {h, 0, 0, 0});
    if (!(std::fabs(got - want) <= (wide ? 1e-5 : 2e-2) * (1.0 + magnitude)))
      failed("d_sinks[" + std::to_string(h) + "] = " + std::to_string(got) + ", from o and lse " + std::to_string(want));
  }
}

// A successful call's o and lse against the reference, row by row.
void check_against_reference(const ServingCase& c, const Fail& failed) {
  const ffpa::ForwardParams& p = c.params;
  const bool wide = c.dtype == DType::f32 || c.dtype == DType::f64;
  const double tolerance = c.dtype == DType::f64   ? 1e-9
                           : c.dtype == DType::f32 ? 1e-5
                           : p.options.accumulation == ffpa::Accumulation::f16 ? 3e-2
                                                                               : 1.6e-2;
  for (size_t b = 0; b < c.reference.sequences.size(); ++b) {
    const SequenceRows& r = c.reference.sequences[b];
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < r.seq_q; ++i) {
        const ReferenceRow want = reference_row(c.reference, static_cast<int64_t>(b), h, i);
        const std::string where = std::to_string(b) + "," + std::to_string(h) + "," + std::to_string(i);
        for (int64_t d = 0; d < c.value_dim; ++d) {
          const double got = read_element(p.o, {r.q_entry, h, r.q_first + i, d});
          if (!(std::fabs(got - want.o[d]) <= tolerance * (1.0 + std::fabs(want.o[d])))) {
            failed("o of sequence/head/row " + where + " column " + std::to_string(d) + " = " + std::to_string(got) +
                   ", reference " + std::to_string(want.o[d]));
            return;
          }
        }
        if (!p.lse.data) continue;
        const double got = read_element(p.lse, {r.q_entry, h, r.q_first + i, 0});
        const bool both_empty = got == -INFINITY && want.lse == -INFINITY;
        if (!both_empty && !(std::fabs(got - want.lse) <= (wide ? 1e-5 : 1e-3) * (1.0 + std::fabs(want.lse)))) {
          failed("lse of sequence/head/row " + where + " = " + std::to_string(got) + ", reference " +
                 std::to_string(want.lse));
          return;
        }
      }
  }
}

}  // namespace

void run_serving_case(uint64_t seed, Tally* tally) {
  std::mt19937_64 rng(seed);
  ServingCase c;
  draw_serving_case(c, rng);
  // Faults go into non-empty calls (an empty one is a no-op success).
  if (!c.empty() && rng() % 3 == 0)
    for (int attempt = 0; attempt < 64 && c.fault.empty(); ++attempt) inject_serving_fault(c, rng);
  ++tally->cases;
  tally->case_failed = false;
  const Fail failed = [&](const std::string& what) { fail(tally, seed, c.fault, what + " [" + c.describe() + "]"); };
  const ffpa::ForwardParams& p = c.params;
  const auto inputs0 = snapshot(c.inputs()), outputs0 = snapshot(c.outputs());

  const CForward cp(p);
  char message[512] = {};
  ffpa::KernelChoice choice;
  const Status selected = ffpa::select_kernel(p, &choice);
  size_t bytes = 1, c_bytes = 1;
  const Status sized = ffpa::workspace_size(p, &bytes);
  const auto c_sized = static_cast<StatusCode>(ffpa_workspace_size(&cp.params, &c_bytes, message, sizeof message));
  const Status cpp = ffpa::forward(p);
  const auto outputs_cpp = snapshot(c.outputs());
  c.o.storage = outputs0[0], c.lse.storage = outputs0[1];
  const auto cs = static_cast<StatusCode>(ffpa_forward(&cp.params, message, sizeof message));
  const StatusCode got = cpp.code;
  tally->statuses[name(got)]++;
  if (tally->list)
    std::printf("%s %s serving %s%s%s\n", seed_text(seed).c_str(), name(got).c_str(), c.describe().c_str(),
                c.fault.empty() ? "" : ": ", c.fault.c_str());

  if (cs != got) failed("forward: C status " + name(cs) + " != C++ " + name(got));
  if (snapshot(c.inputs()) != inputs0) failed("an input was written");
  if (c.fault.empty() ? !cpp.ok()
      : c.dispatch_refusal ? got != StatusCode::impl_unavailable && got != StatusCode::wrong_memory_space
                           : got != c.expected)
    failed("forward: " + name(got) + (c.fault.empty() ? "" : " (expected " + name(c.expected) + ")") + ": " +
           cpp.message);
  if (c_sized != sized.code) failed("workspace_size: C status " + name(c_sized) + " != C++ " + name(sized.code));
  if (sized.ok() && (bytes != 0 || c_bytes != 0)) failed("workspace_size: the CPU reference needs no workspace");
  if (c.data_fault) {
    // The lengths and block ids are data: only the run (or check_sequences) reads them.
    if (!selected.ok() || !sized.ok()) failed("select_kernel / workspace_size read the lengths: " + selected.message);
  } else {
    if (selected.code != got) failed("select_kernel said " + name(selected.code));
    if (!c.dispatch_refusal && sized.code != got) failed("workspace_size said " + name(sized.code));
  }
  if (p.sequences) {
    const Status checked = ffpa::check_sequences(p);
    const auto c_checked = static_cast<StatusCode>(ffpa_check_sequences(&cp.params, message, sizeof message));
    const StatusCode want = c.planning_refusal ? StatusCode::ok : got;
    if (checked.code != want || c_checked != want)
      failed("check_sequences: C++ " + name(checked.code) + ", C " + name(c_checked) + ", expected " + name(want));
    size_t plan = 1, c_plan = 1;
    const Status planned = ffpa::sequence_plan_size(p, &plan);
    const auto c_planned = static_cast<StatusCode>(ffpa_sequence_plan_size(&cp.params, &c_plan, message, sizeof message));
    if (planned.code != selected.code || c_planned != selected.code || (planned.ok() && (plan != 0 || c_plan != 0)))
      failed("sequence_plan_size: C++ " + name(planned.code) + ", C " + name(c_planned) + ", select_kernel " +
             name(selected.code));
  }
  if (!cpp.ok()) {
    if (outputs_cpp != outputs0 || snapshot(c.outputs()) != outputs0) failed("a refused call wrote its output");
    return;
  }
  if (outputs_cpp != snapshot(c.outputs())) failed("C and C++ outputs differ");
  // Exactly the sequences' rows of o and lse are written.
  const RowSet rows = query_rows(c);
  if (!only_rows_written(c.o, p.o, outputs0[0], c.o.storage, rows))
    failed("o: a row of no sequence was written");
  if (p.lse.data && !only_rows_written(c.lse, p.lse, outputs0[1], c.lse.storage, rows))
    failed("lse: a row of no sequence was written");
  check_against_reference(c, failed);
  if (p.lse.data) check_backward(c, rng, failed);
}

}  // namespace ffpa_fuzz
