// GPU tests of split-KV launches of the varlen kernels (the mma_sync kernel's last split CTA per
// work item merges the partials; the hopper kernel's split combine runs after it): split counts
// 2..16 over decode and prefill rows
// with sinks, LSE and padding rows against the CPU reference; repeated launches on one
// workspace (its counters go back to 0, results stay bit-identical); launches of different
// shapes sharing one workspace; CUDA-graph capture and replay; programmatic dependent launch
// on and off across a chain of dependent launches; and the standalone combine kernel against
// the host merge rule.
//
// Filter: --gtest_filter='*VarlenSplit*:*SplitKvCombine*'
#include <utility>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_case.h"
#include "attnkit/detail/merge_rule.h"
#include "attnkit/dtype.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/split_kv_combine.h"
#include "cuda/split_workspace.h"
#include "device_fill.h"
#include "flash_attn/varlen_launch.h"
#include "infra_test_util.h"
#include "test_util.h"

namespace attnkit::test {
namespace {

// A case of random_small_case's features with decode rows (one token, or up to 16 packed rows)
// or prefill rows, `splits` splits. Prefill rows run the hopper kernel on sm90 (its split
// epilogue and the split combine after it) in half the cases, the mma_sync kernel (the in-kernel
// merge) in the other half.
Case split_case(int i, bool decode, int splits) {
  Case c = random_small_case(7000 + i);
  std::mt19937_64 rng(i * 31 + 7);
  c.q_lens.clear();
  c.seq_lens.clear();
  const int n = 1 + static_cast<int>(rng() % 6);
  for (int r = 0; r < n; ++r) {
    // (sizes bound the CPU reference's time)
    const int q = decode ? 1 + static_cast<int>(rng() % std::max(1, 16 / c.group)) : 17 + static_cast<int>(rng() % 64);
    c.q_lens.push_back(q);
    c.seq_lens.push_back(q + static_cast<int>(rng() % (decode ? 1500 : 700)));
  }
  c.num_splits = splits;
  if (i % 4 == 3) c.generation = flash_attn::Generation::mma_sync;
  c.sinks = i % 3 == 0;
  c.want_lse = i % 4 != 1;
  c.pad_tokens = i % 5 == 2 ? 3 : 0;
  return c;
}

// ---- every split count 2..16, decode and prefill rows, against the CPU reference ------------

class VarlenSplitGrid : public ::testing::TestWithParam<int> {};

TEST_P(VarlenSplitGrid, FusedCombineMatchesCpuReference) {
  const int i = GetParam();
  const Case c = split_case(i, i % 2 == 0, 2 + (i / 2) % 15);
  SCOPED_TRACE(c.describe());
  Problem p(c);
  const Result ref = p.run_cpu_reference();
  const int64_t T = c.num_tokens();
  const int H = c.num_heads(), D = c.head_size;
  // (every tuning variant the launch decision offers: TMA / cp.async fills, K/V with and
  // without the L2 policy)
  for (const Problem::Variant& v : p.launch_variants(c.num_splits)) {
    SCOPED_TRACE(v.name + ": " + p.launch_plan(c.num_splits, v.tuning).reason);
    p.set_tuning(v.tuning);
    const Result got = p.run_kernel(c.num_splits);
    // (the hopper kernel on an fp8 cache: fp8 GEMMs, their tolerance)
    const bool q8 = fp8_wgmma(p.launch_plan(c.num_splits, v.tuning), c.cache_dtype);
    EXPECT_TRUE(outputs_match(c.dtype, got.out, ref.out, {T, H, D}, q8));
    if (c.want_lse) EXPECT_TRUE(lse_match(got.lse, ref.lse, {H, T}, q8));
    EXPECT_TRUE(got.padding_untouched) << "the launch wrote rows past the batch's last token";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenSplitGrid, ::testing::Range(0, 60));

// ---- repeated launches, shared workspaces, graphs, PDL -------------------------------------

// Device buffers of one launch: out / lse of the padded token count, and a workspace.
struct LaunchBuffers {
  int64_t out_bytes = 0, lse_bytes = 0;
  cuda::DeviceBuffer out, lse;

  explicit LaunchBuffers(const Case& c) {
    const int64_t T = c.num_tokens() + c.pad_tokens;
    out_bytes = T * c.num_heads() * c.head_size * 2;
    lse_bytes = T * c.num_heads() * 4;
    out.resize(std::max<int64_t>(out_bytes, 16));
    lse.resize(std::max<int64_t>(lse_bytes, 16));
  }
  void poison(cudaStream_t s) {
    poison_device(out.get(), out_bytes, s);
    poison_device(lse.get(), lse_bytes, s);
  }
  std::vector<uint8_t> bytes() const {  // out then lse, as stored
    std::vector<uint8_t> b(out_bytes + lse_bytes);
    ATTNKIT_CUDA_CHECK(cudaMemcpy(b.data(), out.get(), out_bytes, cudaMemcpyDeviceToHost));
    ATTNKIT_CUDA_CHECK(cudaMemcpy(b.data() + out_bytes, lse.get(), lse_bytes, cudaMemcpyDeviceToHost));
    return b;
  }
};

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " != " << b.size();
  const auto diff = std::mismatch(a.begin(), a.end(), b.begin());
  if (diff.first == a.end()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "first differing byte at offset " << (diff.first - a.begin()) << " of "
                                       << a.size() << ": " << int(*diff.first) << " vs " << int(*diff.second);
}

::testing::AssertionResult counters_zero(const cuda::DeviceBuffer& ws, size_t ws_bytes) {
  const size_t n = cuda::split_counter_region_bytes(ws_bytes) / 4;
  const std::vector<uint32_t> counters = to_host<uint32_t>(ws, n);
  for (size_t i = 0; i < n; ++i)
    if (counters[i] != 0)
      return ::testing::AssertionFailure() << "counter " << i << " of " << n << " is " << counters[i];
  return ::testing::AssertionSuccess();
}

// The batch's rows of a launch's output, as floats, for the reference comparison.
Result batch_rows(const Case& c, const std::vector<uint8_t>& bytes) {
  const int64_t real = c.num_tokens(), T = real + c.pad_tokens;
  const int H = c.num_heads(), D = c.head_size;
  Result r;
  for (int64_t i = 0; i < real * H * D; ++i) r.out.push_back(load_as_float(bytes.data(), c.dtype, i));
  const uint8_t* lse = bytes.data() + T * H * D * 2;
  for (int h = 0; h < H; ++h)
    for (int64_t t = 0; t < real; ++t) r.lse.push_back(load_as_float(lse, DType::f32, h * T + t));
  return r;
}

void expect_matches_reference(const Problem& p, const std::vector<uint8_t>& bytes) {
  const Case& c = p.spec();
  const Result ref = p.run_cpu_reference(), got = batch_rows(c, bytes);
  const int64_t T = c.num_tokens();
  const int H = c.num_heads(), D = c.head_size;
  const bool q8 = fp8_wgmma(p.launch_plan(c.num_splits, c.tuning), c.cache_dtype);
  EXPECT_TRUE(outputs_match(c.dtype, got.out, ref.out, {T, H, D}, q8));
  if (c.want_lse) EXPECT_TRUE(lse_match(got.lse, ref.lse, {H, T}, q8));
}

class VarlenSplitReuse : public GpuTest {
 protected:
  // One launch of `p` into `b` over workspace `ws`.
  void launch(const Problem& p, LaunchBuffers& b, const cuda::DeviceBuffer& ws, size_t ws_bytes, bool pdl = true) {
    flash_attn::VarlenArgs a = p.make_args(b.out.get(), p.spec().want_lse ? b.lse.get() : nullptr, ws.get(),
                                           ws_bytes, p.spec().num_splits);
    a.stream = stream_;
    flash_attn::LaunchTuning t = p.spec().tuning;
    t.pdl = pdl;
    flash_attn::run_varlen_attention(a, t);
  }
  // The workspace a launch of case c needs (its padding rows included).
  static size_t workspace_bytes(const Case& c) {
    return flash_attn::varlen_workspace_bytes(c.num_tokens() + c.pad_tokens, c.num_heads(), c.head_size,
                                              c.num_splits);
  }
  cuda::DeviceBuffer fresh_workspace(size_t bytes) {
    cuda::DeviceBuffer ws(std::max<size_t>(bytes, 16));
    poison_device(ws.get(), static_cast<int64_t>(bytes), stream_);
    flash_attn::varlen_workspace_init(ws.get(), bytes, stream_);
    return ws;
  }
};

TEST_F(VarlenSplitReuse, RepeatedLaunchesOnOneWorkspaceGiveIdenticalResults) {
  for (int i = 0; i < 6; ++i) {
    const Case c = split_case(100 + i, i % 2 == 0, i < 2 ? 16 : 3 + i);
    SCOPED_TRACE(c.describe());
    Problem p(c);
    const size_t ws_bytes = workspace_bytes(c);
    const cuda::DeviceBuffer ws = fresh_workspace(ws_bytes);
    LaunchBuffers b(c);
    std::vector<uint8_t> first;
    for (int rep = 0; rep < 5; ++rep) {
      b.poison(stream_);  // every launch must write every batch row again
      launch(p, b, ws, ws_bytes);
      sync();
      const std::vector<uint8_t> got = b.bytes();
      EXPECT_TRUE(counters_zero(ws, ws_bytes)) << "after launch " << rep;
      if (rep == 0) {
        first = got;
        expect_matches_reference(p, got);
      } else {
        EXPECT_TRUE(same_bytes(got, first)) << "launch " << rep << " differs from launch 0";
      }
    }
  }
}

// Launches of different token and split counts share one buffer sized for the largest: no
// launch's partials land on the counters another one uses.
TEST_F(VarlenSplitReuse, ShapesSharingOneWorkspace) {
  Case small = split_case(200, true, 16), large = split_case(201, false, 3);
  large.head_size = small.head_size = 128;
  large.q_lens = {90, 130, 60};
  large.seq_lens = {400, 1200, 60};
  const Problem ps(small), pl(large);
  const size_t ws_bytes = std::max(workspace_bytes(small), workspace_bytes(large));
  const cuda::DeviceBuffer ws = fresh_workspace(ws_bytes);
  LaunchBuffers bs(small), bl(large);
  std::vector<uint8_t> first_small, first_large;
  const bool order[] = {false, true, true, false, true, false, false, true};  // false = the small one
  for (int k = 0; k < 8; ++k) {
    const bool is_large = order[k];
    LaunchBuffers& b = is_large ? bl : bs;
    b.poison(stream_);
    launch(is_large ? pl : ps, b, ws, ws_bytes);
    sync();
    const std::vector<uint8_t> got = b.bytes();
    std::vector<uint8_t>& first = is_large ? first_large : first_small;
    SCOPED_TRACE(std::string(is_large ? "large" : "small") + " launch at step " + std::to_string(k));
    if (first.empty()) {
      first = got;
      expect_matches_reference(is_large ? pl : ps, got);
    } else {
      EXPECT_TRUE(same_bytes(got, first));
    }
    EXPECT_TRUE(counters_zero(ws, ws_bytes));
  }
}

// Two split launches (with PDL) captured in one CUDA graph and replayed: every replay rewrites
// the same bytes the eager launches wrote.
TEST_F(VarlenSplitReuse, CudaGraphCaptureAndReplay) {
  const Case ca = split_case(300, true, 8), cb = split_case(301, false, 4);
  const Problem pa(ca), pb(cb);
  const size_t ws_bytes = std::max(workspace_bytes(ca), workspace_bytes(cb));
  const cuda::DeviceBuffer ws = fresh_workspace(ws_bytes);
  LaunchBuffers ba(ca), bb(cb);
  ba.poison(stream_);
  bb.poison(stream_);
  launch(pa, ba, ws, ws_bytes);
  launch(pb, bb, ws, ws_bytes);
  sync();
  const std::vector<uint8_t> eager_a = ba.bytes(), eager_b = bb.bytes();
  expect_matches_reference(pa, eager_a);
  expect_matches_reference(pb, eager_b);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ATTNKIT_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    launch(pa, ba, ws, ws_bytes);
    launch(pb, bb, ws, ws_bytes);
    launch(pa, ba, ws, ws_bytes);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  ATTNKIT_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  ATTNKIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 4; ++rep) {
    ba.poison(stream_);
    bb.poison(stream_);
    ATTNKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    sync();
    EXPECT_TRUE(same_bytes(ba.bytes(), eager_a)) << "replay " << rep;
    EXPECT_TRUE(same_bytes(bb.bytes(), eager_b)) << "replay " << rep;
    EXPECT_TRUE(counters_zero(ws, ws_bytes)) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// A chain of launches where each one's query is the previous one's output, all sharing one
// workspace: with PDL a launch may start before the previous one finishes, so it must wait for
// its q (read after write) and for the previous launch's merge to read the partials it
// overwrites (write after read). The chain gives the same bytes with PDL on and off.
TEST_F(VarlenSplitReuse, ChainOfDependentLaunchesWithAndWithoutPdl) {
  for (int i = 0; i < 4; ++i) {
    Case c = split_case(400 + i, i % 2 == 0, i < 2 ? 16 : 5);
    c.q_amp = 1.f;
    SCOPED_TRACE(c.describe());
    Problem p(c);
    const int64_t T = c.num_tokens() + c.pad_tokens;
    const int H = c.num_heads(), D = c.head_size;
    const size_t ws_bytes = workspace_bytes(c);
    const cuda::DeviceBuffer ws = fresh_workspace(ws_bytes);
    constexpr int kChain = 4;
    std::vector<std::vector<uint8_t>> results;
    for (bool pdl : {false, true}) {
      std::vector<LaunchBuffers> bufs;
      bufs.reserve(kChain);
      for (int k = 0; k < kChain; ++k) bufs.emplace_back(c);
      for (auto& b : bufs) b.poison(stream_);
      for (int k = 0; k < kChain; ++k) {
        flash_attn::VarlenArgs a = p.make_args(bufs[k].out.get(), c.want_lse ? bufs[k].lse.get() : nullptr,
                                               ws.get(), ws_bytes, c.num_splits);
        if (k > 0) a.q = TensorView(bufs[k - 1].out.get(), c.dtype, {T, H, D}, Device::CUDA);
        a.stream = stream_;
        flash_attn::LaunchTuning t = c.tuning;
        t.pdl = pdl;
        flash_attn::run_varlen_attention(a, t);
      }
      sync();
      std::vector<uint8_t> all;
      for (const auto& b : bufs) {
        const std::vector<uint8_t> one = b.bytes();
        all.insert(all.end(), one.begin(), one.end());
      }
      results.push_back(all);
      if (!pdl) expect_matches_reference(p, bufs[0].bytes());
      EXPECT_TRUE(counters_zero(ws, ws_bytes)) << (pdl ? "with" : "without") << " PDL";
    }
    EXPECT_TRUE(same_bytes(results[1], results[0])) << "PDL changed the chain's results";
  }
}

// ---- the standalone combine kernel against the host merge rule ----------------------------

struct CombineShape {
  int64_t tokens;
  int heads, head_size, splits;
  DType out_dtype;
  bool sinks;
};

class SplitKvCombine : public GpuParamTest<int> {};

TEST_P(SplitKvCombine, MatchesHostMergeRule) {
  const int i = GetParam();
  const int64_t token_choices[] = {1, 5, 37};
  const int head_choices[] = {1, 4}, size_choices[] = {4, 36, 128, 512}, split_choices[] = {2, 3, 7, 16, 33};
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  const CombineShape s{token_choices[i % 3], head_choices[(i / 3) % 2], size_choices[(i / 6) % 4],
                       split_choices[i % 5], dtypes[(i / 5) % 3], i % 2 == 1};
  const int64_t T = s.tokens;
  const int H = s.heads, D = s.head_size, S = s.splits;
  SCOPED_TRACE(std::to_string(T) + " tokens x " + std::to_string(H) + " heads x " + std::to_string(D) + ", " +
               std::to_string(S) + " splits, out " + std::string(dtype_name(s.out_dtype)) +
               (s.sinks ? ", sinks" : ""));
  std::mt19937 rng(i + 1);
  std::uniform_real_distribution<float> u(0.f, 1.f), lse_d(-20.f, 20.f), val(-2.f, 2.f);
  // Partials: some splits empty (-inf, +inf or NaN LSE with NaN values), the rest random.
  std::vector<float> o(static_cast<size_t>(S) * T * H * D), lse(static_cast<size_t>(S) * H * T);
  for (int sp = 0; sp < S; ++sp)
    for (int h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        float& l = lse[(static_cast<size_t>(sp) * H + h) * T + t];
        const float r = u(rng);
        l = r < 0.1f ? -INFINITY : r < 0.15f ? INFINITY : r < 0.2f ? NAN : lse_d(rng);
        float* row = &o[((static_cast<size_t>(sp) * T + t) * H + h) * D];
        for (int d = 0; d < D; ++d) row[d] = std::isfinite(l) ? val(rng) : NAN;
      }
  std::vector<float> sinks(H);
  for (auto& x : sinks) x = u(rng) < 0.25f ? -INFINITY : lse_d(rng);
  const int64_t valid = std::max<int64_t>(1, T - 1);  // the last token is batch padding (unless T = 1)

  // The host rule: merge_weights / merge_value split by split, then the sink.
  std::vector<float> want_out(T * H * D, 0.f), want_lse(H * T);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float acc_lse = -INFINITY;
      std::vector<float> acc(D, 0.f);
      for (int sp = 0; sp < S; ++sp) {
        float wa, wb;
        acc_lse = merge_weights(acc_lse, lse[(static_cast<size_t>(sp) * H + h) * T + t], &wa, &wb);
        const float* row = &o[((static_cast<size_t>(sp) * T + t) * H + h) * D];
        for (int d = 0; d < D; ++d) acc[d] = merge_value(acc[d], wa, row[d], wb);
      }
      if (s.sinks) {
        float wa, wb;
        acc_lse = merge_weights(acc_lse, sinks[h], &wa, &wb);
        for (int d = 0; d < D; ++d) acc[d] = merge_value(acc[d], wa, 0.f, wb);
      }
      for (int d = 0; d < D; ++d) want_out[(t * H + h) * D + d] = acc[d];
      want_lse[h * T + t] = acc_lse;
    }

  const size_t ws_bytes = cuda::split_workspace_bytes(T, H, D, S);
  cuda::DeviceBuffer ws(ws_bytes);
  const cuda::SplitPartials parts = cuda::split_partials_in(ws.get(), ws_bytes, T, H, D, S);
  ATTNKIT_CUDA_CHECK(cudaMemcpy(parts.o, o.data(), o.size() * 4, cudaMemcpyHostToDevice));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(parts.lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  const size_t esize = dtype_size(s.out_dtype);
  cuda::DeviceBuffer out(T * H * D * esize), out_lse(H * T * 4), d_sinks = to_device(sinks);
  const cuda::DeviceBuffer d_valid = to_device(std::vector<int32_t>{static_cast<int32_t>(valid)});
  poison_device(out.get(), T * H * D * static_cast<int64_t>(esize), stream_);
  poison_device(out_lse.get(), H * T * 4, stream_);
  cuda::CombineTarget target;
  target.out = out.get();
  target.out_dtype = s.out_dtype;
  target.out_stride_token = H * D;
  target.out_stride_head = D;
  target.lse = out_lse.as<float>();
  target.lse_stride_head = T;
  target.lse_stride_token = 1;
  target.sinks = s.sinks ? d_sinks.as<float>() : nullptr;
  target.valid_tokens = d_valid.as<int32_t>();
  cuda::launch_split_kv_combine(parts, target, stream_);
  sync();

  const std::vector<uint8_t> raw = to_host<uint8_t>(out, T * H * D * esize);
  const std::vector<float> got_lse_all = to_host<float>(out_lse, H * T);
  std::vector<float> got_out, exp_out, got_lse, exp_lse;
  for (int64_t i2 = 0; i2 < valid * H * D; ++i2) {
    got_out.push_back(load_as_float(raw.data(), s.out_dtype, i2));
    // The expected value as the output dtype stores it.
    std::vector<uint8_t> one(esize);
    store_from_float(one.data(), s.out_dtype, 0, want_out[i2]);
    exp_out.push_back(load_as_float(one.data(), s.out_dtype, 0));
  }
  for (int h = 0; h < H; ++h)
    for (int64_t t = 0; t < valid; ++t) {
      got_lse.push_back(got_lse_all[h * T + t]);
      exp_lse.push_back(want_lse[h * T + t]);
    }
  // All parts at once vs split by split: the weights differ by a few ulps.
  const double tol = s.out_dtype == DType::f32 ? 2e-5 : s.out_dtype == DType::bf16 ? 8e-3 : 1e-3;
  EXPECT_TRUE(all_close(got_out, exp_out, {valid, H, D}, tol, tol));
  EXPECT_TRUE(all_close(got_lse, exp_lse, {H, valid}, 1e-5, 1e-5));
  // Padding tokens keep their poison.
  for (int64_t i2 = valid * H * D * static_cast<int64_t>(esize); i2 < static_cast<int64_t>(raw.size()); ++i2)
    ASSERT_EQ(raw[i2], 0xff) << "padding byte " << i2 << " written";
  for (int h = 0; h < H; ++h)
    for (int64_t t = valid; t < T; ++t) ASSERT_TRUE(std::isnan(got_lse_all[h * T + t])) << "padding LSE written";
}

INSTANTIATE_TEST_SUITE_P(Shapes, SplitKvCombine, ::testing::Range(0, 60));

}  // namespace
}  // namespace attnkit::test
