// FP8 (e4m3 "FN" / e5m2) cache values -> the 16-bit type the MMAs read.
//
// Every e4m3 and e5m2 value is exactly representable in fp16 and in bf16, so the conversion
// here is exact and carries no scale: the dequant scale (per tensor or per KV head, uniform
// over a CTA that serves one KV head) is folded into the softmax scale for K and into the
// epilogue for V. The value the kernel computes with is therefore code * scale, as DESIGN.md
// section 2 defines it, with the multiplication done in fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace attnkit::cuda {

enum class Fp8Format : int { e4m3 = 0, e5m2 = 1 };

// Two fp8 codes (low byte first) -> two 16-bit values of T in one register.
template <class T>
__device__ __forceinline__ uint32_t fp8x2_to(uint16_t two_codes, Fp8Format fmt) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(two_codes), fmt == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  } else {
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);  // exact: fp8 fits in bf16
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// 16 fp8 codes (one 16-byte chunk) -> 16 values of T (two 16-byte chunks).
template <class T>
__device__ __forceinline__ void fp8x16_to(const uint4& codes, Fp8Format fmt, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = fp8x2_to<T>(static_cast<uint16_t>(w[i] & 0xffffu), fmt);
    o[2 * i + 1] = fp8x2_to<T>(static_cast<uint16_t>(w[i] >> 16), fmt);
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

}  // namespace attnkit::cuda
