// Split-KV sweep (attnkit_bench --split-sweep, not part of the default run): decode shapes
// (bf16 and fp8 e4m3 caches; batch 1, 4, 16, 64; KV 4k, 8k, 32k; 32/8 heads, head size 128,
// block 16) timed at forced split counts, with the same method as the decode section (a CUDA
// graph of back-to-back calls rotating over KV instances >= 8x the L2). Counts that leave a
// split under kMinKVPerSplit tokens are skipped. Prints one table: shape x splits -> us and %
// of the read-only ceiling; "rule" is decide_num_splits' count, "best" the fastest measured.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "attention_setup.h"
#include "bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"
#include "flash_attn/split_kv.h"

namespace attnkit::bench {

namespace {

constexpr int kHeads = 32, kKvHeads = 8, kHeadSize = 128, kBlock = 16;
const std::vector<int> kSplitCounts = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};

int rule_splits(int num_reqs, int kv_len, DType cache_dtype, int sm_count) {
  std::vector<int32_t> qsl(num_reqs + 1), seq(num_reqs, kv_len);
  for (int i = 0; i <= num_reqs; ++i) qsl[i] = i;
  flash_attn::SplitKVInput in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.num_heads = kHeads;
  in.num_kv_heads = kKvHeads;
  in.num_sms = sm_count;
  in.cache_dtype = cache_dtype;
  return flash_attn::decide_num_splits(in).num_splits;
}

}  // namespace

void run_split_sweep(Recorder& rec, cudaStream_t stream, double read_gbps) {
  const auto& props = cuda::current_device_props();
  size_t free_bytes = 0, total_bytes = 0;
  ATTNKIT_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  // The largest shape (64 x 32k bf16) is 8.6 GB; 12 GB also holds the smaller rotations.
  const int64_t pool_bytes = std::min<int64_t>(int64_t{12} << 30, static_cast<int64_t>(free_bytes) - (int64_t{4} << 30));
  if (pool_bytes <= 0) {
    rec.fail("sweep", "split sweep pool", "not enough free device memory");
    return;
  }
  cuda::DeviceBuffer pool(pool_bytes);
  const int64_t qo_bytes = int64_t{64} * kHeads * kHeadSize * 2;
  cuda::DeviceBuffer q(qo_bytes), out(qo_bytes), scale(4);
  fill_random(q.get(), qo_bytes / 2, DType::bf16, 31, stream);
  const float kv_scale = 1.f / 16;
  ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(scale.get(), &kv_scale, 4, cudaMemcpyHostToDevice, stream));
  cuda::DeviceBuffer workspace(flash_attn::varlen_workspace_bytes(64, kHeads, kHeadSize, kSplitCounts.back()));

  std::printf("\nsplit sweep: us per call / %% of read BW (%.0f GB/s); '-' = split under %d KV tokens\n", read_gbps,
              flash_attn::kMinKVPerSplit);
  std::printf("%-16s %4s %4s", "shape", "rule", "best");
  for (int s : kSplitCounts) std::printf(" %11d", s);
  std::printf("\n");
  for (DType cd : {DType::bf16, DType::fp8_e4m3}) {
    KVCacheSpec spec;
    spec.block_size = kBlock;
    spec.num_kv_heads = kKvHeads;
    spec.head_size = kHeadSize;
    spec.cache_dtype = cd;
    spec.num_blocks = pool_bytes / (2 * kBlock * kKvHeads * kHeadSize * static_cast<int64_t>(dtype_size(cd)));
    fill_random(pool.get(), spec.total_bytes() / static_cast<int64_t>(dtype_size(cd)), cd, 41, stream);
    const PagedKV cache = pool_view(spec, pool.get());
    for (int B : {1, 4, 16, 64})
      for (int L : {4096, 8192, 32768}) {
        char shape[64];
        std::snprintf(shape, sizeof shape, "%s b%d kv%dk", cd == DType::bf16 ? "bf16" : "fp8", B, L / 1024);
        try {
          const int64_t blocks_per_inst = int64_t{B} * ((L + kBlock - 1) / kBlock);
          const double kv_bytes = double(B) * L * kKvHeads * kHeadSize * 2 * dtype_size(cd);
          const double bytes = kv_bytes + 2.0 * B * kHeads * kHeadSize * 2;
          const int64_t fit = spec.num_blocks / blocks_per_inst;
          if (fit < 1) {
            rec.fail("sweep", shape, "pool too small for one instance");
            continue;
          }
          const int64_t rot = std::min<int64_t>(fit, std::max<int64_t>(1, std::llround(std::ceil(8.0 * props.l2_bytes / kv_bytes))));
          const double est_ms = bytes / 4.0e9 + 0.005;
          const int calls = static_cast<int>(std::clamp<int64_t>(std::max<int64_t>(rot, std::llround(std::ceil(4.0 / est_ms))), 3, 512));
          std::vector<std::unique_ptr<UniformBatch>> inst;
          std::vector<flash_attn::VarlenArgs> args;
          for (int64_t r = 0; r < std::min<int64_t>(rot, calls); ++r) {
            inst.push_back(std::make_unique<UniformBatch>(make_uniform_batch(B, 1, L, kBlock, r * blocks_per_inst, 1000 + r, stream)));
            flash_attn::VarlenArgs a = varlen_args(*inst.back(), cache, q.get(), out.get(), kHeads, kHeadSize, true, stream);
            if (cd != DType::bf16) {
              a.params.k_scale = TensorView(scale.get(), DType::f32, {1}, Device::CUDA);
              a.params.v_scale = TensorView(scale.get(), DType::f32, {1}, Device::CUDA);
            }
            a.workspace = workspace.get();
            a.workspace_bytes = workspace.bytes();
            args.push_back(a);
          }
          std::vector<double> us(kSplitCounts.size(), 0);
          int best = 1;
          double best_us = 1e30;
          for (size_t i = 0; i < kSplitCounts.size(); ++i) {
            const int s = kSplitCounts[i];
            if (s > 1 && L / s < flash_attn::kMinKVPerSplit) continue;
            for (auto& a : args) a.num_splits = s;
            us[i] = time_rotating(args, calls, stream).ms_per_call * 1e3;
            if (us[i] < best_us) best_us = us[i], best = s;
          }
          std::printf("%-16s %4d %4d", shape, rule_splits(B, L, cd, props.sm_count), best);
          for (double u : us) {
            if (u == 0) {
              std::printf(" %11s", "-");
            } else {
              const double pct = read_gbps > 0 ? 100.0 * bytes / u / 1e3 / read_gbps : 0.0;
              std::printf(" %6.1f/%3.0f%%", u, pct);
            }
          }
          std::printf("\n");
          std::fflush(stdout);
        } catch (const std::exception& e) {
          rec.fail("sweep", shape, e.what());
          cudaGetLastError();
        }
      }
  }
}

}  // namespace attnkit::bench
