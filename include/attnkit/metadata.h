// Batch metadata shared by every backend (docs/architecture.md section 3).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "attnkit/tensor.h"

namespace attnkit {

// A batch as plain host arrays, the form the reference and the planners read. Unlike
// CommonAttentionMetadata it also admits query_len > seq_len (the kernel-level varlen call):
// query i of request r sits at position seq_len - query_len + i, which may be negative.
struct BatchView {
  std::span<const int32_t> query_start_loc;  // num_reqs + 1
  std::span<const int32_t> seq_lens;         // num_reqs
  std::span<const int32_t> block_table;      // num_reqs * max_blocks_per_req, row-major
  int max_blocks_per_req = 0;
  int num_reqs() const { return static_cast<int>(seq_lens.size()); }
  int query_len(int r) const { return query_start_loc[r + 1] - query_start_loc[r]; }
  const int32_t* block_row(int r) const {
    return block_table.data() + static_cast<int64_t>(r) * max_blocks_per_req;
  }
  // Checks array lengths, monotone query_start_loc from 0, non-negative lengths, block
  // table wide enough and block ids in [0, num_blocks) for every block a request reads.
  // allow_query_longer_than_keys relaxes query_len <= seq_len (the varlen-kernel contract).
  void validate(std::string_view where, int64_t num_blocks, int block_size,
                bool allow_query_longer_than_keys) const;
};

struct CommonAttentionMetadata {
  // Host copies (planning reads these).
  std::vector<int32_t> query_start_loc;  // num_reqs + 1, starts at 0, non-decreasing
  std::vector<int32_t> seq_lens;         // num_reqs, KV length including the new tokens
  std::vector<int32_t> block_table;      // num_reqs * max_blocks_per_req
  int max_blocks_per_req = 0;
  std::vector<int64_t> slot_mapping;     // num_actual_tokens
  int num_reqs = 0;
  int num_actual_tokens = 0;
  int max_query_len = 0;
  int max_seq_len = 0;
  bool causal = true;
  // Decode context parallelism (include/attnkit/dcp.h): this rank holds key t of every request
  // when (t / dcp_interleave) % dcp_world_size == dcp_rank, in its own cache, which block_table
  // addresses (the rank's local token j of a request sits at block j / block_size). seq_lens stay
  // global (they place the queries); key_seq_lens() are the keys the rank holds. World size 1:
  // no sharding.
  int dcp_world_size = 1, dcp_rank = 0, dcp_interleave = 1;

  // Device copies (kernels read these); undefined on the CPU path.
  TensorView query_start_loc_dev, seq_lens_dev, block_table_dev, slot_mapping_dev;
  // With DCP on a GPU backend: the device copy of key_seq_lens() (int32 [num_reqs], vLLM's
  // dcp_local_seq_lens), the keys the kernels read on this rank.
  TensorView dcp_local_seq_lens_dev;

  int query_len(int r) const { return query_start_loc[r + 1] - query_start_loc[r]; }
  BatchView batch() const;
  // The keys each request has in this rank's cache: seq_lens, or with DCP the rank's local
  // lengths (dcp_local_seq_lens).
  std::vector<int32_t> key_seq_lens() const;
  // Full validation (docs/architecture.md section 3): sizes agree, num_actual_tokens ==
  // query_start_loc.back(), max_* are the true maxima, query_len <= seq_len, blocks needed
  // (for key_seq_lens) <= max_blocks_per_req, block ids < num_blocks, slots < num_blocks *
  // block_size, a valid DCP shard.
  void validate(int64_t num_blocks, int block_size) const;
  // Fills num_reqs, num_actual_tokens, max_query_len, max_seq_len from the arrays.
  void finalize();
};

struct DecodePrefillSplit {
  int num_decodes = 0, num_prefills = 0;
  int num_decode_tokens = 0, num_prefill_tokens = 0;
};

// Expects decodes (query_len <= decode_threshold, which must be >= 1) first; throws Error
// naming the first decode found after a prefill otherwise. Empty requests count as decodes.
DecodePrefillSplit split_decodes_and_prefills(const CommonAttentionMetadata& md,
                                              int decode_threshold = 1);
// The permutation that puts decodes first, stable within each group: new request i is old
// request perm[i].
std::vector<int> decode_first_order(const CommonAttentionMetadata& md, int decode_threshold = 1);
// Applies a request permutation to the host arrays (query_start_loc, seq_lens, block_table,
// slot_mapping). token_perm, if given, receives for each new token its old token index, so
// the caller can permute q/k/v the same way. The result's device copies are undefined (the
// caller uploads the permuted host arrays); the scalars (num_reqs, max_*, causal) carry over.
CommonAttentionMetadata permute_requests(const CommonAttentionMetadata& md,
                                         std::span<const int> perm,
                                         std::vector<int>* token_perm = nullptr);

}  // namespace attnkit
