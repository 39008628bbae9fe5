// Loads and stores of N consecutive values between memory of a runtime float dtype
// (f32/f16/bf16) and float registers, as 16-byte vectors when `vec` says the address allows
// (N a multiple of 8, the first value 16-byte aligned) or one value at a time. The dtype
// switch is uniform across a launch, so it costs a branch, not divergence. Conversions are
// those of convert.cuh (bit-identical to the host ones).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/dtype.h"
#include "cuda/convert.cuh"

namespace attnkit::cuda {

template <int N>
__device__ __forceinline__ void load_floats(const void* base, int64_t elem, DType t, bool vec,
                                            float (&x)[N]) {
  if (t == DType::f32) {
    const float* p = static_cast<const float*>(base) + elem;
    if (vec) {
#pragma unroll
      for (int i = 0; i < N; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(p + i);
        x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) x[i] = p[i];
    }
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + elem;
  uint16_t h[N];
  if (vec) {
#pragma unroll
    for (int i = 0; i < N; i += 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(p + i);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        h[i + 2 * j] = static_cast<uint16_t>(w[j] & 0xFFFFu);
        h[i + 2 * j + 1] = static_cast<uint16_t>(w[j] >> 16);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = p[i];
  }
  if (t == DType::f16) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = f16_bits_to_f32(h[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = bf16_bits_to_f32(h[i]);
  }
}

template <int N>
__device__ __forceinline__ void store_floats(void* base, int64_t elem, DType t, bool vec,
                                             const float (&x)[N]) {
  if (t == DType::f32) {
    float* p = static_cast<float*>(base) + elem;
    if (vec) {
#pragma unroll
      for (int i = 0; i < N; i += 4)
        *reinterpret_cast<float4*>(p + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) p[i] = x[i];
    }
    return;
  }
  uint16_t h[N];
  if (t == DType::f16) {
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = f32_to_f16_bits(x[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) h[i] = f32_to_bf16_bits(x[i]);
  }
  uint16_t* p = static_cast<uint16_t*>(base) + elem;
  if (vec) {
#pragma unroll
    for (int i = 0; i < N; i += 8) {
      uint4 v;
      v.x = h[i] | (static_cast<uint32_t>(h[i + 1]) << 16);
      v.y = h[i + 2] | (static_cast<uint32_t>(h[i + 3]) << 16);
      v.z = h[i + 4] | (static_cast<uint32_t>(h[i + 5]) << 16);
      v.w = h[i + 6] | (static_cast<uint32_t>(h[i + 7]) << 16);
      *reinterpret_cast<uint4*>(p + i) = v;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = h[i];
  }
}

// N bytes, as 8-byte words when `vec` (N a multiple of 8, p 8-byte aligned).
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* p, bool vec, const uint8_t (&q)[N]) {
  if (vec) {
#pragma unroll
    for (int i = 0; i < N; i += 8) {
      uint2 v;
      v.x = q[i] | (q[i + 1] << 8) | (q[i + 2] << 16) | (static_cast<uint32_t>(q[i + 3]) << 24);
      v.y = q[i + 4] | (q[i + 5] << 8) | (q[i + 6] << 16) | (static_cast<uint32_t>(q[i + 7]) << 24);
      *reinterpret_cast<uint2*>(p + i) = v;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = q[i];
  }
}

}  // namespace attnkit::cuda
