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
  // writes partials into `workspace` and merges them (size from varlen_workspace_bytes).
  int num_splits = 1;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  void* stream = nullptr;  // cudaStream_t
  // Preferred kernel generation. hopper: the wgmma kernel serves unsplit prefill-shaped
  // launches (more than 16 packed query rows) of 16-bit caches with head size 64 / 128 on sm90
  // when the build has sm_90a code (hopper_kernels_available()); everything else, and
  // mma_sync, runs the mma_sync kernels.
  Generation generation = Generation::hopper;
};

// Bytes of split-KV workspace a launch with these sizes needs (0 when num_splits == 1).
size_t varlen_workspace_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits);

// Validated by the caller (the impl); launches on args.stream. Throws Error on a CUDA failure
// or a configuration no compiled kernel serves. In a build without CUDA it throws.
void run_varlen_attention(const VarlenArgs& args);

}  // namespace attnkit::flash_attn
