// Whether cascade attention pays for a batch (docs/architecture.md section 6).
//
// Cascade = one non-causal pass of every query over the prefix all requests share, plus one
// causal pass per request over its own suffix, merged by LSE. It reads the shared prefix
// once instead of once per request, so it pays for a long prefix shared by many requests.
//
// The rule (vLLM's FlashAttention `use_cascade_attention`, studies/vllm-backends.md c.12):
//   1. the usable prefix is the common prefix capped so that every request with queries keeps
//      >= 1 suffix token (prefix <= seq_len - max(query_len, 1)), floored to whole blocks;
//   2. refuse with a prefix < kCascadeMinPrefix tokens, fewer than kCascadeMinRequests requests
//      with queries, ALiBi, a sliding window, or decode context parallelism (DCP > 1);
//   3. if the batch would not run as GQA flash-decoding (a prefill present, or no GQA group)
//      cascade pays; otherwise compare, in kCascadeTile-token tiles over the prefix,
//        cascade:  ceil(num_heads * ceil(num_reqs / 128) / num_sms) * prefix_tiles
//        decode:   ceil(num_reqs * num_kv_heads * ceil(group / 128) * prefix_tiles / num_sms)
//      and use cascade only when it is strictly cheaper.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace attnkit::flash_attn {

inline constexpr int kCascadeMinPrefix = 256;   // shorter prefixes are not worth a second pass
inline constexpr int kCascadeMinRequests = 8;   // fewer requests share too little
inline constexpr int kCascadeTile = 128;        // tile of the cost model (q and KV)

struct CascadeInput {
  int common_prefix_len = 0;                 // tokens every request shares (from the KV manager)
  std::span<const int32_t> query_start_loc;  // num_reqs + 1
  std::span<const int32_t> seq_lens;         // num_reqs
  int num_heads = 0, num_kv_heads = 0;
  int block_size = 16;
  bool alibi = false, sliding_window = false;
  int dcp_world_size = 1;
  int num_sms = 0;  // > 0
};

struct CascadeDecision {
  bool use = false;
  int prefix_len = 0;  // the usable prefix (after step 1); meaningful when use
  std::string reason;
};

// Step 1 alone: the prefix cascade may use for this batch.
int cascade_prefix_len(int common_prefix_len, std::span<const int32_t> query_start_loc,
                       std::span<const int32_t> seq_lens, int block_size);

CascadeDecision use_cascade_attention(const CascadeInput& in);

}  // namespace attnkit::flash_attn
