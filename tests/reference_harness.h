// The harness of the CPU reference tests (reference_test.cpp, reference_edges_test.cpp): a
// problem (shape, features, requests) built into a paged cache and batch, and a separate dense
// brute force written from docs/architecture.md section 4: each request's K/V as dense float64
// arrays (the dequantized values the cache holds), a mask test per key, a plain softmax.
#pragma once
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

namespace attnkit::reftest {

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

inline bool quantized(DType t) { return is_fp8(t) || t == DType::nvfp4; }

// What the cache will hold for one row, read back as the reference should see it: the
// storage rounding / quantization of dtype.h applied to the written values.
inline std::vector<double> stored_row(const float* x, int d, DType t, float scale) {
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
inline std::vector<float> make_scales(const Problem& pr, float jitter) {
  const DType t = pr.s.cache_dtype;
  if (!quantized(t)) return {};
  const float base = t == DType::fp8_e4m3 ? 1.f / 300 : t == DType::fp8_e5m2 ? 1.f / 20000
                                                                             : 1.f / 2000;
  if (!pr.f.per_head_scale || t == DType::nvfp4) return {base * jitter};
  std::vector<float> s(pr.s.num_kv_heads);
  for (int h = 0; h < pr.s.num_kv_heads; ++h) s[h] = base * jitter * (0.6f + 0.45f * h);
  return s;
}

inline Built build(const Problem& pr) {
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
inline Expected brute_force(const Built& b) {
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

inline std::string describe(const Problem& pr) {
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
inline void check(const Problem& pr) {
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

}  // namespace attnkit::reftest
