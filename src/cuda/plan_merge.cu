#include "cuda/plan_merge.h"

#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/split_merge_row.cuh"

namespace attnkit::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxChunksPerLane = 4;  // head_size <= 512

// One KV head's partial rows [base, base + n) of a packed row, read through L2.
struct PlanRowParts {
  const PlanMergeArgs* a;
  int64_t base;
  int kv_head;
  __device__ __forceinline__ int64_t index(int s) const { return (base + s) * a->num_kv_heads + kv_head; }
  __device__ __forceinline__ float lse(int s) const { return __ldcg(a->part_lse + index(s)); }
  template <int kMaxChunks>
  __device__ __forceinline__ void values(int s, float4 (&v)[kMaxChunks], int chunks, int lane) const {
    const float4* o = reinterpret_cast<const float4*>(a->part_o + index(s) * a->head_size);
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i)
      if (lane + 32 * i < chunks) v[i] = __ldcg(o + lane + 32 * i);
  }
};

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) plan_merge_kernel(const PlanMergeArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t job = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (job >= static_cast<int64_t>(a.num_rows) * a.num_kv_heads) return;
  const int row = static_cast<int>(job / a.num_kv_heads), kv_head = static_cast<int>(job % a.num_kv_heads);
  if (a.num_rows_dev != nullptr && row >= __ldg(a.num_rows_dev)) return;
  const int32_t lo = __ldg(a.merge_indptr + row), hi = __ldg(a.merge_indptr + row + 1);
  if (hi <= lo) return;  // written directly by the launch
  const int64_t token = row / a.group;
  const int head = kv_head * a.group + row % a.group;
  T* out = static_cast<T*>(a.out) + token * a.out_stride_token + head * a.out_stride_head;
  float* lse = a.lse != nullptr ? a.lse + head * a.lse_stride_head + token * a.lse_stride_token : nullptr;
  const float* sink = a.sinks != nullptr ? a.sinks + head * a.sinks_stride : nullptr;
  merge_row<T, kMaxChunksPerLane>(PlanRowParts{&a, lo, kv_head}, hi - lo, a.head_size, sink, out, lse, lane);
}

}  // namespace

void merge_plan_partials(const PlanMergeArgs& a, cudaStream_t stream) {
  const char* where = "flashinfer plan merge";
  ATTNKIT_REQUIRE(a.head_size % 4 == 0 && a.head_size > 0 && a.head_size <= 4 * 32 * kMaxChunksPerLane, where,
                  "head_size", a.head_size, "must be a positive multiple of 4, <= 512");
  ATTNKIT_REQUIRE(a.num_rows >= 0 && a.num_kv_heads > 0 && a.group > 0, where, "num_rows / num_kv_heads / group",
                  std::to_string(a.num_rows) + " / " + std::to_string(a.num_kv_heads) + " / " + std::to_string(a.group),
                  "must be >= 0 / > 0 / > 0");
  const int64_t jobs = static_cast<int64_t>(a.num_rows) * a.num_kv_heads;
  if (jobs == 0) return;
  const int64_t blocks = (jobs + kWarpsPerBlock - 1) / kWarpsPerBlock;
  ATTNKIT_REQUIRE(blocks <= 0x7fffffff, where, "rows x KV heads", jobs, "must fit one grid");
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarpsPerBlock * 32);
  switch (a.out_dtype) {
    case DType::bf16: plan_merge_kernel<__nv_bfloat16><<<grid, block, 0, stream>>>(a); break;
    case DType::f16: plan_merge_kernel<__half><<<grid, block, 0, stream>>>(a); break;
    case DType::f32: plan_merge_kernel<float><<<grid, block, 0, stream>>>(a); break;
    default: fail(where, "out dtype", dtype_name(a.out_dtype), "must be bf16, f16 or f32");
  }
  ATTNKIT_CUDA_CHECK_LAUNCH();
}

}  // namespace attnkit::cuda
