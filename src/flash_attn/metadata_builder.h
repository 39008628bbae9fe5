// The FlashAttention-style builder: CommonAttentionMetadata -> FlashAttnMetadata, with the
// decode/prefill bookkeeping and the ahead-of-time split-KV decision. One varlen kernel runs
// the whole batch, so the batch need not be reordered.
#pragma once
#include <cstddef>

#include "attnkit/backend.h"
#include "flash_attn/cascade.h"
#include "flash_attn/split_kv.h"

namespace attnkit::flash_attn {

struct FlashAttnMetadata : BackendMetadata {
  int num_reqs = 0;
  int num_actual_tokens = 0;
  int max_query_len = 0;
  int max_seq_len = 0;
  bool causal = true;
  // The kernels' arrays: CommonAttentionMetadata's device copies (int32, CUDA).
  TensorView query_start_loc, seq_lens, block_table;
  int max_blocks_per_req = 0;
  int max_block_id = -1;  // largest block id read; the impl checks it against the cache

  // Decode / prefill bookkeeping (a decode has query_len <= decode_threshold; empty
  // requests count as neither).
  int decode_threshold = 1;
  int num_decodes = 0, num_prefills = 0;
  int num_decode_tokens = 0, num_prefill_tokens = 0;
  int max_decode_seq_len = 0;
  int max_prefill_query_len = 0, max_prefill_seq_len = 0;
  bool decodes_first = true;  // every decode precedes every prefill
  // Every non-empty request has exactly one query token: the batch a captured CUDA graph
  // (UNIFORM_SINGLE_TOKEN_DECODE) replays.
  bool uniform_single_token_decode = false;

  // A DCP shard (CommonAttentionMetadata::dcp_world_size > 1): seq_lens are the rank's local
  // key counts; every query sees all of them (decodes, or no causal mask), so the forward is
  // the plain kernel over the rank's keys, returning its partial and LSE for the combine.
  int dcp_world_size = 1;

  SplitKVDecision split;        // split.num_splits: 1 = no split
  size_t workspace_bytes = 0;   // split-KV partials the launch needs (varlen_workspace_bytes)
};

struct FlashAttnBuilderOptions {
  int decode_threshold = 1;     // > 1 with speculative decoding
  int max_splits = kMaxSplits;  // 1: never split (no workspace, batch-invariant results)
};

class FlashAttnMetadataBuilder final : public MetadataBuilder {
 public:
  explicit FlashAttnMetadataBuilder(const AttentionConfig& cfg, FlashAttnBuilderOptions opts = {});
  std::unique_ptr<BackendMetadata> build(const CommonAttentionMetadata& common) override;
  // The concrete type, for callers that hold the builder as a FlashAttnMetadataBuilder.
  FlashAttnMetadata build_flash(const CommonAttentionMetadata& common) const;
  // use_cascade_attention for this batch with this configuration's heads, features
  // (ALiBi, sliding window) and SM count; common_prefix_len comes from the KV-cache manager.
  CascadeDecision cascade_decision(const CommonAttentionMetadata& common, int common_prefix_len,
                                   int dcp_world_size = 1) const;

 private:
  AttentionConfig cfg_;
  FlashAttnBuilderOptions opts_;
};

}  // namespace attnkit::flash_attn
