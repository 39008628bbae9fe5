// The ahead-of-time split-KV decision of the FlashAttention-style builder.
//
// A launch runs one CTA per work item (request, KV head, tile of packed query rows) and, with
// num_splits > 1, num_splits CTAs per item, each over 1/num_splits of the request's KV, merged
// by LSE at the end of the launch. Splitting pays only when the work items alone leave the GPU
// idle, and never when the splits would read only a few KV tiles each. The rule counts the tile
// the launch takes (launch_plan.h split_rule_tile: its rows, keys per tile, CTAs per SM):
//
//   work items  W = sum over requests of num_kv_heads * ceil(query_len * group / tile rows)
//               (the grid's count: the CTAs that have rows)
//   CTA slots   S = num_sms * the tile's CTAs per SM
//   s = min(floor(S / W), kMaxUsefulSplits, max_splits, floor(max_seq_len / kMinKVPerSplit))
//   (floor: the W * s CTAs fill at most one wave of slots, never start a partial second one)
//   then s drops to the smallest count giving the same longest split (in the tile's KV tiles),
//   since more splits that do not shorten the longest one only add merge work;
//   s <= 1 -> 1.
//   Past half a wave (2W > S), a batch of decode tiles of at most two waves (W <= 2S) still
//   splits when the waves would run mostly empty: s in 2..min(kMaxWaveSplits, max_splits,
//   max_seq_len / kMinKVPerWaveSplit) with the best fill W*s / (ceil(W*s / S) * S), the smallest
//   on ties, if that fill beats one split's by kMinWaveFillGain.
// A split launch runs the tile of the unsplit one (the hopper kernel's too: one CTA per SM).
// The measured evidence for each constant: src/flash_attn/DECISIONS.md ("Split count: ...").
// Borrowed from FlashAttention's num_splits_heuristic: the wave-fill view of the split count and
// the skip of split counts with the same per-split work (FA2's "ineligible" splits).
// kMaxSplits = 32 (vLLM's default flash_attn_max_num_splits_for_cuda_graph) stays the hard cap
// that sizes the workspace.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "attnkit/dtype.h"
#include "flash_attn/launch_plan.h"

namespace attnkit::flash_attn {

inline constexpr int kMinKVPerSplit = 512;      // a split reads >= 8 KV tiles of 64 keys
inline constexpr int kMaxSplits = 32;          // hard cap; bounds the CUDA-graph workspace
inline constexpr int kMaxUsefulSplits = 32;    // the rule never picks more (measured)
inline constexpr int kMaxWaveSplits = 4;       // the wave-fill clause's largest count
inline constexpr double kMinWaveFillGain = 0.15;  // ... the fill it must add
inline constexpr int kMinKVPerWaveSplit = 2048;   // ... and the KV each split keeps

struct SplitKVInput {
  std::span<const int32_t> query_start_loc;  // num_reqs + 1
  std::span<const int32_t> seq_lens;         // num_reqs
  int num_heads = 0, num_kv_heads = 0;
  int num_sms = 0;         // > 0
  int max_splits = kMaxSplits;  // caller's cap (1 disables splitting: no workspace, batch invariance)
  DType cache_dtype = DType::bf16;  // KV cache storage dtype
  int head_size = 0;   // 0: unknown (no tile that needs a head size is counted)
  int cc_major = 0;    // the device's compute capability (0: unknown)
  bool hopper_kernels = false;  // the hopper generation serves the layer (sm_90a code, sm90 device)
};

struct SplitKVDecision {
  int num_splits = 1;
  int64_t work_items = 0;  // W
  int64_t cta_slots = 0;   // S
  std::string reason;      // why this count, in words
};

// The launch facts of an unsplit launch of this batch (launch_plan.h).
LaunchFacts split_kv_facts(const SplitKVInput& in);
// The tile the rule counts for this batch (split_rule_tile of split_kv_facts).
TileConfig split_kv_tile(const SplitKVInput& in);
// Work items W of the rule above.
int64_t split_kv_work_items(const SplitKVInput& in);
SplitKVDecision decide_num_splits(const SplitKVInput& in);

// The rule for a uniform batch: num_reqs requests of q_len queries over kv_len keys each, with
// the other fields of `shape` (heads, SMs, cache dtype, head size, device) as given. What
// FlashAttention's num_splits = 0 and get_scheduler_metadata decide from host-visible sizes, and
// what the bench's uniform batches take.
SplitKVDecision decide_num_splits_uniform(int num_reqs, int q_len, int kv_len, SplitKVInput shape);

}  // namespace attnkit::flash_attn
