// The FlashAttention-style backend's host side: kernel-generation choice, cascade decision,
// metadata builder and the impl's validation (no GPU needed; the split-KV rule: split_kv_test.cpp,
// the launch decision: launch_plan_test.cpp).
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

AttentionConfig config(int cc, int head_size = 128, DType cache = DType::bf16) {
  AttentionConfig c;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_size = head_size;
  c.dtype = DType::bf16;
  c.cache_dtype = cache;
  c.block_size = 16;
  c.device = cc == 0 ? DeviceSpec::Cpu() : DeviceSpec::Cuda(cc / 10, cc % 10);
  return c;
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
      {"hd256 sm90", 90, 256, DType::bf16, false, true, M, M, {"head dims 64 / 128"}, {}},
      {"hd96 sm90", 90, 96, DType::bf16, false, false, M, M, {"head dims 64 / 128"}, {}},
      {"hd192 sm90", 90, 192, DType::bf16, false, false, M, M, {"head size 192 runs on dim 192"}, {}},
      // Rounded head sizes: hopper serves the ones whose mma_sync dim is 64 / 128.
      {"hd8 sm90", 90, 8, DType::bf16, false, false, H, M, {}, {}},
      {"hd40 sm90", 90, 40, DType::bf16, false, false, H, M, {}, {}},
      {"hd112 sm90", 90, 112, DType::bf16, false, false, H, M, {}, {}},
      {"hd72 sm90", 90, 72, DType::bf16, false, false, M, M, {"head size 72 runs on dim 80"}, {}},
      {"hd80 sm90", 90, 80, DType::bf16, false, false, M, M, {"head size 80 runs on dim 80"}, {}},
      {"hd200 sm90", 90, 200, DType::bf16, false, false, M, M, {"head size 200 runs on dim 256"}, {}},
      {"fp8 hd80 sm90", 90, 80, DType::fp8_e4m3, false, false, M, M, {"head size 80 runs on dim 96"}, {}},
      {"fp8 hd40 sm90", 90, 40, DType::fp8_e4m3, false, false, -1, -1, {"has no kernel dim"}, {"16 with an fp8 cache"}},
      {"hd84 sm90", 90, 84, DType::bf16, false, false, -1, -1, {"has no kernel dim"}, {"head size is 84"}},
      {"hd264 sm90", 90, 264, DType::bf16, false, false, M, M, {"head size 264 runs on dim 512"}, {}},
      {"fp8 hd512 sm90", 90, 512, DType::fp8_e5m2, false, false, M, M, {"head size 512 runs on dim 512"}, {}},
      {"hd520 sm90", 90, 520, DType::bf16, false, false, -1, -1, {"has no kernel dim"}, {"head size is 520"}},
      {"fp8 sm90", 90, 128, DType::fp8_e4m3, false, false, M, M, {"16-bit caches"}, {}},
      {"fp8 e5m2 sm90", 90, 128, DType::fp8_e5m2, false, false, M, M, {"fp8_e5m2"}, {}},
      {"alibi sm90", 90, 128, DType::bf16, true, false, H, M, {}, {}},
      {"fp8 sm80", 80, 128, DType::fp8_e4m3, false, false, M, M, {"needs sm90", "16-bit caches"}, {}},
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
      {"nvfp4 sm90", 90, 128, DType::nvfp4, false, false, -1, -1, {"16-bit caches"}, {"nvfp4"}},
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

// ---- metadata builder ------------------------------------------------------------------------

struct HostBatch {
  CommonAttentionMetadata md;
  // Fake device copies: CUDA-tagged views of host memory (the builder never dereferences them).
  std::vector<int32_t> qsl_dev, seq_dev, table_dev;

  HostBatch(const std::vector<int>& q, const std::vector<int>& s, int block_size) {
    md.query_start_loc = {0};
    int max_blocks = 1;
    for (int x : s) max_blocks = std::max(max_blocks, (x + block_size - 1) / block_size);
    int next = 0;
    for (size_t r = 0; r < q.size(); ++r) {
      md.query_start_loc.push_back(md.query_start_loc.back() + q[r]);
      md.seq_lens.push_back(s[r]);
      for (int j = 0; j < max_blocks; ++j) md.block_table.push_back(next++);
      for (int i = 0; i < q[r]; ++i) {
        const int pos = s[r] - q[r] + i;
        md.slot_mapping.push_back(int64_t{md.block_table[r * max_blocks + pos / block_size]} * block_size +
                                  pos % block_size);
      }
    }
    md.max_blocks_per_req = max_blocks;
    md.finalize();
    qsl_dev = md.query_start_loc;
    seq_dev = md.seq_lens;
    table_dev = md.block_table;
    md.query_start_loc_dev = TensorView(qsl_dev.data(), DType::i32, {int64_t(qsl_dev.size())}, Device::CUDA);
    md.seq_lens_dev = TensorView(seq_dev.data(), DType::i32, {int64_t(seq_dev.size())}, Device::CUDA);
    md.block_table_dev = TensorView(table_dev.data(), DType::i32, {md.num_reqs, max_blocks}, Device::CUDA);
  }
};

TEST(FlashAttnBuilder, DecodePrefillBookkeeping) {
  struct Case {
    std::vector<int> q, s;
    int threshold;
    int decodes, prefills, decode_tokens, prefill_tokens, max_dec_seq, max_pre_q, max_pre_seq;
    bool first, uniform;
  };
  const Case cases[] = {
      {{1, 1, 1}, {10, 300, 20}, 1, 3, 0, 3, 0, 300, 0, 0, true, true},
      {{1, 1, 7, 30}, {10, 300, 20, 30}, 1, 2, 2, 2, 37, 300, 30, 30, true, false},
      {{7, 1, 1}, {50, 5, 9}, 1, 2, 1, 2, 7, 9, 7, 50, false, false},
      {{3, 2, 9, 0}, {50, 5, 9, 0}, 4, 2, 1, 5, 9, 50, 9, 9, true, false},
      {{0, 1, 0}, {0, 64, 0}, 1, 1, 0, 1, 0, 64, 0, 0, true, true},
      {{40}, {40}, 1, 0, 1, 0, 40, 0, 40, 40, true, false},
  };
  AttentionConfig cfg = config(90);
  for (const Case& c : cases) {
    HostBatch b(c.q, c.s, cfg.block_size);
    FlashAttnMetadataBuilder builder(cfg, {.decode_threshold = c.threshold});
    const FlashAttnMetadata m = builder.build_flash(b.md);
    EXPECT_EQ(m.num_reqs, static_cast<int>(c.q.size()));
    EXPECT_EQ(m.num_actual_tokens, b.md.num_actual_tokens);
    EXPECT_EQ(m.max_query_len, *std::max_element(c.q.begin(), c.q.end()));
    EXPECT_EQ(m.max_seq_len, *std::max_element(c.s.begin(), c.s.end()));
    EXPECT_EQ(m.num_decodes, c.decodes);
    EXPECT_EQ(m.num_prefills, c.prefills);
    EXPECT_EQ(m.num_decode_tokens, c.decode_tokens);
    EXPECT_EQ(m.num_prefill_tokens, c.prefill_tokens);
    EXPECT_EQ(m.num_decode_tokens + m.num_prefill_tokens, m.num_actual_tokens);
    EXPECT_EQ(m.max_decode_seq_len, c.max_dec_seq);
    EXPECT_EQ(m.max_prefill_query_len, c.max_pre_q);
    EXPECT_EQ(m.max_prefill_seq_len, c.max_pre_seq);
    EXPECT_EQ(m.decodes_first, c.first);
    EXPECT_EQ(m.uniform_single_token_decode, c.uniform);
    EXPECT_EQ(m.query_start_loc.data, b.qsl_dev.data());
    EXPECT_EQ(m.seq_lens.data, b.seq_dev.data());
    EXPECT_EQ(m.block_table.data, b.table_dev.data());
    EXPECT_EQ(m.max_blocks_per_req, b.md.max_blocks_per_req);
    EXPECT_EQ(m.causal, b.md.causal);
    // The block ids read: each request's ceil(seq/16) first entries of its row.
    int max_id = -1;
    for (int r = 0; r < m.num_reqs; ++r)
      for (int j = 0; j < (c.s[r] + 15) / 16; ++j) max_id = std::max(max_id, b.md.block_table[r * b.md.max_blocks_per_req + j]);
    EXPECT_EQ(m.max_block_id, max_id);
    EXPECT_EQ(builder.reorder_batch_threshold(), 0) << "one varlen kernel: no reordering needed";
  }
}

TEST(FlashAttnBuilder, SplitDecisionAndWorkspace) {
  for (int sms : {0, 16, 132})
    for (int max_splits : {1, 4, kMaxSplits}) {
      AttentionConfig cfg = config(90);
      cfg.device.num_sms = sms;
      HostBatch b({1, 1}, {20000, 9000}, cfg.block_size);
      FlashAttnMetadataBuilder builder(cfg, {.decode_threshold = 1, .max_splits = max_splits});
      const FlashAttnMetadata m = builder.build_flash(b.md);
      SplitKVInput in;
      in.query_start_loc = b.md.query_start_loc;
      in.seq_lens = b.md.seq_lens;
      in.num_heads = cfg.num_heads;
      in.num_kv_heads = cfg.num_kv_heads;
      in.num_sms = cfg.device.sms_or_default();
      in.max_splits = max_splits;
      in.cache_dtype = cfg.cache_dtype;
      in.head_size = cfg.head_size;
      in.cc_major = cfg.device.cc_major;
      in.hopper_kernels = choose_generation(cfg).chosen == Generation::hopper;
      EXPECT_EQ(m.split.num_splits, decide_num_splits(in).num_splits) << sms << " " << max_splits;
      EXPECT_LE(m.split.num_splits, max_splits);
      EXPECT_EQ(m.workspace_bytes, m.split.num_splits > 1 ? varlen_workspace_bytes(b.md.num_actual_tokens, cfg.num_heads,
                                                                                   cfg.head_size, m.split.num_splits)
                                                          : 0u);
    }
  // The generic interface returns the same metadata.
  AttentionConfig cfg = config(90);
  HostBatch b({1, 5}, {100, 5}, 16);
  auto md = backend("flash_attn").make_builder(cfg)->build(b.md);
  ASSERT_NE(dynamic_cast<FlashAttnMetadata*>(md.get()), nullptr);
}

TEST(FlashAttnBuilder, CascadeDecisionUsesTheConfiguration) {
  // 64 GQA decodes over a 1024-token shared prefix: cascade pays (see Cascade.DecisionTable).
  std::vector<int> q(64, 1), s(64, 2000);
  HostBatch b(q, s, 16);
  AttentionConfig cfg = config(90);
  const FlashAttnMetadataBuilder plain(cfg);
  const CascadeDecision d = plain.cascade_decision(b.md, 1024);
  EXPECT_TRUE(d.use) << d.reason;
  EXPECT_EQ(d.prefix_len, 1024);
  EXPECT_FALSE(plain.cascade_decision(b.md, 1024, /*dcp_world_size=*/2).use);
  cfg.features.alibi = true;
  EXPECT_FALSE(FlashAttnMetadataBuilder(cfg).cascade_decision(b.md, 1024).use);
  cfg = config(90);
  cfg.features.sliding_window = true;
  EXPECT_FALSE(FlashAttnMetadataBuilder(cfg).cascade_decision(b.md, 1024).use);
  // The device's SM count feeds the cost model.
  cfg = config(90);
  cfg.device.num_sms = 100000;  // every CTA in one wave: cascade 8 tile-waves vs decode 1
  EXPECT_FALSE(FlashAttnMetadataBuilder(cfg).cascade_decision(b.md, 1024).use);
  CommonAttentionMetadata bad = b.md;
  bad.seq_lens[0] = 0;
  EXPECT_THROW(plain.cascade_decision(bad, 1024), Error);
}

TEST(FlashAttnBuilder, RejectsMissingDeviceCopiesAndBadMetadata) {
  AttentionConfig cfg = config(90);
  FlashAttnMetadataBuilder builder(cfg);
  HostBatch b({1, 4}, {30, 4}, 16);
  EXPECT_NO_THROW(builder.build_flash(b.md));
  CommonAttentionMetadata md = b.md;
  md.seq_lens_dev = {};
  EXPECT_TRUE(test::throws_error_with([&] { builder.build_flash(md); },
                                      {"seq_lens_dev"})) << "no device seq_lens";
  md = b.md;
  md.query_start_loc_dev.device = Device::CPU;
  EXPECT_TRUE(test::throws_error_with([&] { builder.build_flash(md); },
                                      {"query_start_loc_dev"})) << "host array as device copy";
  md = b.md;
  md.block_table_dev.dtype = DType::i64;
  EXPECT_TRUE(test::throws_error_with([&] { builder.build_flash(md); },
                                      {"block_table_dev"})) << "int64 table";
  md = b.md;
  md.seq_lens_dev.shape[0] = 1;
  EXPECT_TRUE(test::throws_error_with([&] { builder.build_flash(md); },
                                      {"seq_lens_dev"})) << "short device copy";
  md = b.md;
  md.seq_lens[1] = 3;  // shorter than its 4 new tokens
  EXPECT_TRUE(test::throws_error_with([&] { builder.build_flash(md); },
                                      {"seq_lens"})) << "query longer than keys";
  md = b.md;
  md.block_table[0] = -2;
  EXPECT_TRUE(test::throws_error_with([&] { builder.build_flash(md); }, {"block"})) << "negative block id";
  EXPECT_THROW(FlashAttnMetadataBuilder(cfg, {.decode_threshold = 0}), Error);
  EXPECT_THROW(FlashAttnMetadataBuilder(cfg, {.decode_threshold = 1, .max_splits = kMaxSplits + 1}), Error);
}

// ---- impl ------------------------------------------------------------------------------------

// CUDA-tagged views of host memory: the impl validates them and never dereferences them.
struct FakeGpuCall {
  AttentionConfig cfg = config(90);
  HostBatch batch;
  std::vector<uint16_t> q, out;
  std::vector<uint16_t> cache;
  int64_t num_blocks = 0;
  TensorView qv, ov, cv;

  explicit FakeGpuCall(std::vector<int> seq_lens = {40, 300, 6}, int64_t extra_blocks = 4)
      : batch({1, 1, 6}, seq_lens, 16) {
    const int64_t n = batch.md.num_actual_tokens;
    q.resize(n * cfg.num_heads * cfg.head_size);
    out.resize(q.size());
    num_blocks = batch.md.num_reqs * batch.md.max_blocks_per_req + extra_blocks;
    cache.resize(num_blocks * 2 * cfg.block_size * cfg.num_kv_heads * cfg.head_size);
    qv = TensorView(q.data(), DType::bf16, {n, cfg.num_heads, cfg.head_size}, Device::CUDA);
    ov = TensorView(out.data(), DType::bf16, {n, cfg.num_heads, cfg.head_size}, Device::CUDA);
    cv = TensorView(cache.data(), DType::bf16, {num_blocks, 2, cfg.block_size, cfg.num_kv_heads, cfg.head_size},
                    Device::CUDA);
  }
};

TEST(FlashAttnImpl, ValidatesThenLaunches) {
  FakeGpuCall c;
  FlashAttnMetadataBuilder builder(c.cfg, {.decode_threshold = 1, .max_splits = 1});
  const FlashAttnMetadata md = builder.build_flash(c.batch.md);
  FlashAttnImpl impl(c.cfg);
  EXPECT_EQ(impl.generation(), choose_generation(c.cfg).chosen);
  EXPECT_EQ(impl.generation() == Generation::hopper, hopper_generation_built() && c.cfg.device.cc() == 90);
#ifndef ATTNKIT_WITH_CUDA
  // A valid call gets through every check to the launch, which a CPU build cannot run.
  try {
    impl.forward(c.qv, {}, {}, c.cv, md, {}, c.ov);
    ADD_FAILURE() << "a CPU build launched a kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "flash_attn varlen attention") << e.what();
  }
#endif
  struct Other : BackendMetadata {};
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, Other{}, {}, c.ov); },
                                      {"flash_attn builder"})) << "foreign metadata";
  TensorView host_q = c.qv;
  host_q.device = Device::CPU;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(host_q, {}, {}, c.cv, md, {}, c.ov); },
                                      {"q"})) << "q on the CPU";
  TensorView f16_out = c.ov;
  f16_out.dtype = DType::f16;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, {}, f16_out); },
                                      {"out"})) << "out dtype";
  TensorView other_gpu = c.ov;
  other_gpu.device_index = 1;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, {}, other_gpu); },
                                      {"device_index"})) << "out on another GPU";
  TensorView host_cache = c.cv;
  host_cache.device = Device::CPU;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, host_cache, md, {}, c.ov); },
                                      {"kv_cache"})) << "cache on the CPU";
  TensorView small_cache = c.cv;
  small_cache.shape[0] = md.max_block_id;  // one block short of the largest id read
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, small_cache, md, {}, c.ov); },
                                      {"num_blocks"})) << "cache too small";
  TensorView bad_k = c.qv;  // k must have num_kv_heads heads
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, bad_k, {}, c.cv, md, {}, c.ov); },
                                      {"k"})) << "k shape";
  // Features used by the call but not declared in the configuration the impl was made for.
  std::vector<float> slopes(c.cfg.num_heads, 0.1f);
  AttentionParams alibi;
  alibi.alibi_slopes = TensorView(slopes.data(), DType::f32, {c.cfg.num_heads}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, alibi, c.ov); },
                                      {"ALiBi"})) << "undeclared ALiBi";
  AttentionParams softcap;
  softcap.softcap = 30.f;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, softcap, c.ov); },
                                      {"softcap"})) << "undeclared softcap";
  AttentionParams window;
  window.window_left = 127;
  window.window_right = 0;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, window, c.ov); },
                                      {"window"})) << "undeclared window";
  AttentionParams non_causal;
  non_causal.causal = false;
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, non_causal, c.ov); },
                                      {"causal"})) << "causal mismatch";
}

// The split partials' workspace is the caller's: without one, or with too small a one, a split
// forward is an Error before any launch (the impl allocates none, in either build).
TEST(FlashAttnImpl, SplitLaunchNeedsWorkspace) {
  FakeGpuCall c({4000, 3000, 6});
  FlashAttnMetadataBuilder builder(c.cfg);  // splits allowed: 3 requests leave SMs idle
  const FlashAttnMetadata md = builder.build_flash(c.batch.md);
  ASSERT_GT(md.split.num_splits, 1) << md.split.reason;
  FlashAttnImpl impl(c.cfg);
  EXPECT_THROW(impl.set_workspace(nullptr, 64), Error);
  EXPECT_EQ(impl.max_workspace_bytes(4096), varlen_workspace_bytes(4096, c.cfg.num_heads, c.cfg.head_size, kMaxSplits));
  ASSERT_GT(impl.workspace_bytes_for(md), 0u);
  EXPECT_EQ(impl.workspace_bytes_for(md), md.workspace_bytes);
  EXPECT_LE(impl.workspace_bytes_for(md), impl.workspace_bytes(c.batch.md.num_actual_tokens));
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, {}, c.ov); },
                                      {"set_workspace", std::to_string(md.workspace_bytes), "KV splits"}))
      << "no workspace";
  std::vector<uint8_t> small(md.workspace_bytes - 1);
  impl.set_workspace(small.data(), small.size());
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, {}, c.ov); },
                                      {"workspace bytes", std::to_string(small.size())}))
      << "small workspace";
#ifndef ATTNKIT_WITH_CUDA
  std::vector<uint8_t> ws(md.workspace_bytes + 16);
  impl.set_workspace(ws.data(), ws.size());
  try {
    impl.forward(c.qv, {}, {}, c.cv, md, {}, c.ov);
    ADD_FAILURE() << "a CPU build launched a kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "flash_attn varlen attention") << e.what();
  }
#endif
  // An unsplit batch needs none.
  FakeGpuCall one;
  FlashAttnMetadataBuilder b1(one.cfg);
  const FlashAttnMetadata md1 = b1.build_flash(one.batch.md);
  if (md1.split.num_splits == 1) EXPECT_EQ(FlashAttnImpl(one.cfg).workspace_bytes_for(md1), 0u);
}

TEST(FlashAttnImpl, DeclaredFeaturesPass) {
  FakeGpuCall c;
  c.cfg.features = {.sinks = true, .alibi = true, .softcap = true, .sliding_window = true,
                    .non_causal = true, .lse = true};
  FlashAttnImpl impl(c.cfg);
  c.batch.md.causal = false;
  const FlashAttnMetadata md = FlashAttnMetadataBuilder(c.cfg, {.decode_threshold = 1, .max_splits = 1}).build_flash(c.batch.md);
  std::vector<float> slopes(c.cfg.num_heads, 0.1f), sinks(c.cfg.num_heads, 1.f);
  std::vector<float> lse(c.cfg.num_heads * md.num_actual_tokens);
  AttentionParams p;
  p.causal = false;
  p.softcap = 30.f;
  p.window_left = 64;
  p.window_right = 64;
  p.alibi_slopes = TensorView(slopes.data(), DType::f32, {c.cfg.num_heads}, Device::CUDA);
  p.sinks = TensorView(sinks.data(), DType::f32, {c.cfg.num_heads}, Device::CUDA);
  p.lse = TensorView(lse.data(), DType::f32, {c.cfg.num_heads, md.num_actual_tokens}, Device::CUDA);
#ifndef ATTNKIT_WITH_CUDA
  try {
    impl.forward(c.qv, {}, {}, c.cv, md, p, c.ov);
    ADD_FAILURE() << "a CPU build launched a kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "flash_attn varlen attention") << e.what();
  }
#endif
  p.lse = TensorView(lse.data(), DType::f32, {c.cfg.num_heads, md.num_actual_tokens - 1}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, p, c.ov); },
                                      {"lse"})) << "lse shape";
}

}  // namespace
}  // namespace attnkit::flash_attn
