// GPU tests of the FlashAttention-style varlen paged attention kernel against the CPU
// reference (small shapes, every row) and the GPU fp32 reference (large shapes, sampled rows).
//
// Reduced grid for compute-sanitizer: --gtest_filter='*Sanitizer*'.
#include <utility>
#include <gtest/gtest.h>

#include <cmath>

#include "attention_case.h"
#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "flash_attn/generation.h"
#include "test_util.h"

namespace attnkit::test {
namespace {

// Every row of the batch, output and LSE, for the case's split count and (when it splits)
// for the unsplit launch too, under every tuning variant the launch decision offers for it
// (Problem::launch_variants: TMA and cp.async fills, K/V with and without the L2 policy);
// where a hopper kernel serves the case, for both generations, the hopper one also persistent
// on 1..3 CTAs (each looping over many work items) with one or two Q buffers, and where the
// three-warpgroup tile exists (head dim 64: hopper_wide) with it, at the rule's CTA count and
// persistent on 1..3 CTAs.
void check_against_cpu(const Case& c) {
  Problem p(c);
  const Result ref = p.run_cpu_reference();
  const int64_t T = c.num_tokens();
  const int H = c.num_heads(), D = c.head_size;
  struct Run {
    flash_attn::Generation g;
    int ctas, q_buffers, consumer_groups;
  };
  std::vector<Run> runs = {{c.generation, c.tuning.max_ctas, c.tuning.q_buffers, c.tuning.consumer_groups}};
  if (p.hopper_serves()) {
    const int few = 1 + static_cast<int>(c.seed % 3);
    runs = {{flash_attn::Generation::hopper, 0, 0, 0},
            {flash_attn::Generation::hopper, few, 1 + static_cast<int>(c.seed / 3 % 2), 0},
            {flash_attn::Generation::mma_sync, 0, 0, 0}};
    flash_attn::LaunchTuning wide;
    wide.consumer_groups = 3;
    if (p.launch_plan(1, wide).tile == flash_attn::TileId::hopper_wide)
      runs.insert(runs.end(), {{flash_attn::Generation::hopper, 0, 0, 3}, {flash_attn::Generation::hopper, few, 0, 3}});
  }
  for (const auto& [g, ctas, q_buffers, consumer_groups] : runs) {
    p.set_generation(g);
    flash_attn::LaunchTuning base = c.tuning;
    base.max_ctas = ctas;
    base.q_buffers = q_buffers;
    base.consumer_groups = consumer_groups;
    p.set_tuning(base);
    SCOPED_TRACE(p.spec().describe());
    for (int splits : {1, c.num_splits}) {
      for (const Problem::Variant& v : p.launch_variants(splits)) {
        p.set_tuning(v.tuning);
        SCOPED_TRACE("num_splits " + std::to_string(splits) + ", " + v.name + ": " +
                     p.launch_plan(splits, v.tuning).reason);
        const Result got = p.run_kernel(splits);
        const bool q8 = fp8_wgmma(p.launch_plan(splits, v.tuning), c.cache_dtype);
        EXPECT_TRUE(outputs_match(c.dtype, got.out, ref.out, {T, H, D}, q8));
        if (c.want_lse) EXPECT_TRUE(lse_match(got.lse, ref.lse, {H, T}, q8));
        EXPECT_TRUE(got.padding_untouched) << "the launch wrote rows past the batch's last token";
      }
      p.set_tuning(base);
      if (c.num_splits == 1) break;
    }
  }
}

// ---- random grid over every feature, head size, block size, dtype and cache dtype -----------

class VarlenSmallGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenSmallGrid, MatchesCpuReference) { check_against_cpu(random_small_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenSmallGrid, ::testing::Range(0, 450));

// ---- medium batches (up to 32 requests, ~1k query tokens, 3.5k keys), every row ----------------

class VarlenMediumGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenMediumGrid, MatchesCpuReference) { check_against_cpu(random_medium_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenMediumGrid, ::testing::Range(0, 20));

// ---- head sizes padded up to a compiled dim, and dim 80 -------------------------------------

class VarlenHeadSizeGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenHeadSizeGrid, MatchesCpuReference) { check_against_cpu(random_head_size_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenHeadSizeGrid, ::testing::Range(0, 104));

// ---- fp8 decodes of <= 8 packed rows: the transposed tile against the 16-row one and the CPU ----

class VarlenTransposedDecodeGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenTransposedDecodeGrid, MatchesCpuReference) { check_against_cpu(random_transposed_decode_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenTransposedDecodeGrid, ::testing::Range(0, 80));

// ---- 16-bit decodes on grids of one to two CTAs per SM: the 2-stage TMA tile ------------------

class VarlenTwoStageDecodeGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenTwoStageDecodeGrid, MatchesCpuReference) { check_against_cpu(random_two_stage_decode_case(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenTwoStageDecodeGrid, ::testing::Range(0, 24));

// ---- contiguous K/V (cu_seqlens_k, no block table): the same grids over the same values ------

class VarlenContiguousGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenContiguousGrid, MatchesCpuReference) {
  const int i = GetParam();
  Case c = i % 4 == 3 ? random_medium_case(3100 + i) : random_small_case(3000 + i);
  c.contiguous_kv = true;
  check_against_cpu(c);
}

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenContiguousGrid, ::testing::Range(0, 80));

// ---- every combination of the mask / score-mod features -------------------------------------

class VarlenFeatureGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenFeatureGrid, MatchesCpuReference) {
  const int i = GetParam();
  Case c = random_small_case(1000 + i);
  c.causal = i & 1;
  const int window = (i / 2) % 3;
  c.window_left = window == 0 ? -1 : 7 + i % 50;
  c.window_right = window == 2 ? i % 9 : -1;
  c.softcap = (i / 6) % 2 ? 8.f : 0.f;
  c.alibi = (i / 12) % 2;
  c.alibi_per_seq = (i / 4) % 2;  // (with alibi: one row of slopes per request)
  c.sinks = (i / 24) % 2;
  check_against_cpu(c);
}

INSTANTIATE_TEST_SUITE_P(Combinations, VarlenFeatureGrid, ::testing::Range(0, 48));

// ---- edge cases -------------------------------------------------------------------------------

Case edge_base(uint64_t seed) {
  Case c = random_small_case(seed);
  c.q_lens.clear();
  c.seq_lens.clear();
  return c;
}

TEST(VarlenEdges, QueryLongerThanKeys) {
  for (int i = 0; i < 12; ++i) {
    Case c = edge_base(2000 + i);
    c.causal = i % 2;
    c.q_lens = {5, 37, 1, 70};
    c.seq_lens = {0, 20, 0, 69};
    c.num_splits = i % 3 == 0 ? 3 : 1;
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, EmptyRequestsAndEmptyBatch) {
  for (int i = 0; i < 6; ++i) {
    Case c = edge_base(2100 + i);
    c.q_lens = {0, 3, 0, 0, 1, 0};
    c.seq_lens = {0, 40, 17, 300, 1, 0};
    check_against_cpu(c);
    c.q_lens = {0, 0};
    c.seq_lens = {5, 0};
    check_against_cpu(c);  // no tokens at all: nothing to launch, nothing to write
  }
}

TEST(VarlenEdges, RowsWithoutVisibleKeysGiveZeroAndSinkOrMinusInf) {
  for (int i = 0; i < 8; ++i) {
    Case c = edge_base(2200 + i);
    c.causal = true;
    c.window_left = -1;
    c.window_right = -1;
    c.sinks = i % 2;
    c.q_lens = {9, 2, 33};
    c.seq_lens = {4, 0, 10};  // the first q_len - seq_len rows see nothing
    c.num_splits = 1 + i % 4;
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, MoreSplitsThanTiles) {
  for (int i = 0; i < 6; ++i) {
    Case c = edge_base(2300 + i);
    c.q_lens = {1, 1, 17, 1};
    c.seq_lens = {1, 30, 100, 700};
    c.num_splits = 64 + i;
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, LargeGroupsAndMqa) {
  const int groups[] = {16, 32, 5, 12};
  for (int i = 0; i < 8; ++i) {
    Case c = edge_base(2400 + i);
    c.num_kv_heads = i % 2 ? 1 : 2;
    c.group = groups[i % 4];
    c.q_lens = {1, 1, 3, 12};
    c.seq_lens = {100, 513, 40, 200};
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, WindowSmallerThanTileAndOnBlockBoundaries) {
  for (int i = 0; i < 10; ++i) {
    Case c = edge_base(2500 + i);
    c.window_left = i;
    c.window_right = i % 3 == 0 ? 0 : -1;
    c.causal = i % 2 == 0;
    c.q_lens = {64, 1, 128};
    c.seq_lens = {64, 256, 512};
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, AlibiSlopesPerSequence) {
  // [num_reqs, num_heads] slopes on decode, prefill (both generations) and split launches.
  for (int i = 0; i < 8; ++i) {
    Case c = edge_base(2650 + i);
    c.alibi = true;
    c.alibi_per_seq = true;
    c.causal = i % 2 == 0;
    c.head_size = i % 4 < 2 ? 128 : 64;
    if (i >= 4) c.cache_dtype = c.dtype;  // (hopper-eligible prefills)
    c.q_lens = i % 3 == 0 ? std::vector<int>{1, 1, 1} : std::vector<int>{1, 70, 4, 130};
    c.seq_lens = i % 3 == 0 ? std::vector<int>{300, 900, 41} : std::vector<int>{300, 200, 41, 130};
    c.num_splits = 1 + i % 3;
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, ContiguousKvLengthsAndTiles) {
  // Requests whose rows start anywhere (not 16-aligned), empty requests, one key, page-straddling
  // and long ranges; decode and prefill shapes; every head size.
  const int head_sizes[] = {64, 96, 128, 192, 256};
  for (int i = 0; i < 10; ++i) {
    Case c = edge_base(2800 + i);
    c.contiguous_kv = true;
    c.head_size = head_sizes[i % 5];
    c.causal = i % 2 == 0;
    c.q_lens = i % 3 == 0 ? std::vector<int>{1, 1, 0, 1, 1} : std::vector<int>{5, 1, 0, 130, 17};
    c.seq_lens = i % 3 == 0 ? std::vector<int>{1, 17, 0, 333, 1000} : std::vector<int>{5, 33, 9, 130, 400};
    c.num_splits = 1 + i % 3;
    check_against_cpu(c);
  }
}

TEST(VarlenEdges, KAndVWithDifferentStrides) {
  // The loaders share page offsets between K and V only when their strides agree (and the
  // hopper generation needs that): here they do not, on decode and prefill tiles.
  for (int i = 0; i < 8; ++i) {
    Case c = edge_base(2550 + i);
    if (c.cache_dtype == DType::nvfp4) c.cache_dtype = c.dtype;
    c.v_other_layout = true;
    c.head_size = i % 2 ? 64 : 128;
    c.layout = i % 4 < 2 ? KVLayout::NHD : KVLayout::HND;
    c.q_lens = {1, 70, 4};
    c.seq_lens = {300, 200, 41};
    check_against_cpu(c);
  }
}

// ---- large shapes: sampled rows against the GPU fp32 reference ----------------------------

class VarlenLargeGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenLargeGrid, SampledRowsMatchGpuReference) {
  Case c = random_large_case(GetParam());
  // Large shapes alternate between the generations (the small grids test both on each case).
  if (GetParam() % 2 == 1) c.generation = flash_attn::Generation::mma_sync;
  SCOPED_TRACE(c.describe());
  Problem p(c);
  const Result got = p.run_kernel(c.num_splits);
  const std::vector<RefRow> rows = p.sample_rows(2, c.seed);
  std::vector<float> ref_out, ref_lse;
  p.run_gpu_reference(rows, ref_out, ref_lse);
  const int D = c.head_size;
  std::vector<float> out, lse;
  p.gather_rows(got, rows, out, lse);
  const int64_t n = static_cast<int64_t>(rows.size());
  const bool q8 = fp8_wgmma(p.launch_plan(c.num_splits, c.tuning), c.cache_dtype);
  EXPECT_TRUE(outputs_match(c.dtype, out, ref_out, {n, D}, q8)) << "(sampled row index, dim)";
  if (c.want_lse) EXPECT_TRUE(lse_match(lse, ref_lse, {n}, q8)) << "(sampled row index)";
}

INSTANTIATE_TEST_SUITE_P(Seeds, VarlenLargeGrid, ::testing::Range(0, 32));

// ---- the GPU fp32 reference is itself checked against the CPU reference --------------------

class GpuReferenceGrid : public ::testing::TestWithParam<int> {};

TEST_P(GpuReferenceGrid, MatchesCpuReference) {
  const Case c = random_small_case(5000 + GetParam());
  SCOPED_TRACE(c.describe());
  Problem p(c);
  const Result ref = p.run_cpu_reference();
  std::vector<RefRow> rows;
  const auto& cu = p.cu_seqlens();
  for (int r = 0; r + 1 < static_cast<int>(cu.size()); ++r)
    for (int t = cu[r]; t < cu[r + 1]; ++t)
      for (int h = 0; h < c.num_heads(); ++h) rows.push_back({t, h, r});
  std::vector<float> out, lse;
  p.run_gpu_reference(rows, out, lse);
  const int H = c.num_heads(), D = c.head_size;
  const int64_t T = c.num_tokens();
  std::vector<float> ref_out(rows.size() * D), ref_lse(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t base = (static_cast<int64_t>(rows[i].token) * H + rows[i].head) * D;
    std::copy(ref.out.begin() + base, ref.out.begin() + base + D, ref_out.begin() + i * D);
    ref_lse[i] = ref.lse[static_cast<int64_t>(rows[i].head) * T + rows[i].token];
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  EXPECT_TRUE(all_close(out, ref_out, {n, D}, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(lse, ref_lse, {n}, 1e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Seeds, GpuReferenceGrid, ::testing::Range(0, 24));

// ---- the hopper kernel on plain shapes: 1..5 KV tiles of 128 keys (1..10 of 64 at head dims
// 192 / 256), 1..3 row tiles; head sizes 80, 160 and 200 run padded on dims 96, 192 and 256 ----

// A plain hopper case: 16-bit NHD cache of block 16, no window, score mod, sinks or split.
Case hopper_plain_case(uint64_t seed, DType dtype, int head_size, int kv_heads, int group, bool causal) {
  Case c = edge_base(seed);
  c.dtype = c.cache_dtype = dtype;
  c.layout = KVLayout::NHD;
  c.head_size = head_size;
  c.num_kv_heads = kv_heads;
  c.group = group;
  c.block_size = 16;
  c.causal = causal;
  c.window_left = c.window_right = -1;
  c.softcap = 0.f;
  c.alibi = c.alibi_per_seq = c.sinks = c.per_head_kv_scale = false;
  c.q_amp = 1.f;
  c.num_splits = 1;
  return c;
}

TEST(VarlenHopper, TileCountsAndHeadSizes) {
  int i = 0;
  for (int head_size : {64, 80, 96, 128, 160, 192, 200, 256})
    for (int kv : {64, 128, 200, 256, 384, 600})
      for (bool causal : {false, true}) {
        Case c = hopper_plain_case(2700 + i++, DType::bf16, head_size, 1, 1, causal);
        c.q_lens = {std::min(kv, 130)};
        c.seq_lens = {kv};
        check_against_cpu(c);
      }
}

// The hopper epilogue's output rows (LaunchPlan::tma_output): TMA stores of a warp's 16 rows as
// group heads x 16 / group tokens where the GQA group divides 16 (2: boxes of 8 tokens, 16: of
// one token), the threads' copy where it does not (32, 6) or where the tuning asks, and warps with
// rows past the request's end (7 tokens) on the copy; 16-bit and fp8 caches.
TEST(VarlenHopper, OutputRowsOfEveryGroupSize) {
  int i = 0;
  for (int group : {2, 16, 32, 6})
    for (int head_size : {64, 96, 128, 256})
      for (bool causal : {false, true}) {
        Case c = hopper_plain_case(2800 + i, i % 2 ? DType::f16 : DType::bf16, head_size, 2, group, causal);
        if (i % 3 == 0 && head_size != 96) c.cache_dtype = DType::fp8_e4m3;
        c.tuning.thread_output = i % 4 == 3;
        c.q_lens = {130, 7};
        c.seq_lens = {300, 200};
        ++i;
        check_against_cpu(c);
      }
}

// ---- the hopper softmax's running maxima with a slack (RowSoftmax::step, kMaxSlackLog2) and its
// speculative exponentials at the stored maxima (softmax_scores_speculative): scores that rise
// along the keys (ALiBi with small queries: each 128-key tile's maxima exceed the last's by
// 0.9 .. 46 log2 units over the slopes, so warps take both paths and warpgroups compute S again),
// scores set by the first tiles (large queries, no ALiBi: the maxima stay), both mixed (large
// queries and ALiBi), and a sliding window (rows that see nothing in an item's first tile) ----

TEST(VarlenHopper, RunningMaxSlack) {
  int i = 0;
  for (int head_size : {64, 128, 256})
    for (float q_amp : {0.05f, 8.f})
      for (bool alibi : {false, true})
        for (bool causal : {false, true})
          for (int window : {-1, 150}) {
            Case c = hopper_plain_case(3100 + i, i % 2 ? DType::f16 : DType::bf16, head_size, 2, 4, causal);
            ++i;
            c.alibi = alibi;
            c.window_left = window;  // (rows whose keys start tiles later: maxima still -inf there)
            c.q_amp = q_amp;
            c.q_lens = {130, 40};
            c.seq_lens = {700, 400};
            if (cuda::current_device_props().cc_major == 9 && flash_attn::hopper_generation_built())
              EXPECT_TRUE(Problem(c).hopper_serves()) << c.describe();
            check_against_cpu(c);
          }
}

// ---- fp8 caches on the hopper kernel (both GEMMs in fp8: S = Q K^T on K's codes, Q rounded to
// e4m3 by the producer with a power-of-two factor per consumer warpgroup; O += P V on V's codes,
// transposed by the producer): both formats, bf16 queries (|q| up to 8) and f16 ones (on the
// e4m3 grid, as every fp8 case's: Problem), per-tensor and per-KV-head scales, GQA 1 and 4,
// block sizes 16 and 64, 1..10 tiles, causal or not, head size 112 padded to 128; every case
// must take the hopper kernel

// (case i of the grid below; the sanitizer grid takes a few too)
Case fp8_hopper_case(int i, int head_size, int kv, bool causal) {
  Case c = edge_base(2900 + i);
  c.dtype = i % 2 ? DType::f16 : DType::bf16;
  c.cache_dtype = i % 3 == 0 ? DType::fp8_e5m2 : DType::fp8_e4m3;
  c.layout = KVLayout::NHD;
  c.head_size = head_size;
  c.num_kv_heads = 2;
  c.group = i % 4 == 0 ? 1 : 4;
  c.block_size = i % 5 == 0 ? 64 : 16;
  c.causal = causal;
  c.window_left = c.window_right = -1;
  c.softcap = 0.f;
  c.alibi = c.sinks = false;
  c.per_head_kv_scale = i % 2 == 0;
  c.q_amp = c.dtype == DType::bf16 ? 8.f : 1.f;
  c.num_splits = 1;
  c.q_lens = {std::min(kv, 130), 7};
  c.seq_lens = {kv, 300};
  return c;
}

TEST(VarlenHopper, Fp8Caches) {
  int i = 0;
  for (int head_size : {64, 112, 128, 192, 256})
    for (int kv : {64, 200, 600})
      for (bool causal : {false, true}) {
        const Case c = fp8_hopper_case(i++, head_size, kv, causal);
        if (cuda::current_device_props().cc_major == 9 && flash_attn::hopper_generation_built())
          EXPECT_TRUE(Problem(c).hopper_serves()) << c.describe();
        check_against_cpu(c);
      }
}

// ---- reduced grid for compute-sanitizer memcheck ---------------------------------------------

TEST(VarlenSanitizer, SmallGridOfEveryPath) {
  // Decode and prefill tiles, fp8 and 16-bit caches, splits, windows, partial tiles, block
  // table padding, queries longer than keys, empty requests.
  for (int s = 0; s < 300; s += 7) {  // 7 is coprime to the grid cycle: every head size, cache kind, dtype, block size
    Case c = random_small_case(s);
    if (c.q_lens.size() > 3) {
      c.q_lens.resize(3);
      c.seq_lens.resize(3);
    }
    check_against_cpu(c);
  }
  for (int s = 0; s < 4; ++s) check_against_cpu(random_two_stage_decode_case(s));  // the 2-stage decode tile
  for (int s = 0; s < 16; s += 3) {  // the transposed fp8 decode tile (block sizes, group sizes, splits)
    Case c = random_transposed_decode_case(s);
    if (c.q_lens.size() > 4) {
      c.q_lens.resize(4);
      c.seq_lens.resize(4);
    }
    check_against_cpu(c);
  }
  Case c = edge_base(2600);
  c.q_lens = {0, 7, 1};
  c.seq_lens = {3, 2, 33};
  c.num_splits = 5;
  check_against_cpu(c);
  for (int s = 0; s < 40; s += 9) {  // contiguous K/V: decode and prefill tiles, both generations
    Case k = random_small_case(3000 + s);
    k.contiguous_kv = true;
    check_against_cpu(k);
  }
  c.contiguous_kv = true;  // (requests without keys and queries longer than their keys)
  check_against_cpu(c);
  // fp8 caches on the hopper tiles: codes copied into their stages (head sizes 128, 256; block
  // sizes 16, 64; both formats; a tail past seq_len inside a block)
  for (const auto& [i, head_size] : {std::pair{5, 128}, {12, 128}, {20, 256}, {27, 256}})
    check_against_cpu(fp8_hopper_case(i, head_size, 200, i % 2 == 1));
}

// ---- errors ------------------------------------------------------------------------------------

TEST(VarlenErrors, RejectsInputsNoKernelServes) {
  Case c = edge_base(2700);
  c.head_size = 128;
  c.q_lens = {1};
  c.seq_lens = {10};
  Problem p(c);
  const int64_t bytes = 1 * c.num_heads() * 128 * 2;
  cuda::DeviceBuffer out(bytes), lse(c.num_heads() * 4);
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 4);  // splits without workspace
    EXPECT_THROW(flash_attn::run_varlen_attention(a), Error);
  }
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    a.cache.block_size = 24;
    EXPECT_THROW(flash_attn::run_varlen_attention(a), Error);
  }
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    a.cache.dtype = a.q.dtype == DType::bf16 ? DType::f16 : DType::bf16;
    EXPECT_THROW(flash_attn::run_varlen_attention(a), Error);
  }
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    a.num_heads = c.num_heads() + 1;  // q.shape disagrees
    EXPECT_THROW(flash_attn::run_varlen_attention(a), Error);
  }
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    a.params.softcap = -1.f;
    EXPECT_THROW(flash_attn::run_varlen_attention(a), Error);
  }
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    flash_attn::LaunchTuning t;
    t.max_ctas = -1;
    EXPECT_TRUE(throws_error_with([&] { flash_attn::run_varlen_attention(a, t); }, {"max_ctas", "-1"}));
  }
  {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    flash_attn::LaunchTuning t;
    t.q_buffers = 3;
    EXPECT_TRUE(throws_error_with([&] { flash_attn::run_varlen_attention(a, t); }, {"q_buffers", "3"}));
  }
  for (int stages : {1, 4, -1}) {
    auto a = p.make_args(out.get(), lse.get(), nullptr, 0, 1);
    flash_attn::LaunchTuning t;
    t.transposed_stages = stages;
    EXPECT_TRUE(throws_error_with([&] { flash_attn::run_varlen_attention(a, t); }, {"transposed_stages"}))
        << "transposed_stages " << stages;
  }
  {  // Head dim 512 runs output-column slices, which do not split.
    Case c512 = c;
    c512.head_size = 512;
    Problem p512(c512);
    cuda::DeviceBuffer out512(c512.num_tokens() * c.num_heads() * 512 * 2);
    const size_t ws_bytes = flash_attn::varlen_workspace_bytes(c512.num_tokens(), c.num_heads(), 512, 2);
    cuda::DeviceBuffer ws(ws_bytes);
    auto a = p512.make_args(out512.get(), nullptr, ws.get(), ws_bytes, 2);
    EXPECT_TRUE(throws_error_with([&] { flash_attn::run_varlen_attention(a); }, {"num_splits", "head dim 512"}));
  }
  // Head sizes no kernel dim serves: not a multiple of 8 (the cache view refuses it first),
  // above 512, fp8 rows of 8-byte tails.
  for (const auto& [hs, cache] : {std::pair{84, DType::bf16}, {520, DType::bf16}, {40, DType::fp8_e4m3}}) {
    Case bad = c;
    bad.head_size = hs;
    bad.cache_dtype = cache;
    EXPECT_TRUE(throws_error_with(
        [&] {
          Problem pb(bad);
          cuda::DeviceBuffer out_b(bad.num_tokens() * c.num_heads() * hs * 2);
          flash_attn::run_varlen_attention(pb.make_args(out_b.get(), nullptr, nullptr, 0, 1));
        },
        {"head_size", std::to_string(hs), "multiple of"}))
        << "head size " << hs;
  }
}

}  // namespace
}  // namespace attnkit::test
