// A serving call's batch of sequences (ffpa::SequenceBatch), normalized:
// where each sequence's query rows and keys lie in q, o, lse and in k, v.
// Host and device: the CPU reference, the plan's checks and the kernels read
// a sequence through the same functions.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace ffpa::detail {

// How the B sequences lie in the tensors; every pointer is null in a dense
// call (queries and keys then follow the batch index). The lengths are read
// from memory in the tensors' space (device memory for the kernels).
struct SequenceLayout {
  bool active = false;                    // a serving call (ForwardParams::sequences)
  const int32_t* cu_seqlens_q = nullptr;  // packed q, o, lse: sequence b owns rows [cu[b], cu[b + 1]) of batch 0
  const int32_t* cu_seqlens_k = nullptr;  // packed k, v (or, with a block table, the lengths only)
  const int32_t* seqused_k = nullptr;     // keys sequence b uses
  const int32_t* block_table = nullptr;   // paged k, v: page of keys [p * page_size, (p + 1) * page_size)
  int64_t cu_seqlens_q_stride = 1, cu_seqlens_k_stride = 1, seqused_k_stride = 1;  // elements
  int64_t block_table_stride[2] = {0, 1};  // between sequences, between pages of one
  int64_t max_blocks = 0;                  // pages in a block table row
  int64_t page_size = 0;                   // rows of a page (k's dim 2)
  int64_t num_blocks = 0;                  // pages in the cache (k's dim 0)
  int64_t queries_per_sequence = 0;        // q [B, Hq, Nq, D] without cu_seqlens_q: Nq
  int64_t keys_per_sequence = 0;           // k [B, Hkv, Nkv, D] batched: Nkv
  int64_t packed_rows_q = 0, packed_rows_k = 0;  // total_q, total_k: the rows of packed q / k
  // The call's plan (kernels/serving/plan.hpp: the data checks' verdict and
  // each sequence's first tile), written before the kernels run; the GPU
  // families read their tiles from it.
  const void* plan = nullptr;

  FFPA_HOST_DEVICE bool paged() const { return block_table != nullptr; }
  FFPA_HOST_DEVICE bool packed_q() const { return cu_seqlens_q != nullptr; }
  FFPA_HOST_DEVICE bool packed_k() const { return cu_seqlens_k != nullptr && block_table == nullptr; }
};

// One sequence: its rows in q's batch entry q_batch, from q_begin, and its
// keys (in k's batch entry kv_batch from kv_begin; paged: through its table
// row). seq_kv_capacity: the keys it has (what seqused_k may use).
struct Sequence {
  int64_t q_batch = 0, q_begin = 0, seq_q = 0;
  int64_t kv_batch = 0, kv_begin = 0, seq_kv = 0, seq_kv_capacity = 0;
};

FFPA_HOST_DEVICE Sequence sequence_at(const SequenceLayout& s, int64_t b) {
  Sequence seq;
  if (s.packed_q()) {
    seq.q_batch = 0;
    seq.q_begin = s.cu_seqlens_q[b * s.cu_seqlens_q_stride];
    seq.seq_q = s.cu_seqlens_q[(b + 1) * s.cu_seqlens_q_stride] - seq.q_begin;
  } else {
    seq.q_batch = b;
    seq.seq_q = s.queries_per_sequence;
  }
  if (s.paged()) {
    seq.kv_batch = 0;  // unused: a key's page says where it is
    seq.seq_kv_capacity = s.max_blocks * s.page_size;
    if (s.cu_seqlens_k != nullptr) {
      seq.seq_kv_capacity = s.cu_seqlens_k[(b + 1) * s.cu_seqlens_k_stride] - s.cu_seqlens_k[b * s.cu_seqlens_k_stride];
    }
  } else if (s.packed_k()) {
    seq.kv_batch = 0;
    seq.kv_begin = s.cu_seqlens_k[b * s.cu_seqlens_k_stride];
    seq.seq_kv_capacity = s.cu_seqlens_k[(b + 1) * s.cu_seqlens_k_stride] - seq.kv_begin;
  } else {
    seq.kv_batch = b;
    seq.seq_kv_capacity = s.keys_per_sequence;
  }
  seq.seq_kv = s.seqused_k != nullptr ? s.seqused_k[b * s.seqused_k_stride] : seq.seq_kv_capacity;
  return seq;
}

// The element offset of key j's row (of kv head h) in a k or v tensor of
// b, h, n strides `stride` (dense calls: batch b's key j).
FFPA_HOST_DEVICE int64_t key_row_offset(const SequenceLayout& s, const int64_t (&stride)[3], const Sequence& seq,
                                        int64_t b, int64_t h, int64_t j) {
  if (s.paged()) {
    const int64_t page = s.block_table[b * s.block_table_stride[0] + (j / s.page_size) * s.block_table_stride[1]];
    return page * stride[0] + h * stride[1] + (j % s.page_size) * stride[2];
  }
  return seq.kv_batch * stride[0] + h * stride[1] + (seq.kv_begin + j) * stride[2];
}

// The element offset of query row i's row (of head h) in q, o (b, h, n
// strides) or, with a zero dim-3 stride, lse.
FFPA_HOST_DEVICE int64_t query_row_offset(const int64_t (&stride)[3], const Sequence& seq, int64_t h, int64_t i) {
  return seq.q_batch * stride[0] + h * stride[1] + (seq.q_begin + i) * stride[2];
}

// What can be wrong with a sequence's lengths and pages (the plan's data
// checks, on the device, and check_sequence_data on host memory), with the
// two numbers its message needs (SequenceCheck::value, index).
enum class SequenceFault : int32_t {
  none = 0,
  cu_seqlens_q = 1,    // an offset below the one before it, or negative (value: it, index: b + 1)
  q_rows = 2,          // an offset past q's packed rows (value: it, index: b + 1)
  cu_seqlens_k = 3,    // as cu_seqlens_q
  k_rows = 4,          // as q_rows
  table_capacity = 5,  // cu_seqlens_k's length beyond the table row's keys (value: the length)
  max_seqlen_q = 6,    // a sequence longer than the bound (value: its length)
  seqused_k = 7,       // outside [0, the keys the sequence has] (value: seqused_k[b], index: those keys)
  max_seqlen_k = 8,    // (value: the keys it uses)
  block_table = 9,     // a page id outside [0, num_blocks) (value: the id, index: the page)
};

struct SequenceCheck {
  SequenceFault fault = SequenceFault::none;
  int64_t value = 0, index = 0;
};

// Sequence b's lengths against its tensors and the bounds max_seq_q /
// max_seq_kv (the problem's seq_q / seq_kv), in a fixed order; its pages are
// checked apart (check_pages), so that a device plan can spread them.
FFPA_HOST_DEVICE SequenceCheck check_sequence(const SequenceLayout& s, int64_t b, int64_t max_seq_q,
                                              int64_t max_seq_kv) {
  if (s.cu_seqlens_q) {
    const int64_t first = s.cu_seqlens_q[b * s.cu_seqlens_q_stride];
    const int64_t end = s.cu_seqlens_q[(b + 1) * s.cu_seqlens_q_stride];
    if (first < 0 || end < first) return {SequenceFault::cu_seqlens_q, first < 0 ? first : end, first < 0 ? b : b + 1};
    if (end > s.packed_rows_q) return {SequenceFault::q_rows, end, b + 1};
  }
  if (s.cu_seqlens_k) {
    const int64_t first = s.cu_seqlens_k[b * s.cu_seqlens_k_stride];
    const int64_t end = s.cu_seqlens_k[(b + 1) * s.cu_seqlens_k_stride];
    if (first < 0 || end < first) return {SequenceFault::cu_seqlens_k, first < 0 ? first : end, first < 0 ? b : b + 1};
    if (s.packed_k() && end > s.packed_rows_k) return {SequenceFault::k_rows, end, b + 1};
    if (s.paged() && end - first > s.max_blocks * s.page_size) return {SequenceFault::table_capacity, end - first, b};
  }
  const Sequence seq = sequence_at(s, b);
  if (seq.seq_q > max_seq_q) return {SequenceFault::max_seqlen_q, seq.seq_q, b};
  if (seq.seq_kv < 0 || seq.seq_kv > seq.seq_kv_capacity) {
    return {SequenceFault::seqused_k, seq.seq_kv, seq.seq_kv_capacity};
  }
  if (seq.seq_kv > max_seq_kv) return {SequenceFault::max_seqlen_k, seq.seq_kv, b};
  return {};
}

// The pages [page_first, page_end) of sequence b's table row: each id in
// [0, num_blocks). Pages past the ones its keys need are never read.
FFPA_HOST_DEVICE SequenceCheck check_pages(const SequenceLayout& s, int64_t b, int64_t page_first, int64_t page_end) {
  for (int64_t page = page_first; page < page_end; ++page) {
    const int64_t id = s.block_table[b * s.block_table_stride[0] + page * s.block_table_stride[1]];
    if (id < 0 || id >= s.num_blocks) return {SequenceFault::block_table, id, page};
  }
  return {};
}

// The pages sequence b reads for its keys (valid lengths: check_sequence).
FFPA_HOST_DEVICE int64_t pages_read(const SequenceLayout& s, int64_t b) {
  return (sequence_at(s, b).seq_kv + s.page_size - 1) / s.page_size;
}

}  // namespace ffpa::detail
