// Vector stores of fp32 values into bf16 / f16 / f32 outputs (round to nearest even).
// Destinations must be aligned to the vector: 4 values = 8 bytes (16-bit) or 16 bytes (f32).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/mma_sm80.h"

namespace attnkit::cuda {

template <class T>
__device__ __forceinline__ void store4(T* dst, const float (&v)[4]) {
  if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
  }
}

template <class T>
__device__ __forceinline__ void store8(T* dst, const float (&v)[8]) {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]),
                                                pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
  }
}

}  // namespace attnkit::cuda
