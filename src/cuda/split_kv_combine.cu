#include "cuda/split_kv_combine.h"

#include <string>

#include "attnkit/detail/merge_rule.h"
#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/output_store.h"

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

  const int chunks = parts.head_size / 4;
  float acc[kMaxChunksPerLane][4] = {};
  float lse = -INFINITY;
  for (int s = 0; s < parts.num_splits; ++s) {
    float wa, wb;
    lse = merge_weights(lse, parts.lse[parts.lse_index(s, token, head)], &wa, &wb);
    if (wb == 0.f) {  // this split saw nothing visible: its (unwritten) values contribute 0
      for (int i = 0; i < kMaxChunksPerLane; ++i)
        for (int e = 0; e < 4; ++e) acc[i][e] = merge_value(acc[i][e], wa, 0.f, 0.f);
      continue;
    }
    const float* o = parts.o + parts.o_index(s, token, head);
#pragma unroll
    for (int i = 0; i < kMaxChunksPerLane; ++i) {
      const int c = lane + 32 * i;
      if (c >= chunks) break;
      const float4 v = reinterpret_cast<const float4*>(o)[c];
      acc[i][0] = merge_value(acc[i][0], wa, v.x, wb);
      acc[i][1] = merge_value(acc[i][1], wa, v.y, wb);
      acc[i][2] = merge_value(acc[i][2], wa, v.z, wb);
      acc[i][3] = merge_value(acc[i][3], wa, v.w, wb);
    }
  }
  if (target.sinks != nullptr) {  // the sink: LSE = its logit, value 0
    float wa, wb;
    lse = merge_weights(lse, target.sinks[head * target.sinks_stride], &wa, &wb);
    for (int i = 0; i < kMaxChunksPerLane; ++i)
      for (int e = 0; e < 4; ++e) acc[i][e] = merge_value(acc[i][e], wa, 0.f, wb);
  }

  T* out = static_cast<T*>(target.out) + token * target.out_stride_token + head * target.out_stride_head;
#pragma unroll
  for (int i = 0; i < kMaxChunksPerLane; ++i) {
    const int c = lane + 32 * i;
    if (c >= chunks) break;
    store4(out + 4 * c, acc[i]);
  }
  if (target.lse != nullptr && lane == 0)
    target.lse[head * target.lse_stride_head + token * target.lse_stride_token] = lse;
}

}  // namespace

size_t split_partials_bytes(int64_t num_tokens, int num_heads, int head_size, int num_splits) {
  if (num_splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(num_splits) * num_tokens * num_heads;
  const size_t o_bytes = rows * head_size * sizeof(float);
  const size_t lse_bytes = rows * sizeof(float);
  return o_bytes + ((lse_bytes + 15) / 16) * 16;
}

SplitPartials split_partials_in(void* workspace, int64_t num_tokens, int num_heads, int head_size,
                                int num_splits) {
  SplitPartials p;
  p.num_splits = num_splits;
  p.num_tokens = num_tokens;
  p.num_heads = num_heads;
  p.head_size = head_size;
  p.o = static_cast<float*>(workspace);
  p.lse = p.o + static_cast<size_t>(num_splits) * num_tokens * num_heads * head_size;
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
