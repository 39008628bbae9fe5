// The CPU reference against the dense brute force of reference_harness.h over grids: every
// feature alone and combined, shapes and layouts, cache dtypes (float, fp8, nvfp4), separate
// padded K / V views, random shapes. Edge cases and bad input: reference_edges_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "attnkit/error.h"
#include "reference_harness.h"

namespace attnkit::reftest {
namespace {

// ---- feature grid: every feature alone and combined, causal and not, GQA 1/4/8 ----------

enum Feature { kPlain, kWindowLeft, kWindowBoth, kSoftcap, kAlibi, kSinks, kNoLse, kCustomScale, kAll };
const char* feature_name(int f) {
  static const char* names[] = {"plain", "window_left", "window_both", "softcap", "alibi",
                                "sinks", "no_lse", "custom_scale", "all"};
  return names[f];
}

Feats make_feats(int feature, bool causal) {
  Feats f;
  f.causal = causal;
  const bool all = feature == kAll;
  if (feature == kWindowLeft || all) f.window_left = 20;
  if (feature == kWindowBoth || all) f.window_left = 13, f.window_right = causal ? 0 : 9;
  if (feature == kSoftcap || all) f.softcap = 1.5f;
  if (feature == kAlibi || all) f.alibi = true;
  if (feature == kSinks || all) f.sinks = true;
  if (feature == kNoLse) f.lse = false;
  if (feature == kCustomScale || all) f.scale = 0.05f;
  return f;
}

class FeatureGrid : public ::testing::TestWithParam<std::tuple<int, bool, int>> {};

TEST_P(FeatureGrid, MatchesBruteForce) {
  const auto [feature, causal, ratio] = GetParam();
  Problem pr;
  pr.s.num_kv_heads = ratio == 1 ? 3 : 2;
  pr.s.num_heads = pr.s.num_kv_heads * ratio;
  pr.s.head_size = 64 + 64 * (feature % 3);  // 64, 128, 192
  pr.s.block_size = feature % 2 ? 32 : 16;
  pr.s.layout = (feature + ratio) % 2 ? KVLayout::HND : KVLayout::NHD;
  pr.f = make_feats(feature, causal);
  // A decode, a chunked prefill with history, a fresh prefill, a short request.
  pr.reqs = {{1, 57}, {23, 80}, {31, 31}, {3, 5}};
  pr.seed = 100 + feature * 7 + ratio + causal;
  check(pr);
}

INSTANTIATE_TEST_SUITE_P(
    Reference, FeatureGrid,
    ::testing::Combine(::testing::Range(0, 9), ::testing::Bool(), ::testing::Values(1, 4, 8)),
    [](const auto& info) {
      return std::string(feature_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_causal" : "_noncausal") + "_gqa" +
             std::to_string(std::get<2>(info.param));
    });

// ---- shape grid: head sizes x block sizes x layouts -----------------------------------------

class ShapeGrid : public ::testing::TestWithParam<std::tuple<int, int, KVLayout>> {};

TEST_P(ShapeGrid, MatchesBruteForce) {
  const auto [head_size, block_size, layout] = GetParam();
  Problem pr;
  pr.s.num_heads = 4;
  pr.s.num_kv_heads = 1;
  pr.s.head_size = head_size;
  pr.s.block_size = block_size;
  pr.s.layout = layout;
  pr.s.cache_dtype = DType::bf16;
  pr.s.q_dtype = DType::bf16;
  pr.s.out_dtype = DType::f32;
  // Lengths around block boundaries: exactly one block, one past, several.
  pr.reqs = {{1, block_size}, {5, block_size + 1}, {17, 2 * block_size + 7}, {1, 1}};
  pr.f.sinks = head_size % 128 == 0;
  pr.seed = head_size * 31 + block_size;
  check(pr);
}

INSTANTIATE_TEST_SUITE_P(Reference, ShapeGrid,
                         ::testing::Combine(::testing::Values(64, 72, 96, 128, 160, 256),
                                            ::testing::Values(16, 32, 128),
                                            ::testing::Values(KVLayout::NHD, KVLayout::HND)),
                         [](const auto& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) + "_bs" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  std::string(layout_name(std::get<2>(info.param)));
                         });

// ---- cache dtype grid: float, fp8 (per tensor / per head scales), nvfp4 -------------------

class CacheDtypeGrid : public ::testing::TestWithParam<std::tuple<DType, bool, KVLayout, bool>> {};

TEST_P(CacheDtypeGrid, MatchesBruteForceOnDequantizedValues) {
  const auto [cache_dtype, per_head, layout, causal] = GetParam();
  Problem pr;
  pr.s.num_heads = 12;
  pr.s.num_kv_heads = 3;
  pr.s.head_size = 128;
  pr.s.block_size = 16;
  pr.s.layout = layout;
  pr.s.cache_dtype = cache_dtype;
  pr.s.q_dtype = DType::f16;
  pr.s.out_dtype = cache_dtype == DType::f32 ? DType::f32 : DType::bf16;
  pr.f.causal = causal;
  pr.f.per_head_scale = per_head;
  pr.f.sinks = per_head;
  pr.reqs = {{1, 70}, {12, 40}, {1, 1}};
  pr.seed = 7 + static_cast<int>(cache_dtype) * 5 + per_head;
  check(pr);
}

INSTANTIATE_TEST_SUITE_P(
    Reference, CacheDtypeGrid,
    ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3,
                                         DType::fp8_e5m2, DType::nvfp4),
                       ::testing::Bool(), ::testing::Values(KVLayout::NHD, KVLayout::HND),
                       ::testing::Bool()),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_perhead" : "_pertensor") + "_" +
             std::string(layout_name(std::get<2>(info.param))) +
             (std::get<3>(info.param) ? "_causal" : "_noncausal");
    });

// ---- separate, padded K and V views (vLLM's kv_cache[:, 0] / kv_cache[:, 1]) --------------

class SeparateViewsGrid : public ::testing::TestWithParam<std::tuple<DType, KVLayout>> {};

TEST_P(SeparateViewsGrid, MatchesBruteForce) {
  const auto [cache_dtype, layout] = GetParam();
  Problem pr;
  pr.s.num_heads = 8;
  pr.s.num_kv_heads = 2;
  pr.s.head_size = 96;
  pr.s.block_size = 32;
  pr.s.layout = layout;
  pr.s.cache_dtype = cache_dtype;
  pr.separate_views = true;
  pr.f.per_head_scale = true;
  pr.reqs = {{1, 45}, {9, 70}, {0, 3}};
  pr.seed = 77 + static_cast<int>(cache_dtype);
  check(pr);
}

INSTANTIATE_TEST_SUITE_P(
    Reference, SeparateViewsGrid,
    ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3,
                                         DType::fp8_e5m2),
                       ::testing::Values(KVLayout::NHD, KVLayout::HND)),
    [](const auto& info) {
      return std::string(dtype_name(std::get<0>(info.param))) + "_" +
             std::string(layout_name(std::get<1>(info.param)));
    });

// The fp8 scale really is read: doubling it doubles every V (and so the output).
TEST(ReferenceFp8, OutputFollowsVScale) {
  Problem pr;
  pr.s.num_heads = 4;
  pr.s.num_kv_heads = 2;
  pr.s.head_size = 64;
  pr.s.cache_dtype = DType::fp8_e4m3;
  pr.f.per_head_scale = true;
  pr.reqs = {{3, 20}};
  Built b = build(pr);
  b.run();
  std::vector<float> first(b.out_bytes.size() / 4);
  std::memcpy(first.data(), b.out_bytes.data(), b.out_bytes.size());
  for (float& s : b.v_scale) s *= 2.f;
  b.run();
  std::vector<float> second(first.size()), doubled(first.size());
  std::memcpy(second.data(), b.out_bytes.data(), b.out_bytes.size());
  for (size_t i = 0; i < first.size(); ++i) doubled[i] = 2.f * first[i];
  EXPECT_TRUE(all_close(second, doubled, {3, 4, 64}, 1e-6, 1e-7));
}

// ---- random shapes: everything drawn from a seed ------------------------------------------

class RandomGrid : public ::testing::TestWithParam<int> {};

TEST_P(RandomGrid, MatchesBruteForce) {
  std::mt19937_64 rng(GetParam());
  auto pick = [&](auto... v) {
    const std::vector<std::common_type_t<decltype(v)...>> vs{v...};
    return vs[std::uniform_int_distribution<size_t>(0, vs.size() - 1)(rng)];
  };
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Problem pr;
  pr.seed = GetParam();
  pr.s.cache_dtype = pick(DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3,
                          DType::fp8_e5m2, DType::nvfp4);
  pr.s.num_kv_heads = uni(1, 3);
  pr.s.num_heads = pr.s.num_kv_heads * pick(1, 4, 8);
  pr.s.head_size = pr.s.cache_dtype == DType::nvfp4 ? pick(64, 96, 128, 256)
                                                     : pick(64, 80, 120, 128, 200, 256);
  pr.s.block_size = pick(16, 32, 128);
  pr.s.layout = coin() ? KVLayout::NHD : KVLayout::HND;
  pr.s.q_dtype = pick(DType::f32, DType::f16, DType::bf16);
  pr.s.out_dtype = pick(DType::f32, DType::bf16);
  pr.f.causal = coin();
  if (coin()) pr.f.window_left = uni(0, 60);
  if (coin()) pr.f.window_right = pr.f.causal ? uni(0, 3) : uni(0, 60);
  if (coin()) pr.f.softcap = pick(0.5f, 2.f, 30.f);
  pr.f.alibi = coin();
  pr.f.sinks = coin();
  pr.f.per_head_scale = coin();
  pr.allow_longer = uni(0, 3) == 0;
  const int nreq = uni(1, 5);
  for (int r = 0; r < nreq; ++r) {
    const int ql = pick(0, 1, 1, uni(2, 40));
    const int sl = pr.allow_longer ? uni(0, 120) : ql + uni(0, 120);
    pr.reqs.push_back({ql, sl});
  }
  check(pr);
}

INSTANTIATE_TEST_SUITE_P(Reference, RandomGrid, ::testing::Range(0, 40));

}  // namespace
}  // namespace attnkit::reftest
