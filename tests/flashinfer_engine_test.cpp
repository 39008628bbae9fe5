// The FlashInfer-style backend's builder (ordering, split, per-part tables and plans, limits)
// and the impl's validation of a forward call, on the host.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnkit/backend.h"
#include "attnkit/device.h"
#include "attnkit/error.h"
#include "attnkit/metadata.h"
#include "flashinfer/flashinfer_backend.h"
#include "flashinfer/gpu_planned.h"
#include "flashinfer/metadata_builder.h"
#include "flashinfer_test_util.h"
#include "test_util.h"

namespace attnkit::flashinfer {
namespace {

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
  impl->set_workspace(fake(), impl->workspace_bytes(1));  // (the caller's; never read here)
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
    impl4->set_workspace(fake(), impl4->workspace_bytes(1));
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
    full->set_workspace(fake(), full->workspace_bytes(1));
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

// A GPU forward takes the caller's workspace or none: without one, or with one smaller than
// workspace_bytes_for(metadata), an Error before any launch (the impl allocates nothing).
TEST(FlashInferImpl, ForwardNeedsTheCallersWorkspace) {
  std::mt19937_64 rng(9);
  ForwardCase fc(1 + 40);
  FlashInferMetadataBuilder builder(fc.cfg, small_limits());
  auto md = builder.build(make_batch({1, 40}, {100, 200}, 16, rng));
  auto impl = flashinfer_backend().make_impl(fc.cfg);
  const size_t need = impl->workspace_bytes_for(*md);
  ASSERT_GT(need, 0u);
  EXPECT_LE(need, impl->workspace_bytes(1));
  auto run = [&] { impl->forward(fc.q, fc.k, fc.v, fc.cache, *md, fc.params, fc.out); };
  EXPECT_TRUE(test::throws_error_with(run, {"flashinfer forward", "set_workspace", std::to_string(need)}));
  impl->set_workspace(fake(), need - 16);
  EXPECT_TRUE(test::throws_error_with(run, {"workspace bytes", std::to_string(need - 16)}));
  impl->set_workspace(fake(), need);
  expect_passes_checks(run);
  struct OtherMetadata : BackendMetadata {};
  EXPECT_TRUE(test::throws_error_with([&] { (void)impl->workspace_bytes_for(OtherMetadata{}); },
                                      {"another backend's metadata"}));
}

// The builder's device buffer (MetadataBuilder::device_buffer_bytes / set_device_buffer): the
// two parts' device copies, sized for the builder's limits; a bad buffer is an Error naming it,
// and (on a GPU) a forward before the buffer is set is an Error before any launch.
TEST(FlashInferBuilder, DeviceBufferIsTheCallers) {
  std::mt19937_64 rng(11);
  ForwardCase fc(1 + 40);
  FlashInferMetadataBuilder builder(fc.cfg, small_limits());
  const PlanState& st = builder.state();
  auto part = [](const PlanBuffers& plan, const PageTable& pages) {
    return (DevicePlanLayout(plan.capacity, plan.config.group_size, pages.max_pages()).bytes() + 15) / 16 * 16;
  };
  const size_t need = builder.device_buffer_bytes();
  EXPECT_EQ(need, part(st.decode_plan, st.decode_pages) + part(st.prefill_plan, st.prefill_pages));
  FlashInferMetadataBuilder bigger(fc.cfg, [] {
    BuilderLimits l = small_limits();
    l.max_seq_len *= 2;
    return l;
  }());
  EXPECT_GT(bigger.device_buffer_bytes(), need);  // (more pages)
  EXPECT_EQ(backend("flash_attn").make_builder(fc.cfg)->device_buffer_bytes(), 0u);  // (needs none)
  EXPECT_TRUE(test::throws_error_with([&] { builder.set_device_buffer(nullptr, need); }, {"device_ptr", "null"}));
  EXPECT_TRUE(test::throws_error_with(
      [&] { builder.set_device_buffer(static_cast<char*>(fake()) + 8, need); }, {"16-byte aligned"}));
  EXPECT_TRUE(test::throws_error_with([&] { builder.set_device_buffer(fake(), need - 16); },
                                      {"bytes", std::to_string(need - 16), std::to_string(need)}));
  if (cuda_device_count() == 0) return;  // (the rest makes pinned staging and asks the stream)
  auto md = builder.build(make_batch({1, 40}, {100, 200}, 16, rng));
  auto impl = flashinfer_backend().make_impl(fc.cfg);
  impl->set_workspace(fake(), impl->workspace_bytes(1));
  EXPECT_TRUE(test::throws_error_with([&] { impl->forward(fc.q, fc.k, fc.v, fc.cache, *md, fc.params, fc.out); },
                                      {"flashinfer forward", "set_device_buffer", "device_buffer_bytes"}));
  EXPECT_NO_THROW(builder.set_device_buffer(fake(), need));  // (never read: no forward follows)
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
