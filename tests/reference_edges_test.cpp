// The CPU reference's edge cases (rows with no visible key, empty requests, padding, queries
// longer than their keys, shuffled block ids, output aliasing q, ALiBi slopes per request)
// against the brute force of reference_harness.h, and bad input: every one an Error naming the
// value.
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

// ---- edge cases ---------------------------------------------------------------------------

class EdgeGrid : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

enum Edge { kEmptyRequests, kAllEmpty, kNoRequests, kPadding, kLongerQuery, kLongerWindowed, kZeroKeys };
const char* edge_name(int e) {
  static const char* names[] = {"empty_requests", "all_empty", "no_requests", "padding",
                                "query_longer", "query_longer_windowed", "zero_keys"};
  return names[e];
}

TEST_P(EdgeGrid, MatchesBruteForce) {
  const auto [edge, causal, sinks] = GetParam();
  Problem pr;
  pr.s.num_heads = 8;
  pr.s.num_kv_heads = 2;
  pr.s.head_size = 64;
  pr.f.causal = causal;
  pr.f.sinks = sinks;
  pr.seed = 900 + edge;
  switch (edge) {
    case kEmptyRequests:  // query_len 0 between real ones, with and without keys
      pr.reqs = {{0, 0}, {2, 30}, {0, 19}, {0, 0}, {5, 5}, {0, 33}};
      break;
    case kAllEmpty:
      pr.reqs = {{0, 12}, {0, 0}};
      break;
    case kNoRequests:
      pr.reqs = {};
      pr.pad_tokens = 2;
      break;
    case kPadding:  // q rows past query_start_loc[num_reqs]: output 0, LSE -inf
      pr.reqs = {{1, 20}, {4, 9}};
      pr.pad_tokens = 3;
      break;
    case kLongerQuery:  // negative positions: causal rows see nothing
      pr.allow_longer = true;
      pr.reqs = {{12, 5}, {1, 9}, {20, 20}};
      break;
    case kLongerWindowed:  // non-causal too: a right window ends before key 0
      pr.allow_longer = true;
      pr.f.window_left = 2;
      pr.f.window_right = 1;
      pr.reqs = {{9, 4}, {3, 17}};
      break;
    case kZeroKeys:  // queries with no keys at all
      pr.allow_longer = true;
      pr.reqs = {{3, 0}, {2, 6}};
      break;
  }
  check(pr);
}

INSTANTIATE_TEST_SUITE_P(Reference, EdgeGrid,
                         ::testing::Combine(::testing::Range(0, 7), ::testing::Bool(),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(edge_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_causal" : "_noncausal") +
                                  (std::get<2>(info.param) ? "_sinks" : "");
                         });

// The rows without a visible key are exactly 0 with LSE -inf (or the sink logit).
TEST(ReferenceEdge, NoVisibleKeyRowsAreExact) {
  for (bool sinks : {false, true}) {
    Problem pr;
    pr.s.num_heads = 2;
    pr.s.num_kv_heads = 1;
    pr.s.head_size = 64;
    pr.f.sinks = sinks;
    pr.allow_longer = true;
    pr.reqs = {{4, 2}};  // positions -2, -1, 0, 1: the first two rows see nothing
    Built b = build(pr);
    b.run();
    const float* out = reinterpret_cast<const float*>(b.out_bytes.data());
    for (int t = 0; t < 2; ++t)
      for (int h = 0; h < 2; ++h) {
        for (int c = 0; c < 64; ++c) ASSERT_EQ(out[(t * 2 + h) * 64 + c], 0.f);
        const float lse = b.lse[h * b.num_tokens + t];
        if (sinks) EXPECT_EQ(lse, b.sinks[h]);
        else EXPECT_EQ(lse, -INFINITY);
      }
    EXPECT_TRUE(std::isfinite(b.lse[2]));  // position 0 sees key 0
  }
}

// Output may alias q (in-place attention).
TEST(ReferenceEdge, OutputMayAliasQuery) {
  Problem pr;
  pr.s.num_heads = 4;
  pr.s.num_kv_heads = 4;
  pr.s.head_size = 64;
  pr.reqs = {{6, 40}};
  Built b = build(pr);
  const Expected e = brute_force(b);
  reference_attention(b.q(), b.kv(), b.batch(), b.params(), b.q(), false);
  std::vector<float> got(b.q_bytes.size() / 4);
  std::memcpy(got.data(), b.q_bytes.data(), b.q_bytes.size());
  EXPECT_TRUE(all_close(got, e.out, {6, 4, 64}, 1e-5, 1e-6));
}

// ---- validation: every bad input is an Error naming the value ---------------------------

struct BadInput {
  const char* name;
  const char* expect_in_message;
  void (*mutate)(Built& b, TensorView& q, PagedKV& kv, AttentionParams& p, TensorView& out,
                 bool& allow);
};

// ALiBi slopes per (request, head): each request's rows equal a run with that request's slopes
// for every request (exactly: the same double arithmetic), for several shapes and masks.
TEST(ReferenceAttention, AlibiSlopesPerRequest) {
  for (int i = 0; i < 6; ++i) {
    Problem pr;
    pr.s.num_heads = 4;
    pr.s.num_kv_heads = 2;
    pr.s.head_size = 32;
    pr.f.alibi = true;
    pr.f.causal = i % 2 == 0;
    pr.f.window_left = i % 3 == 0 ? 5 : -1;
    pr.reqs = {{3, 20}, {1, 9}, {7, 7}};
    pr.seed = 40 + i;
    Built b = build(pr);
    const int64_t h = pr.s.num_heads, reqs = 3;
    std::vector<float> rows(reqs * h);
    for (int64_t r = 0; r < reqs; ++r)
      for (int64_t k = 0; k < h; ++k) rows[r * h + k] = 0.05f * static_cast<float>((r + 1) * (k + 2) % 7);
    AttentionParams p = b.params();
    p.alibi_slopes = TensorView(rows.data(), DType::f32, {reqs, h});
    reference_attention(b.q(), b.kv(), b.batch(), p, b.out(), false);
    const std::vector<uint8_t> per_seq = b.out_bytes;
    const std::vector<float> per_seq_lse = b.lse;
    const int64_t row_bytes = h * pr.s.head_size * static_cast<int64_t>(dtype_size(pr.s.out_dtype));
    for (int64_t r = 0; r < reqs; ++r) {
      std::copy(rows.begin() + r * h, rows.begin() + (r + 1) * h, b.alibi.begin());
      b.run();  // [num_heads] slopes: request r's row
      for (int t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
        EXPECT_TRUE(std::equal(per_seq.begin() + t * row_bytes, per_seq.begin() + (t + 1) * row_bytes,
                               b.out_bytes.begin() + t * row_bytes))
            << "case " << i << ", request " << r << ", token " << t;
        for (int64_t k = 0; k < h; ++k)
          EXPECT_EQ(per_seq_lse[k * b.num_tokens + t], b.lse[k * b.num_tokens + t]) << "case " << i << ", head " << k;
      }
    }
  }
}

class ValidationGrid : public ::testing::TestWithParam<BadInput> {};

TEST_P(ValidationGrid, ThrowsErrorNamingTheValue) {
  Problem pr;
  pr.s.num_heads = 8;
  pr.s.num_kv_heads = 2;
  pr.s.head_size = 64;
  pr.s.cache_dtype = DType::fp8_e4m3;
  pr.f.per_head_scale = true;
  pr.f.sinks = true;
  pr.f.alibi = true;
  pr.reqs = {{2, 20}, {1, 9}};
  Built b = build(pr);
  TensorView q = b.q(), out = b.out();
  PagedKV kv = b.kv();
  AttentionParams p = b.params();
  bool allow = false;
  reference_attention(q, kv, b.batch(), p, out, allow);  // the baseline is valid
  GetParam().mutate(b, q, kv, p, out, allow);
  try {
    reference_attention(q, kv, b.batch(), p, out, allow);
    FAIL() << "no Error for " << GetParam().name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().expect_in_message), std::string::npos)
        << e.what();
  }
}

const BadInput kBadInputs[] = {
    {"q_dtype", "q.dtype", [](Built&, TensorView& q, PagedKV&, AttentionParams&, TensorView&, bool&) { q.dtype = DType::i32; }},
    {"q_ndim", "q.shape", [](Built& b, TensorView& q, PagedKV&, AttentionParams&, TensorView&, bool&) { q = TensorView(b.q_bytes.data(), DType::f32, {3, 512}); }},
    {"q_device", "q.device", [](Built&, TensorView& q, PagedKV&, AttentionParams&, TensorView&, bool&) { q.device = Device::CUDA; }},
    {"q_strided_last", "q.stride(-1)", [](Built&, TensorView& q, PagedKV&, AttentionParams&, TensorView&, bool&) { q.strides[2] = 2; }},
    {"out_shape", "out.shape", [](Built&, TensorView&, PagedKV&, AttentionParams&, TensorView& o, bool&) { o.shape[1] = 4; }},
    {"out_dtype", "out.dtype", [](Built&, TensorView&, PagedKV&, AttentionParams&, TensorView& o, bool&) { o.dtype = DType::fp8_e4m3; }},
    {"cache_device", "cache.device", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.device = Device::CUDA; }},
    {"cache_head_size", "cache.head_size", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.head_size = 128; }},
    {"cache_block_size", "cache.block_size", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.block_size = 24; }},
    {"cache_dtype", "cache.dtype", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.dtype = DType::i32; }},
    {"heads_divisible", "num_heads", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.num_kv_heads = 3; }},
    {"cache_null", "cache.k.base", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.k.base = nullptr; }},
    {"block_id", "", [](Built& b, TensorView&, PagedKV&, AttentionParams&, TensorView&, bool&) { b.block_table[0] = static_cast<int32_t>(b.spec.num_blocks); }},
    {"query_longer", "", [](Built& b, TensorView&, PagedKV&, AttentionParams&, TensorView&, bool&) { b.seq_lens[1] = 0; }},
    {"tokens_beyond_q", "query_start_loc", [](Built& b, TensorView& q, PagedKV&, AttentionParams&, TensorView& o, bool&) { q.shape[0] = 2; o.shape[0] = 2; (void)b; }},
    {"lse_shape", "lse", [](Built&, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.lse.shape[1] = 1; }},
    {"k_scale_shape", "k_scale", [](Built&, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.k_scale.shape[0] = 3; }},
    {"v_scale_value", "v_scale[1]", [](Built& b, TensorView&, PagedKV&, AttentionParams&, TensorView&, bool&) { b.v_scale[1] = -1.f; }},
    {"sink_nan", "sinks[3]", [](Built& b, TensorView&, PagedKV&, AttentionParams&, TensorView&, bool&) { b.sinks[3] = NAN; }},
    {"alibi_inf", "alibi_slopes[0]", [](Built& b, TensorView&, PagedKV&, AttentionParams&, TensorView&, bool&) { b.alibi[0] = INFINITY; }},
    {"alibi_rows", "alibi_slopes.shape", [](Built& b, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.alibi_slopes = TensorView(b.alibi.data(), DType::f32, {1, 8}); }},
    {"alibi_heads", "alibi_slopes.shape", [](Built& b, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.alibi_slopes = TensorView(b.alibi.data(), DType::f32, {2, 4}); }},
    {"alibi_3d", "alibi_slopes.shape", [](Built& b, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.alibi_slopes = TensorView(b.alibi.data(), DType::f32, {1, 1, 8}); }},
    {"lse_dtype", "lse.dtype", [](Built&, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.lse.dtype = DType::f16; }},
    {"sinks_device", "sinks.device", [](Built&, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.sinks.device = Device::CUDA; }},
    {"window_left", "window_left", [](Built&, TensorView&, PagedKV&, AttentionParams& p, TensorView&, bool&) { p.window_left = -2; }},
    {"nvfp4_per_head", "k_scale", [](Built&, TensorView&, PagedKV& kv, AttentionParams&, TensorView&, bool&) { kv.dtype = DType::nvfp4; kv.k.scale_base = kv.v.scale_base = kv.k.base; }},
};

INSTANTIATE_TEST_SUITE_P(Reference, ValidationGrid, ::testing::ValuesIn(kBadInputs),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace attnkit::reftest
