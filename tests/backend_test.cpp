// The backend abstraction: block-size rules, the capability check, the registry, KV cache
// shapes and stride orders of every backend, and the reference backend end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/error.h"
#include "attnkit/reference.h"
#include "reference/reference_backend.h"
#include "test_util.h"

namespace attnkit {
namespace {

bool any_contains(const std::vector<std::string>& reasons, const std::string& needle) {
  return std::any_of(reasons.begin(), reasons.end(),
                     [&](const std::string& r) { return r.find(needle) != std::string::npos; });
}

std::string joined(const std::vector<std::string>& reasons) {
  std::string s;
  for (const auto& r : reasons) s += "[" + r + "] ";
  return s;
}

AttentionConfig gqa_config(DeviceSpec device = DeviceSpec::Cuda(9, 0)) {
  return test::model_config(32, 8, 16, device);
}

// ---- BlockSizeRule --------------------------------------------------------------------------

TEST(BlockSizeRule, MultipleOfAllowsExactlyThePositiveMultiples) {
  for (int n : {1, 16, 64}) {
    const auto rule = BlockSizeRule::MultipleOf(n);
    EXPECT_EQ(rule.describe(), "a multiple of " + std::to_string(n));
    for (int bs = -n; bs <= 1100; ++bs)
      EXPECT_EQ(rule.allows(bs), bs > 0 && bs % n == 0) << "n " << n << " block size " << bs;
  }
}

TEST(BlockSizeRule, ListAllowsOnlyItsMembers) {
  const std::vector<int> sizes = {16, 32, 64, 256, 1024};
  const auto rule = BlockSizeRule::List(sizes);
  EXPECT_EQ(rule.describe(), "one of 16, 32, 64, 256, 1024");
  for (int bs = -16; bs <= 2048; ++bs)
    EXPECT_EQ(rule.allows(bs), std::count(sizes.begin(), sizes.end(), bs) == 1) << bs;
  EXPECT_FALSE(BlockSizeRule::List({}).allows(16));
}

// ---- small descriptions ---------------------------------------------------------------------

TEST(BackendNames, CudagraphSupportAndDevices) {
  EXPECT_EQ(cudagraph_support_name(CudagraphSupport::NEVER), "NEVER");
  EXPECT_EQ(cudagraph_support_name(CudagraphSupport::UNIFORM_SINGLE_TOKEN_DECODE),
            "UNIFORM_SINGLE_TOKEN_DECODE");
  EXPECT_EQ(cudagraph_support_name(CudagraphSupport::UNIFORM_BATCH), "UNIFORM_BATCH");
  EXPECT_EQ(cudagraph_support_name(CudagraphSupport::ALWAYS), "ALWAYS");
  EXPECT_EQ(DeviceSpec::Cpu().describe(), "cpu");
  struct Case { int major, minor; const char* name; int sms; };
  for (const Case& c : {Case{8, 0, "sm80", 108}, Case{8, 9, "sm89", 142}, Case{9, 0, "sm90", 132},
                        Case{10, 0, "sm100", 148}, Case{7, 5, "sm75", 108}}) {
    const auto d = DeviceSpec::Cuda(c.major, c.minor);
    EXPECT_EQ(d.describe(), c.name);
    EXPECT_EQ(d.cc(), c.major * 10 + c.minor);
    EXPECT_EQ(d.sms_or_default(), c.sms) << c.name;
    EXPECT_EQ(DeviceSpec::Cuda(c.major, c.minor, 7).sms_or_default(), 7);
  }
}

TEST(AttentionConfig, ValidateNamesTheBrokenField) {
  struct Case { const char* field; void (*mutate)(AttentionConfig&); };
  const Case cases[] = {
      {"num_heads", [](AttentionConfig& c) { c.num_heads = 0; }},
      {"num_kv_heads", [](AttentionConfig& c) { c.num_kv_heads = -1; }},
      {"num_heads", [](AttentionConfig& c) { c.num_kv_heads = 6; }},
      {"head_size", [](AttentionConfig& c) { c.head_size = 0; }},
      {"block_size", [](AttentionConfig& c) { c.block_size = 0; }},
      {"dtype", [](AttentionConfig& c) { c.dtype = DType::fp8_e4m3; }},
      {"cache_dtype", [](AttentionConfig& c) { c.cache_dtype = DType::i32; }},
      {"device", [](AttentionConfig& c) { c.device = DeviceSpec::Cuda(0, 0); }},
  };
  EXPECT_NO_THROW(gqa_config().validate("test"));
  for (const Case& c : cases) {
    AttentionConfig cfg = gqa_config();
    c.mutate(cfg);
    try {
      cfg.validate("test");
      ADD_FAILURE() << "no Error for " << c.field;
    } catch (const Error& e) {
      EXPECT_NE(e.value().find(c.field), std::string::npos) << e.what();
    }
  }
}

TEST(AttentionConfig, DescribeMentionsEveryField) {
  AttentionConfig c = gqa_config(DeviceSpec::Cuda(8, 0));
  c.cache_dtype = DType::fp8_e5m2;
  c.layout = KVLayout::HND;
  c.features.alibi = c.features.sinks = true;
  const std::string d = c.describe();
  for (const char* part : {"32 heads", "8 KV heads", "head size 128", "bf16", "cache fp8_e5m2",
                           "block 16", "HND", "sinks", "ALiBi", "sm80"})
    EXPECT_NE(d.find(part), std::string::npos) << part << " missing in " << d;
  EXPECT_EQ(describe_features({}), "none");
}

// ---- the capability check ------------------------------------------------------------------

Capabilities narrow_caps() {
  Capabilities c;
  c.dtypes = {DType::bf16};
  c.cache_dtypes = {DType::bf16, DType::fp8_e4m3};
  c.head_sizes = {64, 128};
  c.block_sizes = BlockSizeRule::MultipleOf(32);
  c.layouts = {KVLayout::NHD};
  c.features = {};  // no feature
  c.min_cc = 80;
  return c;
}

// Each broken rule gives exactly one sentence naming the value and the allowed set.
TEST(CapabilityCheck, EachRuleOneSentenceWithValueAndAllowedSet) {
  struct Case {
    void (*mutate)(AttentionConfig&);
    std::vector<std::string> mentions;
  };
  const Case cases[] = {
      {[](AttentionConfig& c) { c.dtype = DType::f16; }, {"dtype f16", "bf16"}},
      {[](AttentionConfig& c) { c.cache_dtype = DType::nvfp4; }, {"nvfp4", "bf16, fp8_e4m3"}},
      {[](AttentionConfig& c) { c.head_size = 96; }, {"head size 96", "64, 128"}},
      {[](AttentionConfig& c) { c.block_size = 48; }, {"block size 48", "a multiple of 32"}},
      {[](AttentionConfig& c) { c.layout = KVLayout::HND; }, {"HND", "NHD"}},
      {[](AttentionConfig& c) { c.features.sinks = true; }, {"sinks"}},
      {[](AttentionConfig& c) { c.features.alibi = true; }, {"ALiBi"}},
      {[](AttentionConfig& c) { c.features.softcap = true; }, {"softcap"}},
      {[](AttentionConfig& c) { c.features.sliding_window = true; }, {"sliding-window"}},
      {[](AttentionConfig& c) { c.features.non_causal = true; }, {"non-causal"}},
      {[](AttentionConfig& c) { c.features.lse = true; }, {"LSE"}},
  };
  AttentionConfig base = gqa_config();
  base.block_size = 64;
  ASSERT_TRUE(capability_refusals(narrow_caps(), base).empty())
      << joined(capability_refusals(narrow_caps(), base));
  AttentionConfig all = base;
  for (const Case& c : cases) {
    AttentionConfig cfg = base;
    c.mutate(cfg);
    c.mutate(all);
    const auto why = capability_refusals(narrow_caps(), cfg);
    ASSERT_EQ(why.size(), 1u) << joined(why);
    for (const auto& m : c.mentions) EXPECT_NE(why[0].find(m), std::string::npos) << m << " in " << why[0];
  }
  // All broken at once: every rule reported (head size and block size both fail here).
  EXPECT_EQ(capability_refusals(narrow_caps(), all).size(), std::size(cases)) << joined(capability_refusals(narrow_caps(), all));
}

TEST(CapabilityCheck, HeadSizeMultipleWhenNoList) {
  Capabilities c = narrow_caps();
  c.head_sizes = {};
  c.head_size_multiple_of = 8;
  AttentionConfig cfg = gqa_config();
  cfg.block_size = 32;
  for (int hs = 1; hs <= 600; ++hs) {
    cfg.head_size = hs;
    EXPECT_EQ(capability_refusals(c, cfg).empty(), hs % 8 == 0) << hs;
  }
}

TEST(CapabilityCheck, DeviceRules) {
  Capabilities gpu = narrow_caps();
  Capabilities cpu = narrow_caps();
  cpu.runs_on_cpu = true;
  cpu.min_cc = 0;
  EXPECT_TRUE(device_refusals(cpu, DeviceSpec::Cpu()).empty());
  EXPECT_TRUE(any_contains(device_refusals(gpu, DeviceSpec::Cpu()), "runs on CUDA GPUs only"));
  EXPECT_TRUE(any_contains(device_refusals(cpu, DeviceSpec::Cuda(9, 0)), "runs on the CPU only"));
  for (int cc : {70, 75, 80, 86, 89, 90, 100, 120}) {
    const auto why = device_refusals(gpu, DeviceSpec::Cuda(cc / 10, cc % 10));
    EXPECT_EQ(why.empty(), cc >= 80) << cc;
    if (!why.empty()) {
      EXPECT_TRUE(any_contains(why, "8.0 or newer")) << joined(why);
      EXPECT_TRUE(any_contains(why, "sm" + std::to_string(cc))) << joined(why);
    }
  }
}

// ---- the registry -----------------------------------------------------------------------------

TEST(Registry, PreferenceOrderAndLookup) {
  std::vector<std::string> names;
  for (const AttentionBackend* b : backends()) names.emplace_back(b->name());
  EXPECT_EQ(names, (std::vector<std::string>{"flash_attn", "flashinfer", "reference"}));
  for (const auto& n : names) EXPECT_EQ(backend(n).name(), n);
  try {
    backend("xformers");
    ADD_FAILURE() << "unknown backend accepted";
  } catch (const Error& e) {
    for (const auto& n : names) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
  for (const AttentionBackend* b : backends()) EXPECT_FALSE(b->forward_includes_kv_cache_update());
}

// ---- KV cache shapes and stride orders --------------------------------------------------------

TEST(KVCacheShape, DefaultShapeIsBlocksTwoSlotsHeadsHeadSize) {
  for (const char* name : {"reference", "flash_attn"}) {
    const AttentionBackend& b = backend(name);
    for (int64_t nb : {1, 7, 1000})
      for (int bs : {16, 32, 48, 256})
        for (int kvh : {1, 8})
          for (int hs : {64, 128, 256}) {
            const auto shape = b.get_kv_cache_shape(nb, bs, kvh, hs, DType::bf16);
            EXPECT_EQ(shape, (std::vector<int64_t>{nb, 2, bs, kvh, hs}))
                << name << " nb " << nb << " bs " << bs << " kvh " << kvh << " hs " << hs;
          }
  }
}

TEST(KVCacheShape, RefusedBlockSizesThrowWithTheRule) {
  for (const char* name : {"reference", "flash_attn"})
    for (int bs : {0, 8, 24, 40, 100}) {
      try {
        backend(name).get_kv_cache_shape(10, bs, 8, 128, DType::bf16);
        ADD_FAILURE() << name << " accepted block size " << bs;
      } catch (const Error& e) {
        EXPECT_NE(e.value().find(std::to_string(bs)), std::string::npos) << e.what();
        EXPECT_NE(e.rule().find("multiple of 16"), std::string::npos) << e.what();
      }
    }
}

TEST(KVCacheShape, CacheDtypesAndHeadSizesPerBackend) {
  // FlashAttention has no nvfp4 cache; the reference has it. Both take any multiple of 8.
  EXPECT_THROW(backend("flash_attn").get_kv_cache_shape(4, 16, 8, 128, DType::nvfp4), Error);
  EXPECT_EQ(backend("flash_attn").get_kv_cache_shape(4, 16, 8, 80, DType::bf16), (std::vector<int64_t>{4, 2, 16, 8, 80}));
  for (DType t : {DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2})
    EXPECT_EQ(backend("flash_attn").get_kv_cache_shape(4, 16, 8, 128, t),
              (std::vector<int64_t>{4, 2, 16, 8, 128}));
  // nvfp4: each row holds head_size/2 packed bytes + head_size/16 scale bytes.
  for (int hs : {16, 64, 128, 256})
    EXPECT_EQ(backend("reference").get_kv_cache_shape(3, 32, 2, hs, DType::nvfp4),
              (std::vector<int64_t>{3, 2, 32, 2, hs / 2 + hs / 16}));
  EXPECT_THROW(backend("reference").get_kv_cache_shape(3, 32, 2, 72, DType::nvfp4), Error);
  EXPECT_EQ(backend("reference").get_kv_cache_shape(3, 32, 2, 72, DType::f32),
            (std::vector<int64_t>{3, 2, 32, 2, 72}));
}

TEST(KVCacheShape, StrideOrders) {
  for (const AttentionBackend* b : backends()) {
    EXPECT_EQ(b->get_kv_cache_stride_order(KVLayout::NHD), (std::array<int, 5>{0, 1, 2, 3, 4})) << b->name();
    EXPECT_EQ(b->get_kv_cache_stride_order(KVLayout::HND), (std::array<int, 5>{0, 1, 3, 2, 4})) << b->name();
  }
}

// ---- the reference backend ------------------------------------------------------------------

TEST(ReferenceBackend, ServesEveryDtypeAndFeatureOnTheCpuOnly) {
  const AttentionBackend& ref = backend("reference");
  AttentionConfig cfg = gqa_config(DeviceSpec::Cpu());
  cfg.features = {.sinks = true, .alibi = true, .softcap = true, .sliding_window = true,
                  .non_causal = true, .lse = true};
  for (DType d : {DType::f32, DType::f16, DType::bf16})
    for (DType c : {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4})
      for (int hs : {16, 64, 128, 512}) {
        cfg.dtype = d;
        cfg.cache_dtype = c;
        cfg.head_size = hs;
        EXPECT_TRUE(ref.check(cfg).empty()) << cfg.describe() << ": " << joined(ref.check(cfg));
      }
  cfg.cache_dtype = DType::nvfp4;
  cfg.head_size = 72;  // a multiple of 8 but not of 16
  EXPECT_TRUE(any_contains(ref.check(cfg), "nvfp4")) << joined(ref.check(cfg));
  cfg = gqa_config(DeviceSpec::Cuda(9, 0));
  const auto why = ref.check(cfg);
  ASSERT_EQ(why.size(), 1u) << joined(why);
  EXPECT_NE(why[0].find("runs on the CPU only; it is the test oracle"), std::string::npos) << why[0];
  EXPECT_EQ(ref.cudagraph_support(cfg), CudagraphSupport::NEVER);
  EXPECT_THROW(ref.make_impl(cfg), Error);
  EXPECT_THROW(ref.make_builder(cfg), Error);
}

// A small paged batch on the CPU: random cache contents, distinct shuffled blocks.
struct CpuBatch {
  AttentionConfig cfg;
  CommonAttentionMetadata md;
  int64_t num_blocks = 0;
  std::vector<uint8_t> cache;  // bytes of the physical cache tensor
  TensorView cache_view;
};

CpuBatch make_batch(const AttentionConfig& cfg, const std::vector<int>& query_lens,
                    const std::vector<int>& seq_lens, uint64_t seed) {
  CpuBatch b;
  b.cfg = cfg;
  std::mt19937_64 rng(seed);
  int max_blocks = 1;
  for (int s : seq_lens) max_blocks = std::max(max_blocks, (s + cfg.block_size - 1) / cfg.block_size);
  b.num_blocks = static_cast<int64_t>(seq_lens.size()) * max_blocks + 3;
  std::vector<int32_t> ids(b.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.md.query_start_loc = {0};
  for (size_t r = 0; r < seq_lens.size(); ++r) {
    b.md.query_start_loc.push_back(b.md.query_start_loc.back() + query_lens[r]);
    b.md.seq_lens.push_back(seq_lens[r]);
    for (int j = 0; j < max_blocks; ++j) b.md.block_table.push_back(ids[r * max_blocks + j]);
    for (int i = 0; i < query_lens[r]; ++i) {
      const int pos = seq_lens[r] - query_lens[r] + i;
      b.md.slot_mapping.push_back(int64_t{ids[r * max_blocks + pos / cfg.block_size]} * cfg.block_size +
                                  pos % cfg.block_size);
    }
  }
  b.md.max_blocks_per_req = max_blocks;
  b.md.finalize();
  KVCacheSpec spec{b.num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_size, cfg.cache_dtype, cfg.layout};
  b.cache.resize(spec.total_bytes());
  const int64_t n = spec.total_bytes() * 8 / dtype_bits(spec.storage_dtype());
  if (spec.storage_dtype() == DType::u8 || is_fp8(spec.storage_dtype())) {
    // Random codes, avoiding NaN codes of the fp8 formats (0x7F/0xFF and e5m2's >= 0x7C).
    std::uniform_int_distribution<int> d(0, 0x3F);
    for (auto& x : b.cache) x = static_cast<uint8_t>(d(rng) | (d(rng) & 1 ? 0x80 : 0));
  } else {
    const auto vals = test::random_floats(n, seed + 1);
    for (int64_t i = 0; i < n; ++i) store_from_float(b.cache.data(), spec.storage_dtype(), i, vals[i]);
  }
  const auto shape = spec.logical_shape();
  const auto order = spec.stride_order();
  b.cache_view = TensorView(b.cache.data(), spec.storage_dtype(),
                            {shape[order[0]], shape[order[1]], shape[order[2]], shape[order[3]], shape[order[4]]});
  return b;
}

struct RefCase {
  DType dtype, cache_dtype;
  KVLayout layout;
  bool causal;
};

class ReferenceBackendForward : public ::testing::TestWithParam<RefCase> {};

TEST_P(ReferenceBackendForward, MatchesReferenceAttentionAndLeavesPaddingAlone) {
  const RefCase& rc = GetParam();
  AttentionConfig cfg = gqa_config(DeviceSpec::Cpu());
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_size = 32;
  cfg.dtype = rc.dtype;
  cfg.cache_dtype = rc.cache_dtype;
  cfg.layout = rc.layout;
  cfg.features.non_causal = !rc.causal;
  cfg.features.lse = true;
  // Decodes, a chunked prefill, an empty (padding) request and a fresh prefill.
  CpuBatch b = make_batch(cfg, {1, 1, 5, 0, 9}, {17, 40, 33, 0, 9}, 7);
  b.md.causal = rc.causal;
  const int64_t n = b.md.num_actual_tokens, pad = 3, rows = n + pad;
  const int64_t q_elems = rows * cfg.num_heads * cfg.head_size;
  std::vector<float> qf = test::random_floats(q_elems, 11);
  std::vector<uint16_t> q16(q_elems);
  void* q_data = qf.data();
  if (rc.dtype != DType::f32) {
    for (int64_t i = 0; i < q_elems; ++i) store_from_float(q16.data(), rc.dtype, i, qf[i]);
    q_data = q16.data();
  }
  const TensorView q(q_data, rc.dtype, {rows, cfg.num_heads, cfg.head_size});
  std::vector<float> out(q_elems, 42.f), expected(n * cfg.num_heads * cfg.head_size, -1.f);
  std::vector<float> lse(cfg.num_heads * n, 0.f), expected_lse(cfg.num_heads * n, 0.f);
  std::vector<float> k_scale = {0.5f}, v_scale = {2.f};
  AttentionParams p;
  p.causal = rc.causal;
  if (is_fp8(rc.cache_dtype) || rc.cache_dtype == DType::nvfp4) {
    p.k_scale = TensorView(k_scale.data(), DType::f32, {1});
    p.v_scale = TensorView(v_scale.data(), DType::f32, {1});
  }
  p.lse = TensorView(lse.data(), DType::f32, {cfg.num_heads, n});

  const AttentionBackend& ref = backend("reference");
  auto md = ref.make_builder(cfg)->build(b.md);
  ref.make_impl(cfg)->forward(q, {}, {}, b.cache_view, *md, p,
                              TensorView(out.data(), DType::f32, {rows, cfg.num_heads, cfg.head_size}));

  KVCacheSpec spec{b.num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_size, cfg.cache_dtype, cfg.layout};
  AttentionParams pe = p;
  pe.lse = TensorView(expected_lse.data(), DType::f32, {cfg.num_heads, n});
  TensorView q_cut = q;
  q_cut.shape[0] = n;
  reference_attention(q_cut, spec.view(b.cache_view), b.md.batch(), pe,
                      TensorView(expected.data(), DType::f32, {n, cfg.num_heads, cfg.head_size}));
  const std::vector<float> got(out.begin(), out.begin() + expected.size());
  EXPECT_TRUE(test::all_close(got, expected, {n, cfg.num_heads, cfg.head_size}, 0, 0));
  EXPECT_TRUE(test::all_close(lse, expected_lse, {cfg.num_heads, n}, 0, 0));
  const std::vector<float> padding(out.begin() + expected.size(), out.end());
  EXPECT_TRUE(test::all_close(padding, std::vector<float>(padding.size(), 42.f), {pad, cfg.num_heads, cfg.head_size}, 0, 0))
      << "rows past num_actual_tokens must stay untouched";
}

INSTANTIATE_TEST_SUITE_P(
    Grid, ReferenceBackendForward,
    ::testing::Values(RefCase{DType::f32, DType::f32, KVLayout::NHD, true},
                      RefCase{DType::f32, DType::f32, KVLayout::HND, false},
                      RefCase{DType::bf16, DType::bf16, KVLayout::NHD, true},
                      RefCase{DType::f16, DType::f16, KVLayout::HND, true},
                      RefCase{DType::bf16, DType::fp8_e4m3, KVLayout::NHD, true},
                      RefCase{DType::bf16, DType::fp8_e5m2, KVLayout::HND, false},
                      RefCase{DType::f32, DType::nvfp4, KVLayout::NHD, true},
                      RefCase{DType::f32, DType::nvfp4, KVLayout::HND, false}));

// Independent of reference_attention: with every V row equal to c, each output row is c
// (softmax weights sum to 1) for any q and K.
TEST(ReferenceBackend, ConstantValuesGiveThatValue) {
  AttentionConfig cfg = gqa_config(DeviceSpec::Cpu());
  cfg.num_heads = 6;
  cfg.num_kv_heads = 3;
  cfg.head_size = 16;
  cfg.dtype = cfg.cache_dtype = DType::f32;
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    cfg.layout = layout;
    CpuBatch b = make_batch(cfg, {1, 4, 20}, {30, 4, 52}, 3);
    KVCacheSpec spec{b.num_blocks, cfg.block_size, cfg.num_kv_heads, cfg.head_size, cfg.cache_dtype, cfg.layout};
    const PagedKV kv = spec.view(b.cache_view);
    for (int64_t slot = 0; slot < kv.num_slots(); ++slot)
      for (int h = 0; h < cfg.num_kv_heads; ++h)
        for (int d = 0; d < cfg.head_size; ++d)
          static_cast<float*>(kv.v.base)[row_offset(kv.v, cfg.block_size, slot, h) + d] = 0.25f * d - h;
    const int64_t n = b.md.num_actual_tokens;
    std::vector<float> q = test::random_floats(n * cfg.num_heads * cfg.head_size, 5, -3.f, 3.f);
    std::vector<float> out(q.size()), expected(q.size());
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < cfg.num_heads; ++h)
        for (int d = 0; d < cfg.head_size; ++d)
          expected[(t * cfg.num_heads + h) * cfg.head_size + d] = 0.25f * d - h / 2;
    const AttentionBackend& ref = backend("reference");
    auto md = ref.make_builder(cfg)->build(b.md);
    ref.make_impl(cfg)->forward(TensorView(q.data(), DType::f32, {n, cfg.num_heads, cfg.head_size}), {}, {},
                                b.cache_view, *md, AttentionParams{},
                                TensorView(out.data(), DType::f32, {n, cfg.num_heads, cfg.head_size}));
    EXPECT_TRUE(test::all_close(out, expected, {n, cfg.num_heads, cfg.head_size}, 1e-6, 1e-6)) << layout_name(layout);
  }
}

TEST(ReferenceBackend, ForwardRejectsBadCalls) {
  AttentionConfig cfg = gqa_config(DeviceSpec::Cpu());
  cfg.num_heads = 2;
  cfg.num_kv_heads = 1;
  cfg.head_size = 16;
  cfg.dtype = cfg.cache_dtype = DType::f32;
  CpuBatch b = make_batch(cfg, {1, 3}, {20, 3}, 9);
  const int64_t n = b.md.num_actual_tokens;
  std::vector<float> q(n * 2 * 16, 0.1f), out(q.size());
  const TensorView qv(q.data(), DType::f32, {n, 2, 16}), ov(out.data(), DType::f32, {n, 2, 16});
  const AttentionBackend& ref = backend("reference");
  auto md = ref.make_builder(cfg)->build(b.md);
  auto impl = ref.make_impl(cfg);
  EXPECT_NO_THROW(impl->forward(qv, {}, {}, b.cache_view, *md, {}, ov));

  struct OtherMetadata : BackendMetadata {};
  EXPECT_TRUE(test::throws_error_with(
      [&] { impl->forward(qv, {}, {}, b.cache_view, OtherMetadata{}, {}, ov); },
      {"reference backend's builder"})) << "foreign metadata";
  EXPECT_TRUE(test::throws_error_with([&] {
    impl->forward(TensorView(q.data(), DType::f32, {n - 1, 2, 16}), {}, {}, b.cache_view, *md, {}, ov);
  }, {"q.shape[0]"})) << "q too short";
  EXPECT_TRUE(test::throws_error_with([&] {
    impl->forward(TensorView(q.data(), DType::f16, {n, 2, 16}), {}, {}, b.cache_view, *md, {}, ov);
  }, {"q"})) << "q dtype";
  EXPECT_TRUE(test::throws_error_with([&] {
    impl->forward(TensorView(q.data(), DType::f32, {n, 2, 16}, Device::CUDA), {}, {}, b.cache_view, *md, {}, ov);
  }, {"cuda"})) << "q on CUDA";
  EXPECT_TRUE(test::throws_error_with([&] {
    impl->forward(qv, {}, {}, b.cache_view, *md, {}, TensorView(out.data(), DType::f32, {n, 1, 16}));
  }, {"out"})) << "out shape";
  AttentionParams non_causal;
  non_causal.causal = false;
  EXPECT_TRUE(test::throws_error_with([&] { impl->forward(qv, {}, {}, b.cache_view, *md, non_causal, ov); },
                                      {"causal"})) << "causal mismatch";
  // A cache with fewer blocks than the block table reads.
  TensorView small = b.cache_view;
  small.shape[0] = 1;
  EXPECT_TRUE(test::throws_error_with([&] { impl->forward(qv, {}, {}, small, *md, {}, ov); },
                                      {"num_blocks"})) << "too few blocks";
  // Metadata that breaks its own invariants never reaches a builder's output.
  CommonAttentionMetadata bad = b.md;
  bad.seq_lens[1] = 2;  // < query_len 3
  EXPECT_THROW(ref.make_builder(cfg)->build(bad), Error);
}

}  // namespace
}  // namespace attnkit
