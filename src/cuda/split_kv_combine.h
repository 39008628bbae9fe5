// Split-KV combine: merges the per-split partial results of an attention launch (each split
// covers a disjoint range of keys) with the LSE merge rule of attnkit/detail/merge_rule.h,
// optionally folds in a per-head sink (a partial with LSE = sink logit and no value), and
// writes the final output and LSE. The per-row merge (split_merge_row.cuh) also serves kernels
// that combine their own splits (the varlen kernel's last CTA of a work item); this standalone
// kernel is the building block for producers that do not.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attnkit/dtype.h"
#include "cuda/split_workspace.h"

namespace attnkit::cuda {

// Partials in a caller-provided workspace (layout: split_workspace.h):
//   o  [num_splits, num_tokens, num_heads, head_size]  fp32, normalised within its split
//   lse[num_splits, num_heads, num_tokens]            fp32, natural log; -inf = the split saw nothing
//   counters [num_counters]                           uint32 arrival counts of fused combines, 0 between launches
struct SplitPartials {
  float* o = nullptr;
  float* lse = nullptr;
  unsigned int* counters = nullptr;
  int64_t num_counters = 0;
  int num_splits = 1;
  int64_t num_tokens = 0;
  int num_heads = 0;
  int head_size = 0;

  __host__ __device__ int64_t o_index(int split, int64_t token, int head) const {
    return ((split * num_tokens + token) * num_heads + head) * static_cast<int64_t>(head_size);
  }
  __host__ __device__ int64_t lse_index(int split, int64_t token, int head) const {
    return (static_cast<int64_t>(split) * num_heads + head) * num_tokens + token;
  }
};

// The partials of a launch with these sizes in a workspace of `workspace_bytes` bytes (16-byte
// aligned). Throws Error when they do not fit (see split_workspace_bytes).
SplitPartials split_partials_in(void* workspace, size_t workspace_bytes, int64_t num_tokens, int num_heads,
                                int head_size, int num_splits);

struct CombineTarget {
  void* out = nullptr;  // [num_tokens, num_heads, head_size] of out_dtype, last dim contiguous
  DType out_dtype = DType::bf16;
  int64_t out_stride_token = 0, out_stride_head = 0;
  float* lse = nullptr;  // optional [num_heads, num_tokens]
  int64_t lse_stride_head = 0, lse_stride_token = 0;
  const float* sinks = nullptr;  // optional [num_heads]
  int64_t sinks_stride = 1;
  // Device int: tokens at or past *valid_tokens are batch padding and are not written
  // (the attention kernel wrote no partials for them). nullptr = all num_tokens.
  const int32_t* valid_tokens = nullptr;
};

// One warp per (token, head) row. Throws Error on a launch failure or an unsupported dtype.
void launch_split_kv_combine(const SplitPartials& parts, const CombineTarget& target,
                             cudaStream_t stream);

}  // namespace attnkit::cuda
