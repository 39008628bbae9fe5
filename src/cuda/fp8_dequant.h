// FP8 (e4m3 "FN" / e5m2) cache values -> the 16-bit type the MMAs read.
//
// Every e4m3 and e5m2 value is exactly representable in fp16 (and bf16), so the conversion
// here is exact and carries no scale: the dequant scale (per tensor or per KV head, uniform
// over a CTA that serves one KV head) is folded into the softmax scale for K and into the
// epilogue for V. The value the kernel computes with is therefore code * scale, as
// docs/architecture.md section 2 defines it, with the multiplication done in fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kv_smem_layout.h"
#include "cuda/mma_sm80.h"

namespace attnkit::cuda {

enum class Fp8Format : int { e4m3 = 0, e5m2 = 1 };

// Two e4m3 ("FN") codes (low byte first, in the low 16 bits) -> two f16 values, exact, without
// the conversion instruction (sm_80 has none; cuda_fp8.h's software one is several times
// longer and made the sm_80 pass the longest part of the build). A code's exponent and
// mantissa, moved into an f16's (its sign in place), read as f16 with bias 15 instead of 7:
// times 2^8 is the value, denormals included (0.m x 2^-14 x 2^8 = 0.m x 2^-6). S.1111.111 is
// NaN in e4m3 (it would read as 480): its halves get an all-ones exponent.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2_bits(uint32_t two_codes) {
  const uint32_t t = __byte_perm(two_codes, 0u, 0x1404);  // [0, b0, 0, b1]: each code in its half's high byte
  const uint32_t mag = t & 0x7f007f00u;
  const uint32_t bits = (t & 0x80008000u) | (mag >> 1);
  const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&bits), __half2(__half(256.f), __half(256.f)));
  const uint32_t nan = (mag + 0x01000100u) & 0x80008000u;  // bit 15 of a half whose mag is 0x7f00
  return *reinterpret_cast<const uint32_t*>(&v) | (nan - (nan >> 5));  // 0x8000 -> 0x7c00
}

// Two fp8 codes (low byte first, in the low 16 bits) -> two f16 values in one register.
// The format is a template parameter: with a runtime one the compiler emits both conversions,
// predicated, and both cost issue slots in the decode loop. e5m2 is the high byte of an f16
// (same exponent width and bias), so it is a byte move; e4m3 takes the hardware conversion
// (sm_89+), below that the bit-level one (e4m3x2_to_f16x2_bits).
template <Fp8Format kFmt>
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint32_t two_codes) {
  if constexpr (kFmt == Fp8Format::e5m2) {
    return __byte_perm(two_codes, 0u, 0x1404);  // [0, b0, 0, b1] from the low byte up
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes & 0xffffu), __NV_E4M3);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#else
    return e4m3x2_to_f16x2_bits(two_codes);
#endif
  }
}

// Four codes (one word, low byte first) -> two f16x2 words: lo holds codes 0 and 1, hi codes 2
// and 3. The same values as fp8x2_to_f16x2 of the word and of the word >> 16; e4m3 converts the
// upper half word where it is (F2FP's .H1 operand: ptxas 13.0 does not fold the shift of
// `x >> 16` into it, and the shift cost one instruction per two codes).
template <Fp8Format kFmt>
__device__ __forceinline__ void fp8x4_to_f16x4(uint32_t four, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (kFmt == Fp8Format::e4m3) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(four));
    return;
  }
#endif
  lo = fp8x2_to_f16x2<kFmt>(four);
  hi = fp8x2_to_f16x2<kFmt>(four >> 16);
}

// The power of two that puts a tile's largest |value| (max_abs) in [2^(top - 1), 2^top) (exact
// scaling; 1 for an all-zero or non-finite tile). The caller divides the softmax scale by it.
__device__ __forceinline__ float pow2_range_factor(float max_abs, int top) {
  int e = 0;
  frexpf(max_abs, &e);  // max_abs < 2^e
  return (max_abs > 0.f && max_abs <= 3.0e38f) ? ldexpf(1.f, top - e) : 1.f;
}
// With an fp8 cache the mma_sync MMAs run in f16, so a bf16 Q tile is converted to f16 times the
// factor that puts its largest |q| in f16's top octave, [2^14, 2^15).
__device__ __forceinline__ float f16_range_factor(float max_abs) { return pow2_range_factor(max_abs, 15); }

// ---- MMA fragments straight from fp8 tiles in shared memory (no dequantised copy) -------------
// Tiles are [key][dim] fp8 codes laid out by L (kv_smem_layout.h). The fragments are f16.
//
// K, the B operand of S = Q K^T: the head dimension is permuted inside every 16-dim k-step so
// that virtual k (2t, 2t+1, 8+2t, 9+2t) of lane t is physical dim (4t, 4t+1, 4t+2, 4t+3). Then
// a b16 ldmatrix of 8 keys x 16 codes hands each lane exactly its 4 codes. Q's A fragments
// must use the same permutation (a_frag_dim_permuted); S itself is unchanged.
// b[0]: keys key0..+7 at k-step ks, b[1]: keys key0+8..+15 at ks, b[2] / b[3]: the same at ks+1.
// (k_frags_fp8_offset: this lane's ldmatrix row address relative to the tile; k_frags_fp8_at:
// the load and conversion from such an address, for callers that keep the offsets.)
template <class L>
__device__ __forceinline__ uint32_t k_frags_fp8_offset(int key0, int ks, int lane) {
  const int m = lane >> 3;
  return L::at(key0 + (lane & 7) + ((m & 1) << 3), (ks + (m >> 1)) * 16);
}
template <Fp8Format kFmt>
__device__ __forceinline__ void k_frags_fp8_at(uint32_t addr, FragB (&b)[4]) {
  uint32_t r[4];
  ldmatrix_x4(r, addr);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b[i].r[0] = fp8x2_to_f16x2<kFmt>(r[i]);
    b[i].r[1] = fp8x2_to_f16x2<kFmt>(r[i] >> 16);
  }
}
template <Fp8Format kFmt, class L>
__device__ __forceinline__ void k_frags_fp8(uint32_t tile, int key0, int ks, int lane, FragB (&b)[4]) {
  k_frags_fp8_at<kFmt>(tile + k_frags_fp8_offset<L>(key0, ks, lane), b);
}

// Q as the A operand of k-step ks with the permutation above, from a 16-bit [row][dim] tile.
__device__ __forceinline__ FragA a_frag_dim_permuted(const uint16_t* tile, int pitch, int row0, int ks, int lane) {
  const uint16_t* p = tile + (row0 + (lane >> 2)) * pitch + ks * 16 + 4 * (lane & 3);
  const uint2 lo = *reinterpret_cast<const uint2*>(p);
  const uint2 hi = *reinterpret_cast<const uint2*>(p + 8 * pitch);
  FragA a;
  a.r[0] = lo.x;
  a.r[2] = lo.y;
  a.r[1] = hi.x;
  a.r[3] = hi.y;
  return a;
}

// Q^T as the B operand of k-step ks of S^T = K Q^T (the transposed decode tile), with the
// same permutation: row row0 + g of a 16-bit [row][dim] tile, physical dims 4t .. 4t + 3.
__device__ __forceinline__ FragB b_frag_dim_permuted(const uint16_t* tile, int pitch, int row0, int ks, int lane) {
  const uint2 v = *reinterpret_cast<const uint2*>(tile + (row0 + (lane >> 2)) * pitch + ks * 16 + 4 * (lane & 3));
  return FragB{{v.x, v.y}};
}

// The A fragments of the transposed tile from two k_frags_fp8 / v_frags_fp8 results: the
// fragments' (row g, k 2t..) halves are the same registers in the other operand's order.
// half 0: from b[0] / b[1], half 1: from b[2] / b[3].
__device__ __forceinline__ FragA a_from_b_pair(const FragB (&b)[4], int half) {
  return FragA{{b[2 * half].r[0], b[2 * half + 1].r[0], b[2 * half].r[1], b[2 * half + 1].r[1]}};
}

// V, the B operand of O += P V, for k-step keys key0..key0+15 and the four n8 fragments of
// the 32-dim group `group`, with O's columns permuted: column c of fragment e is dim
// 32 * group + 4c + e (the epilogue puts them back). Each lane reads one 32-bit word (4 codes) of 4 keys.
// (v_frags_fp8_from_words: the conversion of the four words, keys 2t, 2t + 1, 2t + 8, 2t + 9,
// for callers that load them themselves.)
template <Fp8Format kFmt>
__device__ __forceinline__ void v_frags_fp8_from_words(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3,
                                                       FragB (&b)[4]) {
  // Byte e of the words of keys (2t, 2t+1) side by side: e = 0, 1 in p01, e = 2, 3 in p23.
  const uint32_t p01 = __byte_perm(w0, w1, 0x5140), p23 = __byte_perm(w0, w1, 0x7362);
  const uint32_t q01 = __byte_perm(w2, w3, 0x5140), q23 = __byte_perm(w2, w3, 0x7362);
  b[0].r[0] = fp8x2_to_f16x2<kFmt>(p01);
  b[0].r[1] = fp8x2_to_f16x2<kFmt>(q01);
  b[1].r[0] = fp8x2_to_f16x2<kFmt>(p01 >> 16);
  b[1].r[1] = fp8x2_to_f16x2<kFmt>(q01 >> 16);
  b[2].r[0] = fp8x2_to_f16x2<kFmt>(p23);
  b[2].r[1] = fp8x2_to_f16x2<kFmt>(q23);
  b[3].r[0] = fp8x2_to_f16x2<kFmt>(p23 >> 16);
  b[3].r[1] = fp8x2_to_f16x2<kFmt>(q23 >> 16);
}
template <Fp8Format kFmt, class L>
__device__ __forceinline__ void v_frags_fp8(const unsigned char* tile, int key0, int group, int lane, FragB (&b)[4]) {
  const int g = lane >> 2, t = lane & 3;
  const int row = key0 + 2 * t, byte = group * 32 + 4 * g;
  v_frags_fp8_from_words<kFmt>(*reinterpret_cast<const uint32_t*>(tile + L::at(row, byte)),
                               *reinterpret_cast<const uint32_t*>(tile + L::at(row + 1, byte)),
                               *reinterpret_cast<const uint32_t*>(tile + L::at(row + 8, byte)),
                               *reinterpret_cast<const uint32_t*>(tile + L::at(row + 9, byte)), b);
}

}  // namespace attnkit::cuda
