// The FlashAttention-style backend's engine path on the host: the metadata builder (decode and
// prefill bookkeeping, the split decision and workspace, device copies) and the impl's
// validation before a launch (no GPU needed: fake device views are never dereferenced).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "attnkit/error.h"
#include "flash_attn/impl.h"
#include "flash_attn/metadata_builder.h"
#include "flash_attn/split_kv.h"
#include "flash_attn/varlen_launch.h"
#include "flash_attn_test_util.h"
#include "test_util.h"

namespace attnkit::flash_attn {
namespace {

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

#ifndef ATTNKIT_WITH_CUDA
// A valid call gets through every check to the launch, which a CPU build cannot run.
void expect_reaches_the_launch(const std::function<void()>& call) {
  try {
    call();
    ADD_FAILURE() << "a CPU build launched a kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "flash_attn varlen attention") << e.what();
  }
}
#endif

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
  expect_reaches_the_launch([&] { impl.forward(c.qv, {}, {}, c.cv, md, {}, c.ov); });
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
  expect_reaches_the_launch([&] { impl.forward(c.qv, {}, {}, c.cv, md, {}, c.ov); });
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
  expect_reaches_the_launch([&] { impl.forward(c.qv, {}, {}, c.cv, md, p, c.ov); });
#endif
  p.lse = TensorView(lse.data(), DType::f32, {c.cfg.num_heads, md.num_actual_tokens - 1}, Device::CUDA);
  EXPECT_TRUE(test::throws_error_with([&] { impl.forward(c.qv, {}, {}, c.cv, md, p, c.ov); },
                                      {"lse"})) << "lse shape";
}

}  // namespace
}  // namespace attnkit::flash_attn
