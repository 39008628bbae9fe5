// The seam between the FlashAttention-style backend's host side (builder, impl) and its CUDA
// kernels: one plain-data description of a varlen paged attention launch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"
#include "flash_attn/generation.h"
#include "flash_attn/launch_plan.h"

namespace attnkit::flash_attn {

struct VarlenArgs {
  TensorView q;    // [num_tokens, num_heads, head_size], CUDA, f16/bf16
  // CUDA. Paged (block_table), or contiguous K/V (cu_seqlens_k): then the view of
  // contiguous_kv_view over k / v [total_k, num_kv_heads, head_size].
  PagedKV cache;
  TensorView out;  // [num_tokens, num_heads, head_size], dtype of q
  // Device arrays (int32): cu_seqlens_q [num_reqs+1], seqused_k [num_reqs],
  // block_table [num_reqs, max_blocks_per_req]; or, for contiguous K/V, cu_seqlens_k
  // [num_reqs + 1] (request r's keys are rows cu_seqlens_k[r] .. + seqused_k[r] - 1; seqused_k
  // stays required) and no block table.
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* seqused_k = nullptr;
  const int32_t* block_table = nullptr;
  int max_blocks_per_req = 0;
  int num_reqs = 0;
  int max_query_len = 0;
  int max_seq_len = 0;
  int num_heads = 0;
  AttentionParams params;  // device tensors (alibi, sinks, k/v scales, lse)
  // Ahead-of-time split-KV decision from the builder: 1 = no split. With > 1 the launch
  // writes partials into `workspace` and the last split CTA of each work item merges them
  // (one kernel, no separate combine launch). See the workspace contract below.
  int num_splits = 1;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // the buffer's size: the same value on every launch that shares it
  void* stream = nullptr;  // cudaStream_t
  // Preferred kernel generation: hopper where its kernel serves the launch (choose_launch,
  // launch_plan.h), else mma_sync; mma_sync: the mma_sync kernels only.
  Generation generation = Generation::hopper;
};

// Split-KV workspace contract (layout: cuda/split_workspace.h).
//  * Size: at least varlen_workspace_bytes(num_tokens, num_heads, head_size, num_splits) bytes,
//    16-byte aligned. Any larger buffer fits too; one buffer sized for the largest launch
//    serves every smaller one (fewer tokens or splits).
//  * Its first bytes hold completion counters whose extent depends only on workspace_bytes.
//    They must be zero before the first split launch on the buffer: call varlen_workspace_init
//    once after allocating it (stream-ordered before the launch). Every launch leaves them zero
//    again, so eager calls and CUDA-graph replays need no further initialisation, as long as
//    every launch on the buffer passes the same workspace_bytes.
//  * The partials need no initialisation; one buffer must not serve two launches at once.
size_t varlen_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits);

// Zeroes the counter region of a workspace of `bytes` bytes (cudaMemsetAsync on `stream`, a
// cudaStream_t; capturable in a CUDA graph). A null workspace with 0 bytes is a no-op. Throws
// Error on a CUDA failure; a build without CUDA throws.
void varlen_workspace_init(void* workspace, size_t bytes, void* stream);

// The cache view of contiguous K/V rows k / v [total_k, num_kv_heads, head_size] (last dim
// contiguous, any row and head strides) that VarlenArgs::cache takes with cu_seqlens_k: 16-row
// "blocks" starting at every row (cuda/paged_kv_tile.h KvPages), no copy.
PagedKV contiguous_kv_view(const TensorView& k, const TensorView& v);

// The facts choose_launch decides this launch by (the current device's, and whether the cache's
// sides encode as TMA maps). Validates what it reads. Throws Error; a build without CUDA throws.
LaunchFacts varlen_launch_facts(const VarlenArgs& args);

// Validated by the caller (the impl); launches on args.stream the plan choose_launch makes for
// it (tuning: tests and the benchmark only). Throws Error on a CUDA failure or a configuration
// no compiled kernel serves. In a build without CUDA it throws.
void run_varlen_attention(const VarlenArgs& args, const LaunchTuning& tuning = {});

// A planned launch (the FlashInfer-style backend's parts, src/flashinfer/gpu_planned.h): the
// args' batch is a planned part whose block_table is the page table's indices (request r's
// pages from page_indptr[r]); the work comes from the plan's items instead of the grid. Device
// arrays: items (7 int32 per item: plan.h WorkItem), num_items (the plan's count, read by the
// kernel), page_indptr [num_reqs + 1]; part_o / part_lse: the split tiles' partial rows
// (PlanBuffers::workspace_bytes), merged afterwards by the caller (cuda/plan_merge.h).
struct PlannedLaunch {
  const int32_t* items = nullptr;
  const int32_t* num_items = nullptr;
  int64_t grid_items = 0;     // item slots the grid covers per KV head: the plan's count, or its capacity (graph-safe: any plan of it fits)
  int64_t planned_items = 0;  // the current plan's count (the launch decision reads it)
  int tile_q = 0;             // the plan's query tile (16 / 64 / 128 packed rows; the decode tile up to 16)
  const int32_t* page_indptr = nullptr;
  float* part_o = nullptr;
  float* part_lse = nullptr;
};

// Launches the planned part on args.stream (args.num_splits must be 1, no split workspace): the
// tile choose_launch picks (LaunchFacts::planned_items, plan_tile_q: the decode tile, the
// hopper kernel for 128-row prefill plans where it serves, else the mma_sync prefill tile), head
// dims kPlannedHeadDims.
// Throws Error; a build without CUDA throws.
void run_planned_attention(const VarlenArgs& args, const PlannedLaunch& planned, const LaunchTuning& tuning = {});

// True when this build compiled the hopper kernels (sm_90a among its CUDA architectures) and
// the current device is sm90.
bool hopper_kernels_available();

}  // namespace attnkit::flash_attn
