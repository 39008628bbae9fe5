#include "cuda/split_kv_combine.h"

#include <string>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/split_merge_row.cuh"

namespace attnkit::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxChunksPerLane = 4;  // 4 floats per chunk, 32 lanes: head_size <= 512

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    split_kv_combine_kernel(const SplitPartials parts, const CombineTarget target) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= parts.num_tokens * parts.num_heads) return;
  const int64_t token = row / parts.num_heads;
  const int head = static_cast<int>(row % parts.num_heads);
  if (target.valid_tokens != nullptr && token >= *target.valid_tokens) return;
  T* out = static_cast<T*>(target.out) + token * target.out_stride_token + head * target.out_stride_head;
  merge_split_row<T, kMaxChunksPerLane>(
      parts, token, head, target.sinks != nullptr ? target.sinks + head * target.sinks_stride : nullptr, out,
      target.lse != nullptr ? target.lse + head * target.lse_stride_head + token * target.lse_stride_token : nullptr,
      lane);
}

}  // namespace

SplitPartials split_partials_in(void* workspace, size_t workspace_bytes, int64_t num_tokens, int num_heads,
                                int head_size, int num_splits) {
  const SplitWorkspaceLayout l = split_workspace_layout(workspace_bytes, num_tokens, num_heads, head_size, num_splits);
  const size_t need = split_workspace_bytes(num_tokens, num_heads, head_size, num_splits);
  ATTNKIT_REQUIRE(workspace != nullptr && l.fits && (reinterpret_cast<uintptr_t>(workspace) & 15u) == 0,
                  "split-KV workspace", "workspace_bytes", workspace_bytes,
                  "must be a 16-byte aligned buffer of at least split_workspace_bytes() = " + std::to_string(need) +
                      " bytes for " + std::to_string(num_splits) + " splits of " + std::to_string(num_tokens) +
                      " tokens x " + std::to_string(num_heads) + " heads x " + std::to_string(head_size));
  char* base = static_cast<char*>(workspace);
  SplitPartials p;
  p.num_splits = num_splits;
  p.num_tokens = num_tokens;
  p.num_heads = num_heads;
  p.head_size = head_size;
  p.counters = reinterpret_cast<unsigned int*>(base);
  p.num_counters = l.num_counters;
  p.o = reinterpret_cast<float*>(base + l.o_offset);
  p.lse = reinterpret_cast<float*>(base + l.lse_offset);
  return p;
}

void launch_split_kv_combine(const SplitPartials& parts, const CombineTarget& target,
                             cudaStream_t stream) {
  const char* where = "split_kv_combine";
  ATTNKIT_REQUIRE(parts.head_size % 4 == 0 && parts.head_size <= 4 * 32 * kMaxChunksPerLane, where,
                  "head_size", parts.head_size, "must be a multiple of 4 and <= 512");
  const int64_t rows = parts.num_tokens * parts.num_heads;
  if (rows == 0) return;
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  ATTNKIT_REQUIRE(blocks <= 0x7fffffff, where, "num_tokens * num_heads", rows, "must fit one grid");
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarpsPerBlock * 32);
  switch (target.out_dtype) {
    case DType::bf16:
      split_kv_combine_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(parts, target);
      break;
    case DType::f16:
      split_kv_combine_kernel<__half><<<grid, block, 0, stream>>>(parts, target);
      break;
    case DType::f32:
      split_kv_combine_kernel<float><<<grid, block, 0, stream>>>(parts, target);
      break;
    default:
      fail(where, "out dtype", dtype_name(target.out_dtype), "must be bf16, f16 or f32");
  }
  ATTNKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace attnkit::cuda
