// Split-KV combine: merges the per-split partial results of an attention launch (each split
// covers a disjoint range of keys) with the LSE merge rule of attnkit/detail/merge_rule.h,
// optionally folds in a per-head sink (a partial with LSE = sink logit and no value), and
// writes the final output and LSE.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "attnkit/dtype.h"

namespace attnkit::cuda {

// Partials in a caller-provided fp32 workspace:
//   o  [num_splits, num_tokens, num_heads, head_size]  (normalised within its split)
//   lse[num_splits, num_heads, num_tokens]            (natural log; -inf = the split saw nothing)
struct SplitPartials {
  float* o = nullptr;
  float* lse = nullptr;
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

// Workspace bytes for the partials, and the partials laid out in a workspace (o first,
// then lse; both 16-byte aligned when the workspace is).
size_t split_partials_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits);
SplitPartials split_partials_in(void* workspace, int64_t num_tokens, int num_heads, int head_size,
                                int num_splits);

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
