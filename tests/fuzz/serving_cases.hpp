// The API fuzz driver's serving calls (issue 31; docs/serving.md): a
// SequenceBatch with packed or batched queries and packed, batched or paged
// keys (page sizes from 1, odd ones, vLLM's NHD and HND caches, one half of
// a stacked [2, num_blocks, ...] or [num_blocks, 2, ...] buffer, V inside K's
// rows as MLA's latent cache with D_qk != D_v), seqused_k, max_seqlen_q/k
// (0 or given), both causal alignments per sequence, window, softcap, sinks,
// an e4m3 KV cache with f32 [B, Hkv] descales (dense, per head, or one value
// through stride 0), empty sequences; a seventh of the calls are dense (no
// SequenceBatch) with the same options. A third of the non-empty calls get
// one fault: a length or block id in the tensors' memory (refused by the run
// with invalid_sequence_lengths / invalid_block_table, which select_kernel
// cannot see and check_sequences reports), or one validation sees.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ffpa/ffpa.hpp"
#include "fuzz/fuzz_support.hpp"
#include "fuzz/serving_reference.hpp"
#include "support/host_tensors.hpp"

namespace ffpa_fuzz {

enum class QueryForm { packed, batched };
enum class KeyForm { packed, batched, paged };
// How k and v lie in memory, logical [outer, Hkv, inner, D]: bhnd
// [outer, Hkv, inner, row] (a paged cache's HND), bnhd [outer, inner, Hkv,
// row] (NHD), stacked [2, outer, inner, Hkv, row] (K the first half, V the
// second), stacked_inner [outer, 2, inner, Hkv, row].
enum class KvLayout { bhnd, bnhd, stacked, stacked_inner };

// One drawn serving call: the buffers it owns and its parameters (which point
// into it, so a case is built in place and never moved).
struct ServingCase {
  bool dense = false;  // no SequenceBatch: batched queries and keys, the serving options
  QueryForm queries = QueryForm::batched;
  KeyForm keys = KeyForm::batched;
  KvLayout layout = KvLayout::bhnd;
  int64_t batch = 0, heads_q = 1, heads_kv = 1, dim = 8, value_dim = 8;
  int64_t page_size = 0, num_blocks = 0, max_blocks = 0;
  int64_t q_rows = 0;  // q's dim 2: total_q plus spare rows (packed), or Nq
  int64_t k_rows = 0;  // k's dim 2: total_k plus spare rows, Nkv or page_size
  ffpa::DType dtype = ffpa::DType::bf16;
  bool e4m3 = false, value_in_key_rows = false;
  std::vector<int64_t> capacity;  // the keys each sequence has (seqused_k's bound)

  ffpa::testing::HostTensor q, o, lse, k_buffer, v_buffer;
  ffpa::testing::HostTensor cu_q, cu_k, table, used, sinks, k_descale, v_descale, mask, plan;
  ffpa::SequenceBatch sequences;
  ffpa::ForwardParams params;
  ServingReference reference;  // where each sequence's rows are (reference.params = &params)

  std::string fault;  // empty: a valid call
  ffpa::StatusCode expected = ffpa::StatusCode::ok;
  bool data_fault = false;        // in the lengths or block ids: the run refuses it, select_kernel cannot
  bool planning_refusal = false;  // refused by planning the impl (check_sequences plans nothing)
  bool dispatch_refusal = false;  // a GPU impl on host tensors: impl_unavailable or wrong_memory_space

  ServingCase() = default;
  ServingCase(const ServingCase&) = delete;
  ServingCase& operator=(const ServingCase&) = delete;

  // Every buffer the call reads (inputs) and writes (outputs).
  std::vector<ffpa::testing::HostTensor*> inputs();
  std::vector<ffpa::testing::HostTensor*> outputs() { return {&o, &lse}; }
  // B, Hq or the query rows' bound is 0: forward() runs nothing and succeeds.
  bool empty() const;
  std::string describe() const;
};

// Draws a valid call into c (default-constructed) from rng.
void draw_serving_case(ServingCase& c, std::mt19937_64& rng);

// One fault that the call must be refused for (c.fault, c.expected); false
// when the drawn kind does not apply to this call.
bool inject_serving_fault(ServingCase& c, std::mt19937_64& rng);

// Draws the serving call of `seed` (kServingSeedBit set), perhaps with one
// fault, runs it through both APIs and checks it (serving_cases.cpp).
void run_serving_case(uint64_t seed, Tally* tally);

}  // namespace ffpa_fuzz
