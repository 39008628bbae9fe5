// GPU tests of the FlashInfer-style planned parts (src/flashinfer/gpu_planned.h) against the CPU
// reference: the Problem's batch (tests/gpu/attention_case.h) as a page table (its block-table
// rows, or ragged K/V's contiguous view), planned by plan_batch, uploaded, run by the planned
// kernels and merged; every row of the output and LSE (poisoned first) compared. Decode parts
// (1..4 query tokens per request) and prefill parts (1..300), page sizes 16..1024, NHD / HND,
// 16-bit, fp8 and NVFP4 caches, head sizes padded up to 64 / 128 / 256, GQA 1..8, split and
// unsplit plans, every mask and score mod.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attention_case.h"
#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "device_fill.h"
#include "flashinfer/gpu_planned.h"
#include "test_util.h"

namespace attnkit::test {
namespace {

using flashinfer::DevicePlan;
using flashinfer::PageTable;
using flashinfer::PlanBatch;
using flashinfer::PlanBuffers;
using flashinfer::PlanCapacity;
using flashinfer::PlanConfig;
using flashinfer::PlanKernel;

// The problem's batch as FlashInfer's page table (PageTable::fill over its block table).
PageTable page_table_of(const Problem& p) {
  const Case& c = p.spec();
  const int n = static_cast<int>(c.q_lens.size());
  PageTable t(n, std::max<int64_t>(1, static_cast<int64_t>(n) * p.max_blocks()));
  t.fill(BatchView{p.cu_seqlens(), p.seq_lens(), p.block_table(), p.max_blocks()}, 0, n, c.block_size);
  return t;
}

// Ragged K/V (the problem's keys gathered into contiguous rows: Case::contiguous_kv) as the
// page table over the contiguous view that the ragged prefill plans (flashinfer::ragged_pages).
PageTable ragged_table_of(const Problem& p) {
  std::vector<int32_t> kv_indptr{0};
  for (int32_t len : p.seq_lens()) kv_indptr.push_back(kv_indptr.back() + len);
  const flashinfer::RaggedPages rp = flashinfer::ragged_pages(kv_indptr);
  const int n = static_cast<int>(p.seq_lens().size());
  PageTable t(n, std::max<int64_t>(1, static_cast<int64_t>(rp.indices.size())));
  t.assign(rp.indptr, rp.indices, rp.last_page_len, flashinfer::kRaggedPageRows);
  return t;
}

struct PlannedRun {
  Result result;
  bool split = false;
  int tile_q = 0;
};

// Plans, uploads and runs the case's batch; slots: CTA slots per KV head (0: the H200's rule);
// tile_q: the plan's fixed tile (0: as the builder plans, 16 rows for an NVFP4 cache, else the
// batch's own); graph_safe: the launches of a CUDA-graph capture (PlannedPartArgs::graph_safe:
// grids of the plan's capacity, the merge always runs), here without a capture.
PlannedRun run_planned(const Problem& p, PlanKernel kernel, int slots, const flash_attn::LaunchTuning& tuning = {},
                       int tile_q = 0, bool graph_safe = false) {
  const Case& c = p.spec();
  const int64_t T = c.num_tokens();
  const int H = c.num_heads(), D = c.head_size;
  const PageTable pages = c.contiguous_kv ? ragged_table_of(p) : page_table_of(p);
  PlanConfig cfg;
  cfg.kernel = kernel;
  cfg.num_kv_heads = c.num_kv_heads;
  cfg.group_size = c.group;
  // (as the builder plans an NVFP4 cache: 16-row tiles, which the decode tile takes)
  if (kernel == PlanKernel::TensorCore)
    cfg.fixed_tile_q = tile_q > 0 ? tile_q : c.cache_dtype == DType::nvfp4 ? flashinfer::kTileQSmall : 0;
  cfg.head_size = D;
  cfg.page_size = c.contiguous_kv ? flashinfer::kRaggedPageRows : c.block_size;
  cfg.num_slots = slots > 0 ? slots : flashinfer::num_slots_for(cuda::current_device_props().sm_count, c.num_kv_heads);
  const PlanCapacity cap = PlanCapacity::for_limits(cfg, static_cast<int>(c.q_lens.size()), static_cast<int>(T));
  PlanBuffers plan(cfg, cap);
  PlanBatch batch;
  batch.qo_indptr = p.cu_seqlens();
  batch.kv_lens = p.seq_lens();
  batch.causal = c.causal;
  batch.window_left = c.window_left;
  batch.window_right = c.window_right;
  flashinfer::plan_batch(batch, plan);

  cuda::DeviceBuffer out(std::max<int64_t>(T * H * D * 2, 16)), lse(std::max<int64_t>(T * H * 4, 16));
  cuda::DeviceBuffer ws(std::max<size_t>(plan.workspace_bytes(), 16));
  const flash_attn::VarlenArgs va = p.make_args(out.get(), c.want_lse ? lse.get() : nullptr, nullptr, 0, 1);
  cudaStream_t stream;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  PlannedRun run;
  try {
    const size_t plan_bytes = flashinfer::DevicePlanLayout(plan.capacity, c.group, pages.num_pages).bytes();
    cuda::DeviceBuffer plan_copy(plan_bytes);
    DevicePlan dev(plan.capacity, c.group, pages.num_pages, plan_copy.get(), plan_bytes);
    poison_device(out.get(), T * H * D * 2, stream);
    poison_device(lse.get(), T * H * 4, stream);
    poison_device(ws.get(), static_cast<int64_t>(plan.workspace_bytes()), stream);
    dev.upload(plan, pages, batch, stream);
    flashinfer::PlannedPartArgs a;
    a.q = va.q;
    a.out = va.out;
    a.cache = va.cache;
    a.params = va.params;
    a.workspace = ws.get();
    a.workspace_bytes = ws.bytes();
    a.stream = stream;
    a.graph_safe = graph_safe;
    flashinfer::run_planned_part(dev, plan, pages, batch, a, tuning);
    ATTNKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  ATTNKIT_CUDA_CHECK(cudaStreamDestroy(stream));
  run.result.out = download_as_float(out.get(), c.dtype, T * H * D);
  if (c.want_lse) run.result.lse = download_as_float(lse.get(), DType::f32, T * H);
  run.split = plan.split_kv;
  run.tile_q = plan.tile_q;
  return run;
}

// A decode batch: 1..max_q query tokens per request (uniform), group * q <= 16 packed rows.
// nvfp4: an NVFP4 cache, head sizes 64 / 128 / 256 (multiples of 64: tile_set.h head_size_multiple).
Case random_planned_decode_case(uint64_t seed, bool nvfp4 = false) {
  std::mt19937_64 rng(seed * 9176 + 29);
  Case c;
  c.seed = seed;
  constexpr int kPages[] = {16, 32, 64, 128, 256, 512, 1024};
  constexpr int kHeads[] = {64, 128, 256, 40, 112, 200};
  c.block_size = kPages[seed % 7];
  c.head_size = kHeads[(seed / 7) % (nvfp4 ? 3 : 6)];
  c.dtype = (seed / 42) % 2 ? DType::f16 : DType::bf16;
  const int cache_kind = nvfp4 ? 3 : static_cast<int>(rng() % 4);
  constexpr DType kCaches[] = {DType::bf16, DType::fp8_e4m3, DType::fp8_e5m2, DType::nvfp4};
  c.cache_dtype = cache_kind == 0 || c.head_size % (cache_kind == 3 ? 64 : 16) ? c.dtype : kCaches[cache_kind];
  c.layout = rng() % 2 ? KVLayout::NHD : KVLayout::HND;
  const int groups[] = {1, 2, 4, 8};
  c.group = groups[rng() % 4];
  c.num_kv_heads = 1 + static_cast<int>(rng() % 3);
  const int q = 1 + static_cast<int>(rng() % std::min(4, 16 / c.group));
  c.causal = rng() % 8 != 0;
  if (rng() % 4 == 0) c.window_left = static_cast<int>(rng() % 300);
  if (rng() % 5 == 0) c.softcap = 30.f;
  c.alibi = rng() % 6 == 0;
  c.sinks = rng() % 4 == 0;
  c.per_head_kv_scale = rng() % 2 == 0;
  c.want_lse = rng() % 6 != 0;
  const int n = rng() % 4 == 0 ? 1 : 1 + static_cast<int>(rng() % 24);
  const bool skewed = rng() % 5 == 0;  // one long request among short ones
  for (int r = 0; r < n; ++r) {
    int seq;
    if (skewed) seq = r == 0 ? 3000 + static_cast<int>(rng() % 3000) : q + static_cast<int>(rng() % 100);
    else if (rng() % 6 == 0) seq = q + static_cast<int>(rng() % (2 * c.block_size));  // last pages of every fill
    else seq = q + static_cast<int>(rng() % 2500);
    c.q_lens.push_back(q);
    c.seq_lens.push_back(seq);
  }
  return c;
}

void check_planned(const Case& c, int slots, const flash_attn::LaunchTuning& tuning = {}, bool graph_safe = false) {
  SCOPED_TRACE(c.describe() + ", slots " + std::to_string(slots) + (tuning.cp_async_fill ? ", cp.async K/V" : "") +
               (tuning.max_ctas > 0 ? ", " + std::to_string(tuning.max_ctas) + " persistent CTAs" : "") +
               (tuning.q_buffers > 0 ? ", " + std::to_string(tuning.q_buffers) + " Q buffers" : "") +
               (graph_safe ? ", graph-safe launches" : ""));
  Problem p(c);
  const Result ref = p.run_cpu_reference();
  const int64_t T = c.num_tokens();
  const int H = c.num_heads();
  for (PlanKernel k : {PlanKernel::TensorCore, PlanKernel::CudaCoreDecode}) {
    if (k == PlanKernel::CudaCoreDecode && c.max_query_len() > 1) continue;
    const PlannedRun run = run_planned(p, k, slots, tuning, 0, graph_safe);
    SCOPED_TRACE(std::string(k == PlanKernel::TensorCore ? "tensor-core plan" : "cuda-core plan") + ", tile_q " +
                 std::to_string(run.tile_q) + (run.split ? ", split" : ", unsplit"));
    // (an fp8 cache's prefill rows may run on the hopper kernel: fp8 S)
    const bool q8 = is_fp8(c.cache_dtype) && c.max_query_len() > 1;
    EXPECT_TRUE(outputs_match(c.dtype, run.result.out, ref.out, {T, H, c.head_size}, q8));
    if (c.want_lse) EXPECT_TRUE(lse_match(run.result.lse, ref.lse, {H, T}, q8));
  }
}

class PlannedDecodeGrid : public ::testing::TestWithParam<int> {};

// The H200's slot count, and few slots (long chunks, many items per slot) or many (short
// chunks: every tile split).
TEST_P(PlannedDecodeGrid, MatchesCpuReference) {
  const int i = GetParam();
  check_planned(random_planned_decode_case(i), i % 3 == 0 ? 0 : i % 3 == 1 ? 2 : 64);
}

INSTANTIATE_TEST_SUITE_P(Seeds, PlannedDecodeGrid, ::testing::Range(0, 126));

// NVFP4 caches: page sizes 16..1024, NHD / HND, head sizes 64 / 128 / 256, bf16 / f16 queries.
class PlannedDecodeNvfp4Grid : public ::testing::TestWithParam<int> {};
TEST_P(PlannedDecodeNvfp4Grid, MatchesCpuReference) {
  const int i = GetParam();
  check_planned(random_planned_decode_case(i, /*nvfp4=*/true), i % 3 == 0 ? 0 : i % 3 == 1 ? 2 : 64);
}
INSTANTIATE_TEST_SUITE_P(Seeds, PlannedDecodeNvfp4Grid, ::testing::Range(0, 84));

// Prefill parts (the FlashInfer-style prefill's plan over the page table, or, one case in
// four, over the contiguous view of ragged K/V; one in six over an NVFP4 cache, planned with
// 16-row tiles): 1..300 query tokens per request over up to 3000 keys, causal and not, every
// mask and score mod, on the plan's tile (the decode tile for 16-row items, else the mma_sync
// prefill tile: launch_plan.cpp).
Case random_planned_prefill_case(uint64_t seed) {
  std::mt19937_64 rng(seed * 7919 + 5);
  const bool nvfp4 = seed % 6 == 1;
  Case c = random_planned_decode_case(seed, nvfp4);
  c.contiguous_kv = !nvfp4 && seed % 4 == 0;
  if (c.cache_dtype == DType::nvfp4 && !nvfp4) c.cache_dtype = c.dtype;
  c.q_lens.clear();
  c.seq_lens.clear();
  const int n = 1 + static_cast<int>(rng() % 6);
  const bool skewed = rng() % 4 == 0;
  for (int r = 0; r < n; ++r) {
    const int q = skewed && r == 0 ? 200 + static_cast<int>(rng() % 100) : 1 + static_cast<int>(rng() % 160);
    const int prefix = rng() % 3 == 0 ? 0 : static_cast<int>(rng() % 2500);
    c.q_lens.push_back(q);
    c.seq_lens.push_back(q + prefix);
  }
  return c;
}

class PlannedPrefillGrid : public ::testing::TestWithParam<int> {};
TEST_P(PlannedPrefillGrid, MatchesCpuReference) {
  const int i = GetParam();
  check_planned(random_planned_prefill_case(1000 + i), i % 3 == 0 ? 0 : i % 3 == 1 ? 2 : 64);
}
INSTANTIATE_TEST_SUITE_P(Seeds, PlannedPrefillGrid, ::testing::Range(0, 84));

// Prefill plans of 128-row tiles on the hopper kernel (PlanWalk over the plan's items, the page
// table or ragged K/V's contiguous view): head sizes 64 / 128 / 256 (and 112, padded), bf16 /
// f16, NHD / HND, pages 16 / 128, causal and not, window, softcap, sinks, 16-bit and (three
// cases) fp8 caches; few CTA slots (the plan does not split), many (every tile split into chunks:
// partial rows and the plan's merge), the graph-safe launches, and the persistent walk on 1-3 CTAs. The launch decision is asked too: these parts
// take the hopper kernel.
TEST(PlannedPrefillHopper, PlansMatchTheReference) {
  for (int i = 0; i < 20; ++i) {
    Case c;
    c.seed = 3000 + i;
    c.head_size = i >= 16 ? 256 : i % 3 == 0 ? 64 : i % 3 == 1 ? 128 : 112;
    c.dtype = c.cache_dtype = i % 2 ? DType::f16 : DType::bf16;
    c.layout = (i / 2) % 2 ? KVLayout::HND : KVLayout::NHD;
    c.block_size = (i / 4) % 2 ? 128 : 16;
    c.group = 4;
    c.num_kv_heads = 2;
    c.causal = i % 5 != 4;
    if (i % 4 == 1) c.window_left = 200;
    if (i % 4 == 2) c.softcap = 30.f;
    c.sinks = i % 3 == 2;
    c.contiguous_kv = i % 8 >= 6;
    if (i % 8 == 3) c.cache_dtype = i == 11 ? DType::fp8_e5m2 : DType::fp8_e4m3;  // (codes copied into their stages)
    c.q_lens = {300, 64, 257, 33};
    c.seq_lens = {300, 1200, 900, 33};
    check_planned(c, 2);
    check_planned(c, 64);
    check_planned(c, i % 2 ? 2 : 64, {}, /*graph_safe=*/true);
    // the persistent walk forced onto 1-3 CTAs (several rounds, both directions), one and two Q buffers
    flash_attn::LaunchTuning walk;
    walk.max_ctas = 1 + i % 3;
    walk.q_buffers = 1 + (i / 3) % 2;
    check_planned(c, i % 3 == 0 ? 2 : 64, walk);
    if (!flash_attn::hopper_kernels_available() || c.contiguous_kv) continue;
    Problem p(c);
    // (the facts read no buffer contents: a placeholder output of the right alignment serves)
    void* const fake = reinterpret_cast<void*>(uintptr_t{1} << 20);
    const flash_attn::VarlenArgs a = p.make_args(fake, nullptr, nullptr, 0, 1);
    flash_attn::LaunchFacts f = flash_attn::varlen_launch_facts(a);
    f.planned_items = 40;
    f.plan_tile_q = 128;
    const flash_attn::LaunchPlan lp = flash_attn::choose_launch(f);
    EXPECT_EQ(lp.generation, flash_attn::Generation::hopper) << c.describe() << ": " << lp.reason;
  }
}

// (memcheck: paged, ragged and NVFP4 prefill parts, split and not)
TEST(PlannedPrefillSanitizer, SmallGrid) {
  for (int i = 0; i < 12; ++i) {
    Case c = random_planned_prefill_case(2000 + i);
    c.q_lens.resize(std::min<size_t>(c.q_lens.size(), 3));
    c.seq_lens.resize(c.q_lens.size());
    check_planned(c, i % 2 ? 64 : 0);
  }
}

// Large decode batches, sampled rows against the GPU fp32 reference (gpu_reference.h): batch 256
// over 1..4000 keys, batch 4 over 32k, and the skewed batch of one 32k request among 63 of 100
// keys; pages 16 / 128 / 1024, bf16 and fp8 caches, GQA 4 and 8.
class PlannedDecodeLargeGrid : public ::testing::TestWithParam<int> {};
TEST_P(PlannedDecodeLargeGrid, SampledRowsMatchGpuReference) {
  const int i = GetParam();
  std::mt19937_64 rng(i * 131 + 7);
  Case c;
  c.seed = 7000 + i;
  constexpr int kPages[] = {16, 128, 1024};
  c.block_size = kPages[i % 3];
  c.head_size = 128;
  c.dtype = i % 2 ? DType::f16 : DType::bf16;
  c.cache_dtype = (i / 3) % 2 ? DType::fp8_e4m3 : c.dtype;
  c.group = i % 4 < 2 ? 4 : 8;
  c.num_kv_heads = 2;
  c.layout = (i / 2) % 2 ? KVLayout::HND : KVLayout::NHD;
  c.want_lse = true;
  const int shape = i % 3;
  const int n = shape == 0 ? 256 : shape == 1 ? 4 : 64;
  for (int r = 0; r < n; ++r) {
    const int seq = shape == 0 ? 1 + static_cast<int>(rng() % 4000) : shape == 1 ? 32768 - static_cast<int>(rng() % 64)
                    : r == 0 ? 32768 : 100;
    c.q_lens.push_back(1);
    c.seq_lens.push_back(seq);
  }
  SCOPED_TRACE(c.describe());
  Problem p(c);
  const PlannedRun run = run_planned(p, PlanKernel::TensorCore, 0);
  const std::vector<RefRow> rows = p.sample_rows(0, c.seed);
  std::vector<float> ref_out, ref_lse;
  p.run_gpu_reference(rows, ref_out, ref_lse);
  const int D = c.head_size;
  std::vector<float> out, lse;
  p.gather_rows(run.result, rows, out, lse);
  const int64_t m = static_cast<int64_t>(rows.size());
  SCOPED_TRACE(std::string(run.split ? "split" : "unsplit") + " plan, tile_q " + std::to_string(run.tile_q));
  EXPECT_TRUE(outputs_match(c.dtype, out, ref_out, {m, D})) << "(sampled row index, dim)";
  EXPECT_TRUE(lse_match(lse, ref_lse, {m})) << "(sampled row index)";
}
INSTANTIATE_TEST_SUITE_P(Seeds, PlannedDecodeLargeGrid, ::testing::Range(0, 12));

TEST(PlannedDecodeSanitizer, SmallGrid) {
  for (int i = 0; i < 14; ++i) {
    Case c = random_planned_decode_case(500 + i, /*nvfp4=*/i % 4 == 3);
    c.seq_lens.resize(std::min<size_t>(c.seq_lens.size(), 4));
    c.q_lens.resize(c.seq_lens.size());
    check_planned(c, i % 2 ? 64 : 0);
  }
}

TEST(PlannedDecodeErrors, RejectsWhatThePlanCannotRun) {
  Case c = random_planned_decode_case(3);
  c.head_size = 128;
  c.cache_dtype = DType::nvfp4;
  c.group = 4;
  c.q_lens = {8, 8};  // 32 packed rows: planned with 64-row tiles, items the nvfp4 decode tile cannot take
  c.seq_lens = {100, 200};
  Problem p(c);
  EXPECT_TRUE(throws_error_with([&] { run_planned(p, PlanKernel::TensorCore, 0, {}, 64); },
                                {"planned item rows", "32", "nvfp4"}));
  Case big = c;
  big.q_lens = {1, 1};
  big.head_size = 512;
  Problem pb(big);
  EXPECT_TRUE(throws_error_with([&] { run_planned(pb, PlanKernel::TensorCore, 0); }, {"head_size", "512"}));
}

}  // namespace
}  // namespace attnkit::test
