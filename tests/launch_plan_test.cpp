// The launch decision (flash_attn/launch_plan.h) over the tile set (flash_attn/tile_set.h; its
// configurations: tile_set_test.cpp): table tests on the host, no GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/int_math.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/tile_set.h"
#include "test_util.h"

namespace attnkit::flash_attn {
namespace {

// An H200 (132 SMs, sm90, sm_90a kernels built) and a batch of uniform requests.
CacheKind K(bool fp8) { return fp8 ? CacheKind::fp8 : CacheKind::b16; }

LaunchFacts h200(int reqs, int q_len, int kv_len, int head_size = 128, bool fp8 = false, int group = 4,
                 int splits = 1) {
  LaunchFacts f;
  f.cc_major = 9;
  f.sm_count = 132;
  f.hopper_kernels = true;
  f.head_size = head_size;
  f.cache = K(fp8);
  f.num_reqs = reqs;
  f.num_kv_heads = 8;
  f.group = group;
  f.max_query_len = q_len;
  f.max_seq_len = kv_len;
  f.num_splits = splits;
  f.causal = true;
  return f;
}

// Every choice, table-tested: (facts, tuning) -> tile, generation, switches.
TEST(ChooseLaunch, Table) {
  struct Case {
    const char* why;
    LaunchFacts facts;
    LaunchTuning tuning;
    TileId tile;
    int64_t ctas;  // -1: the grid's
    bool pdl, l2_prefetch, evict_first;
    bool cluster = false;
  };
  LaunchTuning cp_async;
  cp_async.cp_async_fill = true;
  LaunchTuning three_stages;
  three_stages.transposed_stages = 3;
  LaunchTuning two_q;
  two_q.q_buffers = 2;
  LaunchTuning few_ctas;
  few_ctas.max_ctas = 3;
  LaunchTuning no_pdl;
  no_pdl.pdl = false;
  auto non_causal = [](LaunchFacts f) {
    f.causal = false;
    return f;
  };
  LaunchTuning three_groups;
  three_groups.consumer_groups = 3;
  LaunchTuning two_groups;
  two_groups.consumer_groups = 2;
  LaunchFacts sm80 = h200(64, 1, 4096);
  sm80.cc_major = 8;
  sm80.hopper_kernels = false;
  LaunchFacts no_tma = h200(64, 1, 4096);
  no_tma.tma_geometry = false;
  LaunchFacts mma_sync_pref = h200(4, 4096, 4096);
  mma_sync_pref.preferred = Generation::mma_sync;
  LaunchFacts alibi_rows = h200(4, 4096, 4096);
  alibi_rows.alibi_per_request = true;
  LaunchFacts other_strides = h200(4, 4096, 4096);
  other_strides.same_kv_strides = false;
  const Case cases[] = {
      // Decodes (<= 16 packed rows): 16-row tiles, TMA fills on sm90.
      {"bf16 64 x 4k: 512 CTAs > 2 per SM", h200(64, 1, 4096), {}, TileId::decode_tma, -1, true, true, false},
      // (256 CTAs on the 2-stage tile's 396 slots: 65% of a wave, no PDL)
      {"bf16 16 x 4k, 2 splits: 256 CTAs, 1-2 per SM, cluster merge", h200(16, 1, 4096, 128, false, 4, 2), {},
       TileId::decode_two_stage, -1, false, false, true, true},
      {"bf16 1 x 1k, 2 splits: cluster merge", h200(1, 1, 1024, 128, false, 4, 2), {}, TileId::decode_tma, -1, true,
       true, true, true},
      {"fp8 4 x 1k, 2 splits: cluster merge", h200(4, 1, 1024, 128, true, 4, 2), {}, TileId::decode_transposed, -1, true,
       true, true, true},
      {"cluster merge off", h200(1, 1, 1024, 128, false, 4, 2), [] { LaunchTuning t; t.cluster_merge = false; return t; }(),
       TileId::decode_tma, -1, true, true, true, false},
      {"bf16 1 x 32k, 32 splits: 256 CTAs", h200(1, 1, 32768, 128, false, 4, 32), {}, TileId::decode_two_stage, -1, false,
       false, true},
      {"bf16 1 x 4k, 8 splits: 64 CTAs, <= 1 per SM", h200(1, 1, 4096, 128, false, 4, 8), {}, TileId::decode_tma, -1,
       true, true, true},
      {"bf16 decode, cp.async forced", h200(64, 1, 4096), cp_async, TileId::decode, -1, true, true, false},
      {"bf16 decode on sm80", sm80, {}, TileId::decode, -1, false, false, false},
      {"cache strides TMA cannot express", no_tma, {}, TileId::decode, -1, true, true, false},
      {"hd 96 bf16: 192-byte rows", h200(64, 1, 4096, 96), {}, TileId::decode, -1, true, true, false},
      {"hd 256 bf16: 512-byte rows", h200(64, 1, 4096, 256), {}, TileId::decode_tma, -1, true, true, false},
      {"fp8 16 x 4k, 4 splits: 512 CTAs > 3 per SM", h200(16, 1, 4096, 128, true, 4, 4), {},
       TileId::decode_transposed_two_stage, -1, false, false, true},
      {"fp8 16 x 4k, 3 splits: 384 CTAs <= 3 per SM", h200(16, 1, 4096, 128, true, 4, 3), {}, TileId::decode_transposed,
       -1, false, false, true},
      {"fp8, 3 stages forced", h200(16, 1, 4096, 128, true, 4, 4), three_stages, TileId::decode_transposed, -1, false,
       false, true},
      {"fp8 64 x 4k: 512 CTAs on 528 slots, no PDL", h200(64, 1, 4096, 128, true), {},
       TileId::decode_transposed_two_stage, -1, false, false, false},
      {"fp8 256 x 4k: 2048 CTAs", h200(256, 1, 4096, 128, true), {}, TileId::decode_transposed_two_stage, -1, true, true,
       false},
      {"fp8, group 16: 16 rows, not transposed", h200(64, 1, 4096, 128, true, 16), {}, TileId::decode_tma, -1, true, true,
       false},
      {"fp8, 2 tokens x group 4 = 8 rows", h200(64, 2, 4096, 128, true), {}, TileId::decode_transposed_two_stage, -1,
       false, false, false},
      {"fp8 hd 64: 64-byte rows, cp.async", h200(64, 1, 4096, 64, true), {}, TileId::decode, -1, true, true, false},
      {"fp8 cp.async forced: the 16-row tile", h200(16, 1, 4096, 128, true, 4, 3), cp_async, TileId::decode, -1, true,
       true, false},
      // Prefill-shaped: the hopper kernel where it serves, else the mma_sync prefill tile.
      {"bf16 prefill 4 x 4k: persistent, two Q buffers", h200(4, 4096, 4096), {}, TileId::hopper_short, 132, true,
       false, false},
      {"bf16 prefill 32 x 512: persistent, two Q buffers", h200(32, 512, 512), {}, TileId::hopper_short, 132, true,
       false, false},
      {"bf16 prefill 2 x 8k: one CTA per item", h200(2, 8192, 8192), {}, TileId::hopper, -1, true, false, false},
      {"hopper, 3 CTAs forced, 2 Q buffers forced", h200(4, 4096, 4096), [&] { LaunchTuning t = few_ctas; t.q_buffers = 2; return t; }(),
       TileId::hopper_short, 3, true, false, false},
      {"hopper, 2 Q buffers forced", h200(2, 8192, 8192), two_q, TileId::hopper_short, -1, true, false, false},
      {"hopper without PDL", h200(4, 4096, 4096), no_pdl, TileId::hopper_short, 132, false, false, false},
      {"hd 256 prefill 4 x 4k: one Q buffer, one CTA per item", h200(4, 4096, 4096, 256), {}, TileId::hopper, -1, true,
       false, false},
      {"hd 256 prefill 16 x 1k: one Q buffer, persistent", h200(16, 1024, 1024, 256), {}, TileId::hopper, 132, true,
       false, false},
      {"hd 256 prefill 8 x 2k: one Q buffer, one CTA per item", h200(8, 2048, 2048, 256), {}, TileId::hopper, -1, true,
       false, false},
      {"hd 256, 32 x 512: one Q buffer (no second one at 256)", h200(32, 512, 512, 256), {}, TileId::hopper, 132, true,
       false, false},
      {"hd 256, 2 Q buffers forced: one", h200(2, 8192, 8192, 256), two_q, TileId::hopper, -1, true, false, false},
      {"hd 200 prefill: hopper on dim 256", h200(2, 8192, 8192, 200), {}, TileId::hopper, -1, true, false, false},
      {"hd 192 prefill 4 x 4k: one CTA per item", h200(4, 4096, 4096, 192), {}, TileId::hopper, -1, true, false, false},
      {"hd 192 prefill 8 x 2k: persistent, two Q buffers", h200(8, 2048, 2048, 192), {}, TileId::hopper_short, 132, true,
       false, false},
      {"hd 192, 32 x 512: two Q buffers", h200(32, 512, 512, 192), {}, TileId::hopper_short, 132, true, false, false},
      // Head dim 64: three consumer warpgroups (192 rows) on long items, two on short ones.
      {"hd 64 prefill 2 x 8k: one CTA per item, three warpgroups", h200(2, 8192, 8192, 64), {}, TileId::hopper_wide, -1,
       true, false, false},
      {"fp8 hd 64 prefill 2 x 8k: three warpgroups", h200(2, 8192, 8192, 64, true), {}, TileId::hopper_wide, -1, true,
       false, false},
      {"hd 56 prefill 2 x 8k: three warpgroups on dim 64", h200(2, 8192, 8192, 56), {}, TileId::hopper_wide, -1, true,
       false, false},
      {"hd 64 causal 8 x 2k: persistent, two warpgroups, two Q buffers", h200(8, 2048, 2048, 64), {},
       TileId::hopper_short, 132, true, false, false},
      {"hd 64 causal 4 x 4k: three warpgroups, one CTA per item", h200(4, 4096, 4096, 64), {}, TileId::hopper_wide, -1,
       true, false, false},
      {"hd 64 non-causal 4 x 4k: persistent, three warpgroups", non_causal(h200(4, 4096, 4096, 64)), {},
       TileId::hopper_wide, 132, true, false, false},
      {"hd 64 non-causal 32 x 512: three warpgroups, not two Q buffers", non_causal(h200(32, 512, 512, 64)), {},
       TileId::hopper_wide, 132, true, false, false},
      {"hd 64 non-causal 1 x 512: 16 x 8 items (< 1.25 waves), two warpgroups", non_causal(h200(1, 512, 512, 64)), {},
       TileId::hopper, -1, true, false, false},
      {"hd 64, 300 queries over 8k keys: 80 items (< 1.25 waves of 132), two warpgroups", h200(1, 300, 8192, 64), {},
       TileId::hopper, -1, true, false, false},
      {"hd 64 causal 8 x 2k, three warpgroups forced: one CTA per item", h200(8, 2048, 2048, 64), three_groups,
       TileId::hopper_wide, -1, true, false, false},
      {"hd 64 non-causal 8 x 2k, three warpgroups forced: persistent", non_causal(h200(8, 2048, 2048, 64)), three_groups,
       TileId::hopper_wide, 132, true, false, false},
      {"hd 64, 2 x 8k, two warpgroups forced: 8k x 64 keys x dims, persistent, two Q buffers", h200(2, 8192, 8192, 64),
       two_groups, TileId::hopper_short, 132, true, false, false},
      {"hd 64, three warpgroups and 3 CTAs forced", h200(2, 8192, 8192, 64),
       [&] { LaunchTuning t = few_ctas; t.consumer_groups = 3; return t; }(), TileId::hopper_wide, 3, true, false, false},
      {"hd 64, three warpgroups and 2 Q buffers forced: two Q buffers, persistent", h200(2, 8192, 8192, 64),
       [&] { LaunchTuning t = two_q; t.consumer_groups = 3; return t; }(), TileId::hopper_short, 132, true, false, false},
      {"hd 128, three warpgroups forced: two", h200(2, 8192, 8192), three_groups, TileId::hopper, -1, true, false, false},
      {"split prefill: hopper, 16 x 8 x 2 items: persistent, two Q buffers", h200(1, 512, 8192, 128, false, 4, 2), {},
       TileId::hopper_short, 132, true, false, false},
      {"split hd 64 prefill 4 x 4k: the split rule's 128-row items, not three warpgroups",
       non_causal(h200(4, 4096, 4096, 64, false, 4, 2)), {}, TileId::hopper_short, 132, true, false, false},
      {"split hd 64 prefill, three warpgroups forced", non_causal(h200(4, 4096, 4096, 64, false, 4, 2)), three_groups,
       TileId::hopper_wide, 132, true, false, false},
      {"fp8 prefill 4 x 4k: persistent, two Q buffers", h200(4, 4096, 4096, 128, true), {}, TileId::hopper_short, 132,
       true, false, false},
      {"fp8 hd 64 prefill 32 x 512: two Q buffers", h200(32, 512, 512, 64, true), {}, TileId::hopper_short, 132, true,
       false, false},
      {"fp8 hd 256 prefill 2 x 8k: one CTA per item", h200(2, 8192, 8192, 256, true), {}, TileId::hopper, -1, true, false,
       false},
      {"hd 96 prefill 4 x 4k: hopper at 128, as head size 128", h200(4, 4096, 4096, 96), {}, TileId::hopper_short, 132,
       true, false, false},
      {"mma_sync preferred", mma_sync_pref, {}, TileId::prefill, -1, true, true, false},
      {"K and V strides differ", other_strides, {}, TileId::prefill, -1, true, true, false},
      {"ALiBi slopes per request: mma_sync", alibi_rows, {}, TileId::prefill, -1, true, true, false},
      {"prefill on sm80", [] { LaunchFacts f = h200(4, 4096, 4096); f.cc_major = 8; f.hopper_kernels = false; return f; }(),
       {}, TileId::prefill, -1, false, false, false},
  };
  for (const Case& c : cases) {
    const LaunchPlan plan = choose_launch(c.facts, c.tuning);
    const std::string ctx = std::string(c.why) + ": " + plan.reason;
    EXPECT_EQ(plan.tile, c.tile) << ctx << " (got " << plan.config.name << ")";
    EXPECT_EQ(plan.generation, plan.config.generation) << ctx;
    EXPECT_EQ(plan.config.rows, tile_config(c.tile, plan.head_dim, c.facts.cache).rows) << ctx;
    EXPECT_EQ(plan.config.keys, tile_config(c.tile, plan.head_dim, c.facts.cache).keys) << ctx;
    EXPECT_TRUE(tile_instantiated(plan.tile, plan.head_dim, c.facts.cache)) << ctx;
    EXPECT_EQ(plan.ctas, c.ctas < 0 ? plan.grid_ctas : c.ctas) << ctx;
    EXPECT_EQ(plan.pdl, c.pdl) << ctx;
    EXPECT_EQ(plan.l2_prefetch, c.l2_prefetch) << ctx;
    EXPECT_EQ(plan.kv_evict_first, c.evict_first) << ctx;
    EXPECT_EQ(plan.cluster_merge, c.cluster) << ctx;
    EXPECT_FALSE(plan.reason.empty()) << ctx;
    const int64_t rows = int64_t{c.facts.max_query_len} * c.facts.group;
    EXPECT_EQ(plan.row_tiles, ceil_div(rows, plan.config.rows)) << ctx;
    EXPECT_EQ(plan.grid_ctas, plan.row_tiles * c.facts.num_kv_heads * c.facts.num_splits * c.facts.num_reqs) << ctx;
    EXPECT_EQ(plan.cta_slots, int64_t{plan.config.ctas_per_sm} * c.facts.sm_count) << ctx;
  }
}

// The hopper kernel's K/V fill: cp.async for 16-bit caches at every head size, map or not, with
// or without cp_async_fill (it has no TMA fill); fp8 codes converted.
TEST(ChooseLaunch, HopperKvFill) {
  struct Case {
    const char* why;
    LaunchFacts facts;
    bool cp_async_forced;
    TileId tile;
    KvFill fill;
  };
  LaunchFacts no_map = h200(4, 4096, 4096, 64);
  no_map.tma_geometry = false;  // (contiguous K/V rows, or strides a map cannot express)
  LaunchFacts planned = h200(4, 4096, 4096, 64);
  planned.planned_items = 128;
  planned.plan_tile_q = 128;
  LaunchFacts planned128 = planned;
  planned128.head_size = 128;
  const Case cases[] = {
      {"the rule at hd 128 (two-segment rows): cp.async", h200(4, 4096, 4096), false, TileId::hopper_short,
       KvFill::cp_async},
      {"hd 192 (three segments): cp.async", h200(4, 4096, 4096, 192), false, TileId::hopper, KvFill::cp_async},
      {"hd 256 (four segments): cp.async", h200(4, 4096, 4096, 256), false, TileId::hopper, KvFill::cp_async},
      {"hd 64 (one-segment rows): cp.async", h200(4, 4096, 4096, 64), false, TileId::hopper_wide,
       KvFill::cp_async},
      {"hd 64, 32 x 512 (two Q buffers): cp.async", h200(32, 512, 512, 64), false, TileId::hopper_short,
       KvFill::cp_async},
      {"hd 64, cp.async forced", h200(4, 4096, 4096, 64), true, TileId::hopper_wide, KvFill::cp_async},
      {"hd 64, no map", no_map, false, TileId::hopper_wide, KvFill::cp_async},
      {"hd 56 padded to 64", h200(32, 512, 512, 56), false, TileId::hopper_short, KvFill::cp_async},
      {"planned part at hd 64 (persistent walk, two Q buffers): cp.async", planned, false, TileId::hopper_short,
       KvFill::cp_async},
      {"planned part at hd 128: cp.async", planned128, false, TileId::hopper_short, KvFill::cp_async},
      {"fp8 hd 128 (one-segment rows of codes): converted", h200(4, 4096, 4096, 128, true), false,
       TileId::hopper_short, KvFill::convert},
      {"fp8 hd 64: converted", h200(32, 512, 512, 64, true), false, TileId::hopper_short, KvFill::convert},
      {"fp8 planned part: converted", [&] { LaunchFacts f = planned; f.cache = CacheKind::fp8; return f; }(), false,
       TileId::hopper_short, KvFill::convert},
  };
  for (const Case& c : cases) {
    LaunchTuning t;
    t.cp_async_fill = c.cp_async_forced;
    const LaunchPlan plan = choose_launch(c.facts, t);
    EXPECT_EQ(plan.tile, c.tile) << c.why << ": " << plan.reason;
    EXPECT_EQ(plan.config.fill, c.fill) << c.why << ": " << plan.reason;
    EXPECT_NE(plan.reason.find(c.fill == KvFill::convert ? "V's transposed there" : "K/V by cp.async"),
              std::string::npos)
        << c.why << ": " << plan.reason;
  }
}

TEST(TileSet, EveryHeadSizeRunsOnTheNextCompiledDim) {
  // Multiples of 8 (16 with an fp8 cache) up to 512, each on the smallest compiled dim >= it
  // that the cache kind has (fp8 tiles: dims of whole 32-dim groups).
  for (int hs = 1; hs <= 600; ++hs)
    for (bool fp8 : {false, true}) {
      const int d = kernel_head_dim(hs, K(fp8));
      const std::string ctx = "head size " + std::to_string(hs) + (fp8 ? " fp8" : "");
      if (hs % (fp8 ? 16 : 8) != 0 || hs > kMaxHeadSize) {
        EXPECT_EQ(d, 0) << ctx;
        continue;
      }
      ASSERT_GE(d, hs) << ctx;
      EXPECT_TRUE(std::count(std::begin(kMmaSyncHeadDims), std::end(kMmaSyncHeadDims), d)) << ctx;
      for (int smaller : kMmaSyncHeadDims)
        if (smaller >= hs && smaller < d) EXPECT_TRUE(fp8 && !cache_head_dim(smaller, CacheKind::fp8)) << ctx << ": skipped " << smaller;
    }
  EXPECT_EQ(kernel_head_dim(80, CacheKind::b16), 80);
  EXPECT_EQ(kernel_head_dim(80, CacheKind::fp8), 96);
  EXPECT_EQ(kernel_head_dim(112, CacheKind::b16), 128);
  EXPECT_EQ(kernel_head_dim(264, CacheKind::b16), 512);
  // NVFP4: planned launches only, head sizes multiples of 64 (16-byte packed rows, 4-byte scale rows).
  EXPECT_EQ(kernel_head_dim(128, CacheKind::nvfp4), 0);
  EXPECT_EQ(kernel_head_dim(128, CacheKind::nvfp4, true), 128);
  EXPECT_EQ(kernel_head_dim(192, CacheKind::nvfp4, true), 256);
  EXPECT_EQ(kernel_head_dim(96, CacheKind::nvfp4, true), 0);
  EXPECT_EQ(kernel_head_dim(96, CacheKind::fp8, true), 128);
  // A padded size reads its rows by cp.async (a TMA box copies whole rows); hopper serves every
  // size up to 256 on the next of its dims 64 / 96 / 128 / 192 / 256 (96: 16-bit caches).
  LaunchFacts dec = h200(64, 1, 4096, 112);
  EXPECT_EQ(choose_launch(dec).tile, TileId::decode) << choose_launch(dec).reason;
  EXPECT_NE(choose_launch(dec).reason.find("padded to 128"), std::string::npos) << choose_launch(dec).reason;
  dec.head_size = 128;
  EXPECT_EQ(choose_launch(dec).tile, TileId::decode_tma);
  EXPECT_EQ(choose_launch(h200(4, 2048, 2048, 112)).generation, Generation::hopper);
  EXPECT_EQ(choose_launch(h200(4, 2048, 2048, 40)).generation, Generation::hopper);
  // 72 .. 96: the hopper kernel at 96 for prefill-shaped launches (fp8 caches: at 128), the
  // decode tile at its mma_sync dim for decode-shaped ones (tile_head_dim); a split
  // prefill-shaped launch on the hopper kernel at 96 too, the mma_sync prefill tile at its dim
  // where mma_sync is preferred.
  for (int hs : {72, 80, 88, 96}) {
    const std::string ctx = "head size " + std::to_string(hs);
    const int mma_dim = hs <= 80 ? 80 : 96;
    EXPECT_EQ(choose_launch(h200(4, 2048, 2048, hs)).generation, Generation::hopper) << ctx;
    EXPECT_EQ(choose_launch(h200(4, 2048, 2048, hs)).head_dim, 96) << ctx;
    EXPECT_EQ(choose_launch(h200(4, 2048, 2048, hs)).reason.find("padded to 96") != std::string::npos, hs != 96)
        << ctx << ": " << choose_launch(h200(4, 2048, 2048, hs)).reason;
    EXPECT_EQ(choose_launch(h200(64, 1, 4096, hs)).tile, TileId::decode) << ctx;
    EXPECT_EQ(choose_launch(h200(64, 1, 4096, hs)).head_dim, mma_dim) << ctx;
    LaunchFacts split = h200(4, 2048, 2048, hs);
    split.num_splits = 2;
    EXPECT_EQ(choose_launch(split).generation, Generation::hopper) << ctx;
    EXPECT_EQ(choose_launch(split).head_dim, 96) << ctx;
    split.preferred = Generation::mma_sync;
    EXPECT_EQ(choose_launch(split).tile, TileId::prefill) << ctx;
    EXPECT_EQ(choose_launch(split).head_dim, mma_dim) << ctx;
    EXPECT_EQ(tile_head_dim(TileId::hopper, hs, CacheKind::fp8), hs % 16 == 0 ? 128 : 0) << ctx;
    EXPECT_EQ(tile_head_dim(TileId::hopper_short, hs, CacheKind::b16), 96) << ctx;
    EXPECT_EQ(tile_head_dim(TileId::prefill, hs, CacheKind::b16), mma_dim) << ctx;
  }
  EXPECT_EQ(tile_head_dim(TileId::hopper, 264, CacheKind::b16), 0);
  EXPECT_EQ(tile_head_dim(TileId::hopper, 96, CacheKind::b16, /*planned=*/true), 128);
  EXPECT_EQ(tile_head_dim(TileId::hopper_wide, 40, CacheKind::b16), 64);
  EXPECT_EQ(choose_launch(h200(4, 2048, 2048, 232)).generation, Generation::hopper);
  EXPECT_EQ(choose_launch(h200(4, 2048, 2048, 232)).config.keys, 64);
  EXPECT_TRUE(test::throws_error_with([] { choose_launch(h200(4, 16, 16, 84)); }, {"head_size", "84", "multiple of 8"}));
  EXPECT_TRUE(test::throws_error_with([] { choose_launch(h200(4, 16, 16, 40, true)); }, {"head_size", "40", "16 (fp8"}));
}

// Planned launches (FlashInfer-style parts): a decode part on the decode tiles, a prefill part on
// the hopper kernel for plans of its 128-row tiles (PlanWalk), else the mma_sync prefill tile,
// one CTA per planned item and KV head. The item's rows
// decide (the plan's tile_q caps them): a prefill part planned with 16-row tiles takes the decode
// tile, which is how NVFP4 prefills run; an NVFP4 part with larger items is an error.
TEST(ChooseLaunch, PlannedPartsTakeTheirTiles) {
  LaunchFacts decode = h200(64, 1, 4096);
  decode.planned_items = 64;
  const LaunchPlan d = choose_launch(decode);
  EXPECT_EQ(d.config.rows, kDecodeTileRows) << d.reason;
  EXPECT_EQ(d.grid_ctas, 64 * 8);
  LaunchFacts prefill = h200(4, 1024, 4096);
  prefill.planned_items = 40;
  ASSERT_TRUE(prefill.hopper_kernels);
  const LaunchPlan p = choose_launch(prefill);
  EXPECT_EQ(p.tile, TileId::prefill) << p.reason;
  EXPECT_EQ(p.generation, Generation::mma_sync) << p.reason;
  EXPECT_EQ(p.grid_ctas, 40 * 8);
  EXPECT_FALSE(p.l2_prefetch);
  EXPECT_NE(p.reason.find("planned prefill"), std::string::npos) << p.reason;
  prefill.planned_items = 0;
  EXPECT_EQ(choose_launch(prefill).generation, Generation::hopper) << "(the varlen launch of the same shape)";
  LaunchFacts fp4 = h200(4, 64, 4096);
  fp4.cache = CacheKind::nvfp4;
  fp4.planned_items = 8;
  EXPECT_TRUE(test::throws_error_with([&] { choose_launch(fp4); }, {"planned item rows", "256", "nvfp4"}));
  fp4.plan_tile_q = 64;
  EXPECT_TRUE(test::throws_error_with([&] { choose_launch(fp4); }, {"planned item rows", "64", "nvfp4"}));
  fp4.plan_tile_q = 16;
  EXPECT_EQ(choose_launch(fp4).tile, TileId::decode);
  fp4.plan_tile_q = 0;
  fp4.max_query_len = 4;
  EXPECT_EQ(choose_launch(fp4).tile, TileId::decode);
  prefill.planned_items = 40;
  prefill.plan_tile_q = 16;
  EXPECT_EQ(choose_launch(prefill).config.rows, kDecodeTileRows) << choose_launch(prefill).reason;
  // A plan of the hopper tile's rows (split or not, graph-safe or not: the epilogue writes the
  // partial rows of split tiles) runs the hopper kernel over the plan's items, by the varlen
  // launch's persistence rule: 40 items x 8 heads of <= 4096 keys at head dim 128 walked by one CTA
  // per SM with two Q buffers, 10 x 8 with one (a CTA count that does not depend on the items
  // planned now: a captured launch replays with other plans), never the 192-row tile;
  // other tiles, per-request ALiBi or unequal K / V strides stay on mma_sync.
  prefill.plan_tile_q = 128;
  const LaunchPlan h = choose_launch(prefill);
  EXPECT_EQ(h.tile, TileId::hopper_short) << h.reason;
  EXPECT_EQ(h.generation, Generation::hopper);
  EXPECT_TRUE(h.persistent) << h.reason;
  EXPECT_EQ(h.ctas, 132);
  EXPECT_EQ(h.grid_ctas, 40 * 8);
  EXPECT_NE(h.reason.find("over the plan's items"), std::string::npos) << h.reason;
  prefill.planned_items = 10;
  EXPECT_EQ(choose_launch(prefill).tile, TileId::hopper) << choose_launch(prefill).reason;
  EXPECT_EQ(choose_launch(prefill).ctas, 132) << "(the launcher caps them at the plan's capacity x KV heads)";
  LaunchFacts hd64 = prefill;
  hd64.head_size = 64;
  hd64.causal = false;
  hd64.planned_items = 400;
  EXPECT_EQ(choose_launch(hd64).config.rows, 128) << choose_launch(hd64).reason << " (the plan's tile rows)";
  prefill.planned_items = 40;
  prefill.plan_tile_q = 64;
  EXPECT_EQ(choose_launch(prefill).tile, TileId::prefill) << choose_launch(prefill).reason;
  EXPECT_NE(choose_launch(prefill).reason.find("tile_q 64"), std::string::npos) << choose_launch(prefill).reason;
  prefill.plan_tile_q = 128;
  prefill.alibi_per_request = true;
  EXPECT_EQ(choose_launch(prefill).tile, TileId::prefill);
  prefill.alibi_per_request = false;
  prefill.head_size = 256;
  EXPECT_EQ(choose_launch(prefill).generation, Generation::hopper) << choose_launch(prefill).reason;
  prefill.cache = CacheKind::fp8;
  EXPECT_EQ(choose_launch(prefill).generation, Generation::hopper) << choose_launch(prefill).reason;
}

TEST(ChooseLaunch, HeadDim512RunsOutputSlicesOfThePrefillTile) {
  for (bool fp8 : {false, true})
    for (int q : {1, 4, 300}) {  // decode-shaped launches too: no decode tile at 512
      const LaunchPlan plan = choose_launch(h200(3, q, 2000, 512, fp8));
      const std::string ctx = "q " + std::to_string(q) + (fp8 ? " fp8" : "") + ": " + plan.reason;
      EXPECT_EQ(plan.tile, TileId::prefill) << ctx;
      EXPECT_EQ(plan.config.o_slices, 2) << ctx;
      EXPECT_EQ(plan.grid_ctas, ceil_div(int64_t{q} * 4, plan.config.rows) * 8 * 3 * 2) << ctx;
    }
  EXPECT_TRUE(test::throws_error_with([] { choose_launch(h200(3, 1, 2000, 512, false, 4, 2)); },
                                      {"num_splits", "2", "head dim 512"}));
  // The split rule never splits them.
  SplitKVInput in;
  const std::vector<int32_t> qsl = {0, 1, 2}, seq = {30000, 30000};
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.num_heads = 8;
  in.num_kv_heads = 1;
  in.num_sms = 132;
  in.head_size = 512;
  in.cc_major = 9;
  const SplitKVDecision d = decide_num_splits(in);
  EXPECT_EQ(d.num_splits, 1) << d.reason;
  EXPECT_NE(d.reason.find("head dim 512"), std::string::npos) << d.reason;
  in.head_size = 128;
  EXPECT_GT(decide_num_splits(in).num_splits, 1) << "(the same batch at head size 128 splits)";
}

// The hopper output: TMA stores where the GQA group divides a warp's 16 rows (each box then holds
// whole tokens' groups), the threads' copy elsewhere and where the tuning asks; mma_sync launches
// never take it.
TEST(ChooseLaunch, HopperOutputByTmaWhereTheGroupDividesAWarpsRows) {
  LaunchTuning threads;
  threads.thread_output = true;
  for (int group : {1, 2, 3, 4, 5, 6, 8, 12, 16, 32}) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE("group " + std::to_string(group) + (fp8 ? ", fp8" : ", bf16"));
      const LaunchFacts f = h200(8, 2048, 2048, 128, fp8, group);
      const LaunchPlan plan = choose_launch(f);
      ASSERT_EQ(plan.generation, Generation::hopper);
      EXPECT_EQ(plan.tma_output, 16 % group == 0) << plan.reason;
      EXPECT_FALSE(choose_launch(f, threads).tma_output);
      LaunchFacts sm80 = f;
      sm80.cc_major = 8;
      sm80.hopper_kernels = false;
      EXPECT_FALSE(choose_launch(sm80).tma_output);
    }
  }
}

TEST(ChooseLaunch, RejectsBadTuningWithTheValue) {
  const LaunchFacts f = h200(16, 1, 4096, 128, true);
  for (int stages : {1, 4, -1}) {
    LaunchTuning t;
    t.transposed_stages = stages;
    EXPECT_TRUE(test::throws_error_with([&] { choose_launch(f, t); }, {"transposed_stages", std::to_string(stages)}));
  }
  LaunchTuning t;
  t.max_ctas = -2;
  EXPECT_TRUE(test::throws_error_with([&] { choose_launch(f, t); }, {"max_ctas", "-2"}));
  t = {};
  t.q_buffers = 3;
  EXPECT_TRUE(test::throws_error_with([&] { choose_launch(f, t); }, {"q_buffers", "3"}));
  LaunchFacts bad = f;
  bad.sm_count = 0;
  EXPECT_TRUE(test::throws_error_with([&] { choose_launch(bad); }, {"sm_count", "0"}));
}

// The split rule counts the launch's own tiles: its work items are the grid's CTAs that have
// rows, its slots the tile's CTAs per SM, for prefill and decode shapes.
TEST(ChooseLaunch, SplitRuleCountsTheGridsWork) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 2000; ++trial) {
    const int kv_heads = 1 << (rng() % 4), group = 1 + rng() % 8, reqs = 1 + rng() % 20;
    const int hd = std::vector<int>{64, 96, 128, 192, 256}[rng() % 5];
    const bool fp8 = rng() % 2, decode = rng() % 2;
    test::Batch b;
    for (int r = 0; r < reqs; ++r) {
      const int q = decode ? 1 + static_cast<int>(rng() % std::max(1, 16 / group)) : static_cast<int>(rng() % 700);
      b.add(q, q + static_cast<int>(rng() % 9000));
    }
    SplitKVInput in;
    in.query_start_loc = b.qsl;
    in.seq_lens = b.seq;
    in.num_heads = kv_heads * group;
    in.num_kv_heads = kv_heads;
    in.num_sms = 132;
    in.cache_dtype = fp8 ? DType::fp8_e4m3 : DType::bf16;
    in.head_size = hd;
    in.cc_major = 9;
    in.hopper_kernels = true;
    const SplitKVDecision d = decide_num_splits(in);
    // The unsplit launch of this batch, as the dispatcher plans it.
    LaunchFacts f = split_kv_facts(in);
    const LaunchPlan plan = choose_launch(f);
    // The base tile: the launch's, or the one its grid-size refinements started from (the
    // 2-stage decode variants keep its slots; hopper_wide, on grids of more than 1.25 waves of
    // the 128-row tile, has 192 rows where it had 128: DECISIONS.md: Split count counts the
    // base tile).
    const TileConfig base = tile_config(split_rule_tile(f), hd, K(fp8));
    int64_t grid_items = 0;
    for (int r = 0; r < reqs; ++r)
      grid_items += kv_heads * ceil_div(int64_t{b.qsl[r + 1] - b.qsl[r]} * group, base.rows);
    const std::string ctx = "trial " + std::to_string(trial) + " (" + plan.config.name + "): " + d.reason;
    EXPECT_EQ(d.work_items, grid_items) << ctx;
    EXPECT_EQ(d.cta_slots, int64_t{base.ctas_per_sm} * 132) << ctx;
    if (plan.tile == TileId::hopper_wide) {
      LaunchTuning two_groups;
      two_groups.consumer_groups = 2;
      EXPECT_GT(4 * choose_launch(f, two_groups).grid_ctas, 5 * d.cta_slots) << ctx;
      continue;
    }
    EXPECT_LE(d.work_items, plan.grid_ctas) << ctx;
    EXPECT_EQ(base.rows, plan.config.rows) << ctx;
    // A split launch runs the generation of the unsplit one, in a tile of the same rows and keys
    // (the rule's trim counts its KV tiles).
    f.num_splits = d.num_splits;
    const LaunchPlan split = choose_launch(f);
    EXPECT_EQ(split.generation, plan.generation) << ctx;
    EXPECT_EQ(split.config.rows, plan.config.rows) << ctx;
    EXPECT_EQ(split.config.keys, base.keys) << ctx;
    if (d.num_splits > 1 && plan.generation == Generation::hopper)
      EXPECT_LE(d.work_items * d.num_splits, d.cta_slots) << ctx << " (hopper splits fill at most one wave)";
  }
}

// Batches the hopper kernel serves split into hopper CTAs by the one-wave rule, over 128-key
// tiles (chunked prefills of bench section prefill-split; 32 / 8 heads, head size 128, 132 SMs).
TEST(ChooseLaunch, HopperServedBatchesSplitIntoOneWaveOfHopperCtas) {
  struct Case {
    int reqs, q, kv, splits;
    const char* why;
  };
  for (const Case& c : {Case{1, 128, 8192, 4, "W = 32: floor(132 / 32)"}, Case{4, 32, 4096, 4, "W = 32"},
                        Case{1, 512, 16384, 1, "W = 128: past half a wave"},
                        Case{1, 16, 16384, 16, "W = 8: 16 splits"}, Case{2, 16, 8192, 8, "W = 16: 8 splits"},
                        Case{1, 128, 1536, 3, "W = 32, 1536 keys: splits of >= 512 keys"}}) {
    test::Batch b;
    for (int r = 0; r < c.reqs; ++r) b.add(c.q, c.kv);
    SplitKVInput in;
    in.query_start_loc = b.qsl;
    in.seq_lens = b.seq;
    in.num_heads = 32;
    in.num_kv_heads = 8;
    in.num_sms = 132;
    in.head_size = 128;
    in.cc_major = 9;
    in.hopper_kernels = true;
    const SplitKVDecision d = decide_num_splits(in);
    EXPECT_EQ(d.num_splits, c.splits) << c.why << ": " << d.reason;
    EXPECT_EQ(split_kv_tile(in).generation, Generation::hopper) << c.why;
    LaunchFacts f = split_kv_facts(in);
    f.num_splits = d.num_splits;
    EXPECT_EQ(choose_launch(f).generation, Generation::hopper) << c.why << ": split launches stay on wgmma";
  }
}

// The PDL rule: off only for grids of more than half and less than 90% of a wave (up to a whole
// wave for the transposed tile).
TEST(ChooseLaunch, PdlOffOnlyForGridsOfHalfToNinetyPercentOfAWave) {
  struct Case {
    int64_t ctas, slots;
    bool pdl;
  };
  // The H200 shapes behind the rule (fp8: 396 slots, bf16: 264), then the bounds.
  for (const Case& c : {Case{256, 396, false}, Case{64, 396, true}, Case{128, 396, true}, Case{384, 396, true},
                        Case{128, 264, true}, Case{256, 264, true}, Case{64, 264, true}, Case{1024, 396, true},
                        Case{50, 100, true}, Case{51, 100, false}, Case{89, 100, false}, Case{90, 100, true},
                        Case{0, 100, true}, Case{1, 1, true}})
    EXPECT_EQ(pdl_for_grid(c.ctas, c.slots), c.pdl) << c.ctas << " CTAs on " << c.slots << " slots";
  for (int64_t slots : {1, 7, 264, 396, 528})
    for (int64_t ctas = 0; ctas <= 3 * slots; ++ctas) {
      const double fill = static_cast<double>(ctas) / static_cast<double>(slots);
      EXPECT_EQ(pdl_for_grid(ctas, slots), !(fill > 0.5 && fill < 0.9)) << ctas << " CTAs on " << slots << " slots";
      EXPECT_EQ(pdl_for_grid(ctas, slots, true), !(fill > 0.5 && fill <= 1.0))
          << ctas << " CTAs on " << slots << " slots (transposed)";
    }
  EXPECT_FALSE(pdl_for_grid(512, 528, true));
  EXPECT_TRUE(pdl_for_grid(2048, 528, true));
  EXPECT_TRUE(pdl_for_grid(256, 528, true));
}

}  // namespace
}  // namespace attnkit::flash_attn
