// What the varlen attention kernels read: VarlenArgs resolved into plain device-side data
// (pointers, strides in elements of each tensor's storage type, resolved scale and flags).
#pragma once
#include <cstdint>

#include "cuda/fast_divmod.h"
#include "cuda/split_kv_combine.h"
#include "cuda/device_errors.h"
#include "cuda/tma_sm90.h"

namespace attnkit::flash_attn {

struct VarlenKernelParams {
  // q / out: [num_tokens, num_heads, head_size], last dim contiguous. head_size <= the kernel's
  // head dim (tile_set.h kernel_head_dim): loads zero-fill columns past it, stores skip them.
  int head_size = 0;
  int kv_row_bytes = 0;  // bytes of head_size values in the cache (a multiple of 16)
  const void* q = nullptr;
  int64_t q_stride_token = 0, q_stride_head = 0;
  void* out = nullptr;
  int64_t out_stride_token = 0, out_stride_head = 0;
  int64_t num_tokens = 0;

  // Paged cache sides; byte strides (the host checks they fit 32 bits).
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  int32_t k_stride_block = 0, k_stride_slot = 0, k_stride_head = 0;
  int32_t v_stride_block = 0, v_stride_slot = 0, v_stride_head = 0;
  cuda::FastDivmod block_size;
  int64_t num_blocks = 0;  // blocks in the cache (bounds the early L2 prefetch's page ids)
  int fp8_format = 0;  // cuda::Fp8Format for fp8 caches
  // NVFP4 caches (planned launches): each side's block scales, one e4m3 byte per 16 values in rows
  // of head_size / 16 bytes (KVCacheSpec::view); byte strides. The global scales are k_scale /
  // v_scale below ([1]).
  const void* k_block_scales = nullptr;
  const void* v_block_scales = nullptr;
  int32_t k_bscale_stride_block = 0, k_bscale_stride_slot = 0, k_bscale_stride_head = 0;
  int32_t v_bscale_stride_block = 0, v_bscale_stride_slot = 0, v_bscale_stride_head = 0;

  // Batch: cu_seqlens_q [num_reqs + 1], seqused_k [num_reqs], block_table [num_reqs, max_blocks].
  // Contiguous K/V (cu_seqlens_k [num_reqs + 1] set, no block table): request r's keys are rows
  // cu_seqlens_k[r] .. of the cache view, whose "blocks" are 16 rows starting at every row.
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* seqused_k = nullptr;
  const int32_t* block_table = nullptr;
  int max_blocks_per_req = 0;
  int num_reqs = 0;
  int num_heads = 0, num_kv_heads = 0;
  cuda::FastDivmod group;  // num_heads / num_kv_heads: packed row m is token m / group, head m % group of the KV head's

  // Semantics (docs/architecture.md section 4).
  float scale = 1.f;  // resolved softmax scale
  bool causal = true;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  const float* alibi_slopes = nullptr;  // [num_heads] or [num_reqs, num_heads]
  int64_t alibi_stride = 1;             // between heads
  int64_t alibi_req_stride = 0;         // between requests (0: one row for every request)
  const float* sinks = nullptr;  // [num_heads]
  int64_t sinks_stride = 1;
  // fp8 dequant scales / NVFP4 global scales: [1] (stride 0 used) or [num_kv_heads]; nullptr = 1.
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t k_scale_stride = 0, v_scale_stride = 0;

  // Optional LSE output (natural log), [num_heads, num_tokens].
  float* lse = nullptr;
  int64_t lse_stride_head = 0, lse_stride_token = 0;

  // Split-KV: with num_splits > 1 every CTA writes partials instead of out / lse, and the last
  // CTA of each work item to finish merges them into out / lse (counters in the workspace).
  int num_splits = 1;
  cuda::SplitPartials partials;
  // Set by the launcher from the LaunchPlan (launch_plan.h):
  // the launch is a grid of clusters of num_splits CTAs (one work item's splits) that merge
  // through distributed shared memory; `partials` is then not touched (LaunchPlan::cluster_merge).
  bool cluster_merge = false;
  // with programmatic dependent launch, before waiting for the previous kernel, each CTA of
  // the mma_sync kernel asks L2 for its work item's first K/V tiles (LaunchPlan::l2_prefetch).
  bool l2_prefetch = false;
  // ... only CTAs whose linear block index is below this (set by the launcher: the first wave,
  // CTAs per SM x SMs). Later CTAs start after the previous kernel is done; for them the
  // prefetch would only delay their first loads.
  int64_t l2_prefetch_ctas = 0;

  // Set by the launcher for TMA stage fills (decode tiles, sm90; cuda/tensor_map.h): tensor maps
  // of the K and V sides. Unused otherwise.
  cuda::TmaDesc k_map{}, v_map{};

  // Set by the hopper launchers (LaunchPlan::tma_output): the output's rows as a TMA map
  // (cuda::RowsGeometry, boxes of one warp's 16 packed rows); o_map_ok false: the threads copy.
  cuda::TmaDesc o_map{};
  bool o_map_ok = false;

  // TMA stage fills read K/V with an L2 evict-first policy (LaunchPlan::kv_evict_first).
  bool kv_evict_first = false;

  // Planned launches (FlashInfer-style; set plan_items: the kernels' schedulers then take the
  // plan's items, PlanScheduler, and split tiles write its partial rows; src/flashinfer/plan.h): the plan's work
  // items (7 int32 each) and their count on the device, its query tile, the page table's indptr
  // (block_table is then its indices), and the partial rows of split tiles: o [rows][num_kv_heads]
  // [head_size], lse [rows][num_kv_heads] (merged after the launch through merge_indptr).
  const int32_t* plan_items = nullptr;
  const int32_t* plan_num_items = nullptr;
  int plan_tile_q = 0;
  const int32_t* page_indptr = nullptr;
  float* plan_part_o = nullptr;
  float* plan_part_lse = nullptr;

  // The device error record (cuda/device_errors.h; set by the launcher): where the kernels'
  // metadata guards (cuda/metadata_guard.cuh) report; nullptr = nowhere (the guards still hold).
  cuda::DeviceErrorRecord* errors = nullptr;

  // Diagnostics: per-CTA timestamps (cuda/cta_trace.h), [grid CTAs][kCtaTraceSlots]; nullptr = off.
  uint64_t* cta_trace = nullptr;
};

struct VarlenArgs;
// Checks the arguments this kernel family relies on and resolves them (varlen_dispatch.cu).
VarlenKernelParams varlen_kernel_params(const VarlenArgs& args);

}  // namespace attnkit::flash_attn
