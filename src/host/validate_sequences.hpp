// Validation of a serving call's batch of sequences (ForwardParams::sequences):
// its tensors, how q, k, v, o and lse relate to them, and (on host memory) the
// lengths and block ids themselves.
#pragma once

#include <cstdint>

#include "common/attention_problem.hpp"
#include "ffpa/ffpa.hpp"
#include "host/validate_checks.hpp"

namespace ffpa::detail {

// B: the sequences of a serving call (cu_seqlens_q's, else q's batch).
int64_t sequence_count(const SequenceBatch& batch, const ForwardParams& p);

// The batch's tensors (ranks, sizes, dtypes, null pointers, strides,
// alignment) and the shapes of q, k, v, o and lse against them; what the
// batch does not serve (a mask, dropout, precision fp8, an FP8 KV cache of
// the library's own format) is refused here too.
Status check_sequence_batch(const ForwardParams& p);

// The byte ranges of the batch's four tensors (cu_seqlens_q, cu_seqlens_k,
// block_table, seqused_k), for the overlap checks of the outputs.
inline constexpr int kSequenceTensors = 4;
Status sequence_byte_ranges(const SequenceBatch& batch, ByteRange (&ranges)[kSequenceTensors],
                            const char* (&names)[kSequenceTensors]);

// Fills problem->sequences and the bounds seq_q / seq_kv (max_seqlen_q /
// max_seqlen_k, or the loosest bounds the tensors give) of a checked call.
void set_sequence_layout(const ForwardParams& p, AttentionProblem* problem);

// The lengths and block ids, read from host memory: cu_seqlens non-decreasing
// and within their tensors, every Nq_b within max_seqlen_q, seqused_k[b] in
// [0, the keys sequence b has] and within max_seqlen_k, every page a
// sequence reads in [0, num_blocks). invalid_sequence_lengths /
// invalid_block_table naming the sequence and the value.
Status check_sequence_data(const AttentionProblem& p);

// The status of a fault the checks found in sequence b (check_sequence and
// check_pages of common/sequence_batch.hpp, here or in a device plan): its
// message from the check's numbers and the problem's shapes alone (it reads
// no tensor).
Status sequence_fault_status(const AttentionProblem& p, int64_t b, const SequenceCheck& check);

}  // namespace ffpa::detail
