// Device conversions between float and the storage formats, bit-identical to the host ones in
// src/core/dtype.cpp (RNE everywhere; e4m3 saturates to 448 incl. +-inf; e5m2 saturates finite
// values to 57344 and keeps inf; e2m1 saturates at 6; the same NaN codes). Written with integer
// operations on purpose: the hardware cvt instructions differ from the host rules on NaN
// encodings and on infinities, and this code runs in memory-bound kernels where a few integer
// instructions per element are free.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "attnkit/dtype.h"

namespace attnkit::cuda {

// Every function here is device-only; tests compare them with the host functions directly.

// Encodes a finite |x| >= 0 into a format with `mbits` mantissa bits and exponent bias `bias`
// (subnormals at exponent field 0) with RNE. Returns exponent|mantissa, which may exceed the
// format's largest finite code: callers saturate. Same results as encode_small() in dtype.cpp,
// in a few instructions: subnormals round by one float addition of a magic number whose ulp
// is the format's subnormal quantum (the FPU's own RNE); normals round the float's bits at the
// format's last mantissa bit (add half-ulp-minus-one plus the kept lsb, then truncate).
__device__ __forceinline__ uint32_t encode_small(float ax, int mbits, int bias) {
  const float min_normal = __uint_as_float(static_cast<uint32_t>(127 + 1 - bias) << 23);
  if (ax < min_normal) {
    const float magic = __uint_as_float(static_cast<uint32_t>(127 + 24 - bias - mbits) << 23);
    return __float_as_uint(__fadd_rn(ax, magic)) - __float_as_uint(magic);
  }
  const int shift = 23 - mbits;
  uint32_t u = __float_as_uint(ax);
  u += ((1u << (shift - 1)) - 1u) + ((u >> shift) & 1u);
  return (u >> shift) - (static_cast<uint32_t>(127 - bias) << mbits);
}

__device__ __forceinline__ bool is_nan_bits(float x) {
  return (__float_as_uint(x) & 0x7FFFFFFFu) > 0x7F800000u;
}
__device__ __forceinline__ bool is_inf_bits(float x) {
  return (__float_as_uint(x) & 0x7FFFFFFFu) == 0x7F800000u;
}
__device__ __forceinline__ float abs_bits(float x) {
  return __uint_as_float(__float_as_uint(x) & 0x7FFFFFFFu);
}
__device__ __forceinline__ uint32_t sign_bit(float x) { return __float_as_uint(x) >> 31; }

// ---- 16-bit floats ----------------------------------------------------------------------
__device__ __forceinline__ uint16_t f32_to_f16_bits(float x) {
  if (is_nan_bits(x)) return 0x7E00;
  const uint16_t sign = static_cast<uint16_t>(sign_bit(x) << 15);
  if (is_inf_bits(x)) return sign | 0x7C00;
  uint32_t c = encode_small(abs_bits(x), 10, 15);
  if (c >= 0x7C00u) c = 0x7C00u;  // overflow -> inf
  return sign | static_cast<uint16_t>(c);
}

__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t c = h & 0x7FFFu;
  if ((c & 0x7C00u) == 0x7C00u)  // NaN decodes to the canonical quiet NaN, as nanf("") does
    return (c & 0x3FFu) ? __uint_as_float(0x7FC00000u) : __uint_as_float(sign | 0x7F800000u);
  if (c < 0x400u) {  // subnormal: man * 2^-24, exact in float
    const float v = static_cast<float>(c) * 5.9604644775390625e-8f;
    return __uint_as_float(__float_as_uint(v) | sign);
  }
  return __uint_as_float(sign | ((c + ((127u - 15u) << 10)) << 13));
}

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float x) {
  uint32_t u = __float_as_uint(x);
  if (is_nan_bits(x)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// ---- 8-bit floats -----------------------------------------------------------------------
__device__ __forceinline__ uint8_t f32_to_e4m3(float x) {
  if (is_nan_bits(x)) return 0x7F;
  const uint8_t sign = static_cast<uint8_t>(sign_bit(x) << 7);
  const float ax = abs_bits(x);
  if (ax >= 448.f) return sign | 0x7E;  // also +-inf
  uint32_t c = encode_small(ax, 3, 7);
  if (c > 0x7Eu) c = 0x7Eu;
  return sign | static_cast<uint8_t>(c);
}

__device__ __forceinline__ uint8_t f32_to_e5m2(float x) {
  if (is_nan_bits(x)) return 0x7F;
  const uint8_t sign = static_cast<uint8_t>(sign_bit(x) << 7);
  if (is_inf_bits(x)) return sign | 0x7C;
  uint32_t c = encode_small(abs_bits(x), 2, 15);
  if (c > 0x7Bu) c = 0x7Bu;  // finite values saturate to 57344
  return sign | static_cast<uint8_t>(c);
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t c = v & 0x7Fu;
  if (c == 0x7Fu) return __uint_as_float(0x7FC00000u);
  const uint32_t exp_field = c >> 3, man = c & 7u;
  if (exp_field == 0) {  // man * 2^-9
    const float f = static_cast<float>(man) * 0.001953125f;
    return __uint_as_float(__float_as_uint(f) | sign);
  }
  return __uint_as_float(sign | ((exp_field + 120u) << 23) | (man << 20));
}

__device__ __forceinline__ float e5m2_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t c = v & 0x7Fu;
  if (c >= 0x7Cu) return c == 0x7Cu ? __uint_as_float(sign | 0x7F800000u) : __uint_as_float(0x7FC00000u);
  const uint32_t exp_field = c >> 2, man = c & 3u;
  if (exp_field == 0) {  // man * 2^-16
    const float f = static_cast<float>(man) * 1.52587890625e-5f;
    return __uint_as_float(__float_as_uint(f) | sign);
  }
  return __uint_as_float(sign | ((exp_field + 112u) << 23) | (man << 21));
}

// ---- 4-bit e2m1 (NVFP4 values) ------------------------------------------------------------
__device__ __forceinline__ uint8_t f32_to_e2m1(float x) {
  if (is_nan_bits(x)) return 0x7;  // no NaN in e2m1: +6
  const uint8_t sign = static_cast<uint8_t>(sign_bit(x) << 3);
  const float ax = abs_bits(x);
  if (ax >= 6.f) return sign | 0x7;  // also +-inf
  uint32_t c = encode_small(ax, 1, 1);
  if (c > 0x7u) c = 0x7u;
  return sign | static_cast<uint8_t>(c);
}

__device__ __forceinline__ float e2m1_to_f32(uint8_t nibble) {
  // 0, 0.5, 1, 1.5, 2, 3, 4, 6 as (code & 7); exact.
  const uint32_t c = nibble & 7u;
  const float mag = c < 2u ? 0.5f * static_cast<float>(c)
                           : __uint_as_float(((c >> 1) + 126u) << 23) * (1.f + 0.5f * (c & 1u));
  return (nibble & 8u) ? -mag : mag;
}

// ---- quantizers as the host defines them --------------------------------------------------
// x / d, correctly rounded like IEEE division (what the host computes), for many x and one d:
// q = x * RN(1/d), corrected once with the exact remainder fma(-q, d, x) (Markstein). That is
// the correctly rounded quotient whenever nothing under- or overflows; outside
// 2^-100 <= |x|, |q|, d < 2^100 (and for inf / NaN) it falls back to the full division.
struct Divider {
  float d, r;
  bool fast;
  __device__ __forceinline__ explicit Divider(float divisor) : d(divisor) {
    const float ad = fabsf(divisor);
    fast = ad >= 0x1p-100f && ad < 0x1p100f;
    r = fast ? __frcp_rn(divisor) : 0.f;
  }
  __device__ __forceinline__ float operator()(float x) const {
    if (fast) {
      const float q = __fmul_rn(x, r);
      const float y = __fmaf_rn(__fmaf_rn(-q, d, x), r, q);
      const float ax = fabsf(x), ay = fabsf(y);
      if (ax >= 0x1p-100f && ax < 0x1p100f && ay >= 0x1p-100f && ay < 0x1p100f) return y;
    }
    return __fdiv_rn(x, d);
  }
};

// stored = saturate(RNE(x / scale)).
template <DType T>
__device__ __forceinline__ uint8_t fp8_quantize(float x, const Divider& scale) {
  static_assert(T == DType::fp8_e4m3 || T == DType::fp8_e5m2);
  const float y = scale(x);
  return T == DType::fp8_e4m3 ? f32_to_e4m3(y) : f32_to_e5m2(y);
}
template <DType T>
__device__ __forceinline__ uint8_t fp8_quantize(float x, float scale) {
  return fp8_quantize<T>(x, Divider(scale));
}

template <DType T>
__device__ __forceinline__ float fp8_to_f32(uint8_t v) {
  static_assert(T == DType::fp8_e4m3 || T == DType::fp8_e5m2);
  return T == DType::fp8_e4m3 ? e4m3_to_f32(v) : e5m2_to_f32(v);
}

// One NVFP4 block, as quantize_nvfp4_block: s = e4m3(amax / (6 g)); q_i = e2m1(x_i / (s g))
// (0 when s g == 0). fmaxf ignores NaN like std::fmax. Products and quotients are rounded
// one at a time (explicit _rn intrinsics keep nvcc from contracting them).
__device__ __forceinline__ void nvfp4_quantize_block(const float (&x)[kNvfp4BlockValues], float g,
                                                     uint8_t (&packed)[kNvfp4BlockValues / 2],
                                                     uint8_t& scale_e4m3) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kNvfp4BlockValues; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const uint8_t s = f32_to_e4m3(__fdiv_rn(amax, __fmul_rn(6.f, g)));
  scale_e4m3 = s;
  const float step = __fmul_rn(e4m3_to_f32(s), g);
  const Divider div(step);
#pragma unroll
  for (int i = 0; i < kNvfp4BlockValues; i += 2) {
    const uint8_t lo = step > 0.f ? f32_to_e2m1(div(x[i])) : 0;
    const uint8_t hi = step > 0.f ? f32_to_e2m1(div(x[i + 1])) : 0;
    packed[i / 2] = static_cast<uint8_t>((lo & 0xF) | (hi << 4));
  }
}

}  // namespace attnkit::cuda
