// The merge of a FlashInfer-style plan's split tiles (src/flashinfer/plan.h): after the planned
// decode launch, every packed row whose tile was split into KV chunks has partial rows
// [merge_indptr[row], merge_indptr[row + 1]) (per KV head); one warp folds them (the shared
// merge rule, cuda/split_merge_row.cuh, with the head's sink) into the output row and its LSE.
// Rows with an empty range were written by the launch directly and are not touched.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/dtype.h"

namespace attnkit::cuda {

struct PlanMergeArgs {
  const float* part_o = nullptr;    // [partial rows][num_kv_heads][head_size]
  const float* part_lse = nullptr;  // [partial rows][num_kv_heads]
  const int32_t* merge_indptr = nullptr;  // device, [num_rows + 1]
  int num_rows = 0;                 // packed rows of the part (tokens x group), or the capacity's ...
  const int32_t* num_rows_dev = nullptr;  // ... with the current count here (device; CUDA graphs)
  int num_kv_heads = 0, group = 1, head_size = 0;
  void* out = nullptr;              // row (token, head) at token * out_stride_token + head * out_stride_head
  DType out_dtype = DType::bf16;
  int64_t out_stride_token = 0, out_stride_head = 0;
  float* lse = nullptr;             // natural log, [num_heads][tokens] by strides; nullptr = none
  int64_t lse_stride_head = 0, lse_stride_token = 0;
  const float* sinks = nullptr;     // [num_heads]; nullptr = none
  int64_t sinks_stride = 1;
};

// Launches the merge on `stream`. Throws Error on bad arguments or a launch failure.
void merge_plan_partials(const PlanMergeArgs& args, cudaStream_t stream);

}  // namespace attnkit::cuda
