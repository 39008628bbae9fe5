#include "gpu_reference.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>

#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"

namespace attnkit::test {

namespace {

constexpr int kThreads = 256;

struct RefArgs {
  const void* q;
  int q_f16;  // 1: f16, 0: bf16
  int64_t q_stride_token, q_stride_head;
  PagedKV cache;
  GpuBatch batch;
  int head_size;
  int group;  // query heads per KV head
  float scale;
  int causal, window_left, window_right;
  float softcap;
  const float* alibi;       // [num_heads] or [num_reqs, num_heads]
  int64_t alibi_req_stride;  // 0 for [num_heads]
  const float* sinks;
  const float* k_scale;
  const float* v_scale;
  int k_scale_n, v_scale_n;
  const RefRow* rows;
  float* out;
  float* lse;
};

__device__ float load_q(const RefArgs& a, int64_t i) {
  if (a.q_f16) return __half2float(static_cast<const __half*>(a.q)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(a.q)[i]);
}

// Dequantised cache value: code * scale for fp8, the stored value otherwise.
__device__ float load_kv(const RefArgs& a, const PagedKVSide& side, const float* scale, int scale_n,
                         int64_t slot, int head, int d) {
  const int64_t blk = slot / a.cache.block_size, s = slot % a.cache.block_size;
  const int64_t off = blk * side.stride_block + s * side.stride_slot + head * side.stride_head + d;
  switch (a.cache.dtype) {
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(side.base)[off]);
    case DType::f16: return __half2float(static_cast<const __half*>(side.base)[off]);
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: {
      const __nv_fp8_storage_t code = static_cast<const uint8_t*>(side.base)[off];
      const __half_raw h = __nv_cvt_fp8_to_halfraw(code, a.cache.dtype == DType::fp8_e4m3 ? __NV_E4M3 : __NV_E5M2);
      const float sc = scale == nullptr ? 1.f : scale[scale_n == 1 ? 0 : head];
      return __half2float(__half(h)) * sc;
    }
    default: return NAN;
  }
}

__device__ float block_reduce(float v, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float x = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, x) : v + x;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.f;
  for (int w = 0; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

__global__ void __launch_bounds__(kThreads) reference_row_kernel(const RefArgs a) {
  extern __shared__ float sm[];
  float* qs = sm;                    // [head_size]
  float* scratch = qs + a.head_size;  // [32]
  float* logits = scratch + 32;      // [visible keys]
  const RefRow row = a.rows[blockIdx.x];
  const int D = a.head_size;
  const int q_start = a.batch.cu_seqlens_q[row.req];
  const int q_len = a.batch.cu_seqlens_q[row.req + 1] - q_start;
  const int seq = a.batch.seqused_k[row.req];
  const int64_t pos = int64_t(seq) - q_len + (row.token - q_start);
  int64_t lo = 0, hi = seq;
  if (a.causal && pos + 1 < hi) hi = pos + 1;
  if (a.window_left >= 0 && pos - a.window_left > lo) lo = pos - a.window_left;
  if (a.window_right >= 0 && pos + a.window_right + 1 < hi) hi = pos + a.window_right + 1;
  const int n = hi > lo ? static_cast<int>(hi - lo) : 0;

  for (int d = threadIdx.x; d < D; d += kThreads)
    qs[d] = load_q(a, row.token * a.q_stride_token + row.head * a.q_stride_head + d);
  __syncthreads();

  const int kvh = row.head / a.group;
  const int32_t* brow = a.batch.block_table + int64_t(row.req) * a.batch.max_blocks_per_req;
  const float slope = a.alibi ? a.alibi[row.req * a.alibi_req_stride + row.head] : 0.f;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int64_t j = lo + i;
    const int64_t slot = int64_t(brow[j / a.cache.block_size]) * a.cache.block_size + j % a.cache.block_size;
    float dot = 0.f;
    for (int d = 0; d < D; ++d) dot += qs[d] * load_kv(a, a.cache.k, a.k_scale, a.k_scale_n, slot, kvh, d);
    float s = dot * a.scale;
    if (a.softcap > 0.f) s = a.softcap * tanhf(s / a.softcap);
    if (a.alibi) s -= slope * fabsf(float(pos - j));
    logits[i] = s;
    mx = fmaxf(mx, s);
  }
  const float sink = a.sinks ? a.sinks[row.head] : -INFINITY;
  mx = fmaxf(block_reduce(mx, true, scratch), sink);
  float local = 0.f;
  for (int i = threadIdx.x; i < n; i += kThreads) local += expf(logits[i] - mx);
  const float sum_keys = block_reduce(local, false, scratch);
  const float denom = sum_keys + (sink == -INFINITY ? 0.f : expf(sink - mx));

  for (int d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.f;
    for (int i = 0; i < n; ++i) {
      const int64_t j = lo + i;
      const int64_t slot = int64_t(brow[j / a.cache.block_size]) * a.cache.block_size + j % a.cache.block_size;
      acc += expf(logits[i] - mx) * load_kv(a, a.cache.v, a.v_scale, a.v_scale_n, slot, kvh, d);
    }
    a.out[int64_t(blockIdx.x) * D + d] = (n > 0 && denom > 0.f) ? acc / denom : 0.f;
  }
  if (threadIdx.x == 0) a.lse[blockIdx.x] = (mx == -INFINITY || !(denom > 0.f)) ? -INFINITY : mx + logf(denom);
}

}  // namespace

void gpu_reference_rows(const TensorView& q, const PagedKV& cache, const GpuBatch& batch,
                        const AttentionParams& params, const std::vector<RefRow>& rows,
                        int max_keys, std::vector<float>& out, std::vector<float>& lse) {
  const int D = static_cast<int>(q.size(2));
  const int num_heads = static_cast<int>(q.size(1));
  out.assign(rows.size() * D, 0.f);
  lse.assign(rows.size(), 0.f);
  if (rows.empty()) return;
  cuda::DeviceBuffer d_rows(rows.size() * sizeof(RefRow)), d_out(out.size() * 4), d_lse(lse.size() * 4);
  ATTNKIT_CUDA_CHECK(cudaMemcpy(d_rows.get(), rows.data(), rows.size() * sizeof(RefRow), cudaMemcpyHostToDevice));
  RefArgs a{};
  a.q = q.data;
  a.q_f16 = q.dtype == DType::f16;
  a.q_stride_token = q.stride(0);
  a.q_stride_head = q.stride(1);
  a.cache = cache;
  a.batch = batch;
  a.head_size = D;
  a.group = num_heads / cache.num_kv_heads;
  a.scale = params.resolved_scale(D);
  a.causal = params.causal;
  a.window_left = params.window_left;
  a.window_right = params.window_right;
  a.softcap = params.softcap;
  a.alibi = params.alibi_slopes.defined() ? params.alibi_slopes.ptr<const float>() : nullptr;
  a.alibi_req_stride = params.alibi_slopes.defined() && params.alibi_slopes.ndim == 2 ? params.alibi_slopes.stride(0) : 0;
  a.sinks = params.sinks.defined() ? params.sinks.ptr<const float>() : nullptr;
  a.k_scale = params.k_scale.defined() ? params.k_scale.ptr<const float>() : nullptr;
  a.v_scale = params.v_scale.defined() ? params.v_scale.ptr<const float>() : nullptr;
  a.k_scale_n = params.k_scale.defined() ? static_cast<int>(params.k_scale.size(0)) : 1;
  a.v_scale_n = params.v_scale.defined() ? static_cast<int>(params.v_scale.size(0)) : 1;
  a.rows = d_rows.as<RefRow>();
  a.out = d_out.as<float>();
  a.lse = d_lse.as<float>();
  const size_t smem = (D + 32 + static_cast<size_t>(max_keys)) * sizeof(float);
  ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(reference_row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  reference_row_kernel<<<static_cast<unsigned>(rows.size()), kThreads, smem>>>(a);
  ATTNKIT_CUDA_CHECK_LAUNCH();
  ATTNKIT_CUDA_CHECK(cudaDeviceSynchronize());
  ATTNKIT_CUDA_CHECK(cudaMemcpy(out.data(), d_out.get(), out.size() * 4, cudaMemcpyDeviceToHost));
  ATTNKIT_CUDA_CHECK(cudaMemcpy(lse.data(), d_lse.get(), lse.size() * 4, cudaMemcpyDeviceToHost));
}

}  // namespace attnkit::test
