// The FlashInfer-style backend's host side: capabilities and check() tables, cache shapes,
// the page-table conversion, the builder (ordering, split, per-part tables and plans) and
// the impl's validation.
#include <gtest/gtest.h>

#include "test_util.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "attnkit/error.h"
#include "core/cuda_archs.h"
#include "attnkit/metadata.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/metadata_builder.h"
#include "flashinfer/page_table.h"

namespace attnkit::flashinfer {
namespace {

AttentionConfig config(int heads, int kv_heads, int block, DeviceSpec dev = DeviceSpec::Cuda(9, 0)) {
  return test::model_config(heads, kv_heads, block, dev);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " | ";
  return s;
}

// ---- capabilities and check() -------------------------------------------------------------

TEST(FlashInferBackend, NameCapabilitiesAndRegistry) {
  const AttentionBackend& b = flashinfer_backend();
  EXPECT_EQ(b.name(), "flashinfer");
  EXPECT_EQ(&backend("flashinfer"), &b);
  const Capabilities c = b.capabilities();
  EXPECT_EQ(c.dtypes, (std::vector<DType>{DType::f16, DType::bf16}));
  EXPECT_EQ(c.cache_dtypes, (std::vector<DType>{DType::f16, DType::bf16, DType::fp8_e4m3,
                                                DType::fp8_e5m2, DType::nvfp4}));
  EXPECT_EQ(c.head_sizes, (std::vector<int>{64, 128, 256}));
  EXPECT_EQ(c.layouts, (std::vector<KVLayout>{KVLayout::NHD, KVLayout::HND}));
  EXPECT_TRUE(c.features.sinks && c.features.softcap && c.features.sliding_window &&
              c.features.non_causal && c.features.lse);
  EXPECT_FALSE(c.features.alibi);
  EXPECT_FALSE(c.runs_on_cpu);
  EXPECT_EQ(c.min_cc, 80);
  EXPECT_FALSE(b.forward_includes_kv_cache_update());
}

// The block-size rule over every size x group x device: 16/32/64 always; 128..1024 only for
// GQA/MQA on sm90+; anything else never.
TEST(FlashInferBackend, BlockSizeRuleDependsOnGroupAndDevice) {
  const AttentionBackend& b = flashinfer_backend();
  for (int block : {8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048}) {
    for (auto [heads, kv] : {std::pair{32, 32}, std::pair{32, 16}, std::pair{32, 4}, std::pair{8, 1}}) {
      for (int cc : {80, 89, 90, 100}) {
        const AttentionConfig c = config(heads, kv, block, DeviceSpec::Cuda(cc / 10, cc % 10));
        const bool small = block == 16 || block == 32 || block == 64;
        const bool large = block >= 128 && block <= 1024 && (block & (block - 1)) == 0;
        const bool want = small || (large && heads > kv && cc >= 90);
        const auto why = configuration_refusals(c);
        EXPECT_EQ(why.empty(), want) << "block " << block << " heads " << heads << "/" << kv
                                     << " sm" << cc << ": " << joined(why);
        const auto sizes = block_sizes_for(c);
        EXPECT_EQ(std::find(sizes.begin(), sizes.end(), block) != sizes.end(), want)
            << "block_sizes_for, block " << block << " heads " << heads << "/" << kv << " sm" << cc;
        if (large && heads == kv)
          EXPECT_NE(joined(why).find("GQA"), std::string::npos) << joined(why);
        if (large && heads > kv && cc < 90)
          EXPECT_NE(joined(why).find("sm90"), std::string::npos) << joined(why);
      }
    }
  }
}

TEST(FlashInferBackend, CheckTable) {
  struct Row {
    const char* what;
    AttentionConfig cfg;
    const char* reason;  // nullptr: accepted
  };
  auto with = [](AttentionConfig c, auto&& f) { f(c); return c; };
  const AttentionConfig gqa = config(32, 8, 16);
  const Row rows[] = {
      {"plain bf16 GQA on sm90", gqa, nullptr},
      {"block 256 with GQA on sm90", config(32, 8, 256), nullptr},
      {"block 1024 with MQA on sm100", config(16, 1, 1024, DeviceSpec::Cuda(10, 0)), nullptr},
      {"block 256 with MHA", config(32, 32, 256), "GQA"},
      {"block 256 with GQA on sm80", config(32, 8, 256, DeviceSpec::Cuda(8, 0)), "sm90"},
      {"block 24", config(32, 8, 24), "block size 24"},
      {"ALiBi", with(gqa, [](auto& c) { c.features.alibi = true; }), "ALiBi"},
      {"sinks", with(gqa, [](auto& c) { c.features.sinks = true; }), nullptr},
      {"softcap + window + lse", with(gqa, [](auto& c) {
         c.features.softcap = c.features.sliding_window = c.features.lse = true; }), nullptr},
      {"non-causal", with(gqa, [](auto& c) { c.features.non_causal = true; }), nullptr},
      {"head size 512", with(gqa, [](auto& c) { c.head_size = 512; }), "head size 512"},
      {"head size 96", with(gqa, [](auto& c) { c.head_size = 96; }), "head size 96"},
      {"head size 64 / 256", with(gqa, [](auto& c) { c.head_size = 256; }), nullptr},
      {"fp32", with(gqa, [](auto& c) { c.dtype = c.cache_dtype = DType::f32; }), "f32"},
      {"fp16", with(gqa, [](auto& c) { c.dtype = c.cache_dtype = DType::f16; }), nullptr},
      {"fp8 e4m3 cache on sm80", with(config(32, 8, 16, DeviceSpec::Cuda(8, 0)),
                                       [](auto& c) { c.cache_dtype = DType::fp8_e4m3; }), nullptr},
      {"fp8 e5m2 cache", with(gqa, [](auto& c) { c.cache_dtype = DType::fp8_e5m2; }), nullptr},
      {"nvfp4 cache", with(gqa, [](auto& c) { c.cache_dtype = DType::nvfp4; }), nullptr},
      {"HND", with(gqa, [](auto& c) { c.layout = KVLayout::HND; }), nullptr},
      {"CPU", config(32, 8, 16, DeviceSpec::Cpu()), "CPU"},
      {"sm75", config(32, 8, 16, DeviceSpec::Cuda(7, 5)), "8.0"},
  };
  for (const Row& r : rows) {
    const auto why = configuration_refusals(r.cfg);
    if (!r.reason) {
      EXPECT_TRUE(why.empty()) << r.what << ": " << joined(why);
    } else {
      EXPECT_NE(joined(why).find(r.reason), std::string::npos)
          << r.what << ": expected a reason with '" << r.reason << "', got: " << joined(why);
    }
  }
}

// The selector hands an engine this backend on a GPU only where its kernels are in the build
// (a CUDA build with code for the device); builders and impls (the host side) accept what the
// configuration rules accept either way.
TEST(FlashInferBackend, CheckOnGpusFollowsTheBuildsKernels) {
  for (const AttentionConfig& c : {config(32, 8, 16), config(32, 8, 256), config(16, 1, 1024, DeviceSpec::Cuda(10, 0))}) {
    EXPECT_TRUE(configuration_refusals(c).empty()) << joined(configuration_refusals(c));
    const auto why = flashinfer_backend().check(c);
    if (flashinfer_kernels_built() && gpu_code_refusal(c.device.cc()).empty()) {
      EXPECT_TRUE(why.empty()) << joined(why);
    } else if (flashinfer_kernels_built()) {  // (no code for the device: core/cuda_archs.h)
      ASSERT_EQ(why.size(), 1u) << joined(why);
      EXPECT_NE(why[0].find("no GPU code that runs on"), std::string::npos) << why[0];
    } else {
      ASSERT_EQ(why.size(), 1u) << joined(why);
      EXPECT_NE(why[0].find("GPU kernels are not in this build"), std::string::npos) << why[0];
    }
    EXPECT_NO_THROW(flashinfer_backend().make_builder(c));
    EXPECT_NE(flashinfer_backend().variant(c).find("prefill: planned tiles"), std::string::npos) << flashinfer_backend().variant(c);
  }
  // NVFP4 caches: read by the planned decode (dequantized in the kernel) wherever the kernels are built.
  AttentionConfig fp4 = config(32, 8, 16);
  fp4.cache_dtype = DType::nvfp4;
  EXPECT_EQ(flashinfer_backend().check(fp4).empty(), flashinfer_kernels_built()) << joined(flashinfer_backend().check(fp4));
  const auto cpu = flashinfer_backend().check(config(32, 8, 16, DeviceSpec::Cpu()));
  EXPECT_EQ(joined(cpu).find("GPU kernels are not in this build"), std::string::npos) << joined(cpu);
}

TEST(FlashInferBackend, CudagraphSupportAndVariant) {
  const AttentionBackend& b = flashinfer_backend();
  EXPECT_EQ(b.cudagraph_support(config(32, 8, 16)), CudagraphSupport::ALWAYS);
  EXPECT_EQ(b.cudagraph_support(config(16, 1, 16)), CudagraphSupport::ALWAYS);
  EXPECT_EQ(b.cudagraph_support(config(32, 32, 16)), CudagraphSupport::UNIFORM_BATCH);
  EXPECT_NE(b.variant(config(32, 8, 16)).find("tensor cores"), std::string::npos);
  EXPECT_NE(b.variant(config(32, 32, 16)).find("CUDA cores"), std::string::npos);
}

// ---- cache shape ------------------------------------------------------------------------

TEST(FlashInferBackend, KVCacheShapeTable) {
  const AttentionBackend& b = flashinfer_backend();
  struct Row { int64_t blocks; int block, kv_heads, head; DType dt; std::vector<int64_t> shape; };
  const Row rows[] = {
      {10, 16, 8, 128, DType::bf16, {10, 2, 16, 8, 128}},
      {3, 1024, 2, 64, DType::f16, {3, 2, 1024, 2, 64}},
      {7, 256, 4, 256, DType::fp8_e4m3, {7, 2, 256, 4, 256}},
      {7, 32, 4, 64, DType::fp8_e5m2, {7, 2, 32, 4, 64}},
      {5, 16, 8, 128, DType::nvfp4, {5, 2, 16, 8, 128 / 2 + 128 / 16}},  // 72 bytes
      {5, 64, 1, 64, DType::nvfp4, {5, 2, 64, 1, 36}},
      {5, 512, 1, 256, DType::nvfp4, {5, 2, 512, 1, 144}},
  };
  for (const Row& r : rows)
    EXPECT_EQ(b.get_kv_cache_shape(r.blocks, r.block, r.kv_heads, r.head, r.dt), r.shape)
        << "block " << r.block << " head " << r.head << " " << dtype_name(r.dt);
  EXPECT_TRUE(test::throws_error_with([&] { b.get_kv_cache_shape(4, 24, 8, 128, DType::bf16); },
                                      {"block_size = 24"}));
  EXPECT_TRUE(test::throws_error_with([&] { b.get_kv_cache_shape(4, 16, 8, 96, DType::bf16); },
                                      {"head_size = 96"}));
  EXPECT_TRUE(test::throws_error_with([&] { b.get_kv_cache_shape(4, 16, 8, 128, DType::f32); },
                                      {"cache_dtype"}));
  EXPECT_EQ(b.get_kv_cache_stride_order(KVLayout::NHD), (std::array<int, 5>{0, 1, 2, 3, 4}));
  EXPECT_EQ(b.get_kv_cache_stride_order(KVLayout::HND), (std::array<int, 5>{0, 1, 3, 2, 4}));
}

// ---- batches ----------------------------------------------------------------------------

// A valid batch: distinct random block ids, slots of the new tokens from the block table.
CommonAttentionMetadata make_batch(const std::vector<int32_t>& qo, const std::vector<int32_t>& kv,
                                   int block, std::mt19937_64& rng, bool causal = true) {
  CommonAttentionMetadata md;
  md.causal = causal;
  md.query_start_loc = {0};
  for (int32_t q : qo) md.query_start_loc.push_back(md.query_start_loc.back() + q);
  md.seq_lens = kv;
  int max_blocks = 1;
  for (int32_t s : kv) max_blocks = std::max(max_blocks, (s + block - 1) / block);
  md.max_blocks_per_req = max_blocks + static_cast<int>(rng() % 3);  // rows wider than needed
  std::vector<int32_t> ids(static_cast<size_t>(kv.size()) * md.max_blocks_per_req);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  md.block_table = ids;
  for (size_t r = 0; r < kv.size(); ++r)
    for (int32_t i = 0; i < qo[r]; ++i) {
      const int64_t pos = kv[r] - qo[r] + i;
      md.slot_mapping.push_back(int64_t{md.block_table[r * md.max_blocks_per_req + pos / block]} * block + pos % block);
    }
  md.finalize();
  return md;
}

TEST(FlashInferPageTable, ConversionIsExactOverRandomBatches) {
  for (int page : {16, 32, 64, 128, 256, 512, 1024}) {
    for (uint64_t seed = 0; seed < 6; ++seed) {
      std::mt19937_64 rng(seed * 101 + page);
      const int n = 1 + static_cast<int>(rng() % 12);
      std::vector<int32_t> qo(n), kv(n);
      for (int r = 0; r < n; ++r) {
        kv[r] = static_cast<int32_t>(rng() % 5000);  // includes 0 and exact multiples by chance
        if (r % 4 == 1) kv[r] = page * (1 + static_cast<int32_t>(rng() % 4));  // full last page
        qo[r] = kv[r] == 0 ? 0 : 1 + static_cast<int32_t>(rng() % std::min(kv[r], 40));
      }
      const CommonAttentionMetadata md = make_batch(qo, kv, page, rng);
      const BatchView batch = md.batch();
      const int begin = static_cast<int>(rng() % (n + 1));
      PageTable t(16, 1 << 14);
      t.fill(batch, begin, n, page);
      ASSERT_EQ(t.num_reqs, n - begin);
      EXPECT_EQ(t.indptr[0], 0);
      for (int i = 0; i < t.num_reqs; ++i) {
        const int r = begin + i;
        const int pages = (kv[r] + page - 1) / page;
        SCOPED_TRACE("page " + std::to_string(page) + " seed " + std::to_string(seed) +
                     " request " + std::to_string(r) + " kv " + std::to_string(kv[r]));
        EXPECT_EQ(t.indptr[i + 1] - t.indptr[i], pages);
        for (int p = 0; p < pages; ++p)
          EXPECT_EQ(t.indices[t.indptr[i] + p], batch.block_row(r)[p]) << "page " << p;
        const int want_last = kv[r] == 0 ? 0 : kv[r] - (pages - 1) * page;
        EXPECT_EQ(t.last_page_len[i], want_last);
        EXPECT_TRUE(kv[r] == 0 || (t.last_page_len[i] >= 1 && t.last_page_len[i] <= page));
        EXPECT_EQ(t.kv_len(i), kv[r]);
      }
      EXPECT_EQ(t.num_pages, t.indptr[t.num_reqs]);
    }
  }
}

TEST(FlashInferPageTable, Errors) {
  std::mt19937_64 rng(3);
  const CommonAttentionMetadata md = make_batch({1, 5}, {40, 100}, 16, rng);
  BatchView batch = md.batch();
  PageTable t(2, 7);  // the batch needs 3 + 7 = 10 pages
  EXPECT_TRUE(test::throws_error_with([&] { t.fill(batch, 0, 2, 16); }, {"max_pages = 7"}));
  PageTable one(1, 100);
  EXPECT_TRUE(test::throws_error_with([&] { one.fill(batch, 0, 2, 16); }, {"max_reqs = 1"}));
  PageTable ok(4, 100);
  EXPECT_TRUE(test::throws_error_with([&] { ok.fill(batch, 1, 3, 16); }, {"request range"}));
  EXPECT_TRUE(test::throws_error_with([&] { ok.fill(batch, 0, 2, 0); }, {"page_size = 0"}));
  // A row too short for its sequence, and a negative block id.
  std::vector<int32_t> seq = {40, 100};
  batch.seq_lens = seq;
  batch.max_blocks_per_req = 2;
  std::vector<int32_t> table = {0, 1, 2, 3};
  batch.block_table = table;
  EXPECT_TRUE(test::throws_error_with([&] { ok.fill(batch, 0, 2, 16); }, {"max_blocks_per_req = 2"}));
  seq = {20, 30};
  table = {0, -4, 2, 3};
  EXPECT_TRUE(test::throws_error_with([&] { ok.fill(batch, 0, 2, 16); }, {"block_table[0][1] = -4"}));
  // A rejected fill leaves the table as it was.
  ok.fill(md.batch(), 0, 2, 16);
  const std::vector<int32_t> before(ok.indices.begin(), ok.indices.begin() + ok.num_pages);
  EXPECT_TRUE(test::throws_error_with([&] { ok.fill(batch, 0, 2, 16); }, {"-4"}));
  EXPECT_EQ(ok.num_reqs, 2);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), ok.indices.begin()));
}

// ---- the builder ------------------------------------------------------------------------

BuilderLimits small_limits() {
  BuilderLimits l;
  l.max_reqs = 32;
  l.max_tokens = 4096;
  l.max_seq_len = 20000;
  return l;
}

TEST(FlashInferBuilder, SplitsConvertsAndPlansEachPart) {
  for (auto [heads, kv_heads] : {std::pair{32, 32}, std::pair{32, 8}}) {
    for (int page : {16, 256}) {
      if (page > 64 && heads == kv_heads) continue;
      const AttentionConfig cfg = config(heads, kv_heads, page);
      FlashInferMetadataBuilder builder(cfg, small_limits());
      // Decodes: one token on CUDA cores (MHA); on tensor cores as many as fit the 16-row tile
      // with their group (speculative decoding).
      const int threshold = builder.reorder_batch_threshold();
      EXPECT_EQ(threshold, heads == kv_heads ? 1 : 16 / (heads / kv_heads));
      for (uint64_t seed = 0; seed < 10; ++seed) {
        std::mt19937_64 rng(seed + page + heads * 7 + kv_heads);
        const int n = 1 + static_cast<int>(rng() % 20);
        std::vector<int32_t> qo(n), kv(n);
        for (int r = 0; r < n; ++r) {
          kv[r] = 1 + static_cast<int32_t>(rng() % 20000);
          qo[r] = rng() % 3 == 0 ? 1
                  : rng() % 2 ? std::min<int32_t>(kv[r], 1 + static_cast<int32_t>(rng() % threshold))
                              : 1 + static_cast<int32_t>(rng() % std::min<int32_t>(kv[r], 150));
        }
        CommonAttentionMetadata md = make_batch(qo, kv, page, rng);
        md = permute_requests(md, decode_first_order(md, threshold));
        auto built = builder.build(md);
        const auto& m = dynamic_cast<const FlashInferMetadata&>(*built);
        const DecodePrefillSplit split = split_decodes_and_prefills(md, threshold);
        SCOPED_TRACE("heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) + " page " +
                     std::to_string(page) + " seed " + std::to_string(seed));
        EXPECT_EQ(m.num_decodes, split.num_decodes);
        EXPECT_EQ(m.num_prefills, split.num_prefills);
        EXPECT_EQ(m.num_decode_tokens, split.num_decode_tokens);
        EXPECT_EQ(m.num_prefill_tokens, split.num_prefill_tokens);
        EXPECT_FALSE(m.stale());
        const PlanState& s = *m.state;
        const int nd = m.num_decodes;
        // Each part's page table holds its own requests' rows, from index 0.
        ASSERT_EQ(s.decode_pages.num_reqs, nd);
        ASSERT_EQ(s.prefill_pages.num_reqs, n - nd);
        for (int r = 0; r < n; ++r) {
          const PageTable& t = r < nd ? s.decode_pages : s.prefill_pages;
          const int i = r < nd ? r : r - nd;
          EXPECT_EQ(t.kv_len(i), md.seq_lens[r]) << "request " << r;
          EXPECT_EQ(t.indices[t.indptr[i]], md.block_table[static_cast<size_t>(r) * md.max_blocks_per_req]);
        }
        // Each part's plan sees its own requests and tokens.
        EXPECT_EQ(s.decode_plan.num_reqs, nd);
        EXPECT_EQ(s.decode_plan.num_tokens, m.num_decode_tokens);
        EXPECT_EQ(s.prefill_plan.num_reqs, n - nd);
        EXPECT_EQ(s.prefill_plan.num_tokens, m.num_prefill_tokens);
        for (int r = nd; r <= n; ++r)
          EXPECT_EQ(s.prefill_qo_indptr[r - nd], md.query_start_loc[r] - md.query_start_loc[nd]);
        for (int i = 0; i < s.prefill_plan.num_items; ++i) {
          const WorkItem& it = s.prefill_plan.items[i];
          EXPECT_LE(it.kv_end, md.seq_lens[nd + it.request]);
        }
        EXPECT_EQ(s.decode_plan.config.kernel,
                  heads == kv_heads ? PlanKernel::CudaCoreDecode : PlanKernel::TensorCore);
        EXPECT_EQ(s.prefill_plan.config.kernel, PlanKernel::TensorCore);
      }
    }
  }
}

TEST(FlashInferBuilder, UnorderedBatchIsAnErrorNamingTheRequest) {
  std::mt19937_64 rng(1);
  FlashInferMetadataBuilder builder(config(32, 8, 16), small_limits());
  const CommonAttentionMetadata md = make_batch({1, 7, 1}, {30, 50, 60}, 16, rng);
  EXPECT_TRUE(test::throws_error_with([&] { builder.build(md); }, {"request 2 is a decode"}));
  // The engine's fix: decode_first_order then permute_requests.
  const auto ordered = permute_requests(md, decode_first_order(md, 1));
  EXPECT_NO_THROW(builder.build(ordered));
}

TEST(FlashInferBuilder, NonCausalBatchesGoWhollyToThePrefillPath) {
  std::mt19937_64 rng(2);
  FlashInferMetadataBuilder builder(config(32, 8, 16), small_limits());
  // Not ordered decodes-first: irrelevant, nothing runs on the decode path.
  const CommonAttentionMetadata md = make_batch({5, 1, 1, 9}, {5, 40, 1, 100}, 16, rng, /*causal=*/false);
  auto built = builder.build(md);
  const auto& m = dynamic_cast<const FlashInferMetadata&>(*built);
  EXPECT_FALSE(m.causal);
  EXPECT_EQ(m.num_decodes, 0);
  EXPECT_EQ(m.num_prefills, 4);
  EXPECT_EQ(m.num_prefill_tokens, 16);
  EXPECT_EQ(m.state->decode_plan.num_items, 0);
  EXPECT_EQ(m.state->prefill_plan.num_reqs, 4);
  // Every non-causal tile sees all of its request's keys.
  for (int i = 0; i < m.state->prefill_plan.num_items; ++i) {
    const WorkItem& it = m.state->prefill_plan.items[i];
    if (it.chunk == it.num_chunks - 1) EXPECT_EQ(it.kv_end, md.seq_lens[it.request]);
    if (it.chunk == 0) EXPECT_EQ(it.kv_begin, 0);
  }
}

TEST(FlashInferBuilder, LimitsStalenessAndFixedBuffers) {
  std::mt19937_64 rng(4);
  BuilderLimits l = small_limits();
  l.max_reqs = 3;
  l.max_tokens = 64;
  l.cuda_graph = true;
  FlashInferMetadataBuilder builder(config(32, 8, 16), l);
  const PlanState& s = builder.state();
  const void* ptrs[] = {s.decode_plan.items.data(), s.prefill_plan.items.data(),
                        s.prefill_pages.indices.data(), s.decode_pages.indptr.data()};
  auto first = builder.build(make_batch({1, 1, 30}, {10, 3000, 40}, 16, rng));
  EXPECT_EQ(s.prefill_plan.tile_q, 128) << "graph mode: the largest prefill tile, whatever the batch";
  EXPECT_EQ(s.decode_plan.tile_q, 16);
  auto second = builder.build(make_batch({1, 20}, {19999, 20}, 16, rng));
  EXPECT_TRUE(dynamic_cast<const FlashInferMetadata&>(*first).stale());
  EXPECT_FALSE(dynamic_cast<const FlashInferMetadata&>(*second).stale());
  const void* after[] = {s.decode_plan.items.data(), s.prefill_plan.items.data(),
                         s.prefill_pages.indices.data(), s.decode_pages.indptr.data()};
  EXPECT_TRUE(std::equal(std::begin(ptrs), std::end(ptrs), std::begin(after)));
  EXPECT_TRUE(test::throws_error_with([&] { builder.build(make_batch({1, 1, 1, 1}, {5, 5, 5, 5}, 16, rng)); },
                                      {"max_reqs = 3"}));
  EXPECT_TRUE(test::throws_error_with([&] { builder.build(make_batch({65}, {100}, 16, rng)); },
                                      {"max_tokens = 64"}));
  EXPECT_TRUE(test::throws_error_with([&] { builder.build(make_batch({1}, {30000}, 16, rng)); },
                                      {"max_seq_len = 20000"}));
  // Refused and malformed configurations.
  EXPECT_TRUE(test::throws_error_with(
      [&] { FlashInferMetadataBuilder b(config(32, 32, 256), small_limits()); }, {"block_size = 256"}));
  EXPECT_TRUE(test::throws_error_with([&] { FlashInferMetadataBuilder b(config(32, 5, 16), small_limits()); },
                                      {"num_heads / num_kv_heads"}));
  EXPECT_TRUE(test::throws_error_with(
      [&] { flashinfer_backend().make_builder(config(32, 8, 16, DeviceSpec::Cpu())); }, {"CPU"}));
  AttentionConfig alibi = config(32, 8, 16);
  alibi.features.alibi = true;
  EXPECT_TRUE(test::throws_error_with([&] { flashinfer_backend().make_impl(alibi); }, {"ALiBi"}));
  EXPECT_NE(flashinfer_backend().make_builder(config(32, 8, 16)), nullptr);
}

// ---- the impl -----------------------------------------------------------------------------

// CUDA views over a fake address: validation reads shapes only, never the memory.
void* fake() { return reinterpret_cast<void*>(uintptr_t{0x10000}); }

AttentionConfig windowed_config() {
  AttentionConfig c = config(8, 2, 16);
  c.features.sliding_window = true;
  return c;
}

struct ForwardCase {
  AttentionConfig cfg = windowed_config();
  int64_t blocks = 64;
  int tokens = 0;
  TensorView q, k, v, out, cache;
  AttentionParams params;

  explicit ForwardCase(int num_tokens) : tokens(num_tokens) {
    q = TensorView(fake(), DType::bf16, {tokens, 8, 128}, Device::CUDA);
    k = TensorView(fake(), DType::bf16, {tokens, 2, 128}, Device::CUDA);
    v = k;
    out = q;
    cache = TensorView(fake(), DType::bf16, {blocks, 2, 16, 2, 128}, Device::CUDA);
  }
};

// A batch that passes every check of the forward reaches the GPU: without one (a build without
// CUDA, or a machine without a GPU such as CI's) that is the first CUDA call's error, not a
// check's. With a GPU these fake tensors must not launch: the GPU tests run such batches on real
// ones (python/tests/test_gpu.py test_cuda_flashinfer_layer_mixed_batch; the planned parts:
// tests/gpu/flashinfer_planned_test.cpp).
template <class F>
void expect_passes_checks(F&& f) {
  if (cuda_device_count() > 0) return;
  try {
    f();
    ADD_FAILURE() << "no error without a GPU";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.rfind("flashinfer forward", 0), 0u) << m;
    EXPECT_TRUE(m.find("cuda") != std::string::npos || m.find("CUDA") != std::string::npos) << m;
  }
}

TEST(FlashInferImpl, ValidatesMixedBatchesBeforeTheKernels) {
  std::mt19937_64 rng(5);
  ForwardCase fc(1 + 40);
  FlashInferMetadataBuilder builder(fc.cfg, small_limits());
  auto md = builder.build(make_batch({1, 40}, {100, 200}, 16, rng));
  auto impl = flashinfer_backend().make_impl(fc.cfg);
  auto run = [&](const ForwardCase& c, const BackendMetadata& m) {
    impl->forward(c.q, c.k, c.v, c.cache, m, c.params, c.out);
  };
  expect_passes_checks([&] { run(fc, *md); });

  struct OtherMetadata : BackendMetadata {};
  EXPECT_TRUE(test::throws_error_with([&] { run(fc, OtherMetadata{}); }, {"another backend's metadata"}));
  {
    ForwardCase c = fc;
    c.q = TensorView(fake(), DType::bf16, {c.tokens, 8, 64}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"q.shape = [41, 8, 64]"}));
  }
  {
    ForwardCase c = fc;
    c.q = TensorView(fake(), DType::bf16, {c.tokens, 8, 128});  // CPU
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"q.device"}));
  }
  {
    ForwardCase c = fc;
    c.out = TensorView(fake(), DType::f16, {c.tokens, 8, 128}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"out.dtype"}));
  }
  {
    ForwardCase c = fc;
    c.q = TensorView(fake(), DType::bf16, {c.tokens - 1, 8, 128}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"num_actual_tokens = 41"}));
  }
  {
    ForwardCase c = fc;  // HND order given for an NHD configuration
    c.cache = TensorView(fake(), DType::bf16, {64, 2, 2, 16, 128}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"cache.shape = [64, 2, 2, 16, 128]"}));
  }
  {
    ForwardCase c = fc;  // the plan reads page ids up to 2 * max_blocks_per_req - 1
    c.cache = TensorView(fake(), DType::bf16, {3, 2, 16, 2, 128}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"num_blocks = 3"}));
  }
  {
    ForwardCase c = fc;
    c.params.alibi_slopes = TensorView(fake(), DType::f32, {8}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"ALiBi"}));
  }
  {
    ForwardCase c = fc;  // a feature the configuration did not declare
    c.params.softcap = 30.f;
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"softcap"}));
  }
  {
    ForwardCase c = fc;
    c.params.lse = TensorView(fake(), DType::f32, {8, c.tokens}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"LSE output"}));
  }
  {
    ForwardCase c = fc;
    c.params.causal = false;
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *md); }, {"params.causal"}));
  }
  {
    ForwardCase c = fc;  // the plan assumed no window: any window is within it
    c.params.window_left = 10;
    expect_passes_checks([&] { run(c, *md); });
  }
  {
    BuilderLimits l = small_limits();
    l.window_left = 8;
    FlashInferMetadataBuilder windowed(fc.cfg, l);
    auto wmd = windowed.build(make_batch({1, 40}, {100, 200}, 16, rng));
    ForwardCase c = fc;
    c.params.window_left = 16;  // wider than planned
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *wmd); }, {"planned window_left = 8"}));
    c.params.window_left = -1;
    EXPECT_TRUE(test::throws_error_with([&] { run(c, *wmd); }, {"planned window_left = 8"}));
    c.params.window_left = 4;
    expect_passes_checks([&] { run(c, *wmd); });
  }
  {
    // nvfp4: the packed u8 cache (last dim 128/2 + 128/16 = 72 bytes).
    AttentionConfig cfg = fc.cfg;
    cfg.cache_dtype = DType::nvfp4;
    FlashInferMetadataBuilder b4(cfg, small_limits());
    auto md4 = b4.build(make_batch({1, 40}, {100, 200}, 16, rng));
    auto impl4 = flashinfer_backend().make_impl(cfg);
    ForwardCase c = fc;
    c.cache = TensorView(fake(), DType::u8, {64, 2, 16, 2, 72}, Device::CUDA);
    expect_passes_checks([&] { impl4->forward(c.q, c.k, c.v, c.cache, *md4, c.params, c.out); });
    c.cache = TensorView(fake(), DType::u8, {64, 2, 16, 2, 128}, Device::CUDA);
    EXPECT_TRUE(test::throws_error_with(
        [&] { impl4->forward(c.q, c.k, c.v, c.cache, *md4, c.params, c.out); }, {"[64, 2, 16, 2, 72]"}));
  }
  {
    // Declared features in use, and buffers padded past num_actual_tokens (CUDA graphs).
    AttentionConfig cfg = fc.cfg;
    cfg.features.lse = cfg.features.sinks = cfg.features.softcap = true;
    auto full = flashinfer_backend().make_impl(cfg);
    ForwardCase c = fc;
    c.q = TensorView(fake(), DType::bf16, {64, 8, 128}, Device::CUDA);
    c.out = c.q;
    c.params.lse = TensorView(fake(), DType::f32, {8, c.tokens}, Device::CUDA);
    c.params.sinks = TensorView(fake(), DType::f32, {8}, Device::CUDA);
    c.params.softcap = 30.f;
    expect_passes_checks([&] { full->forward(c.q, c.k, c.v, c.cache, *md, c.params, c.out); });
  }
  builder.build(make_batch({1}, {5}, 16, rng));
  EXPECT_TRUE(test::throws_error_with([&] { run(fc, *md); }, {"re-planned"}));
}

// The caller-owned workspace (AttentionImpl::workspace_bytes / set_workspace): the size covers
// both parts' split partials for the builder's capacity (plans lay their partials out for it),
// and both backends answer through the public interface.
TEST(FlashInferImpl, WorkspaceBytesCoverTheBuildersPlans) {
  const AttentionConfig cfg = config(32, 8, 16);
  auto impl = flashinfer_backend().make_impl(cfg);
  const AttentionImpl& base = *impl;
  EXPECT_EQ(base.workspace_bytes(0), 0u);
  const size_t bytes = base.workspace_bytes(64);
  EXPECT_EQ(base.workspace_bytes(1 << 20), bytes);
  FlashInferMetadataBuilder builder(cfg, BuilderLimits{});
  const PlanState& st = builder.state();
  EXPECT_EQ(bytes, std::max(st.decode_plan.workspace_bytes(), st.prefill_plan.workspace_bytes()));
  // (fewer tokens, smaller capacities)
  EXPECT_LT(plan_workspace_bytes(cfg, BuilderLimits{}, 64), bytes);
  EXPECT_TRUE(test::throws_error_with([&] { impl->set_workspace(nullptr, 16); }, {"bytes", "device pointer"}));
  EXPECT_NO_THROW(impl->set_workspace(nullptr, 0));
  auto fa = backend("flash_attn").make_impl(cfg);
  EXPECT_GT(fa->workspace_bytes(64), 0u);
  EXPECT_TRUE(test::throws_error_with([&] { fa->set_workspace(nullptr, 16); }, {"bytes", "device pointer"}));
}

}  // namespace
}  // namespace attnkit::flashinfer
