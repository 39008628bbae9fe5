// The seam between the FlashAttention-style backend's host side (builder, impl) and its CUDA
// kernels: one plain-data description of a varlen paged attention launch.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attnkit/kv_cache.h"
#include "attnkit/params.h"
#include "attnkit/tensor.h"
#include "flash_attn/generation.h"

namespace attnkit::flash_attn {

// How mma_sync decode tiles fill their K/V stages on sm90 (VarlenArgs::kv_fill).
enum class KvFill {
  automatic,  // TMA for fp8 caches in grids of more than one wave of CTA slots and for the transposed
              // fp8 tile, for 16-bit caches in grids of at most 2 CTAs per SM (the 2-stage tile), else
              // cp.async (varlen_kernel.cuh launch_decode)
  cp_async,   // 16-byte cp.async copies by every thread
  tma,        // TMA wherever the cache allows (tests and A/B)
};

struct VarlenArgs {
  TensorView q;    // [num_tokens, num_heads, head_size], CUDA, f16/bf16
  PagedKV cache;   // CUDA
  TensorView out;  // [num_tokens, num_heads, head_size], dtype of q
  // Device arrays (int32): cu_seqlens_q [num_reqs+1], seqused_k [num_reqs],
  // block_table [num_reqs, max_blocks_per_req].
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
  // Preferred kernel generation. hopper: the wgmma kernel serves unsplit prefill-shaped
  // launches (more than 16 packed query rows) of 16-bit caches with head size 64 / 128 on sm90
  // when the build has sm_90a code (hopper_kernels_available()); everything else, and
  // mma_sync, runs the mma_sync kernels.
  Generation generation = Generation::hopper;
  // Programmatic dependent launch on sm90+ (ignored below): the kernel may be scheduled while
  // the previous kernel in the stream drains and waits for it before its first memory access;
  // it lets the next kernel do the same. Off = a plain stream-ordered launch. The mma_sync
  // launcher leaves it off for a grid of more than half and less than 90% of one wave of CTA
  // slots (measured: such grids got spread unevenly over the SMs; varlen_kernel.cuh).
  bool enable_pdl = true;
  // With enable_pdl, on sm90+: while the previous kernel drains, each CTA of the first wave of
  // the mma_sync kernel (decode and the prefill shapes hopper does not serve) asks L2 for the first K/V
  // tiles of its work item, so its first loads after the wait hit L2 instead of starting the
  // HBM stream from idle. The block table and lengths it reads then may still be changing;
  // only the prefetch uses them, clamped into the cache. Off: nothing before the wait.
  bool l2_prefetch = true;
  // Hopper generation: at most this many CTAs, each looping over work items (persistent);
  // 0 = the launcher's choice (hopper_kernel.cuh: persistent with one CTA per SM when
  // max_seq_len <= 4096, else one CTA per item). Tests use small counts to give every CTA
  // many items.
  int max_ctas = 0;
  // Hopper generation: Q tiles in shared memory, 1 or 2 (two: the next work item's Q loads
  // while a persistent CTA computes on the current one; K/V rings one stage shorter at head
  // size 128); 0 = the launcher's choice (two for persistent launches with max_seq_len <= 1024).
  // Tests set it to run both configurations on every shape.
  int hopper_q_buffers = 0;
  // mma_sync decode launches (<= 16 packed query rows per request) with 2 splits on sm90: the
  // two splits of a work item run as one thread-block cluster and rank 0 merges their partials
  // from the others' shared memory (no workspace round trip at the end of the launch). Off, or
  // anywhere else: the workspace merge (the last split CTA to finish merges). The workspace
  // stays required for num_splits > 1 either way.
  bool cluster_split_merge = true;
  // mma_sync decode tiles on sm90: each 16-key page group of a K/V tile may arrive as one TMA
  // box (a tensor map per cache side, encoded per launch) instead of 16-byte cp.async copies by
  // every thread, where the cache allows (row bytes a multiple of 128 up to 512, 16-byte aligned
  // strides; else cp.async). automatic: the measured rules of KvFill::automatic.
  KvFill kv_fill = KvFill::automatic;
  // mma_sync decode launches of fp8 caches with at most 8 packed query rows per request
  // (max_query_len * group <= 8), head size <= 128, on sm90 with TMA stage fills (kv_fill not
  // cp_async, rows of whole 128-byte segments): the transposed tile (keys on the MMA's M, rows
  // on N; varlen_decode_transposed.cuh), 4 CTAs per SM. Off: the 16-row tile.
  bool transposed_decode = true;
  // The transposed tile's K/V stages: 3 (grids of at most 3 CTAs per SM) or 2 (larger grids,
  // where its 4 CTAs per SM each keep fewer bytes in flight: measured faster, varlen_traits.h
  // DecodeTransposedTwoStageTraits); 0 = that choice, 2 / 3 force one (tests run both).
  int transposed_stages = 0;
  // Split mma_sync decode launches (num_splits > 1) with TMA stage fills (sm90): K/V boxes read
  // with an L2 evict-first policy. Each K/V byte is read once per launch; the hint keeps what
  // is read again (the split partials the last CTA merges, lengths, block tables, Q) in L2 while
  // the KV streams through it. H200, bench decode-ab in turns with copies without a policy
  // (398523b): 1 x 32k (32 splits) fp8 +3.8%, bf16 +1.5%; 16 x 4k / 16 x 32k (2-3 splits)
  // within +-0.4%; unsplit launches keep plain copies (64 x 32k fp8 lost 2.6% with it, 64 x 4k /
  // 256 x 4k within +-0.6%). Off: plain copies everywhere.
  bool kv_evict_first = true;
  // Diagnostics (mma_sync kernel): a device buffer of grid-CTAs x cuda::kCtaTraceSlots uint64
  // that receives per-CTA timestamps (cuda/cta_trace.h; attnkit_bench --decode-trace); the
  // grid is (row tiles, num_kv_heads * num_splits, num_reqs). nullptr (default) = off.
  uint64_t* cta_trace = nullptr;
};

// Whether the mma_sync launcher uses PDL (with VarlenArgs::enable_pdl, on sm90+) for a grid of
// `ctas` CTAs on `slots` CTA slots (CTAs per SM x SMs): not for more than half and less than 90%
// of one wave. With PDL such a grid's first CTAs took the slots its predecessor left free long
// before the release and the rest came after, spread unevenly over the SMs (H200: fp8 decode
// 1 x 32k, 4 x 4k, 16 x 1k, 256 CTAs on 396 slots, 9-15% slower; bench/RESULTS.md "wip-pdl-ab").
// The transposed fp8 decode tile (4 CTAs per SM) also loses with PDL at a whole wave: fp8
// 64 x 4k / 64 x 32k / 16 x 32k (512 CTAs on 528 slots) 85 / 88 / 82% of read BW without PDL
// against 81 / 80 / 78% with it (bench decode-ab at 3814cae); for it the off range runs to a
// full wave.
inline bool pdl_for_grid(int64_t ctas, int64_t slots, bool transposed_decode = false) {
  if (transposed_decode) return !(2 * ctas > slots && ctas <= slots);
  return !(2 * ctas > slots && 10 * ctas < 9 * slots);
}

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

// Validated by the caller (the impl); launches on args.stream. Throws Error on a CUDA failure
// or a configuration no compiled kernel serves. In a build without CUDA it throws.
void run_varlen_attention(const VarlenArgs& args);

}  // namespace attnkit::flash_attn
