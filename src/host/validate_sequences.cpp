// Validation of a serving call's batch of sequences (validate_sequences.hpp).
// Shapes: sequence b's queries are rows of q's batch entry 0 (packed) or
// q's batch entry b; its keys rows of k's entry 0 (packed), pages of the
// cache (paged) or k's entry b (batched). The lengths themselves live in
// the tensors' memory: check_sequence_data reads them where the host can.
#include "host/validate_sequences.hpp"

#include <algorithm>
#include <string>

namespace ffpa::detail {
namespace {

// The batch's tensors, each optional, in a fixed order.
struct SequenceField {
  Tensor SequenceBatch::*member;
  const char* name;
  int32_t rank;
  const char* logical_shape;
};
constexpr SequenceField kSequenceFields[kSequenceTensors] = {
    {&SequenceBatch::cu_seqlens_q, "sequences.cu_seqlens_q", 1, "[B + 1]"},
    {&SequenceBatch::cu_seqlens_k, "sequences.cu_seqlens_k", 1, "[B + 1]"},
    {&SequenceBatch::block_table, "sequences.block_table", 2, "[B, max_blocks]"},
    {&SequenceBatch::seqused_k, "sequences.seqused_k", 1, "[B]"},
};

Status check_size(Arg a, int32_t dim, int64_t expected, const char* what) {
  if (a.t.shape[dim] != expected)
    return fail(StatusCode::shape_mismatch, a.name, ".shape[", dim, "] = ", a.t.shape[dim], " differs from ", what,
                " = ", expected);
  return {};
}

// The batch's own tensors: rank, sizes, int32, data, strides, alignment.
Status check_batch_tensors(const SequenceBatch& batch) {
  for (const SequenceField& f : kSequenceFields) {
    const Tensor& t = batch.*f.member;
    if (!t.data) continue;
    const Arg a{t, f.name};
    FFPA_RETURN_IF_ERROR(check_rank(a, f.rank, f.logical_shape));
    FFPA_RETURN_IF_ERROR(check_sizes(a));
    if (t.dtype != DType::i32)
      return fail(StatusCode::unsupported_dtype, f.name, ".dtype = ", dtype_name(t.dtype), "; it must be i32");
    for (int32_t i = 0; i < t.rank; ++i)
      if (t.stride[i] < 0) return fail(StatusCode::invalid_stride, f.name, ".stride[", i, "] = ", t.stride[i], " is negative");
    if (!aligned(t.data, 4)) return fail(StatusCode::misaligned, f.name, ".data = ", t.data, " is not 4-byte aligned");
  }
  if (batch.max_seqlen_q < 0)
    return fail(StatusCode::invalid_option, "sequences.max_seqlen_q = ", batch.max_seqlen_q, " is negative");
  if (batch.max_seqlen_k < 0)
    return fail(StatusCode::invalid_option, "sequences.max_seqlen_k = ", batch.max_seqlen_k, " is negative");
  return {};
}

}  // namespace

int64_t sequence_count(const SequenceBatch& batch, const ForwardParams& p) {
  if (batch.cu_seqlens_q.data) return std::max<int64_t>(batch.cu_seqlens_q.shape[0] - 1, 0);
  return p.q.shape[0];
}

Status check_sequence_batch(const ForwardParams& p) {
  const SequenceBatch& batch = *p.sequences;
  FFPA_RETURN_IF_ERROR(check_batch_tensors(batch));
  if (batch.cu_seqlens_q.data && batch.cu_seqlens_q.shape[0] < 1)
    return fail(StatusCode::shape_mismatch, "sequences.cu_seqlens_q.shape[0] = 0; it holds B + 1 offsets");
  const int64_t count = sequence_count(batch, p);
  const std::string b_text = "B (" + std::string(batch.cu_seqlens_q.data ? "sequences.cu_seqlens_q.shape[0] - 1" : "q.shape[0]") + ")";
  const Arg q{p.q, "q"}, k{p.k, "k"}, v{p.v, "v"}, o{p.o, "o"}, lse{p.lse, "lse"};

  // Queries: packed rows of batch entry 0, or one entry per sequence.
  if (batch.cu_seqlens_q.data) FFPA_RETURN_IF_ERROR(check_size(q, 0, 1, "1 (packed queries: cu_seqlens_q is given)"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 0, q, 0, batch.cu_seqlens_q.data ? "1" : "B"));
  FFPA_RETURN_IF_ERROR(check_same_size(o, 2, q, 2, batch.cu_seqlens_q.data ? "total_q" : "Nq"));
  if (p.lse.data) {
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 0, q, 0, batch.cu_seqlens_q.data ? "1" : "B"));
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 1, q, 1, "Hq"));
    FFPA_RETURN_IF_ERROR(check_same_size(lse, 2, q, 2, batch.cu_seqlens_q.data ? "total_q" : "Nq"));
  }

  // Keys: v's pages / rows as k's.
  FFPA_RETURN_IF_ERROR(check_same_size(v, 0, k, 0, batch.block_table.data ? "num_blocks" : "the batch entries"));
  FFPA_RETURN_IF_ERROR(check_same_size(v, 2, k, 2, batch.block_table.data ? "page_size" : "Nkv"));
  const Arg table{batch.block_table, "sequences.block_table"}, cu_k{batch.cu_seqlens_k, "sequences.cu_seqlens_k"};
  const Arg used{batch.seqused_k, "sequences.seqused_k"};
  if (batch.block_table.data) {
    FFPA_RETURN_IF_ERROR(check_size(table, 0, count, b_text.c_str()));
    if (batch.block_table.shape[1] > 0 && p.k.shape[2] == 0)
      return fail(StatusCode::shape_mismatch, "k.shape[2] (page_size) = 0 with a block table of ",
                  batch.block_table.shape[1], " pages a sequence; a page holds at least one key");
  } else if (batch.cu_seqlens_k.data) {
    FFPA_RETURN_IF_ERROR(check_size(k, 0, 1, "1 (packed keys: cu_seqlens_k is given)"));
  } else {
    FFPA_RETURN_IF_ERROR(check_size(k, 0, count, b_text.c_str()));
  }
  if (batch.cu_seqlens_k.data) FFPA_RETURN_IF_ERROR(check_size(cu_k, 0, count + 1, "B + 1"));
  if (batch.seqused_k.data) FFPA_RETURN_IF_ERROR(check_size(used, 0, count, b_text.c_str()));
  // Batched queries: every sequence has Nq of them, a shape (packed ones are
  // checked against max_seqlen_q in the lengths, check_sequence_data).
  if (!batch.cu_seqlens_q.data && count > 0 && batch.max_seqlen_q > 0 && p.q.shape[2] > batch.max_seqlen_q)
    return fail(StatusCode::invalid_sequence_lengths, "every sequence has q.shape[2] (Nq) = ", p.q.shape[2],
                " queries, more than sequences.max_seqlen_q = ", batch.max_seqlen_q);

  if (p.sequence_plan && (reinterpret_cast<uintptr_t>(p.sequence_plan) % 8 != 0))
    return fail(StatusCode::misaligned, "sequence_plan = ", p.sequence_plan, " is not 8-byte aligned");
  // What a batch of sequences does not serve.
  if (p.mask.data)
    return fail(StatusCode::invalid_mask_layout,
                "a mask with a sequence batch: the sequences' lengths differ, so no [B, Hq, Nq, Nkv] mask fits them "
                "(use causal, the window or per-key lengths)");
  if (p.options.dropout_p > 0.0f)
    return fail(StatusCode::invalid_dropout, "options.dropout_p = ", p.options.dropout_p,
                " with a sequence batch: dropout is served for dense calls only");
  if (p.options.precision == Precision::fp8 || p.fp8_kv_cache)
    return fail(StatusCode::invalid_option,
                "precision fp8 (the library's own FP8 format) with a sequence batch: its pre-pass quantizes dense "
                "tensors; a serving engine's FP8 cache is k and v in e4m3 with k_descale / v_descale");
  return {};
}

Status sequence_byte_ranges(const SequenceBatch& batch, ByteRange (&ranges)[kSequenceTensors],
                            const char* (&names)[kSequenceTensors]) {
  for (int i = 0; i < kSequenceTensors; ++i) {
    names[i] = kSequenceFields[i].name;
    FFPA_RETURN_IF_ERROR(byte_range(Arg{batch.*kSequenceFields[i].member, names[i]}, &ranges[i]));
  }
  return {};
}

void set_sequence_layout(const ForwardParams& p, AttentionProblem* problem) {
  const SequenceBatch& batch = *p.sequences;
  SequenceLayout& s = problem->sequences;
  s.active = true;
  s.cu_seqlens_q = static_cast<const int32_t*>(batch.cu_seqlens_q.data);
  s.cu_seqlens_k = static_cast<const int32_t*>(batch.cu_seqlens_k.data);
  s.seqused_k = static_cast<const int32_t*>(batch.seqused_k.data);
  s.block_table = static_cast<const int32_t*>(batch.block_table.data);
  s.cu_seqlens_q_stride = batch.cu_seqlens_q.stride[0];
  s.cu_seqlens_k_stride = batch.cu_seqlens_k.stride[0];
  s.seqused_k_stride = batch.seqused_k.stride[0];
  if (s.block_table) {
    s.block_table_stride[0] = batch.block_table.stride[0];
    s.block_table_stride[1] = batch.block_table.stride[1];
    s.max_blocks = batch.block_table.shape[1];
    s.page_size = p.k.shape[2];
    s.num_blocks = p.k.shape[0];
  }
  s.queries_per_sequence = s.cu_seqlens_q ? 0 : p.q.shape[2];
  s.keys_per_sequence = s.block_table || s.cu_seqlens_k ? 0 : p.k.shape[2];
  s.packed_rows_q = s.cu_seqlens_q ? p.q.shape[2] : 0;
  s.packed_rows_k = s.packed_k() ? p.k.shape[2] : 0;
  s.plan = p.sequence_plan;
  problem->batch = sequence_count(batch, p);
  // The loosest bounds the tensors give, unless the caller gives tighter ones.
  const int64_t q_bound = p.q.shape[2];  // total_q, or Nq
  const int64_t k_bound = s.block_table ? s.max_blocks * s.page_size : p.k.shape[2];
  problem->seq_q = batch.max_seqlen_q > 0 ? batch.max_seqlen_q : q_bound;
  problem->seq_kv = batch.max_seqlen_k > 0 ? batch.max_seqlen_k : k_bound;
  if (!s.cu_seqlens_q) problem->seq_q = q_bound;  // every sequence has exactly Nq queries
}

Status sequence_fault_status(const AttentionProblem& p, int64_t b, const SequenceCheck& check) {
  const SequenceLayout& s = p.sequences;
  const int64_t value = check.value, index = check.index;
  switch (check.fault) {
    case SequenceFault::none: return {};
    case SequenceFault::cu_seqlens_q:
    case SequenceFault::cu_seqlens_k: {
      const char* name = check.fault == SequenceFault::cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k";
      return fail(StatusCode::invalid_sequence_lengths, "sequences.", name, "[", index, "] = ", value,
                  value < 0 ? " is negative" : " is below the offset before it",
                  ": the offsets must be non-negative and non-decreasing");
    }
    case SequenceFault::q_rows:
      return fail(StatusCode::invalid_sequence_lengths, "sequences.cu_seqlens_q[", index, "] = ", value,
                  " is past q's ", s.packed_rows_q, " packed rows");
    case SequenceFault::k_rows:
      return fail(StatusCode::invalid_sequence_lengths, "sequences.cu_seqlens_k[", index, "] = ", value,
                  " is past k's ", s.packed_rows_k, " packed rows");
    case SequenceFault::table_capacity:
      return fail(StatusCode::invalid_sequence_lengths, "sequence ", b, " has ", value,
                  " keys by cu_seqlens_k, more than its block table row holds (", s.max_blocks, " pages of ",
                  s.page_size, ")");
    case SequenceFault::max_seqlen_q:
      return fail(StatusCode::invalid_sequence_lengths, "sequence ", b, " has ", value,
                  " queries, more than max_seqlen_q = ", p.seq_q);
    case SequenceFault::seqused_k:
      return fail(StatusCode::invalid_sequence_lengths, "sequences.seqused_k[", b, "] = ", value,
                  " is outside [0, ", index, "], the keys sequence ", b, " has");
    case SequenceFault::max_seqlen_k:
      return fail(StatusCode::invalid_sequence_lengths, "sequence ", b, " uses ", value,
                  " keys, more than max_seqlen_k = ", p.seq_kv);
    case SequenceFault::block_table:
      return fail(StatusCode::invalid_block_table, "sequences.block_table[", b, "][", index, "] = ", value,
                  " is outside [0, ", s.num_blocks, "), the cache's pages (a page sequence ", b,
                  " reads for its keys)");
  }
  return fail(StatusCode::invalid_sequence_lengths, "sequence ", b, ": unknown fault ", static_cast<int>(check.fault));
}

Status check_sequence_data(const AttentionProblem& p) {
  const SequenceLayout& s = p.sequences;
  if (!s.active) return {};
  for (int64_t b = 0; b < p.batch; ++b) {
    SequenceCheck check = check_sequence(s, b, p.seq_q, p.seq_kv);
    if (check.fault == SequenceFault::none && s.paged()) check = check_pages(s, b, 0, pages_read(s, b));
    FFPA_RETURN_IF_ERROR(sequence_fault_status(p, b, check));
  }
  return {};
}

}  // namespace ffpa::detail
