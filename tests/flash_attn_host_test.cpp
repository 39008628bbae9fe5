// The FlashAttention-style backend's host side: kernel-generation choice, capabilities and the
// cascade decision (no GPU needed; the builder and impl: flash_attn_engine_test.cpp, the split-KV
// rule: split_kv_test.cpp, the launch decision: launch_plan_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "flash_attn/cascade.h"
#include "flash_attn/flash_attn_backend.h"
#include "flash_attn/generation.h"
#include "flash_attn/impl.h"
#include "flash_attn/metadata_builder.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/varlen_launch.h"
#include "flash_attn_test_util.h"
#include "test_util.h"

namespace attnkit::flash_attn {
namespace {

using test::Batch;

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += "[" + x + "] ";
  return s;
}

bool mentions(const std::vector<std::string>& reasons, const std::string& needle) {
  return std::any_of(reasons.begin(), reasons.end(),
                     [&](const std::string& r) { return r.find(needle) != std::string::npos; });
}

// ---- kernel generations ---------------------------------------------------------------------

struct GenCase {
  const char* name;
  int cc, head_size;
  DType cache;
  bool alibi, sinks;
  // chosen with hopper kernels built / as shipped (none = -1)
  int chosen_if_built, chosen_shipped;
  std::vector<std::string> hopper_reasons;  // substrings of hopper's refusal when built
  std::vector<std::string> mma_reasons;     // substrings of mma_sync's refusal
};
constexpr int H = static_cast<int>(Generation::hopper), M = static_cast<int>(Generation::mma_sync);

TEST(Generation, ChoiceTable) {
  const GenCase cases[] = {
      {"bf16 GQA sm90", 90, 128, DType::bf16, false, false, H, M, {}, {}},
      {"hd64 sm90", 90, 64, DType::bf16, false, false, H, M, {}, {}},
      {"hd64 sinks sm90", 90, 64, DType::bf16, false, true, H, M, {}, {}},
      {"hd256 sm90", 90, 256, DType::bf16, false, true, H, M, {}, {}},
      {"hd96 sm90", 90, 96, DType::bf16, false, false, H, M, {}, {}},
      {"hd192 sm90", 90, 192, DType::bf16, false, false, H, M, {}, {}},
      {"hd160 sm90", 90, 160, DType::bf16, false, false, H, M, {}, {}},
      // Rounded head sizes: hopper serves every size up to 256, on the next of 64 / 96 / 128 / 192 / 256.
      {"hd8 sm90", 90, 8, DType::bf16, false, false, H, M, {}, {}},
      {"hd40 sm90", 90, 40, DType::bf16, false, false, H, M, {}, {}},
      {"hd112 sm90", 90, 112, DType::bf16, false, false, H, M, {}, {}},
      {"hd72 sm90", 90, 72, DType::bf16, false, false, H, M, {}, {}},
      {"hd80 sm90", 90, 80, DType::bf16, false, false, H, M, {}, {}},
      {"hd200 sm90", 90, 200, DType::bf16, false, false, H, M, {}, {}},
      {"fp8 hd80 sm90", 90, 80, DType::fp8_e4m3, false, false, H, M, {}, {}},
      {"fp8 hd40 sm90", 90, 40, DType::fp8_e4m3, false, false, -1, -1, {"has no kernel dim"}, {"16 with an fp8 cache"}},
      {"hd84 sm90", 90, 84, DType::bf16, false, false, -1, -1, {"has no kernel dim"}, {"head size is 84"}},
      {"hd264 sm90", 90, 264, DType::bf16, false, false, M, M, {"head size 264 runs on dim 512"}, {}},
      {"fp8 hd512 sm90", 90, 512, DType::fp8_e5m2, false, false, M, M, {"head size 512 runs on dim 512"}, {}},
      {"hd520 sm90", 90, 520, DType::bf16, false, false, -1, -1, {"has no kernel dim"}, {"head size is 520"}},
      {"fp8 sm90", 90, 128, DType::fp8_e4m3, false, false, H, M, {}, {}},
      {"fp8 e5m2 sm90", 90, 128, DType::fp8_e5m2, false, false, H, M, {}, {}},
      {"fp8 hd64 sm90", 90, 64, DType::fp8_e4m3, false, false, H, M, {}, {}},
      {"fp8 hd256 sm90", 90, 256, DType::fp8_e4m3, false, false, H, M, {}, {}},
      {"fp8 hd192 sm90", 90, 192, DType::fp8_e5m2, false, false, H, M, {}, {}},
      {"alibi sm90", 90, 128, DType::bf16, true, false, H, M, {}, {}},
      {"fp8 sm80", 80, 128, DType::fp8_e4m3, false, false, M, M, {"needs sm90"}, {}},
      {"bf16 sm80", 80, 128, DType::bf16, false, false, M, M, {"the device is sm80"}, {}},
      // Shared memory per block (cuda_archs.h smem_per_block_optin): 99 KB on sm86 / sm89 holds
      // the head-dim-64 and fp8 head-dim-128 tiles, not the 16-bit head-dim-128 ones (102 / 106
      // KB); 163 KB on sm80 holds head dim 192, not 256.
      {"bf16 sm89", 89, 128, DType::bf16, false, false, -1, -1, {"needs sm90"}, {"104448 bytes", "sm89 gives 101376"}},
      {"hd64 sm89", 89, 64, DType::bf16, false, false, M, M, {"needs sm90"}, {}},
      {"fp8 sm86", 86, 128, DType::fp8_e4m3, false, false, M, M, {"needs sm90"}, {}},
      {"hd192 sm80", 80, 192, DType::bf16, false, false, M, M, {"the device is sm80"}, {}},
      {"hd256 sm80", 80, 256, DType::bf16, false, false, -1, -1, {"the device is sm80"}, {"prefill tile at head dim 256", "sm80 gives 166912"}},
      {"bf16 sm100", 100, 128, DType::bf16, false, false, M, M, {"the device is sm100"}, {}},
      {"sm75", 75, 128, DType::bf16, false, false, -1, -1, {"needs sm90"}, {"sm80 or newer"}},
      {"hd512 sm90", 90, 512, DType::bf16, false, false, M, M, {"head size 512 runs on dim 512"}, {}},
      {"nvfp4 sm90", 90, 128, DType::nvfp4, false, false, -1, -1, {"FP8 caches only (cache dtype is nvfp4)"}, {"nvfp4"}},
      {"cpu", 0, 128, DType::bf16, false, false, -1, -1, {"CPU"}, {"CPU"}},
  };
  for (const GenCase& c : cases) {
    AttentionConfig cfg = config(c.cc, c.head_size, c.cache);
    cfg.features.alibi = c.alibi;
    cfg.features.sinks = c.sinks;
    for (bool built : {true, false}) {
      const GenerationChoice g = choose_generation(cfg, built);
      const int want = built ? c.chosen_if_built : c.chosen_shipped;
      ASSERT_EQ(g.chosen.has_value(), want >= 0) << c.name << " built " << built << ": " << g.describe();
      if (want >= 0) EXPECT_EQ(static_cast<int>(*g.chosen), want) << c.name << " built " << built;
      // Exactly the generations whose rules fail are refused, each with reasons; one that
      // could serve but lost on preference (mma_sync when hopper is chosen) is not.
      const bool hopper_fails = !(built && c.chosen_if_built == H);
      const bool mma_fails = c.chosen_shipped < 0;
      EXPECT_EQ(g.refused.size(), size_t{hopper_fails} + size_t{mma_fails}) << c.name << ": " << g.describe();
      for (const auto& r : g.refused) {
        EXPECT_FALSE(r.reasons.empty()) << c.name;
        const auto& expected = r.generation == Generation::hopper ? c.hopper_reasons : c.mma_reasons;
        for (const auto& m : expected) EXPECT_TRUE(mentions(r.reasons, m)) << c.name << ": " << m << " not in " << joined(r.reasons);
        if (r.generation == Generation::hopper)
          EXPECT_EQ(mentions(r.reasons, "not built"), !built) << c.name << ": " << joined(r.reasons);
      }
    }
    // As built: the hopper generation serves where it can when this library has its kernels;
    // without them, the choice says when hopper alone would have served.
    const GenerationChoice as_built = choose_generation(cfg);
    if (hopper_generation_built()) {
      EXPECT_EQ(as_built.chosen == Generation::hopper, c.chosen_if_built == H) << c.name << ": " << as_built.describe();
    } else {
      EXPECT_FALSE(as_built.chosen == Generation::hopper);
      const bool fallback = c.chosen_if_built == H;
      EXPECT_EQ(as_built.why.find("not built") != std::string::npos, fallback) << c.name << ": " << as_built.why;
    }
  }
}

TEST(Generation, DescribeNamesChosenAndRefused) {
  const std::string d = choose_generation(config(80, 128, DType::fp8_e4m3)).describe();
  EXPECT_EQ(d.rfind("mma_sync generation", 0), 0u) << d;
  EXPECT_NE(d.find("hopper generation refused"), std::string::npos) << d;
  EXPECT_NE(d.find("needs sm90"), std::string::npos) << d;
}

// ---- the backend's own rules ----------------------------------------------------------------

TEST(FlashAttnBackend, CapabilitiesAndRules) {
  const FlashAttnBackend fa;
  const Capabilities caps = fa.capabilities();
  EXPECT_TRUE(caps.head_sizes.empty());  // (any multiple of 8 the kernels' dims cover)
  EXPECT_EQ(caps.head_size_multiple_of, 8);
  EXPECT_EQ(caps.block_sizes.multiple_of, 16);
  EXPECT_EQ(caps.min_cc, 80);
  EXPECT_FALSE(caps.runs_on_cpu);
  EXPECT_TRUE(caps.features.sinks && caps.features.alibi && caps.features.softcap &&
              caps.features.sliding_window && caps.features.non_causal && caps.features.lse);
  EXPECT_EQ(fa.cudagraph_support(config(90)), CudagraphSupport::UNIFORM_SINGLE_TOKEN_DECODE);

  EXPECT_TRUE(fa.check(config(90)).empty()) << joined(fa.check(config(90)));
  for (int bs : {16, 32, 48, 64, 256, 1024}) {
    AttentionConfig c = config(90);
    c.block_size = bs;
    EXPECT_TRUE(fa.check(c).empty()) << bs;
  }
  AttentionConfig mixed = config(90);
  mixed.cache_dtype = DType::f16;  // bf16 model, f16 cache
  EXPECT_TRUE(mentions(fa.check(mixed), "must have the model dtype")) << joined(fa.check(mixed));
  AttentionConfig fp32 = config(90, 128, DType::f32);
  fp32.dtype = DType::f32;
  EXPECT_TRUE(mentions(fa.check(fp32), "dtype f32 is not supported")) << joined(fa.check(fp32));
  EXPECT_TRUE(mentions(fa.check(config(75)), "8.0 or newer")) << joined(fa.check(config(75)));
  EXPECT_TRUE(mentions(fa.check(config(0)), "runs on CUDA GPUs only")) << joined(fa.check(config(0)));
  EXPECT_NE(fa.variant(config(90)).find("mma_sync"), std::string::npos);
  EXPECT_THROW(fa.make_builder(config(0)), Error);
  EXPECT_THROW(fa.make_impl(config(90, 84)), Error);
  EXPECT_THROW(fa.make_impl(config(90, 520)), Error);
  for (int hs : {8, 32, 40, 72, 80, 96, 112, 160, 200, 224, 256, 264, 512})
    EXPECT_TRUE(fa.check(config(90, hs)).empty()) << hs << ": " << joined(fa.check(config(90, hs)));
  EXPECT_NE(fa.variant(config(90, 112)).find("head-dim-128 kernels (head size 112 zero-padded)"), std::string::npos)
      << fa.variant(config(90, 112));
  // Head size 96: the hopper kernel has dim 96 (16-bit caches), so no padding is named; head
  // size 80 runs padded on hopper 96 and on the mma_sync dim 80 (tile_head_dim).
  EXPECT_NE(fa.variant(config(90, 96)).find("the head-dim-96 kernels"), std::string::npos) << fa.variant(config(90, 96));
  EXPECT_EQ(fa.variant(config(90, 96)).find("zero-padded"), std::string::npos) << fa.variant(config(90, 96));
  // (a build without sm_90a code, ATTNKIT_CUDA=OFF among them, serves it on mma_sync alone)
  const std::string hd80 = flash_attn::hopper_generation_built()
                               ? "head-dim-96 kernels (head size 80 zero-padded); the mma_sync launches on "
                                 "the head-dim-80 kernels"
                               : "serves it, the head-dim-80 kernels";
  EXPECT_NE(fa.variant(config(90, 80)).find(hd80), std::string::npos) << fa.variant(config(90, 80));
}

// ---- cascade -------------------------------------------------------------------------------

TEST(Cascade, DocumentedConstants) {
  EXPECT_EQ(kCascadeMinPrefix, 256);
  EXPECT_EQ(kCascadeMinRequests, 8);
  EXPECT_EQ(kCascadeTile, 128);
}

TEST(Cascade, PrefixIsCappedAndFloored) {
  Batch b;
  b.add(1, 1000);
  b.add(10, 800);   // 790 context tokens: cap 790
  b.add(0, 100);    // empty request: no cap
  EXPECT_EQ(cascade_prefix_len(2000, b.qsl, b.seq, 16), 784);   // floor(790 / 16) * 16
  EXPECT_EQ(cascade_prefix_len(700, b.qsl, b.seq, 16), 688);
  EXPECT_EQ(cascade_prefix_len(700, b.qsl, b.seq, 256), 512);
  Batch fresh;
  fresh.add(300, 300);  // a fresh prefill shares nothing cached: prefix 0
  EXPECT_EQ(cascade_prefix_len(4096, fresh.qsl, fresh.seq, 16), 0);
  // Every request keeps >= 1 suffix token.
  Batch tight;
  tight.add(1, 513);
  EXPECT_EQ(cascade_prefix_len(10000, tight.qsl, tight.seq, 16), 512);
  tight.seq[0] = 512;
  EXPECT_EQ(cascade_prefix_len(10000, tight.qsl, tight.seq, 16), 496);
}

struct CascadeCase {
  const char* name;
  int prefix, reqs, q, seq, heads, kv_heads, sms;
  bool alibi, window;
  int dcp;
  bool use;
  const char* reason;
};

TEST(Cascade, DecisionTable) {
  const CascadeCase cases[] = {
      {"short prefix", 240, 16, 1, 2000, 32, 8, 132, false, false, 1, false, "< 256"},
      {"prefix capped below 256", 4096, 16, 1, 250, 32, 8, 132, false, false, 1, false, "< 256"},
      {"7 requests", 1024, 7, 1, 2000, 32, 8, 132, false, false, 1, false, "needs >= 8"},
      {"alibi", 1024, 16, 1, 2000, 32, 8, 132, true, false, 1, false, "ALiBi"},
      {"window", 1024, 16, 1, 2000, 32, 8, 132, false, true, 1, false, "sliding window"},
      {"dcp", 1024, 16, 1, 2000, 32, 8, 132, false, false, 2, false, "context parallelism"},
      {"MHA decode", 1024, 8, 1, 2000, 32, 32, 132, false, false, 1, true, "no GQA group"},
      {"GQA prefill chunks", 1024, 8, 16, 2000, 32, 8, 132, false, false, 1, true, "prefills"},
      // 8 decodes, 32/8 heads, 1024 prefix (8 tiles) on 132 SMs: cascade ceil(32/132)*8 = 8,
      // decode ceil(8*8*1*8/132) = 4 -> plain split-KV decode wins.
      {"GQA decode few reqs", 1024, 8, 1, 2000, 32, 8, 132, false, false, 1, false, "cascade 8 vs split-KV decode 4"},
      // 64 decodes: cascade 8 vs decode ceil(64*8*8/132) = 32 -> cascade.
      {"GQA decode many reqs", 1024, 64, 1, 2000, 32, 8, 132, false, false, 1, true, "cascade 8 vs split-KV decode 32"},
      // 256 decodes, 64 heads, 8 SMs: cascade ceil(64*2/8)*2 = 32 vs decode ceil(256*8*2/8) = 512.
      {"small GPU", 256, 256, 1, 300, 64, 8, 8, false, false, 1, true, "cascade 32 vs split-KV decode 512"},
  };
  for (const CascadeCase& c : cases) {
    Batch b;
    for (int r = 0; r < c.reqs; ++r) b.add(c.q, c.seq);
    CascadeInput in;
    in.common_prefix_len = c.prefix;
    in.query_start_loc = b.qsl;
    in.seq_lens = b.seq;
    in.num_heads = c.heads;
    in.num_kv_heads = c.kv_heads;
    in.block_size = 16;
    in.alibi = c.alibi;
    in.sliding_window = c.window;
    in.dcp_world_size = c.dcp;
    in.num_sms = c.sms;
    const CascadeDecision d = use_cascade_attention(in);
    EXPECT_EQ(d.use, c.use) << c.name << ": " << d.reason;
    EXPECT_NE(d.reason.find(c.reason), std::string::npos) << c.name << ": " << d.reason;
    if (d.use) {
      EXPECT_GE(d.prefix_len, kCascadeMinPrefix);
      EXPECT_EQ(d.prefix_len % in.block_size, 0);
    }
  }
}

TEST(Cascade, RejectsBadInput) {
  Batch b;
  b.add(1, 1000);
  CascadeInput in;
  in.common_prefix_len = 512;
  in.query_start_loc = b.qsl;
  in.seq_lens = b.seq;
  in.num_heads = 32;
  in.num_kv_heads = 8;
  in.num_sms = 0;
  EXPECT_THROW(use_cascade_attention(in), Error);
  in.num_sms = 132;
  in.num_kv_heads = 6;
  EXPECT_THROW(use_cascade_attention(in), Error);
  EXPECT_THROW(cascade_prefix_len(-1, b.qsl, b.seq, 16), Error);
  EXPECT_THROW(cascade_prefix_len(512, b.qsl, b.seq, 0), Error);
}

}  // namespace
}  // namespace attnkit::flash_attn
