// Split-KV sweep (attnkit_bench --split-sweep, not part of the default run): decode shapes
// (bf16 and fp8 e4m3 caches; batch 1, 4, 16, 64 at KV 4k, 8k, 32k, batch 128, 256 at 4k, 8k; 32/8 heads, head size 128,
// block 16) timed at forced split counts, with the same method as the decode section (a CUDA
// graph of back-to-back calls rotating over KV instances >= 8x the L2). Counts that leave a
// split under kMinKVPerSplit tokens are skipped. Prints one table: shape x splits -> us and %
// of the read-only ceiling; "rule" is decide_num_splits' count, "best" the fastest measured.
// BENCH_MATCH / --match selects shapes by name (e.g. "bf16 b16 kv4k|fp8 b64").
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

}  // namespace

void run_split_sweep(Recorder& rec, cudaStream_t stream, double read_gbps) {
  const auto& props = cuda::current_device_props();
  // The largest shape (64 x 32k bf16) is 8.6 GB; 12 GB also holds the smaller rotations.
  constexpr int kMaxBatch = 256;
  DecodeBuffers buf = make_decode_buffers(int64_t{12} << 30, int64_t{4} << 30, kMaxBatch, kHeads, kHeadSize, stream);
  if (buf.pool_bytes <= 0) {
    rec.fail("sweep", "split sweep pool", "not enough free device memory");
    return;
  }
  // One workspace for every shape and split count of the sweep (its counters zeroed once).
  cuda::DeviceBuffer workspace = split_workspace(flash_attn::varlen_workspace_bytes(kMaxBatch, kHeads, kHeadSize, kSplitCounts.back()), stream);

  std::printf("\nsplit sweep: us per call / %% of read BW (%.0f GB/s); '-' = split under %d KV tokens\n", read_gbps,
              flash_attn::kMinKVPerSplit);
  std::printf("%-16s %4s %4s", "shape", "rule", "best");
  for (int s : kSplitCounts) std::printf(" %11d", s);
  std::printf("\n");
  for (DType cd : {DType::bf16, DType::fp8_e4m3}) {
    const KVCacheSpec spec = decode_pool_spec(cd, buf.pool_bytes, kBlock, kKvHeads, kHeadSize);
    fill_random(buf.pool.get(), spec.total_bytes() / static_cast<int64_t>(dtype_size(cd)), cd, 41, stream);
    const PagedKV cache = pool_view(spec, buf.pool.get());
    for (int B : {1, 4, 16, 64, 128, 256})
      for (int L : {4096, 8192, 32768}) {
        if (B >= 128 && L > 8192) continue;  // (the 12 GB pool; batch 128 / 256 are multi-wave shapes)
        char shape_name[64];
        std::snprintf(shape_name, sizeof shape_name, "%s b%d kv%dk", cd == DType::bf16 ? "bf16" : "fp8", B, L / 1024);
        if (!key_selected(shape_name)) continue;
        try {
          DecodeShape shape = make_decode_shape(B, L, spec, cache, buf.q.get(), buf.out.get(),
                                                cd == DType::bf16 ? nullptr : buf.scale.as<float>(), kHeads,
                                                props.l2_bytes, stream);
          auto& args = shape.args;
          const int calls = shape.calls;
          const double bytes = shape.bytes;
          for (auto& a : args) {
            a.workspace = workspace.get();
            a.workspace_bytes = workspace.bytes();
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
          std::printf("%-16s %4d %4d", shape_name, builder_num_splits(B, 1, L, kHeads, kKvHeads, cd, props.sm_count), best);
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
          rec.fail("sweep", shape_name, e.what());
          cudaGetLastError();
        }
      }
  }
}

}  // namespace attnkit::bench
