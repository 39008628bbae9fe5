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
//   CTA slots   S = num_sms * CTAs per SM: kCtasPerSmPrefill when any request is a prefill,
//               else kCtasPerSmDecodeTransposed where the transposed fp8 decode tile serves
//               (transposed_decode_tile), kCtasPerSmDecodeFp8 for other fp8 caches,
//               kCtasPerSmDecode otherwise
//   s = min(floor(S / W), kMaxUsefulSplits, max_splits, floor(max_seq_len / kMinKVPerSplit))
//   (floor: the W * s CTAs fill at most one wave of slots, never start a partial second one)
//   then s drops to the smallest count giving the same longest split (in KV tiles), since more
//   splits that do not shorten the longest one only add merge work; s <= 1 -> 1.
//   Past half a wave (2W > S), a decode-only batch of at most two waves (W <= 2S) still splits
//   when the waves would run mostly empty: s in 2..min(kMaxWaveSplits, max_splits,
//   max_seq_len / kMinKVPerWaveSplit) with the best fill W*s / (ceil(W*s / S) * S), the smallest on
//   ties, if that fill beats one split's by kMinWaveFillGain. Batches with a prefill never do
//   (the hopper kernel serves unsplit launches only).
//
// Measured on the H200 (132 SMs; attnkit_bench --split-sweep, 32/8 heads, hd 128, block 16,
// us per call at forced split counts, commit 1ebe660):
//   bf16 batch 16 (W = 128): 1 split 76.9 / 148.0 / 567.5 us (KV 4k / 8k / 32k), 2 splits
//     75.0 / 142.3 / 536.9, 3 splits 83.9 / 157.9 / 605.0, 4 splits 78.2 / 143.4 / 534.5: the
//     decode kernel keeps 2 CTAs per SM busy, and 384 CTAs (1.45 waves of 264) lose.
//   fp8 batch 16: 1 split 66.5 / 126.7 / 482.6, 2: 51.3 / 90.9 / 330.0, 3: 50.3 / 86.1 / 301.7,
//     4: 58.0 / 97.0 / 348.3: the fp8 path (dequant + f16 MMAs per tile) is compute-bound
//     per CTA and wants 3 CTAs per SM (384 <= 396 slots).
//   fp8 batch 4 x 32k: 4 splits 129.9, 8: 95.0, 12: 92.1, 16: 110.4 us (bf16: 8 splits best,
//     145.9 us) -- the same slots, 3 per SM for fp8 and 2 for bf16.
//   batch 1 (W = 8, either dtype): best 8 / 12 / 16 splits at KV 4k / 8k / 32k (bf16 18.1 /
//     24.4 / 52.2 us) while a separate combine kernel merged the splits; no split shorter than
//     512 tokens won (1 x 4k: 8 splits 18.1 us, 16 splits 19.6 us; fp8 4 x 4k: 8 splits
//     24.7 us, 12 splits 28.5 us), hence kMinKVPerSplit.
//   With the merge fused into the kernel (the last split CTA merges; commit 1dd3aa2, same
//   sweep): bf16 1 x 32k 16 splits 48.6 us, 24: 49.2, 32: 44.0 (66% of read BW); fp8 1 x 32k
//   16: 42.8, 24: 40.6, 32: 41.0; batch 4 / 16 / 64 keep their best counts (8 / 2 / 1 for
//   bf16): hence kMaxUsefulSplits = kMaxSplits = 32.
//   batch 64 (W = 512 > S / 2): 1 split is best for bf16 and within 3% for fp8.
//   Same sweep at d6c4eed (fp8 format as a template parameter, more of the fp8 time is now HBM):
//   fp8 batch 64, 1 / 2 / 3 splits: 192.3 / 184.1 / 185.6 us at KV 4k, 369.1 / 329.7 / 324.4 at
//   8k, 1366 / 1249 / 1296 at 32k -- W = 512 on 396 slots fills 65% of two waves, 3 splits 97%;
//   bf16 batch 64 (97% of two waves of 264) stays best unsplit: hence the wave-fill clause. With
//   splits of 512 keys it lost (48d7893, fp8 batch 64 x 1k: 2 splits 39% of read BW, unsplit
//   47% the run before): hence kMinKVPerWaveSplit. The sweep at 18652a5 (batch 128 / 256 added)
//   agrees with the rule on every row but fp8 64 x 32k (rule 3 splits 1207 us, best 2 1183):
//   past two waves splitting only loses (fp8 256 x 4k: 615.8 us unsplit, 683.7 at 2 splits;
//   bf16 256 x 4k 1029.1 vs 1049.1), hence the W <= 2S bound.
// The transposed fp8 decode tile (4 CTAs per SM; sweep at 0a4cc11, us per call at 1 / 2 / 3 /
//   4 splits): batch 16 x 4k 71.4 / 47.1 / 43.5 / 43.4, 8k 138.8 / 85.4 / 76.0 / 76.3, 32k
//   534.4 / 313.3 / 277.0 / 298.8; batch 4 x 8k / 32k best at 12 splits (28.4 / 79.6 us; 16: 29.2
//   / 82.8); batch 64 unsplit best at 4k / 8k / 32k (138.6 / 268.8 / 1080.7; 2 splits 147.6 /
//   283.1 / 1178.1): 512 CTAs fill 97% of its 528 slots. Its splits counted 3 per SM until the
//   tile got 2 stages in grids of more than 3 per SM (tenth session, bench decode-ab in turns):
//   batch 16 at 4 splits on it against 3 splits on 3 stages, +1.5% at 4k, +2.3% at 32k (4
//   splits on 3 stages: -0.2% / -7%). Hence 4 per SM for both clauses.
// Prefill tiles (64 query rows) were not swept: a batch with one keeps one CTA per SM, the
// count the earlier rule used for everything.
//
// Borrowed from FlashAttention's num_splits_heuristic (studies/flash-attention.md 2.1, 2.2.8):
// the q tile of 64 rows, the wave-fill view of the split count and the skip of split counts
// with the same per-split work (FA2's "ineligible" splits). kMaxSplits = 32 (vLLM's default
// flash_attn_max_num_splits_for_cuda_graph) stays the hard cap that sizes the workspace.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "attnkit/dtype.h"

namespace attnkit::flash_attn {

inline constexpr int kQTileRows = 64;                      // query rows per CTA tile
inline constexpr int kKVTileTokens = 64;                   // KV tokens per main-loop iteration
inline constexpr int kMinKVPerSplit = 8 * kKVTileTokens;   // a split reads >= 8 KV tiles
inline constexpr int kMaxSplits = 32;                      // hard cap; bounds the CUDA-graph workspace
inline constexpr int kMaxUsefulSplits = 32;                // the rule never picks more (measured)
inline constexpr int kCtasPerSmDecode = 2;                 // decode-only batch, 16-bit cache
inline constexpr int kCtasPerSmDecodeFp8 = 3;              // decode-only batch, fp8 cache
inline constexpr int kCtasPerSmDecodeTransposed = 4;       // ... served by the transposed decode tile
inline constexpr int kTransposedMaxRows = 8;               // packed rows (query_len * group) it serves
// Whether a decode launch takes the transposed fp8 tile (varlen_kernel.cuh launch_decode, with
// the default VarlenArgs): fp8 cache, head size 128 (TMA stage rows of 128 bytes), sm90+, at
// most kTransposedMaxRows packed query rows per request.
inline bool transposed_decode_tile(bool fp8_cache, int head_size, int cc_major, int64_t max_packed_rows) {
  return fp8_cache && head_size == 128 && cc_major >= 9 && max_packed_rows <= kTransposedMaxRows;
}
inline constexpr int kCtasPerSmPrefill = 1;                // batch with any prefill request
inline constexpr int kMaxWaveSplits = 4;                   // the wave-fill clause's largest count
inline constexpr double kMinWaveFillGain = 0.15;           // ... the fill it must add
inline constexpr int kMinKVPerWaveSplit = 2048;            // ... and the KV each split keeps

struct SplitKVInput {
  std::span<const int32_t> query_start_loc;  // num_reqs + 1
  std::span<const int32_t> seq_lens;         // num_reqs
  int num_heads = 0, num_kv_heads = 0;
  int decode_threshold = 1;
  int num_sms = 0;         // > 0
  int max_splits = kMaxSplits;  // caller's cap (1 disables splitting: no workspace, batch invariance)
  DType cache_dtype = DType::bf16;  // KV cache storage dtype (the fp8 path wants more CTAs)
  int head_size = 0;  // with cc_major: whether the transposed fp8 decode tile serves (0: unknown)
  int cc_major = 0;   // the device's compute capability (0: unknown)
};

struct SplitKVDecision {
  int num_splits = 1;
  int64_t work_items = 0;  // W
  int64_t cta_slots = 0;   // S
  std::string reason;      // why this count, in words
};

// Work items W of the rule above.
int64_t split_kv_work_items(const SplitKVInput& in);
// CTAs per SM the rule counts for this batch (prefill / fp8 decode / decode).
int split_kv_ctas_per_sm(const SplitKVInput& in);
SplitKVDecision decide_num_splits(const SplitKVInput& in);

}  // namespace attnkit::flash_attn
