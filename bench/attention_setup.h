// Paged-cache batches for the attention benchmarks: uniform requests whose blocks are spread
// over a cache pool in shuffled order, with the device arrays run_varlen_attention reads.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "attnkit/kv_cache.h"
#include "cuda/device_buffer.h"
#include "flash_attn/varlen_launch.h"
#include "flashinfer/gpu_planned.h"

namespace attnkit::bench {

struct UniformBatch {
  int num_reqs = 0, q_len = 0, kv_len = 0;
  int blocks_per_req = 0;
  cuda::DeviceBuffer cu_seqlens_q, seqused_k, block_table;
};

// Builds the metadata of num_reqs requests (q_len new tokens each, kv_len keys) whose blocks
// are the pool blocks [first_block, first_block + num_reqs * blocks_per_req) in shuffled order.
UniformBatch make_uniform_batch(int num_reqs, int q_len, int kv_len, int block_size,
                                int64_t first_block, uint64_t seed, cudaStream_t stream);

// A dense cache pool of `spec` over `storage` (device memory of spec.total_bytes()).
PagedKV pool_view(const KVCacheSpec& spec, void* storage);

// A split-KV workspace of at least `bytes` (>= 16) with its counters zeroed on `stream`
// (the varlen_launch.h contract): ready for any number of launches that fit it.
cuda::DeviceBuffer split_workspace(size_t bytes, cudaStream_t stream);

// The launch for one batch (split-KV off unless num_splits > 1 with its workspace).
flash_attn::VarlenArgs varlen_args(const UniformBatch& b, const PagedKV& cache, void* q, void* out,
                                   int num_heads, int head_size, bool causal, cudaStream_t stream);

// Per-call time of `calls` back-to-back run_varlen_attention launches rotating over `args`,
// captured as one CUDA graph (eager launches if the capture fails), median of 5 samples.
struct GraphTiming {
  double ms_per_call = 0;
  bool graph = true;
};
// tunings: call i's is tunings[i % size] (none: the defaults).
GraphTiming time_rotating(const std::vector<flash_attn::VarlenArgs>& args, int calls, cudaStream_t stream,
                          const std::vector<flash_attn::LaunchTuning>& tunings = {});

// Per-call times of several launches (`calls` calls rotating over `args`, one CUDA graph each),
// replayed in turns: `reps` rounds, each round one replay of every launch, starting one launch
// later than the round before; medians. The SM clock drifts along a run (power cap; fp8 decode
// follows it, bf16 barely): sampled in turns, every launch sees the same drift, where one block
// of samples per launch let the earlier ones run at higher clocks. Throws when a capture fails.
struct TimedLaunch {
  std::vector<flash_attn::VarlenArgs> args;
  int calls = 1;
  flash_attn::LaunchTuning tuning = {};  // (tests and A/B rows: launch_plan.h)
  // Set: call i enqueues this (i in [0, calls)) instead of run_varlen_attention(args[i % n]).
  std::function<void(int)> call;
};
std::vector<double> time_interleaved(const std::vector<TimedLaunch>& launches, cudaStream_t stream, int reps = 9);

// One decode shape of the decode bench and the split sweep (one new token per request): a
// cache pool of `cache_dtype` over `pool` and the rotation over KV instances it holds.
KVCacheSpec decode_pool_spec(DType cache_dtype, int64_t pool_bytes, int block_size, int num_kv_heads,
                             int head_size);

// The device buffers of a decode section: a cache pool of min(max_pool, free - keep_free) bytes
// (pool_bytes <= 0 and nothing allocated when the device lacks the memory), bf16 q (random) /
// out for max_batch one-token requests of num_heads x head_size, and the fp8 dequant scale
// (1/16, device f32 [1]).
struct DecodeBuffers {
  int64_t pool_bytes = 0;
  cuda::DeviceBuffer pool, q, out, scale;
};
DecodeBuffers make_decode_buffers(int64_t max_pool, int64_t keep_free, int max_batch, int num_heads, int head_size,
                                  cudaStream_t stream);

struct DecodeShape {
  std::vector<std::unique_ptr<UniformBatch>> instances;
  std::vector<flash_attn::VarlenArgs> args;  // one per instance; num_splits 1, no workspace yet
  int calls = 0;          // graph length: >= every instance once and >= ~4 ms of work
  double kv_bytes = 0;    // K/V bytes one call reads
  double bytes = 0;       // K/V + q + out bytes one call moves
};
// batch x kv_len over the pool `cache` (from decode_pool_spec), rotating over enough distinct
// instances to exceed the L2 8x. fp8_scale: device f32 [1] for fp8 caches (else nullptr).
// Throws std::runtime_error when the pool cannot hold one instance.
DecodeShape make_decode_shape(int batch, int kv_len, const KVCacheSpec& spec, const PagedKV& cache,
                              void* q, void* out, const float* fp8_scale, int num_heads, size_t l2_bytes,
                              cudaStream_t stream);

// The split-KV count the FlashAttention-style builder chooses for a uniform batch on the
// current device.
int builder_num_splits(int num_reqs, int q_len, int kv_len, int num_heads, int num_kv_heads,
                       DType cache_dtype, int sm_count, int head_size = 128);

// The tensor-core plan configuration of the FlashInfer-style parts the benches time (the
// current device's CTA slots).
flashinfer::PlanConfig planned_config(int num_kv_heads, int group_size, int head_size, int page_size);

// A batch as a FlashInfer-style planned part (src/flashinfer/gpu_planned.h): its lengths read
// back from the device arrays the FlashAttention-style launch `a` reads, its block table as the
// page table (ragged: K/V rows through the contiguous view's page table, flashinfer::
// ragged_pages), planned by plan_batch for this batch's capacity and uploaded on `stream`;
// run() launches it with a's tensors and the given workspace.
struct PlannedPart {
  std::vector<int32_t> qo, kv;
  flashinfer::PageTable pages;
  flashinfer::PlanBuffers plan;
  flashinfer::PlanBatch batch;
  cuda::DeviceBuffer plan_copy;  // the device copy's memory (the caller's: DevicePlan allocates none)
  std::unique_ptr<flashinfer::DevicePlan> dev;
  flashinfer::PlannedPartArgs args;
  void run() const { flashinfer::run_planned_part(*dev, plan, pages, batch, args); }
};
std::unique_ptr<PlannedPart> plan_part(const UniformBatch& b, const flash_attn::VarlenArgs& a, int page, bool ragged,
                                       const cuda::DeviceBuffer& workspace, cudaStream_t stream);

// Per-call times of eager calls (no CUDA graph: each call's host work and launch latency
// included), the launches in turns: a warm-up call of each, then `reps` rounds of `calls` calls
// (call i of launch c: calls_of[c](i)) of each launch; medians.
std::vector<double> eager_in_turns(const std::vector<std::function<void(int)>>& calls_of, int calls,
                                   cudaStream_t stream, int reps = 9);

}  // namespace attnkit::bench
