// The FlashInfer-style backend's host side: capabilities and check() tables, cache shapes and
// the page-table conversion (the builder and the impl: flashinfer_engine_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/error.h"
#include "attnkit/metadata.h"
#include "core/cuda_archs.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/page_table.h"
#include "flashinfer_test_util.h"
#include "test_util.h"

namespace attnkit::flashinfer {
namespace {

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

}  // namespace
}  // namespace attnkit::flashinfer
