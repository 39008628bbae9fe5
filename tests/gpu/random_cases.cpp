// The random case builders of the GPU attention tests (attention_case.h): deterministic in the
// seed, each a grid's systematic part (head size, cache kind, dtype, block size) plus drawn
// features, head counts and request lengths.
#include <algorithm>
#include <array>
#include <iterator>
#include <random>

#include "attention_case.h"

namespace attnkit::test {

namespace {

constexpr int kHeadSizes[] = {64, 96, 128, 192, 256};
constexpr int kBlockSizes[] = {16, 32, 48, 128, 256};

template <class Rng>
int uniform_int(Rng& rng, int lo, int hi) {  // inclusive
  return lo + static_cast<int>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

template <class Rng>
void random_features(Case& c, Rng& rng) {
  c.layout = rng() % 2 ? KVLayout::NHD : KVLayout::HND;
  c.causal = rng() % 10 < 7;
  if (rng() % 4 == 0) {
    c.window_left = uniform_int(rng, 0, 96);
    c.window_right = rng() % 2 ? -1 : uniform_int(rng, 0, 24);
  }
  if (rng() % 5 == 0) c.softcap = rng() % 2 ? 5.f : 30.f;
  c.alibi = rng() % 5 == 0;
  c.alibi_per_seq = c.alibi && c.seed % 2 == 1;  // (no draw: the rest of the case stays)
  c.sinks = rng() % 4 == 0;
  c.per_head_kv_scale = rng() % 2 == 0;
  if (rng() % 3 == 0) c.scale = 0.05f + 0.25f * static_cast<float>(rng() % 1000) / 1000.f;
  c.q_amp = rng() % 2 ? 1.f : 3.f;
  c.want_lse = rng() % 8 != 0;
}

}  // namespace

Case random_small_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 3);
  Case c;
  c.seed = seed;
  // The systematic part: every head size x cache kind x dtype x block size.
  c.head_size = kHeadSizes[seed % 5];
  const int cache_kind = static_cast<int>((seed / 5) % 3);
  c.dtype = (seed / 15) % 2 ? DType::f16 : DType::bf16;
  c.cache_dtype = cache_kind == 0 ? c.dtype : cache_kind == 1 ? DType::fp8_e4m3 : DType::fp8_e5m2;
  c.block_size = kBlockSizes[(seed / 30) % 5];
  random_features(c, rng);
  const int kv_choices[] = {1, 2, 4};
  const int group_choices[] = {1, 3, 4, 8};
  c.num_kv_heads = kv_choices[rng() % 3];
  c.group = group_choices[rng() % 4];
  const int n = uniform_int(rng, 1, 8);
  const bool all_decode = rng() % 3 == 0;  // exercises the 16-row decode tiles
  for (int r = 0; r < n; ++r) {
    int q, seq;
    const int kind = static_cast<int>(rng() % 20);
    if (all_decode) {
      q = uniform_int(rng, 1, std::max(1, 16 / c.group));
      seq = q + uniform_int(rng, 0, 700);
    } else if (kind == 0) {  // empty request (CUDA-graph padding)
      q = 0;
      seq = uniform_int(rng, 0, 64);
    } else if (kind == 1) {  // query longer than its keys
      q = uniform_int(rng, 2, 40);
      seq = uniform_int(rng, 0, q - 1);
    } else if (kind < 9) {  // decode
      q = 1;
      seq = uniform_int(rng, 1, 700);
    } else {  // prefill / chunked prefill
      q = uniform_int(rng, 2, 90);
      seq = q + (rng() % 2 ? 0 : uniform_int(rng, 0, 400));
    }
    c.q_lens.push_back(q);
    c.seq_lens.push_back(seq);
  }
  c.num_splits = rng() % 2 ? 1 : uniform_int(rng, 2, 9);
  c.pad_tokens = seed % 4 == 3 ? static_cast<int>(1 + seed % 5) : 0;  // (no draw: the rest of the case stays)
  return c;
}

Case random_head_size_case(uint64_t seed) {
  // Every head size class: compiled dims (80, 96, 256, 512) and sizes padded up to one (8, 32,
  // 40 -> 64; 72 -> 80; 112 -> 128; 160 -> 192; 200, 224 -> 256; 320 -> 512), on the small and
  // the medium grids.
  constexpr int kSizes[] = {8, 32, 40, 72, 80, 96, 112, 160, 200, 224, 256, 320, 512};
  constexpr int kN = static_cast<int>(std::size(kSizes));
  Case c = (seed / kN) % 4 == 3 ? random_medium_case(5000 + seed) : random_small_case(4000 + seed);
  c.seed = seed;
  c.head_size = kSizes[seed % kN];
  if (is_fp8(c.cache_dtype) && c.head_size % 16 != 0) c.cache_dtype = c.dtype;  // (fp8 rows: 16-byte chunks)
  if (c.head_size > 256) c.num_splits = 1;  // (dim 512's output slices do not split)
  return c;
}

Case random_transposed_decode_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 6700417 + 13);
  Case c;
  c.seed = seed;
  c.head_size = 128;
  c.dtype = seed % 2 ? DType::f16 : DType::bf16;
  c.cache_dtype = (seed / 2) % 2 ? DType::fp8_e5m2 : DType::fp8_e4m3;
  c.block_size = kBlockSizes[(seed / 4) % 5];
  random_features(c, rng);
  c.num_kv_heads = uniform_int(rng, 1, 4);
  c.group = uniform_int(rng, 1, 8);  // every count of valid rows (and columns of padding) of the N8 tile
  const int max_q = 8 / c.group;
  const int n = uniform_int(rng, 1, 24);
  for (int r = 0; r < n; ++r) {
    const int q = rng() % 8 == 0 ? 0 : uniform_int(rng, 1, max_q);  // (0: CUDA-graph padding)
    // Short, page-straddling and long key ranges; a query may also be longer than its keys.
    const int kind = static_cast<int>(rng() % 4);
    const int seq = kind == 0 ? uniform_int(rng, 0, 40) : kind == 3 ? uniform_int(rng, 2000, 5000) : uniform_int(rng, q, 900);
    c.q_lens.push_back(q);
    c.seq_lens.push_back(seq);
  }
  c.num_splits = rng() % 2 ? 1 : uniform_int(rng, 2, 9);
  c.pad_tokens = seed % 5 == 4 ? static_cast<int>(1 + seed % 3) : 0;
  // The launcher's stage count (3 on these small grids), or 2 / 3 forced (no draw).
  c.tuning.transposed_stages = std::array<int, 3>{0, 2, 3}[(seed % 7) % 3];
  return c;
}

Case random_two_stage_decode_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 2750159 + 17);
  Case c;
  c.seed = seed;
  c.head_size = seed % 2 ? 64 : 128;
  c.dtype = (seed / 2) % 2 ? DType::f16 : DType::bf16;
  c.cache_dtype = c.dtype;
  c.block_size = kBlockSizes[(seed / 4) % 5];
  random_features(c, rng);
  c.num_kv_heads = 8;
  c.group = rng() % 2 ? 4 : 8;
  // 17..33 requests x 8 KV heads (x 1 or 2 splits): 136..528 CTAs, around one to two per SM.
  const int n = uniform_int(rng, 17, 33);
  for (int r = 0; r < n; ++r) {
    const int q = rng() % 10 == 0 ? 0 : uniform_int(rng, 1, 16 / c.group);
    c.q_lens.push_back(q);
    c.seq_lens.push_back(uniform_int(rng, q, 1500));
  }
  c.num_splits = rng() % 2 ? 1 : 2;
  return c;
}

Case random_medium_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 15485863 + 5);
  Case c;
  c.seed = seed;
  c.head_size = kHeadSizes[seed % 5];
  c.dtype = (seed / 5) % 2 ? DType::f16 : DType::bf16;
  const int cache_kind = static_cast<int>(rng() % 3);
  c.cache_dtype = cache_kind == 0 ? c.dtype : cache_kind == 1 ? DType::fp8_e4m3 : DType::fp8_e5m2;
  c.block_size = kBlockSizes[rng() % 5];
  random_features(c, rng);
  c.num_kv_heads = rng() % 2 ? 2 : 1;
  c.group = rng() % 2 ? 4 : 8;
  const int n = uniform_int(rng, 1, 32);
  int token_budget = 1024;  // bounds the CPU reference's work
  for (int r = 0; r < n; ++r) {
    const bool prefill = rng() % 4 == 0;
    const int q = prefill ? uniform_int(rng, 2, std::max(2, std::min(700, token_budget))) : 1;
    token_budget = std::max(0, token_budget - q);
    const int seq = q + static_cast<int>(rng() % 3500);
    c.q_lens.push_back(q);
    c.seq_lens.push_back(seq);
  }
  const int splits[] = {1, 3, 8};
  c.num_splits = splits[rng() % 3];
  return c;
}

Case random_large_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 104729 + 11);
  Case c;
  c.seed = seed;
  c.head_size = kHeadSizes[rng() % 5];
  c.dtype = rng() % 2 ? DType::f16 : DType::bf16;
  const int cache_kind = static_cast<int>(rng() % 3);
  c.cache_dtype = cache_kind == 0 ? c.dtype : cache_kind == 1 ? DType::fp8_e4m3 : DType::fp8_e5m2;
  c.block_size = kBlockSizes[rng() % 5];
  random_features(c, rng);
  if (c.window_left >= 0) c.window_left = uniform_int(rng, 0, 4096);
  const int kv_choices[] = {1, 2, 8};
  c.num_kv_heads = kv_choices[rng() % 3];
  c.group = c.num_kv_heads == 1 ? 8 : (rng() % 2 ? 4 : 1);
  const int n = rng() % 3 == 0 ? uniform_int(rng, 1, 4) : uniform_int(rng, 16, 64);
  int64_t kv_budget = 600000;  // total keys over the batch: bounds memory and reference time
  for (int r = 0; r < n; ++r) {
    const bool prefill = rng() % 8 == 0 || n <= 4;
    const int q = prefill ? uniform_int(rng, 2, 2048) : 1;
    const int64_t max_ctx = std::min<int64_t>(32768 - q, kv_budget / std::max(1, n - r));
    const int seq = q + static_cast<int>(rng() % std::max<int64_t>(1, max_ctx));
    kv_budget -= seq;
    c.q_lens.push_back(q);
    c.seq_lens.push_back(seq);
  }
  const int splits[] = {1, 1, 4, 16, 48};
  c.num_splits = splits[rng() % 5];
  return c;
}

}  // namespace attnkit::test
