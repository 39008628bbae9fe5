// The ahead-of-time split-KV rule of the FlashAttention-style builder (flash_attn/split_kv.h):
// its constants, worked examples, the slots of each decode tile, the trim step, properties over
// a random grid, and its errors. The tile it counts comes from launch_plan_test.cpp's decision.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/tile_set.h"
#include "test_util.h"

namespace attnkit::flash_attn {
namespace {

using test::Batch;

// ---- split-KV ------------------------------------------------------------------------------

TEST(SplitKV, DocumentedConstants) {
  EXPECT_EQ(kMinKVPerSplit, 512);
  EXPECT_EQ(kMaxWaveSplits, 4);
  EXPECT_DOUBLE_EQ(kMinWaveFillGain, 0.15);
  EXPECT_EQ(kMinKVPerWaveSplit, 2048);
  EXPECT_EQ(kMinKVPerSplit % tile_config(TileId::prefill, 128, CacheKind::b16).keys, 0);
  EXPECT_EQ(kMaxSplits, 32);
  EXPECT_EQ(kMaxUsefulSplits, 32);
  EXPECT_LE(kMaxUsefulSplits, kMaxSplits);
}

SplitKVInput input(const Batch& b, int heads, int kv_heads, int sms, int max_splits = kMaxSplits,
                   DType cache_dtype = DType::bf16) {
  SplitKVInput in;
  in.cache_dtype = cache_dtype;
  in.query_start_loc = b.qsl;
  in.seq_lens = b.seq;
  in.num_heads = heads;
  in.num_kv_heads = kv_heads;
  in.num_sms = sms;
  in.max_splits = max_splits;
  return in;
}

// The work items are the grid's: the CTAs of the launch's tile that have rows.
TEST(SplitKV, WorkItemsCountTheLaunchTilesRows) {
  Batch b;
  b.add(1, 1000);    // decode in a prefill-shaped launch: ceil(4 / 128) = 1 tile per KV head
  b.add(0, 0);       // empty: nothing
  b.add(100, 500);   // prefill: 400 packed rows, ceil(400 / 128) = 4 tiles per KV head
  EXPECT_EQ(split_kv_work_items(input(b, 32, 8, 132)), 8 * 1 + 8 * 4);
  Batch decodes;
  decodes.add(1, 1000);  // decode-shaped launch: 16-row tiles, one per (request, KV head)
  decodes.add(1, 10);
  EXPECT_EQ(split_kv_work_items(input(decodes, 32, 8, 132)), 2 * 8);
  EXPECT_EQ(split_kv_tile(input(decodes, 32, 8, 132)).rows, kDecodeTileRows);
  Batch big_group;
  big_group.add(1, 100);  // group 128 (MQA, 128 heads): 128 packed rows, one 128-row tile
  EXPECT_EQ(split_kv_work_items(input(big_group, 128, 1, 132)), 1);
  Batch spec_b;
  spec_b.add(3, 100);  // 3 speculative tokens x group 16 = 48 rows: one 128-row tile
  EXPECT_EQ(split_kv_work_items(input(spec_b, 16, 1, 132)), 1);
  spec_b.add(1, 100);  // 1 x 16 = 16 rows fit the decode tile, but the launch is prefill-shaped
  EXPECT_EQ(split_kv_work_items(input(spec_b, 16, 1, 132)), 2);
}

TEST(SplitKV, WorkedExamples) {
  struct Case { int reqs, q, seq, heads, kv_heads, sms, max_splits; DType cache; int expect; const char* why; };
  const DType bf16 = DType::bf16, fp8 = DType::fp8_e4m3;
  const Case cases[] = {
      // One long decode on an H200: W = 8 items, floor(264 / 8) = 33 -> kMaxUsefulSplits (the
      // sweep's best with the fused merge: 32 splits 44.0 us, 16 splits 48.6 us).
      {1, 1, 32768, 32, 8, 132, 32, bf16, 32, "one decode: kMaxUsefulSplits"},
      {1, 1, 32768, 32, 8, 132, 32, fp8, 32, "one decode, fp8: kMaxUsefulSplits"},
      {1, 1, 65536, 8, 1, 132, 32, bf16, 32, "one item: capped at kMaxUsefulSplits"},
      {1, 1, 32768, 32, 8, 132, 8, bf16, 8, "caller cap"},
      {1, 1, 32768, 32, 8, 132, 1, bf16, 1, "splitting disabled"},
      // 1 x 4k: floor(4096 / 512) = 8 splits (the sweep's best, 18.1 us; 16 splits 19.6 us).
      {1, 1, 4096, 32, 8, 132, 32, bf16, 8, "min KV per split at 4k"},
      // Short KV: floor(2000 / 512) = 3 splits of ceil(32 tiles / 3) = 11 tiles.
      {1, 1, 2000, 32, 8, 132, 32, bf16, 3, "min KV per split"},
      {1, 1, 1023, 32, 8, 132, 32, bf16, 1, "too short to split twice"},
      {1, 1, 1024, 32, 8, 132, 32, bf16, 2, "exactly two minimal splits"},
      // Batch 4 (W = 32): bf16 floor(264 / 32) = 8 (145.9 us at 32k, best); fp8 floor(396 / 32)
      // = 12 (92.1 us, best; 4 splits 129.9 us).
      {4, 1, 32768, 32, 8, 132, 32, bf16, 8, "batch 4 bf16: 2 CTAs per SM"},
      {4, 1, 32768, 32, 8, 132, 32, fp8, 12, "batch 4 fp8: 3 CTAs per SM"},
      {4, 1, 4096, 32, 8, 132, 32, fp8, 8, "batch 4 fp8 at 4k: min KV per split"},
      // Batch 16 (W = 128): bf16 floor(264 / 128) = 2 (75.0 us at 4k vs 76.9 unsplit, 83.9 at
      // 3); fp8 floor(396 / 128) = 3 (50.3 us vs 66.5 unsplit, 58.0 at 4).
      {16, 1, 4096, 32, 8, 132, 32, bf16, 2, "batch 16 bf16: one wave of 256 CTAs"},
      {16, 1, 32768, 32, 8, 132, 32, fp8, 3, "batch 16 fp8: one wave of 384 CTAs"},
      {16, 1, 32768, 32, 8, 132, 32, DType::fp8_e5m2, 3, "e5m2 is fp8 too"},
      {16, 1, 32768, 32, 8, 132, 32, DType::f16, 2, "f16 counts as 16-bit"},
      // W = 64 * 8 = 512 > S / 2. bf16: 512 CTAs fill 97% of two waves of 264 slots: no split.
      // fp8: 65% of two waves of 396; 2 splits fill 86%, 3 splits 97% (the wave-fill clause;
      // sweep at d6c4eed: 3 splits 324.4 us vs 369.1 unsplit at 8k).
      {64, 1, 32768, 32, 8, 132, 32, bf16, 1, "enough work"},
      {64, 1, 32768, 32, 8, 132, 32, fp8, 3, "fp8 batch 64: the last of two waves runs mostly empty"},
      {64, 1, 32768, 32, 8, 132, 2, fp8, 2, "fp8 batch 64, caller cap 2"},
      {64, 1, 1024, 32, 8, 132, 32, fp8, 1, "fp8 batch 64 x 1k: splits under kMinKVPerWaveSplit"},
      {64, 1, 4096, 32, 8, 132, 32, fp8, 2, "fp8 batch 64 x 4k: 2 splits of 2048 keys"},
      {128, 1, 32768, 32, 8, 132, 32, fp8, 1, "W = 1024 > two waves of 396: no split"},
      {48, 1, 32768, 32, 8, 132, 32, fp8, 1, "W = 384 fills 97% of one wave"},
      // Prefill-shaped batches (no hopper kernel here: the mma_sync prefill tile of 128 rows,
      // 2 CTAs per SM at head size <= 128): a request of 100 tokens x group 4 = 400 rows is
      // ceil(400 / 128) = 4 tiles per KV head. One request: W = 32, floor(264 / 32) = 8.
      {1, 100, 5000, 32, 8, 132, 32, bf16, 8, "prefill: 2 CTAs per SM of the prefill tile"},
      {1, 100, 5000, 32, 8, 132, 32, fp8, 8, "prefill ignores the cache dtype"},
      {2, 100, 5000, 32, 8, 132, 32, bf16, 4, "two prefills: W = 64, floor(264 / 64) = 4"},
      {3, 100, 5000, 32, 8, 132, 32, bf16, 2, "three prefills: W = 96"},
      {5, 100, 5000, 32, 8, 132, 32, bf16, 1, "W = 160 past half a wave: prefills never take the wave-fill clause"},
      // 40 tiles: floor(2560 / 512) = 5 splits of 8 tiles (4 would need 10).
      {1, 1, 40 * 64, 8, 1, 132, 32, bf16, 5, "by_kv = 5"},
      // W 8 -> 16 splits; 141 tiles are 9 per split at 16 and 10 at 15.
      {1, 1, 9000, 8, 8, 132, 32, bf16, 16, "141 tiles"},
  };
  for (const Case& c : cases) {
    Batch b;
    for (int r = 0; r < c.reqs; ++r) b.add(c.q, c.seq);
    const SplitKVDecision d = decide_num_splits(input(b, c.heads, c.kv_heads, c.sms, c.max_splits, c.cache));
    EXPECT_EQ(d.num_splits, c.expect) << c.why << ": " << d.reason;
    EXPECT_FALSE(d.reason.empty());
  }
}

// fp8 decodes the transposed tile serves (head size 128, sm90, <= 8 packed rows) run 4 CTAs
// per SM: the slots, and with them the split counts, follow.
TEST(SplitKV, TransposedDecodeTileSlots) {
  struct Case { int reqs, q, seq, heads, kv_heads, head_size, cc_major, unused, ctas_per_sm, splits; const char* why; };
  const Case cases[] = {
      {16, 1, 4096, 32, 8, 128, 9, 1, 4, 4, "batch 16 x 4k: W = 128, floor(528 / 128) = 4"},
      {64, 1, 8192, 32, 8, 128, 9, 1, 4, 1, "batch 64: W = 512 fills 97% of one wave of 528 (wave-fill clause)"},
      {4, 1, 32768, 32, 8, 128, 9, 1, 4, 16, "batch 4 x 32k: floor(528 / 32) = 16"},
      {16, 1, 4096, 32, 8, 128, 8, 1, 3, 3, "sm89: the 16-row fp8 tile, 3 CTAs per SM"},
      {16, 1, 4096, 32, 8, 128, 0, 1, 3, 3, "unknown device"},
      {16, 1, 4096, 32, 8, 64, 9, 1, 3, 3, "head size 64: no TMA rows of 128 bytes"},
      {16, 1, 4096, 32, 4, 128, 9, 1, 4, 8, "group 8 x 1 token = 8 rows: W = 64, floor(528 / 64) = 8"},
      {16, 1, 4096, 64, 4, 128, 9, 1, 3, 6, "group 16: 16 packed rows, floor(396 / 64) = 6"},
      {16, 2, 4096, 32, 8, 128, 9, 2, 4, 4, "2 speculative tokens x group 4 = 8 rows"},
      {16, 3, 4096, 32, 8, 128, 9, 3, 3, 3, "3 tokens x group 4 = 12 rows"},
  };
  for (const Case& c : cases) {
    Batch b;
    for (int r = 0; r < c.reqs; ++r) b.add(c.q, c.seq);
    SplitKVInput in = input(b, c.heads, c.kv_heads, 132, kMaxSplits, DType::fp8_e4m3);
    in.head_size = c.head_size;
    in.cc_major = c.cc_major;
    EXPECT_EQ(split_kv_tile(in).ctas_per_sm, c.ctas_per_sm) << c.why;
    EXPECT_EQ(decide_num_splits(in).num_splits, c.splits) << c.why << ": " << decide_num_splits(in).reason;
    in.cache_dtype = DType::bf16;
    EXPECT_EQ(split_kv_tile(in).ctas_per_sm, 2) << c.why << " (bf16)";
  }
}

// The trim step: 100 tiles capped at 11 splits are 10 tiles per split, as with 10 splits (9
// would need 12); 150 tiles at 16 splits are 10 per split, as 15 splits give.
TEST(SplitKV, TrimsSplitsThatDoNotShortenTheLongestSplit) {
  struct Case { int tiles, max_splits, expect; };
  for (const Case& c : {Case{100, 11, 10}, Case{150, 32, 17}, Case{40, 32, 5}, Case{64, 32, 8}}) {
    Batch b;
    b.add(1, c.tiles * 64);  // (KV tiles of 64 keys: the mma_sync tiles a split launch runs)
    const auto d = decide_num_splits(input(b, 8, 8, 132, c.max_splits));
    EXPECT_EQ(d.num_splits, c.expect) << c.tiles << " tiles: " << d.reason;
  }
}

TEST(SplitKV, PropertiesOverARandomGrid) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 3000; ++trial) {
    const int kv_heads = 1 << (rng() % 4);
    const int group = 1 << (rng() % 4);
    const int sms = 20 + rng() % 140;
    const int max_splits = 1 + rng() % kMaxSplits;
    Batch b;
    const int reqs = 1 + rng() % 12;
    for (int r = 0; r < reqs; ++r) {
      const int q = rng() % 4 == 0 ? static_cast<int>(rng() % 300) : 1;
      b.add(q, q + static_cast<int>(rng() % 20000));
    }
    const DType cache = rng() % 2 ? DType::fp8_e4m3 : DType::bf16;
    const SplitKVInput in = input(b, kv_heads * group, kv_heads, sms, max_splits, cache);
    const SplitKVDecision d = decide_num_splits(in);
    int max_q = 0;
    for (int r = 0; r < reqs; ++r) max_q = std::max(max_q, b.qsl[r + 1] - b.qsl[r]);
    const bool prefill = max_q * group > kDecodeTileRows;  // a prefill-shaped launch
    int max_kv = 0;
    for (int r = 0; r < reqs; ++r)
      if (b.qsl[r + 1] > b.qsl[r]) max_kv = std::max(max_kv, b.seq[r]);
    const std::string ctx = "trial " + std::to_string(trial) + ": " + d.reason;
    ASSERT_GE(d.num_splits, 1) << ctx;
    EXPECT_LE(d.num_splits, std::min(kMaxUsefulSplits, max_splits)) << ctx;
    EXPECT_EQ(d.work_items, split_kv_work_items(in));
    // (head size unknown, no sm90: the prefill tile 2 CTAs per SM, decode 2 for 16-bit, 3 for fp8)
    const int per_sm = prefill ? 2 : cache == DType::bf16 ? 2 : 3;
    EXPECT_EQ(d.cta_slots, int64_t{sms} * per_sm) << ctx;
    EXPECT_EQ(split_kv_tile(in).ctas_per_sm, per_sm) << ctx;
    const bool one_wave_rule = 2 * d.work_items <= d.cta_slots;
    if (!one_wave_rule) {
      // Past half a wave: only decode-only batches of at most two waves split, into at most
      // kMaxWaveSplits, and only for a real gain in wave fill.
      if (prefill || d.work_items > 2 * d.cta_slots) EXPECT_EQ(d.num_splits, 1) << ctx;
      EXPECT_LE(d.num_splits, kMaxWaveSplits) << ctx;
      if (d.num_splits > 1) {
        auto fill = [&](int64_t s) {
          const int64_t ctas = d.work_items * s;
          return double(ctas) / double((ctas + d.cta_slots - 1) / d.cta_slots * d.cta_slots);
        };
        EXPECT_GE(fill(d.num_splits), fill(1) + kMinWaveFillGain - 1e-9) << ctx;
        EXPECT_GE(max_kv / d.num_splits, kMinKVPerWaveSplit) << ctx;
      }
    }
    if (one_wave_rule && d.num_splits > 1) {
      // Each split of the longest KV reads at least kMinKVPerSplit tokens.
      EXPECT_GE(max_kv / d.num_splits, kMinKVPerSplit) << ctx;
      // The split CTAs fit in one wave of slots.
      EXPECT_LE(int64_t{d.num_splits} * d.work_items, d.cta_slots) << ctx;
      // Minimal: one split fewer would lengthen the longest split.
      const int tiles = (max_kv + 63) / 64;
      const int s = d.num_splits;
      EXPECT_GT((tiles + s - 2) / (s - 1), (tiles + s - 1) / s) << ctx;
    }
    // Monotone within the one-wave rule (the wave-fill clause is not: a batch past half a wave
    // may split more than a smaller one): more SMs never mean fewer splits; more KV heads never
    // mean more; an fp8 cache never means fewer splits than a bf16 one.
    if (one_wave_rule) {
      SplitKVInput more_sms = in;
      more_sms.num_sms = sms * 2;
      EXPECT_GE(decide_num_splits(more_sms).num_splits, d.num_splits) << ctx;
      SplitKVInput more_heads = in;
      more_heads.num_kv_heads = kv_heads * 2;
      more_heads.num_heads = kv_heads * 2 * group;
      const SplitKVDecision dh = decide_num_splits(more_heads);
      if (2 * dh.work_items <= dh.cta_slots) EXPECT_LE(dh.num_splits, d.num_splits) << ctx;
      SplitKVInput as_fp8 = in, as_bf16 = in;
      as_fp8.cache_dtype = DType::fp8_e4m3;
      as_bf16.cache_dtype = DType::bf16;
      const SplitKVDecision db = decide_num_splits(as_bf16);
      if (2 * db.work_items <= db.cta_slots)
        EXPECT_GE(decide_num_splits(as_fp8).num_splits, db.num_splits) << ctx;
    }
  }
}

TEST(SplitKV, RejectsBadInput) {
  Batch b;
  b.add(1, 100);
  EXPECT_THROW(decide_num_splits(input(b, 32, 8, 0)), Error);
  EXPECT_THROW(decide_num_splits(input(b, 30, 8, 132)), Error);
  EXPECT_THROW(decide_num_splits(input(b, 32, 8, 132, 0)), Error);
  SplitKVInput bad = input(b, 32, 8, 132);
  bad.seq_lens = {};
  EXPECT_THROW(decide_num_splits(bad), Error);
  Batch none;
  none.add(0, 0);
  EXPECT_EQ(decide_num_splits(input(none, 32, 8, 132)).num_splits, 1);
}

}  // namespace
}  // namespace attnkit::flash_attn
