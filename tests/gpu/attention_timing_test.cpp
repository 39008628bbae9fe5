// Quick timings of the varlen kernel for the kernel author (the benchmarks in bench/ are the
// reference numbers). Disabled by default; run with
//   attnkit_gpu_tests --gtest_also_run_disabled_tests --gtest_filter='*Timing*'
// Each case times back-to-back launches captured in a CUDA graph with CUDA events (median of
// several replays) and rotates over enough distinct caches to exceed the L2 for memory-bound
// (decode) shapes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "attention_case.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "device_fill.h"
#include "flash_attn/split_kv.h"

namespace attnkit::test {
namespace {

struct Timed {
  double ms;
};

using Launch = std::function<void(const flash_attn::VarlenArgs&)>;

// Median over `reps` batches of `iters` launches; launches rotate over the problems. (Tile
// alternatives are compared by the benchmark's A/B rows: bench/decode.cpp, LaunchTuning.)
Timed time_launches(const std::vector<const Problem*>& problems, int splits, int iters, int reps,
                    const Launch& launch = [](const flash_attn::VarlenArgs& a) { flash_attn::run_varlen_attention(a); }) {
  const Case& c = problems[0]->spec();
  const int64_t T = c.num_tokens();
  const int H = c.num_heads(), D = c.head_size;
  cuda::DeviceBuffer out(T * H * D * 2), lse(T * H * 4);
  const size_t ws_bytes = flash_attn::varlen_workspace_bytes(T, H, D, splits);
  cuda::DeviceBuffer ws(std::max<size_t>(ws_bytes, 16));
  std::vector<flash_attn::VarlenArgs> args;
  cudaStream_t stream;
  ATTNKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  flash_attn::varlen_workspace_init(ws_bytes ? ws.get() : nullptr, ws_bytes, stream);
  for (const Problem* p : problems) {
    args.push_back(p->make_args(out.get(), lse.get(), ws_bytes ? ws.get() : nullptr, ws_bytes, splits));
    args.back().stream = stream;
  }
  for (int i = 0; i < 3; ++i) launch(args[i % args.size()]);
  // Back-to-back launches captured in a CUDA graph, so launch gaps stay out of the numbers.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNKIT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) launch(args[i % args.size()]);
  ATTNKIT_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNKIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  ATTNKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t a, b;
  ATTNKIT_CUDA_CHECK(cudaEventCreate(&a));
  ATTNKIT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    ATTNKIT_CUDA_CHECK(cudaEventRecord(a, stream));
    ATTNKIT_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ATTNKIT_CUDA_CHECK(cudaEventRecord(b, stream));
    ATTNKIT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    ATTNKIT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2]};
}

Case timing_case(int head_size, DType cache, bool causal, std::vector<int> q, std::vector<int> seq) {
  Case c;
  c.dtype = DType::bf16;
  c.cache_dtype = cache;
  c.head_size = head_size;
  c.num_kv_heads = 8;
  c.group = 4;
  c.block_size = 16;
  c.causal = causal;
  c.q_lens = std::move(q);
  c.seq_lens = std::move(seq);
  return c;
}

void prefill(int head_size, bool causal, int seqlen) {
  const int reqs = 16384 / seqlen;
  Case c = timing_case(head_size, DType::bf16, causal, std::vector<int>(reqs, seqlen), std::vector<int>(reqs, seqlen));
  Problem p(c);
  const Timed t = time_launches({&p}, 1, 5, 5);
  const double pairs = causal ? reqs * (double(seqlen) * (seqlen + 1) / 2) : reqs * double(seqlen) * seqlen;
  const double flops = 4.0 * pairs * c.num_heads() * head_size;
  std::printf("TIMING prefill bf16 hd%d %s %dx%d, 32/8 heads, block 16: %.3f ms, %.1f TFLOP/s\n", head_size,
              causal ? "causal" : "full", reqs, seqlen, t.ms, flops / t.ms * 1e-9);
}

std::vector<std::unique_ptr<Problem>> decode_problems(int batch, int kv, DType cache, double& bytes_one) {
  // Enough distinct problems that the rotation's data exceeds the 60 MB L2 several times.
  bytes_one = double(batch) * kv * 8 * 128 * 2 * (is_fp8(cache) ? 1 : 2);
  const int copies = std::max(1, std::min(8, static_cast<int>(std::ceil(240e6 / bytes_one))));
  std::vector<std::unique_ptr<Problem>> ps;
  for (int i = 0; i < copies; ++i) {
    Case c = timing_case(128, cache, true, std::vector<int>(batch, 1), std::vector<int>(batch, kv));
    c.seed = 100 + i;
    ps.push_back(std::make_unique<Problem>(c));
  }
  return ps;
}

std::vector<const Problem*> raw(const std::vector<std::unique_ptr<Problem>>& ps) {
  std::vector<const Problem*> r;
  for (const auto& p : ps) r.push_back(p.get());
  return r;
}

void decode(int batch, int kv, DType cache, int splits) {
  double bytes = 0;
  const auto ps = decode_problems(batch, kv, cache, bytes);
  const Timed t = time_launches(raw(ps), splits, 20, 5);
  std::printf("TIMING decode %s batch %d kv %d, 32/8 heads hd128 block 16, splits %d: %.1f us, %.0f GB/s\n",
              dtype_name(cache).data(), batch, kv, splits, t.ms * 1e3, bytes / t.ms * 1e-6);
}

// The builder's split count (split_kv.h) for a decode batch of the timing shapes (32/8 heads).
int builder_splits(int batch, int kv, DType cache_dtype = DType::bf16) {
  int dev = 0, sms = 0;
  ATTNKIT_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  flash_attn::SplitKVInput in;
  in.num_heads = 32;
  in.num_kv_heads = 8;
  in.num_sms = sms;
  in.cache_dtype = cache_dtype;
  in.head_size = 128;
  in.cc_major = cuda::current_device_props().cc_major;
  in.hopper_kernels = flash_attn::hopper_kernels_available();
  return flash_attn::decide_num_splits_uniform(batch, 1, kv, in).num_splits;
}

TEST(DISABLED_VarlenTiming, Prefill) {
  prefill(128, true, 16384);
  prefill(128, false, 16384);
  prefill(128, true, 2048);
  prefill(64, true, 16384);
  prefill(256, true, 16384);
}

TEST(DISABLED_VarlenTiming, Decode) {
  decode(64, 8192, DType::bf16, 1);
  decode(64, 8192, DType::fp8_e4m3, 1);
  const int h = builder_splits(16, 4096), one = builder_splits(1, 32768);
  decode(16, 4096, DType::bf16, h);
  decode(16, 4096, DType::fp8_e4m3, builder_splits(16, 4096, DType::fp8_e4m3));
  decode(1, 32768, DType::bf16, one);
  decode(1, 32768, DType::fp8_e4m3, builder_splits(1, 32768, DType::fp8_e4m3));
  decode(1, 32768, DType::bf16, 12);
  decode(1, 32768, DType::bf16, 16);
  decode(1, 32768, DType::bf16, 24);
  decode(128, 4096, DType::bf16, 1);
  decode(128, 4096, DType::fp8_e4m3, 1);
}

}  // namespace
}  // namespace attnkit::test
