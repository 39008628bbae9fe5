// Decode context parallelism on the CPU (attnkit/dcp.h): the shard rule, and the sharded
// attention of N simulated ranks combined by the merge rule against unsharded attention, over
// grids of N (1..8), interleave (1, 16, 64), GQA, masks, score mods, sinks and lengths that
// leave ranks empty; each rank directly (reference_attention_dcp_shard) and through the engine
// API (CommonAttentionMetadata's DCP shard, the reference backend's builder and impl).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/dcp.h"
#include "flash_attn/metadata_builder.h"
#include "attnkit/error.h"
#include "attnkit/reference.h"
#include "test_util.h"

namespace attnkit {
namespace {

TEST(DcpShardRule, LocalLengthsMatchVllmAndPartitionTheTokens) {
  // vLLM's get_dcp_local_seq_lens examples: L = 11, N = 2, I = 1 -> (6, 5); L = 10, N = 2, I = 4 -> (6, 4).
  EXPECT_EQ(dcp_local_len(11, {2, 0, 1}), 6);
  EXPECT_EQ(dcp_local_len(11, {2, 1, 1}), 5);
  EXPECT_EQ(dcp_local_len(10, {2, 0, 4}), 6);
  EXPECT_EQ(dcp_local_len(10, {2, 1, 4}), 4);
  for (int N : {1, 2, 3, 4, 8})
    for (int I : {1, 16, 64})
      for (int64_t L : {0, 1, 5, 15, 16, 17, 63, 64, 65, 1000, 4097}) {
        int64_t total = 0;
        std::vector<int64_t> seen(N, 0);
        for (int64_t t = 0; t < L; ++t) {
          const int r = dcp_rank_of(t, N, I);
          ASSERT_EQ(dcp_global_token(seen[r], {N, r, I}), t) << "N " << N << " I " << I << " t " << t;
          ++seen[r];
        }
        for (int r = 0; r < N; ++r) {
          EXPECT_EQ(dcp_local_len(L, {N, r, I}), seen[r]) << "N " << N << " I " << I << " L " << L << " rank " << r;
          total += dcp_local_len(L, {N, r, I});
        }
        EXPECT_EQ(total, L);
      }
  const std::vector<int32_t> lens = {0, 7, 130};
  EXPECT_EQ(dcp_local_seq_lens(lens, {4, 1, 16}), (std::vector<int32_t>{0, 0, 32}));
}

TEST(DcpShardRule, BadShardsAreErrorsNamingTheValue) {
  const std::vector<int32_t> lens = {5};
  EXPECT_TRUE(test::throws_error_with([&] { dcp_local_seq_lens(lens, {0, 0, 1}); }, {"world_size", "0"}));
  EXPECT_TRUE(test::throws_error_with([&] { dcp_local_seq_lens(lens, {2, 2, 1}); }, {"rank", "2", "[0, world_size = 2)"}));
  EXPECT_TRUE(test::throws_error_with([&] { dcp_local_seq_lens(lens, {2, -1, 1}); }, {"rank", "-1"}));
  EXPECT_TRUE(test::throws_error_with([&] { dcp_local_seq_lens(lens, {2, 0, 0}); }, {"interleave", "0"}));
  const std::vector<int32_t> bad = {-3};
  EXPECT_TRUE(test::throws_error_with([&] { dcp_local_seq_lens(bad, {2, 0, 1}); }, {"seq_lens[0]", "-3"}));
}

// An f32 NHD paged cache owned by the test.
struct Cache {
  KVCacheSpec spec;
  std::vector<float> data;
  Cache(int64_t blocks, int block_size, int kv_heads, int head_size) {
    spec.num_blocks = std::max<int64_t>(blocks, 1);
    spec.block_size = block_size;
    spec.num_kv_heads = kv_heads;
    spec.head_size = head_size;
    spec.cache_dtype = DType::f32;
    spec.layout = KVLayout::NHD;
    data.assign(spec.total_bytes() / 4, 0.f);
  }
  float* row(int64_t block, int side, int slot, int head) {
    return data.data() + (((block * 2 + side) * spec.block_size + slot) * spec.num_kv_heads + head) * spec.head_size;
  }
  PagedKV view() { return spec.view(TensorView(data.data(), DType::f32, {static_cast<int64_t>(data.size())})); }
};

struct DcpCase {
  int N, I, kv_heads, group, head_size = 32, block_size = 16;
  std::vector<int> q_lens, seq_lens;
  bool causal = true;
  int window_left = -1;
  float softcap = 0.f;
  bool alibi = false, sinks = false;
  uint64_t seed;
  bool engine = false;  // each rank through the reference backend's builder and impl
};

void check_dcp(const DcpCase& c) {
  SCOPED_TRACE("N " + std::to_string(c.N) + " I " + std::to_string(c.I) + " seed " + std::to_string(c.seed));
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int n = static_cast<int>(c.q_lens.size()), H = c.kv_heads * c.group, D = c.head_size, bs = c.block_size;
  std::vector<int32_t> qsl{0}, seq(c.seq_lens.begin(), c.seq_lens.end());
  for (int q : c.q_lens) qsl.push_back(qsl.back() + q);
  const int64_t T = qsl.back();
  // The global cache: request r's blocks in order.
  int max_blocks = 1;
  for (int s : c.seq_lens) max_blocks = std::max(max_blocks, (s + bs - 1) / bs);
  Cache global(int64_t{n} * max_blocks, bs, c.kv_heads, D);
  std::vector<int32_t> table(static_cast<size_t>(n) * max_blocks);
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < max_blocks; ++b) table[static_cast<size_t>(r) * max_blocks + b] = r * max_blocks + b;
  for (float& x : global.data) x = u(rng);
  std::vector<float> q(T * H * D), slopes(H), sinks(H);
  for (float& x : q) x = u(rng);
  for (int h = 0; h < H; ++h) slopes[h] = 0.02f * (h + 1), sinks[h] = u(rng);
  AttentionParams p;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.softcap = c.softcap;
  if (c.alibi) p.alibi_slopes = TensorView(slopes.data(), DType::f32, {H});
  const TensorView qv(q.data(), DType::f32, {T, H, D});

  // Unsharded (with the sink in the softmax).
  std::vector<float> want(T * H * D), want_lse(H * T);
  AttentionParams pg = p;
  if (c.sinks) pg.sinks = TensorView(sinks.data(), DType::f32, {H});
  pg.lse = TensorView(want_lse.data(), DType::f32, {H, T});
  BatchView gb{qsl, seq, table, max_blocks};
  reference_attention(qv, global.view(), gb, pg, TensorView(want.data(), DType::f32, {T, H, D}));

  // N ranks, each over its shard (local blocks, local lengths), then the combine.
  std::vector<std::vector<float>> outs(c.N, std::vector<float>(T * H * D)), lses(c.N, std::vector<float>(H * T));
  std::vector<TensorView> out_views, lse_views;
  for (int rank = 0; rank < c.N; ++rank) {
    const DcpShard shard{c.N, rank, c.I};
    const std::vector<int32_t> local = dcp_local_seq_lens(seq, shard);
    int lmax = 1;
    for (int l : local) lmax = std::max(lmax, (l + bs - 1) / bs);
    Cache lc(int64_t{n} * lmax, bs, c.kv_heads, D);
    std::vector<int32_t> ltable(static_cast<size_t>(n) * lmax);
    for (int r = 0; r < n; ++r) {
      for (int b = 0; b < lmax; ++b) ltable[static_cast<size_t>(r) * lmax + b] = r * lmax + b;
      for (int j = 0; j < local[r]; ++j) {
        const int64_t t = dcp_global_token(j, shard);
        for (int side = 0; side < 2; ++side)
          for (int h = 0; h < c.kv_heads; ++h)
            std::copy_n(global.row(table[static_cast<size_t>(r) * max_blocks + t / bs], side, static_cast<int>(t % bs), h), D,
                        lc.row(ltable[static_cast<size_t>(r) * lmax + j / bs], side, j % bs, h));
      }
    }
    if (c.engine) {
      // The rank's engine step: the metadata names the shard, seq_lens stay global, the block
      // table is the rank's; the builder and impl of the reference backend run it.
      AttentionConfig cfg;
      cfg.num_heads = H;
      cfg.num_kv_heads = c.kv_heads;
      cfg.head_size = D;
      cfg.dtype = cfg.cache_dtype = DType::f32;
      cfg.block_size = bs;
      cfg.device = DeviceSpec::Cpu();
      cfg.features.lse = true;
      cfg.features.alibi = c.alibi;
      cfg.features.softcap = c.softcap != 0.f;
      cfg.features.sliding_window = c.window_left >= 0;
      cfg.features.non_causal = !c.causal;
      CommonAttentionMetadata md;
      md.query_start_loc = qsl;
      md.seq_lens = seq;
      md.block_table = ltable;
      md.max_blocks_per_req = lmax;
      md.slot_mapping.assign(T, -1);
      md.causal = c.causal;
      md.dcp_world_size = c.N;
      md.dcp_rank = rank;
      md.dcp_interleave = c.I;
      md.finalize();
      const AttentionBackend& ref = backend("reference");
      const auto built = ref.make_builder(cfg)->build(md);
      AttentionParams pr = p;
      pr.lse = TensorView(lses[rank].data(), DType::f32, {H, T});
      const TensorView cache(lc.data.data(), DType::f32, {lc.spec.num_blocks, 2, bs, c.kv_heads, D});
      ref.make_impl(cfg)->forward(qv, TensorView(), TensorView(), cache, *built, pr,
                                  TensorView(outs[rank].data(), DType::f32, {T, H, D}));
    } else {
      BatchView lb{qsl, local, ltable, lmax};
      reference_attention_dcp_shard(qv, lc.view(), lb, seq, p, shard, TensorView(outs[rank].data(), DType::f32, {T, H, D}),
                                    TensorView(lses[rank].data(), DType::f32, {H, T}));
    }
    out_views.push_back(TensorView(outs[rank].data(), DType::f32, {T, H, D}));
    lse_views.push_back(TensorView(lses[rank].data(), DType::f32, {H, T}));
  }
  std::vector<float> got(T * H * D), got_lse(H * T);
  dcp_combine_reference(out_views, lse_views, c.sinks ? TensorView(sinks.data(), DType::f32, {H}) : TensorView(),
                        TensorView(got.data(), DType::f32, {T, H, D}), TensorView(got_lse.data(), DType::f32, {H, T}));
  EXPECT_TRUE(test::all_close(got, want, {T, H, D}, 2e-5, 2e-5));
  EXPECT_TRUE(test::all_close(got_lse, want_lse, {H, T}, 2e-5, 2e-5));
}

class DcpGrid : public ::testing::TestWithParam<int> {};

TEST_P(DcpGrid, ShardedThenCombinedEqualsUnsharded) {
  const int i = GetParam();
  std::mt19937_64 rng(i * 131 + 7);
  const int Ns[] = {1, 2, 3, 4, 8}, Is[] = {1, 16, 64};
  DcpCase c{Ns[i % 5], Is[(i / 5) % 3], 1 + static_cast<int>(rng() % 2), (i / 15) % 2 ? 4 : 1};
  c.seed = i;
  c.engine = i % 2 == 1;
  c.causal = rng() % 5 != 0;
  if (rng() % 4 == 0) c.window_left = static_cast<int>(rng() % 100);
  if (rng() % 4 == 0) c.softcap = 5.f;
  c.alibi = rng() % 4 == 0;
  c.sinks = rng() % 3 == 0;
  const int reqs = 1 + static_cast<int>(rng() % 5);
  for (int r = 0; r < reqs; ++r) {
    const int kind = static_cast<int>(rng() % 4);
    const int seq = kind == 0 ? 1 + static_cast<int>(rng() % 12)            // ranks left empty
                    : kind == 1 ? 1 + static_cast<int>(rng() % 200) : 200 + static_cast<int>(rng() % 900);
    const int q = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % std::min(seq, 20)) : 1;  // decodes, chunked prefills
    c.q_lens.push_back(q);
    c.seq_lens.push_back(seq);
  }
  check_dcp(c);
}

INSTANTIATE_TEST_SUITE_P(Seeds, DcpGrid, ::testing::Range(0, 60));

TEST(DcpReference, BadInputIsAnErrorNamingTheValue) {
  std::vector<float> q(1 * 2 * 16, 0.1f), out(32), lse(2);
  Cache lc(1, 16, 1, 16);
  const std::vector<int32_t> qsl = {0, 1}, global = {20}, table = {0};
  const TensorView qv(q.data(), DType::f32, {1, 2, 16}), ov(out.data(), DType::f32, {1, 2, 16}),
      lv(lse.data(), DType::f32, {2, 1});
  const std::vector<int32_t> good = dcp_local_seq_lens(global, {2, 1, 1}), wrong = {good[0] + 1};
  AttentionParams p;
  EXPECT_NO_THROW(reference_attention_dcp_shard(qv, lc.view(), BatchView{qsl, good, table, 1}, global, p, {2, 1, 1}, ov, lv));
  EXPECT_TRUE(test::throws_error_with(
      [&] { reference_attention_dcp_shard(qv, lc.view(), BatchView{qsl, wrong, table, 1}, global, p, {2, 1, 1}, ov, lv); },
      {"seq_lens[0]", std::to_string(wrong[0]), "dcp_local_len"}));
  EXPECT_TRUE(test::throws_error_with(
      [&] { reference_attention_dcp_shard(qv, lc.view(), BatchView{qsl, good, table, 1}, global, p, {2, 3, 1}, ov, lv); },
      {"rank", "3"}));
  std::vector<float> s(2, 0.f);
  AttentionParams ps = p;
  ps.sinks = TensorView(s.data(), DType::f32, {2});
  EXPECT_TRUE(test::throws_error_with(
      [&] { reference_attention_dcp_shard(qv, lc.view(), BatchView{qsl, good, table, 1}, global, ps, {2, 1, 1}, ov, lv); },
      {"sinks", "combine"}));
  EXPECT_TRUE(test::throws_error_with(
      [&] { reference_attention_dcp_shard(qv, lc.view(), BatchView{qsl, good, table, 1}, global, p, {2, 1, 1}, ov, TensorView()); },
      {"lse"}));
  const std::vector<TensorView> outs = {ov}, lses = {lv, lv};
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine_reference(outs, lses, TensorView(), ov, TensorView()); },
                                      {"outs.size() / lses.size()", "1 / 2"}));
}

// The engine API's DCP shard: bad shards and lengths name the value; the reference's builder
// takes any shard, the FlashAttention-style one the shards whose queries see all of the rank's
// keys (its kernels have no global-position masks), the FlashInfer-style one none.
TEST(DcpMetadata, ShardsAreCheckedAndOnlyTheReferenceTakesThem) {
  CommonAttentionMetadata md;
  md.query_start_loc = {0, 1, 3};
  md.seq_lens = {40, 70};
  md.max_blocks_per_req = 2;  // (the rank's keys: at most 20 and 35 of the 40 and 70 with N = 2, I = 16)
  md.block_table = {0, 1, 2, 3};
  md.slot_mapping = {-1, -1, -1};
  md.dcp_world_size = 2;
  md.dcp_rank = 1;
  md.dcp_interleave = 16;
  md.finalize();
  EXPECT_EQ(md.key_seq_lens(), dcp_local_seq_lens(md.seq_lens, DcpShard{2, 1, 16}));
  EXPECT_NO_THROW(md.validate(4, 16));
  CommonAttentionMetadata bad = md;
  bad.dcp_rank = 2;
  EXPECT_TRUE(test::throws_error_with([&] { bad.validate(4, 16); }, {"rank", "2"}));
  bad = md;
  bad.dcp_world_size = 1;  // unsharded: request 1's 70 keys need 5 blocks
  bad.dcp_rank = 0;
  EXPECT_TRUE(test::throws_error_with([&] { bad.validate(4, 16); }, {"max_blocks_per_req"}));
  bad = md;
  bad.seq_lens = {40, 1};  // 2 new tokens in 1 key
  bad.finalize();
  EXPECT_TRUE(test::throws_error_with([&] { bad.validate(4, 16); }, {"seq_lens[1]", "query_len (2)"}));
  AttentionConfig cfg;
  cfg.num_heads = 8;
  cfg.num_kv_heads = 2;
  cfg.head_size = 128;
  cfg.device = DeviceSpec::Cuda(9, 0);
  // flashinfer refuses shards; flash_attn takes shards whose queries see all of the rank's keys
  // (causal decodes, or no causal mask) and refuses longer causal queries.
  EXPECT_TRUE(test::throws_error_with([&] { backend("flashinfer").make_builder(cfg)->build(md); },
                                      {"dcp_world_size", "2", "reference backend runs any shard"}));
  EXPECT_TRUE(test::throws_error_with([&] { backend("flash_attn").make_builder(cfg)->build(md); },
                                      {"query_len of request 1", "2", "causal DCP shard"}));
  {
    CommonAttentionMetadata dec = md;
    dec.query_start_loc = {0, 1, 2};
    dec.slot_mapping = {-1, -1};
    dec.finalize();
    // (CUDA views over a fake address: the builder reads shapes only)
    void* fake = reinterpret_cast<void*>(uintptr_t{0x10000});
    dec.query_start_loc_dev = TensorView(fake, DType::i32, {3}, Device::CUDA);
    dec.seq_lens_dev = TensorView(fake, DType::i32, {2}, Device::CUDA);
    dec.block_table_dev = TensorView(fake, DType::i32, {2, 2}, Device::CUDA);
    auto fa = backend("flash_attn").make_builder(cfg);
    EXPECT_TRUE(test::throws_error_with([&] { fa->build(dec); }, {"dcp_local_seq_lens_dev", "undefined"}));
    int32_t local_dev_marker = 0;
    dec.dcp_local_seq_lens_dev = TensorView(&local_dev_marker, DType::i32, {2}, Device::CUDA);
    const auto built = fa->build(dec);
    const auto* m = dynamic_cast<const flash_attn::FlashAttnMetadata*>(built.get());
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->dcp_world_size, 2);
    EXPECT_EQ(m->seq_lens.data, dec.dcp_local_seq_lens_dev.data) << "the kernels read the rank's key counts";
    const std::vector<int32_t> keys = dec.key_seq_lens();
    EXPECT_EQ(m->max_seq_len, *std::max_element(keys.begin(), keys.end()));
    EXPECT_EQ(m->max_decode_seq_len, m->max_seq_len);
    // No causal mask: every query sees all of the rank's keys at any length.
    CommonAttentionMetadata full = md;
    full.causal = false;
    full.query_start_loc_dev = dec.query_start_loc_dev;
    full.seq_lens_dev = dec.seq_lens_dev;
    full.block_table_dev = dec.block_table_dev;
    full.dcp_local_seq_lens_dev = dec.dcp_local_seq_lens_dev;
    EXPECT_NO_THROW(fa->build(full));
    // The shard's forward: the partial and its LSE over every one of the rank's keys; a window,
    // ALiBi or a sink (global positions / joins once) is refused, and so is a missing LSE.
    AttentionConfig fcfg = cfg;
    fcfg.features.sliding_window = fcfg.features.sinks = fcfg.features.alibi = fcfg.features.lse = true;
    auto impl = backend("flash_attn").make_impl(fcfg);
    const TensorView q(fake, DType::bf16, {2, 8, 128}, Device::CUDA), cache(fake, DType::bf16, {8, 2, 16, 2, 128}, Device::CUDA);
    const TensorView lse(fake, DType::f32, {8, 2}, Device::CUDA), vec(fake, DType::f32, {8}, Device::CUDA);
    const auto fwd = [&](const AttentionParams& pr) { impl->forward(q, {}, {}, cache, *built, pr, q); };
    AttentionParams pr;
    pr.lse = lse;
    AttentionParams windowed = pr, alibi = pr, sinks = pr, no_lse = pr;
    windowed.window_left = 8;
    alibi.alibi_slopes = vec;
    sinks.sinks = vec;
    no_lse.lse = TensorView();
    EXPECT_TRUE(test::throws_error_with([&] { fwd(windowed); }, {"params.window", "DCP shard"}));
    EXPECT_TRUE(test::throws_error_with([&] { fwd(alibi); }, {"params.alibi_slopes", "DCP shard"}));
    EXPECT_TRUE(test::throws_error_with([&] { fwd(sinks); }, {"params.sinks", "combine"}));
    EXPECT_TRUE(test::throws_error_with([&] { fwd(no_lse); }, {"params.lse", "combine"}));
  }
  cfg.device = DeviceSpec::Cpu();
  cfg.dtype = cfg.cache_dtype = DType::f32;
  EXPECT_NO_THROW(backend("reference").make_builder(cfg)->build(md));
}

TEST(DcpReference, EmptyShardsContributeNothing) {
  // Two ranks' partials of one row: rank 1 empty (+inf, NaN or -inf LSE, NaN values) leaves rank 0's.
  for (float bad : {INFINITY, NAN, -INFINITY}) {
    std::vector<float> o0 = {1.f, 2.f, 3.f, 4.f}, o1 = {NAN, NAN, NAN, NAN}, l0 = {0.5f}, l1 = {bad}, out(4), lse(1);
    const std::vector<TensorView> outs = {TensorView(o0.data(), DType::f32, {1, 1, 4}), TensorView(o1.data(), DType::f32, {1, 1, 4})};
    const std::vector<TensorView> lses = {TensorView(l0.data(), DType::f32, {1, 1}), TensorView(l1.data(), DType::f32, {1, 1})};
    dcp_combine_reference(outs, lses, TensorView(), TensorView(out.data(), DType::f32, {1, 1, 4}),
                          TensorView(lse.data(), DType::f32, {1, 1}));
    EXPECT_EQ(out, o0) << bad;
    EXPECT_FLOAT_EQ(lse[0], 0.5f) << bad;
  }
}

}  // namespace
}  // namespace attnkit

namespace attnkit {
namespace {

// The NCCL combine's checks and workspace (include/attnkit/dcp.h dcp_combine): bad arguments
// name the value before any collective, in every build (a fake communicator is never used).
TEST(DcpCombine, WorkspaceAndArgumentChecks) {
  using P = DcpCombinePath;
  // AG + RS: gathered LSEs N x H x T, the weighted partials T x H x D, the result T x H/N x D (f32,
  // 256-byte sections); all-to-all: sent and received partials and LSEs.
  EXPECT_EQ(dcp_combine_workspace_bytes(64, 32, 128, 2, P::all_gather_reduce_scatter),
            size_t{4} * (2 * 32 * 64 + 64 * 32 * 128 + 64 * 16 * 128));
  EXPECT_EQ(dcp_combine_workspace_bytes(64, 32, 128, 2, P::all_to_all), size_t{4} * 2 * (64 * 32 * 128 + 32 * 64));
  EXPECT_EQ(dcp_combine_workspace_bytes(0, 32, 128, 4, P::all_to_all), 0u);
  EXPECT_TRUE(test::throws_error_with([] { (void)dcp_combine_workspace_bytes(4, 6, 64, 4, P::all_to_all); },
                                      {"num_heads", "6", "multiple of the world size 4"}));
  void* fake = reinterpret_cast<void*>(uintptr_t{0x10000});
  DcpCombineArgs a;
  a.shard = {2, 0, 1};
  a.partial_out = TensorView(fake, DType::bf16, {4, 8, 64}, Device::CUDA);
  a.partial_lse = TensorView(fake, DType::f32, {8, 4}, Device::CUDA);
  a.out = TensorView(fake, DType::bf16, {4, 4, 64}, Device::CUDA);
  a.nccl_comm = fake;
  a.workspace = fake;
  a.workspace_bytes = 16;
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(a); }, {"workspace_bytes", "16"}));
  DcpCombineArgs b = a;
  b.partial_lse = TensorView(fake, DType::f32, {4, 8}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"partial_lse"}));
  b = a;
  b.out_lse = TensorView(fake, DType::f32, {8, 4}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"out_lse"}));
  b = a;
  b.partial_out = TensorView(fake, DType::i32, {4, 8, 64}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"partial_out.dtype", "i32"}));
  b = a;
  b.path = static_cast<P>(7);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"path", "7"}));
  b = a;
  b.partial_out = TensorView(fake, DType::bf16, {4, 8, 64}, Device::CPU);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"partial_out"}));
  b = a;
  b.partial_out = TensorView(fake, DType::bf16, {4, 7, 64}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"num_heads", "7", "multiple of the world size 2"}));
  b = a;
  b.out = TensorView(fake, DType::bf16, {4, 8, 64}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"out.shape"}));
  b = a;
  b.workspace_bytes = dcp_combine_workspace_bytes(4, 8, 64, 2, b.path);
  b.nccl_comm = nullptr;
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"nccl_comm"}));
  b = a;
  b.shard = {2, 2, 1};
  EXPECT_TRUE(test::throws_error_with([&] { dcp_combine(b); }, {"rank", "2"}));
}

}  // namespace
}  // namespace attnkit
