// The CPU reference against a separate dense brute force written here from docs/architecture.md section 4:
// each request's K/V as dense float64 arrays (the dequantized values the cache holds), a mask
// test per key, a plain softmax. Grids cover shapes, layouts, cache dtypes, every feature alone
// and combined, and the edge cases (rows with no visible key, empty requests, padding,
// queries longer than their keys, shuffled block ids).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "attnkit/kv_cache.h"
#include "attnkit/metadata.h"
#include "attnkit/params.h"
#include "attnkit/reference.h"
#include "test_util.h"

namespace attnkit {
namespace {

using test::all_close;

struct Shape {
  int num_heads = 8, num_kv_heads = 2, head_size = 128, block_size = 16;
  KVLayout layout = KVLayout::NHD;
  DType cache_dtype = DType::f32, q_dtype = DType::f32, out_dtype = DType::f32;
};

struct Feats {
  bool causal = true;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool alibi = false, sinks = false, lse = true;
  bool per_head_scale = false;
  float scale = 0.f;  // 0 = default 1/sqrt(head_size)
};

struct Req {
  int query_len, seq_len;
};

struct Problem {
  Shape s;
  Feats f;
  std::vector<Req> reqs;
  bool allow_longer = false;
  int pad_tokens = 0;  // q rows past the batch (CUDA-graph padding)
  bool separate_views = false;  // K and V as two padded strided views (paged_kv_from_views)
  uint64_t seed = 1;
};

// Everything one call needs, owning its memory; views are made on demand.
struct Built {
  Problem pr;
  KVCacheSpec spec;
  std::vector<uint8_t> cache_bytes;
  std::vector<int32_t> qsl, seq_lens, block_table;
  int max_blocks = 0;
  int64_t num_tokens = 0;
  std::vector<uint8_t> q_bytes, out_bytes;
  std::vector<float> lse, alibi, sinks, k_scale, v_scale;
  std::vector<std::vector<double>> dense_k, dense_v;  // per request [seq_len][kv_head][d]
  std::vector<double> q_vals;                         // q as stored, [token][head][d]

  std::vector<uint8_t> k_mem, v_mem;  // separate_views only

  PagedKV kv() {
    if (pr.separate_views) return separate_kv();
    return spec.view(TensorView(cache_bytes.data(), spec.storage_dtype(),
                                {static_cast<int64_t>(cache_bytes.size()) /
                                 static_cast<int64_t>(dtype_size(spec.storage_dtype()))}));
  }
  // Rows padded by 8 elements, blocks by 16, slot-major (NHD) or head-major (HND) per block.
  PagedKV separate_kv() {
    const int64_t nb = spec.num_blocks, bs = spec.block_size, hk = spec.num_kv_heads;
    const int64_t d = spec.head_size, row = d + 8;
    const int64_t s_slot = spec.layout == KVLayout::NHD ? hk * row : row;
    const int64_t s_head = spec.layout == KVLayout::NHD ? row : bs * row;
    const int64_t s_block = bs * hk * row + 16;
    const size_t bytes = nb * s_block * dtype_size(spec.cache_dtype);
    if (k_mem.size() != bytes) k_mem.assign(bytes, 0xFF), v_mem.assign(bytes, 0xFF);
    return paged_kv_from_views(
        TensorView(k_mem.data(), spec.cache_dtype, {nb, bs, hk, d}, {s_block, s_slot, s_head, 1}),
        TensorView(v_mem.data(), spec.cache_dtype, {nb, bs, hk, d}, {s_block, s_slot, s_head, 1}));
  }
  BatchView batch() const { return {qsl, seq_lens, block_table, max_blocks}; }
  TensorView q() {
    return TensorView(q_bytes.data(), pr.s.q_dtype, {num_tokens, pr.s.num_heads, pr.s.head_size});
  }
  TensorView out() {
    return TensorView(out_bytes.data(), pr.s.out_dtype,
                      {num_tokens, pr.s.num_heads, pr.s.head_size});
  }
  AttentionParams params() {
    AttentionParams p;
    p.scale = pr.f.scale;
    p.causal = pr.f.causal;
    p.window_left = pr.f.window_left;
    p.window_right = pr.f.window_right;
    p.softcap = pr.f.softcap;
    const int64_t h = pr.s.num_heads;
    if (pr.f.alibi) p.alibi_slopes = TensorView(alibi.data(), DType::f32, {h});
    if (pr.f.sinks) p.sinks = TensorView(sinks.data(), DType::f32, {h});
    if (pr.f.lse) p.lse = TensorView(lse.data(), DType::f32, {h, num_tokens});
    if (!k_scale.empty()) p.k_scale = TensorView(k_scale.data(), DType::f32, {static_cast<int64_t>(k_scale.size())});
    if (!v_scale.empty()) p.v_scale = TensorView(v_scale.data(), DType::f32, {static_cast<int64_t>(v_scale.size())});
    return p;
  }
  void run() {
    reference_attention(q(), kv(), batch(), params(), out(), pr.allow_longer);
  }
};

bool quantized(DType t) { return is_fp8(t) || t == DType::nvfp4; }

// What the cache will hold for one row, read back as the reference should see it: the
// storage rounding / quantization of dtype.h applied to the written values.
std::vector<double> stored_row(const float* x, int d, DType t, float scale) {
  std::vector<double> r(d);
  if (t == DType::nvfp4) {
    for (int b = 0; b < d / kNvfp4BlockValues; ++b) {
      uint8_t packed[kNvfp4BlockValues / 2], s;
      float vals[kNvfp4BlockValues];
      quantize_nvfp4_block(x + b * kNvfp4BlockValues, scale, packed, &s);
      dequantize_nvfp4_block(packed, s, scale, vals);
      for (int i = 0; i < kNvfp4BlockValues; ++i) r[b * kNvfp4BlockValues + i] = vals[i];
    }
  } else if (is_fp8(t)) {
    for (int i = 0; i < d; ++i) r[i] = dequantize_fp8(t, quantize_fp8(t, x[i], scale), scale);
  } else {
    for (int i = 0; i < d; ++i) {
      uint8_t buf[4];
      store_from_float(buf, t, 0, x[i]);
      r[i] = load_as_float(buf, t, 0);
    }
  }
  return r;
}

// Dequant scale of one KV head for the problem's cache dtype (values sized so the random
// data in [-1, 1] spans the format's range).
std::vector<float> make_scales(const Problem& pr, float jitter) {
  const DType t = pr.s.cache_dtype;
  if (!quantized(t)) return {};
  const float base = t == DType::fp8_e4m3 ? 1.f / 300 : t == DType::fp8_e5m2 ? 1.f / 20000
                                                                             : 1.f / 2000;
  if (!pr.f.per_head_scale || t == DType::nvfp4) return {base * jitter};
  std::vector<float> s(pr.s.num_kv_heads);
  for (int h = 0; h < pr.s.num_kv_heads; ++h) s[h] = base * jitter * (0.6f + 0.45f * h);
  return s;
}

Built build(const Problem& pr) {
  Built b;
  b.pr = pr;
  const Shape& s = pr.s;
  std::mt19937_64 rng(pr.seed);
  const int nreq = static_cast<int>(pr.reqs.size());

  b.qsl.assign(1, 0);
  int total_blocks = 0;
  for (const Req& r : pr.reqs) {
    b.qsl.push_back(b.qsl.back() + r.query_len);
    b.seq_lens.push_back(r.seq_len);
    const int nb = (r.seq_len + s.block_size - 1) / s.block_size;
    b.max_blocks = std::max(b.max_blocks, nb);
    total_blocks += nb;
  }
  b.max_blocks += 1;  // a spare column: the reference must never read it
  b.num_tokens = b.qsl.back() + pr.pad_tokens;

  // Shuffled physical block ids, with unused blocks in between.
  b.spec.num_blocks = total_blocks + 3;
  b.spec.block_size = s.block_size;
  b.spec.num_kv_heads = s.num_kv_heads;
  b.spec.head_size = s.head_size;
  b.spec.cache_dtype = s.cache_dtype;
  b.spec.layout = s.layout;
  std::vector<int32_t> ids(b.spec.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.block_table.assign(static_cast<size_t>(nreq) * b.max_blocks, -1);
  int next = 0;
  for (int r = 0; r < nreq; ++r) {
    const int nb = (pr.reqs[r].seq_len + s.block_size - 1) / s.block_size;
    for (int i = 0; i < nb; ++i) b.block_table[r * b.max_blocks + i] = ids[next++];
  }
  b.cache_bytes.assign(b.spec.total_bytes(), 0xFF);  // garbage where nothing is written

  b.k_scale = make_scales(pr, 1.0f);
  b.v_scale = make_scales(pr, 1.3f);

  // Dense K/V per request, written through write_kv at every position's slot.
  const int hk = s.num_kv_heads, d = s.head_size;
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  int64_t total_kv = 0;
  for (const Req& r : pr.reqs) total_kv += r.seq_len;
  std::vector<float> k_new(total_kv * hk * d), v_new(total_kv * hk * d);
  std::vector<int64_t> slots(total_kv);
  int64_t t = 0;
  for (int r = 0; r < nreq; ++r) {
    const int len = pr.reqs[r].seq_len;
    b.dense_k.emplace_back(static_cast<size_t>(len) * hk * d);
    b.dense_v.emplace_back(static_cast<size_t>(len) * hk * d);
    for (int j = 0; j < len; ++j, ++t) {
      slots[t] = slot_of(&b.block_table[r * b.max_blocks], s.block_size, j);
      for (int h = 0; h < hk; ++h) {
        float* kr = &k_new[(t * hk + h) * d];
        float* vr = &v_new[(t * hk + h) * d];
        for (int c = 0; c < d; ++c) kr[c] = u(rng), vr[c] = u(rng);
        const float ks = b.k_scale.empty() ? 1.f : b.k_scale[b.k_scale.size() > 1 ? h : 0];
        const float vs = b.v_scale.empty() ? 1.f : b.v_scale[b.v_scale.size() > 1 ? h : 0];
        const auto kq = stored_row(kr, d, s.cache_dtype, ks);
        const auto vq = stored_row(vr, d, s.cache_dtype, vs);
        std::copy(kq.begin(), kq.end(), &b.dense_k[r][(static_cast<size_t>(j) * hk + h) * d]);
        std::copy(vq.begin(), vq.end(), &b.dense_v[r][(static_cast<size_t>(j) * hk + h) * d]);
      }
    }
  }
  if (total_kv > 0) {
    KVScales sc;
    if (!b.k_scale.empty())
      sc.k_scale = TensorView(b.k_scale.data(), DType::f32, {static_cast<int64_t>(b.k_scale.size())});
    if (!b.v_scale.empty())
      sc.v_scale = TensorView(b.v_scale.data(), DType::f32, {static_cast<int64_t>(b.v_scale.size())});
    write_kv(TensorView(k_new.data(), DType::f32, {total_kv, hk, d}),
             TensorView(v_new.data(), DType::f32, {total_kv, hk, d}), b.kv(),
             TensorView(slots.data(), DType::i64, {total_kv}), sc);
  }

  // q in [-4, 4] so softmax is far from uniform; stored in q_dtype.
  const int64_t nq = b.num_tokens * s.num_heads * d;
  b.q_bytes.assign(nq * dtype_size(s.q_dtype), 0);
  b.q_vals.resize(nq);
  std::uniform_real_distribution<float> uq(-4.f, 4.f);
  for (int64_t i = 0; i < nq; ++i) {
    store_from_float(b.q_bytes.data(), s.q_dtype, i, uq(rng));
    b.q_vals[i] = load_as_float(b.q_bytes.data(), s.q_dtype, i);
  }
  // Output and LSE start as NaN so an unwritten element fails the comparison.
  b.out_bytes.assign(nq * dtype_size(s.out_dtype), 0);
  for (int64_t i = 0; i < nq; ++i) store_from_float(b.out_bytes.data(), s.out_dtype, i, NAN);
  b.lse.assign(static_cast<size_t>(s.num_heads) * b.num_tokens, NAN);

  for (int h = 0; h < s.num_heads; ++h)
    b.alibi.push_back(std::exp2(-8.f * (h + 1) / s.num_heads));
  std::uniform_real_distribution<float> us(-2.f, 3.f);
  for (int h = 0; h < s.num_heads; ++h) b.sinks.push_back(us(rng));
  return b;
}

struct Expected {
  std::vector<double> out;  // [num_tokens, num_heads, head_size]
  std::vector<double> lse;  // [num_heads, num_tokens]
};

// The brute force: docs/architecture.md section 4 key by key, in double.
Expected brute_force(const Built& b) {
  const Shape& s = b.pr.s;
  const Feats& f = b.pr.f;
  const int H = s.num_heads, HK = s.num_kv_heads, D = s.head_size;
  const double scale = f.scale != 0.f ? f.scale : 1.0 / std::sqrt(static_cast<double>(D));
  Expected e;
  e.out.assign(b.num_tokens * H * D, 0.0);
  e.lse.assign(static_cast<size_t>(H) * b.num_tokens, -INFINITY);
  for (size_t r = 0; r < b.pr.reqs.size(); ++r) {
    const int ql = b.pr.reqs[r].query_len, sl = b.pr.reqs[r].seq_len;
    for (int i = 0; i < ql; ++i) {
      const int64_t t = b.qsl[r] + i;
      const int64_t p = static_cast<int64_t>(sl) - ql + i;
      for (int h = 0; h < H; ++h) {
        const int kh = h / (H / HK);
        const double* q = &b.q_vals[(t * H + h) * D];
        std::vector<double> logits;
        std::vector<int> keys;
        for (int j = 0; j < sl; ++j) {
          bool visible = true;
          if (f.causal && j > p) visible = false;
          if (f.window_left >= 0 && j < p - f.window_left) visible = false;
          if (f.window_right >= 0 && j > p + f.window_right) visible = false;
          if (!visible) continue;
          const double* k = &b.dense_k[r][(static_cast<size_t>(j) * HK + kh) * D];
          double dot = 0;
          for (int c = 0; c < D; ++c) dot += q[c] * k[c];
          double sc = scale * dot;
          if (f.softcap > 0) sc = f.softcap * std::tanh(sc / f.softcap);
          if (f.alibi) sc += -static_cast<double>(b.alibi[h]) * std::fabs(static_cast<double>(p - j));
          logits.push_back(sc);
          keys.push_back(j);
        }
        const bool sink = f.sinks;
        const double sink_logit = sink ? b.sinks[h] : 0.0;
        if (keys.empty()) {
          e.lse[h * b.num_tokens + t] = sink ? sink_logit : -INFINITY;
          continue;  // output stays 0
        }
        double m = *std::max_element(logits.begin(), logits.end());
        if (sink) m = std::max(m, sink_logit);
        double sum = sink ? std::exp(sink_logit - m) : 0.0;
        for (double l : logits) sum += std::exp(l - m);
        double* o = &e.out[(t * H + h) * D];
        for (size_t n = 0; n < keys.size(); ++n) {
          const double w = std::exp(logits[n] - m) / sum;
          const double* v = &b.dense_v[r][(static_cast<size_t>(keys[n]) * HK + kh) * D];
          for (int c = 0; c < D; ++c) o[c] += w * v[c];
        }
        e.lse[h * b.num_tokens + t] = m + std::log(sum);
      }
    }
  }
  return e;
}

std::string describe(const Problem& pr) {
  std::ostringstream os;
  os << "H=" << pr.s.num_heads << " HK=" << pr.s.num_kv_heads << " D=" << pr.s.head_size
     << " bs=" << pr.s.block_size << " " << layout_name(pr.s.layout) << " cache="
     << dtype_name(pr.s.cache_dtype) << " q=" << dtype_name(pr.s.q_dtype)
     << " out=" << dtype_name(pr.s.out_dtype) << " causal=" << pr.f.causal << " window=("
     << pr.f.window_left << "," << pr.f.window_right << ") softcap=" << pr.f.softcap
     << " alibi=" << pr.f.alibi << " sinks=" << pr.f.sinks << " lse=" << pr.f.lse
     << " per_head_scale=" << pr.f.per_head_scale << " allow_longer=" << pr.allow_longer
     << " pad=" << pr.pad_tokens << " reqs=";
  for (const Req& r : pr.reqs) os << "(" << r.query_len << "/" << r.seq_len << ")";
  return os.str();
}

// Runs the reference on `pr` and compares output and LSE with the brute force.
void check(const Problem& pr) {
  SCOPED_TRACE(describe(pr));
  Built b = build(pr);
  b.run();
  const Expected e = brute_force(b);
  const int64_t n = b.num_tokens * pr.s.num_heads * pr.s.head_size;
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = load_as_float(b.out_bytes.data(), pr.s.out_dtype, i);
  // f32 output: only the final double -> float rounding differs; f16/bf16: their rounding.
  const double rtol = pr.s.out_dtype == DType::f32 ? 1e-5 : pr.s.out_dtype == DType::f16 ? 1e-3 : 5e-3;
  EXPECT_TRUE(all_close(out, e.out, {b.num_tokens, pr.s.num_heads, pr.s.head_size}, rtol, 1e-6))
      << "output";
  if (pr.f.lse) {
    EXPECT_TRUE(all_close(b.lse, e.lse, {pr.s.num_heads, b.num_tokens}, 1e-6, 1e-5)) << "lse";
  }
}

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
}  // namespace attnkit
