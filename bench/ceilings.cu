// The ceilings every other number is read against: a streaming read-only kernel (the decode
// ceiling), a device-to-device copy, and a large bf16 GEMM through cuBLAS.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/device_props.h"

namespace attnkit::bench {

namespace {

// Reads every 16-byte word once (4 independent loads in flight per thread) and folds them into
// a value written only if it hits an impossible pattern, so the loads cannot be elided.
__global__ void __launch_bounds__(256) read_kernel(const uint4* __restrict__ p, int64_t n, uint32_t* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __ldcs(p + i + k * stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + " failed: cublas status " + std::to_string(static_cast<int>(s)));
}

}  // namespace

Ceilings run_ceilings(Recorder& rec, cudaStream_t stream) {
  Ceilings c;
  const auto& props = cuda::current_device_props();
  std::printf("device: %s, %d SMs, L2 %.0f MB, %.0f GB\n", props.name.c_str(), props.sm_count,
              props.l2_bytes / 1e6, props.global_mem_bytes / 1e9);
  const int64_t bytes = int64_t{4} << 30;  // 4 GiB: ~70x the L2
  try {
    cuda::DeviceBuffer buf(bytes), sink(64);
    fill_random_bytes(buf.get(), bytes, 1, stream);
    const int blocks = props.sm_count * (props.max_threads_per_sm / 256);
    const double ms = time_ms([&] {
      read_kernel<<<blocks, 256, 0, stream>>>(buf.as<uint4>(), bytes / 16, sink.as<uint32_t>());
    }, stream, 3, 15);
    ATTNKIT_CUDA_CHECK_LAUNCH();
    c.read_gbps = bytes / ms / 1e6;
    rec.add({"ceiling", "read-only stream 4 GiB", "attnkit", "GB/s", c.read_gbps, ms,
             "16-byte streaming loads, 4 in flight per thread; the decode ceiling"});
    const int64_t half = bytes / 2;
    const double cms = time_ms([&] {
      ATTNKIT_CUDA_CHECK(cudaMemcpyAsync(buf.as<uint8_t>() + half, buf.get(), half, cudaMemcpyDeviceToDevice, stream));
    }, stream, 3, 15);
    c.copy_gbps = 2.0 * half / cms / 1e6;
    rec.add({"ceiling", "device copy 2 GiB", "attnkit", "GB/s", c.copy_gbps, cms, "cudaMemcpyAsync D2D, read + write bytes"});
  } catch (const std::exception& e) {
    rec.fail("ceiling", "read-only stream / copy", e.what());
  }
  try {
    const int n = 8192;
    cuda::DeviceBuffer a(int64_t{n} * n * 2), b(int64_t{n} * n * 2), d(int64_t{n} * n * 2);
    fill_random(a.get(), int64_t{n} * n, DType::bf16, 2, stream);
    fill_random(b.get(), int64_t{n} * n, DType::bf16, 3, stream);
    cublasHandle_t h;
    check_cublas(cublasCreate(&h), "cublasCreate");
    check_cublas(cublasSetStream(h, stream), "cublasSetStream");
    const float alpha = 1.f, beta = 0.f;
    const double ms = time_ms([&] {
      check_cublas(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                b.get(), CUDA_R_16BF, n, &beta, d.get(), CUDA_R_16BF, n,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }, stream, 3, 10);
    cublasDestroy(h);
    c.gemm_tflops = 2.0 * n * n * static_cast<double>(n) / ms / 1e9;
    rec.add({"ceiling", "bf16 GEMM 8192^3", "attnkit", "TFLOP/s", c.gemm_tflops, ms, "cuBLAS, fp32 accumulate, random data"});
  } catch (const std::exception& e) {
    rec.fail("ceiling", "bf16 GEMM 8192^3", e.what());
  }
  return c;
}

}  // namespace attnkit::bench
