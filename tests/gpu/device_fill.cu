#include "device_fill.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"

namespace attnkit::test {

namespace {

__device__ float hash_uniform(uint64_t seed, int64_t i) {  // splitmix64 -> [-1, 1)
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.f / 16777216.f) - 1.f;
}

__global__ void fill_kernel(void* dst, DType dtype, int64_t n, uint64_t seed, float amp, bool e4m3_grid) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float x = amp * hash_uniform(seed, i);
    if (e4m3_grid)
      x = __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3), __NV_E4M3)));
    switch (dtype) {
      case DType::f32: static_cast<float*>(dst)[i] = x; break;
      case DType::bf16: static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(x); break;
      case DType::f16: static_cast<__half*>(dst)[i] = __float2half_rn(x); break;
      case DType::fp8_e4m3: static_cast<uint8_t*>(dst)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); break;
      case DType::fp8_e5m2: static_cast<uint8_t*>(dst)[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); break;
      default: break;
    }
  }
}

}  // namespace

void fill_random_device(void* dst, DType dtype, int64_t n, uint64_t seed, float amp, bool e4m3_grid) {
  const bool ok = dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16 || is_fp8(dtype);
  ATTNKIT_REQUIRE(ok, "fill_random_device", "dtype", dtype_name(dtype), "must be f32, bf16, f16 or fp8");
  if (n == 0) return;
  fill_kernel<<<1024, 256>>>(dst, dtype, n, seed, amp, e4m3_grid);
  ATTNKIT_CUDA_CHECK_LAUNCH();
}

void poison_device(void* dst, int64_t bytes, cudaStream_t stream, uint8_t byte) {
  if (bytes > 0) ATTNKIT_CUDA_CHECK(cudaMemsetAsync(dst, byte, static_cast<size_t>(bytes), stream));
}

}  // namespace attnkit::test
