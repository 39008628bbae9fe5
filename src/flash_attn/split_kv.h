// The ahead-of-time split-KV decision of the FlashAttention-style builder.
//
// A launch runs one CTA per work item (request, KV head, q tile) and, with num_splits > 1,
// num_splits CTAs per item, each over 1/num_splits of the request's KV, merged afterwards by
// LSE. Splitting pays only when the work items alone leave the GPU idle, and never when the
// splits would read only a few KV tiles each. The rule:
//
//   q tiles of a request (per KV head): a decode (query_len <= decode_threshold) packs its GQA
//     group into the M tile, ceil(query_len * group / kQTileRows); a prefill takes
//     group * ceil(query_len / kQTileRows) (one CTA row-tile per query head).
//   work items  W = sum over requests of num_kv_heads * q_tiles
//   CTA slots   S = num_sms * kCtasPerSm
//   W >= kFillFraction * S                        -> 1 (the items already fill the GPU)
//   otherwise s = min(ceil(S / W), kMaxSplits, max_splits, floor(max_seq_len / kMinKVPerSplit))
//   then s drops to the smallest count giving the same longest split (in KV tiles), since more
//   splits that do not shorten the longest one only add merge work; s <= 1 -> 1.
//
// Borrowed from FlashAttention's num_splits_heuristic (studies/flash-attention.md 2.1, 2.2.8):
// the 0.8 fill threshold, the q tile of 64 rows and the
// skip of split counts with the same per-split work (FA2's "ineligible" splits). FA2/FA3 then
// search wave efficiency up to 128 splits; we take the direct count and cap it at 32 (vLLM's
// default flash_attn_max_num_splits_for_cuda_graph), and add the minimum KV per split (4 tiles
// of 64 = 256 tokens; FA3 likewise never splits 4 KV blocks or fewer). FA2 counts 2 CTAs per
// SM; our decode kernel is measured best with one work item per SM on the H200 (batch 1 x 32k:
// 16 splits 52.6 us vs 32 splits 59.7 us; batch 16 x 4k: 2 splits 77 us vs 3 splits 90 us), so
// kCtasPerSm = 1.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "attnkit/dtype.h"

namespace attnkit::flash_attn {

inline constexpr int kQTileRows = 64;                      // query rows per CTA tile
inline constexpr int kKVTileTokens = 64;                   // KV tokens per main-loop iteration
inline constexpr int kMinKVPerSplit = 4 * kKVTileTokens;   // a split reads >= 4 KV tiles
inline constexpr int kMaxSplits = 32;                      // also bounds the CUDA-graph workspace
inline constexpr int kCtasPerSm = 1;                       // work items per SM (see below)
inline constexpr double kFillFraction = 0.8;               // W >= 0.8 * slots: GPU is full

struct SplitKVInput {
  std::span<const int32_t> query_start_loc;  // num_reqs + 1
  std::span<const int32_t> seq_lens;         // num_reqs
  int num_heads = 0, num_kv_heads = 0;
  int decode_threshold = 1;
  int num_sms = 0;         // > 0
  int max_splits = kMaxSplits;  // caller's cap (1 disables splitting: no workspace, batch invariance)
  DType cache_dtype = DType::bf16;  // KV cache storage dtype (the fp8 path wants more CTAs)
};

struct SplitKVDecision {
  int num_splits = 1;
  int64_t work_items = 0;  // W
  int64_t cta_slots = 0;   // S
  std::string reason;      // why this count, in words
};

// Work items W of the rule above.
int64_t split_kv_work_items(const SplitKVInput& in);
SplitKVDecision decide_num_splits(const SplitKVInput& in);

}  // namespace attnkit::flash_attn
