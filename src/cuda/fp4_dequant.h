// NVFP4 cache values -> the f16 MMA fragments of the decode tile, converted in registers from the
// packed codes in shared memory (software conversion: sm90 has no e2m1 instruction).
//
// A cache row holds head_size e2m1 codes, two per byte (the even dim in the low nibble), and its
// scale row one e4m3 scale per 16 dims (docs/architecture.md section 2); a value is
// code x scale x global. In f16, code x scale x 16 is exact and normal for every nonzero
// product (2^-6 .. 43008: 2 + 4 significant bits), so the fragments carry that and the kernel's
// fp32 factors carry global / 16 (kFp4ScaleBias): folded into the softmax scale for K and into
// the epilogue for V, as the fp8 scales are.
//
// A code becomes f16 through a table of the eight magnitudes' high bytes (one byte_perm for two
// codes) plus its sign bit. Two codes whose magnitudes sit 8 bits apart share the lookup, so the
// fragments pair codes in that order:
//   K (the B operand of S = Q K^T): lane t of a key's 32-dim group holds the 8 codes of dims
//     8t .. 8t+7 (one 32-bit word); k-step 2j takes dims (0, 2) and (1, 3), k-step 2j + 1 dims
//     (4, 6) and (5, 7) of it. Q's A fragments use the same order (a_frags_fp4_order).
//   V (the B operand of O += P V): the four keys of a lane each give one word (8 dims); fragment
//     e of a 64-dim group holds dim 64 G + 8 n + e in its column n, and pairs the keys'
//     codes of that dim. The epilogue puts the columns back (TileMath::store_parts).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/fp8_dequant.h"
#include "cuda/mma_sm80.h"

namespace attnkit::cuda {

// code x scale x kFp4ScaleBias is what the fragments hold (see above).
inline constexpr float kFp4ScaleBias = 16.f;

// High bytes of the f16 of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (their low bytes are 0).
inline constexpr uint32_t kE2m1F16HighLo = 0x3E3C3800u, kE2m1F16HighHi = 0x46444240u;

__device__ __forceinline__ uint32_t hmul2_bits(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Two codes -> f16x2 (low half first): `mags` holds their 3 magnitude bits at bits 4-6 and 12-14
// (every other bit 0: the byte_perm selector), `signs` their sign bits at bits 15 and 31.
__device__ __forceinline__ uint32_t e2m1x2_to_f16x2(uint32_t mags, uint32_t signs) {
  return __byte_perm(kE2m1F16HighLo, kE2m1F16HighHi, mags) | (signs & 0x80008000u);
}

// Two e4m3 block scales (the low two bytes of `two`) -> f16x2 of scale x kFp4ScaleBias (exact).
__device__ __forceinline__ uint32_t e4m3x2_scales(uint32_t two) {
  return hmul2_bits(fp8x2_to_f16x2<Fp8Format::e4m3>(two), 0x4c004c00u);  // x 16
}
__device__ __forceinline__ uint32_t low_twice(uint32_t h2) { return __byte_perm(h2, 0u, 0x1010); }
__device__ __forceinline__ uint32_t high_twice(uint32_t h2) { return __byte_perm(h2, 0u, 0x3232); }

// ---- K ------------------------------------------------------------------------------------

// One key's word of 8 codes (dims 8t .. 8t+7 of a 32-dim group j) times its block scale s2
// ({s, s}, from k_scales_fp4) -> the B fragments of k-steps 2j (lo) and 2j + 1 (hi).
__device__ __forceinline__ void k_frags_fp4_from_word(uint32_t w, uint32_t s2, FragB& lo, FragB& hi) {
  const uint32_t sa = __byte_perm(w, 0u, 0x1404);  // bytes 0, 1 of w at bytes 1, 3 (sign bits)
  const uint32_t sb = __byte_perm(w, 0u, 0x3424);  // bytes 2, 3 at bytes 1, 3
  lo.r[0] = hmul2_bits(e2m1x2_to_f16x2((w << 4) & 0x7070u, sa << 4), s2);   // dims 0, 2
  lo.r[1] = hmul2_bits(e2m1x2_to_f16x2(w & 0x7070u, sa), s2);               // dims 1, 3
  hi.r[0] = hmul2_bits(e2m1x2_to_f16x2((w >> 12) & 0x7070u, sb << 4), s2);  // dims 4, 6
  hi.r[1] = hmul2_bits(e2m1x2_to_f16x2((w >> 16) & 0x7070u, sb), s2);       // dims 5, 7
}

// The block scales of this lane's codes in 32-dim groups j and j + 1 (j even) of one key, from
// its scale row: {s_j, s_j+1} (f16, x kFp4ScaleBias). Lane t's dims 8t.. of group j lie in block
// 2j + t / 2.
__device__ __forceinline__ uint32_t k_scales_fp4(const unsigned char* scale_row, int j, int lane) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(scale_row + 2 * j);  // blocks 2j .. 2j + 3
  const uint32_t h = static_cast<uint32_t>(lane & 3) >> 1;
  return e4m3x2_scales(__byte_perm(w, 0u, h | ((h + 2u) << 4)));
}

// Q as the A operands of k-steps 2j (lo) and 2j + 1 (hi) in the order above, from a 16-bit
// [row][dim] tile (pitch in elements): rows row0 + g and row0 + g + 8, dims 32j + 8t .. + 7.
__device__ __forceinline__ void a_frags_fp4_order(const uint16_t* tile, int pitch, int row0, int j, int lane,
                                                  FragA& lo, FragA& hi) {
  const uint16_t* p = tile + (row0 + (lane >> 2)) * pitch + j * 32 + 8 * (lane & 3);
  const uint4 r = *reinterpret_cast<const uint4*>(p);
  const uint4 r8 = *reinterpret_cast<const uint4*>(p + 8 * pitch);
  lo.r[0] = __byte_perm(r.x, r.y, 0x5410);  // dims 0, 2
  lo.r[2] = __byte_perm(r.x, r.y, 0x7632);  // dims 1, 3
  lo.r[1] = __byte_perm(r8.x, r8.y, 0x5410);
  lo.r[3] = __byte_perm(r8.x, r8.y, 0x7632);
  hi.r[0] = __byte_perm(r.z, r.w, 0x5410);  // dims 4, 6
  hi.r[2] = __byte_perm(r.z, r.w, 0x7632);  // dims 5, 7
  hi.r[1] = __byte_perm(r8.z, r8.w, 0x5410);
  hi.r[3] = __byte_perm(r8.z, r8.w, 0x7632);
}

// ---- V ------------------------------------------------------------------------------------

// The words of two keys a, b (8 codes each, the same dims) and their scales s_ab ({s_a, s_b})
// -> f16x2 (a's value low) of each of the 8 dims.
__device__ __forceinline__ void v_pairs_fp4(uint32_t wa, uint32_t wb, uint32_t s_ab, uint32_t (&out)[8]) {
  const uint32_t c_lo = __byte_perm(wa, wb, 0x5140);  // a.b0 b.b0 a.b1 b.b1
  const uint32_t c_hi = __byte_perm(wa, wb, 0x7362);  // a.b2 b.b2 a.b3 b.b3
  const uint32_t d0 = __byte_perm(wa, wb, 0x4000), d1 = __byte_perm(wa, wb, 0x5010);  // a.bi at byte 1, b.bi at 3
  const uint32_t d2 = __byte_perm(wa, wb, 0x6020), d3 = __byte_perm(wa, wb, 0x7030);
  out[0] = hmul2_bits(e2m1x2_to_f16x2((c_lo << 4) & 0x7070u, d0 << 4), s_ab);
  out[1] = hmul2_bits(e2m1x2_to_f16x2(c_lo & 0x7070u, d0), s_ab);
  out[2] = hmul2_bits(e2m1x2_to_f16x2((c_lo >> 12) & 0x7070u, d1 << 4), s_ab);
  out[3] = hmul2_bits(e2m1x2_to_f16x2((c_lo >> 16) & 0x7070u, d1), s_ab);
  out[4] = hmul2_bits(e2m1x2_to_f16x2((c_hi << 4) & 0x7070u, d2 << 4), s_ab);
  out[5] = hmul2_bits(e2m1x2_to_f16x2(c_hi & 0x7070u, d2), s_ab);
  out[6] = hmul2_bits(e2m1x2_to_f16x2((c_hi >> 12) & 0x7070u, d3 << 4), s_ab);
  out[7] = hmul2_bits(e2m1x2_to_f16x2((c_hi >> 16) & 0x7070u, d3), s_ab);
}

// V as the B operands of the k-step of keys key0 .. key0 + 15 for the 8 n8 fragments of 64-dim
// group `group` (fragment e, column n: dim 64 group + 8n + e). L: the data tile's layout;
// scales: the side's scale tile (rows of kScaleRowBytes).
template <class L, int kScaleRowBytes>
__device__ __forceinline__ void v_frags_fp4(const unsigned char* tile, const unsigned char* scales, int key0,
                                            int group, int lane, FragB (&b)[8]) {
  const int g = lane >> 2, t = lane & 3;
  const int row = key0 + 2 * t, byte = group * 32 + 4 * g;
  auto word = [&](int r) { return *reinterpret_cast<const uint32_t*>(tile + L::at(r, byte)); };
  // (block 4 group + g / 2 of each key: byte g / 2 of the scale row's word `group`)
  auto scale_word = [&](int r) { return *reinterpret_cast<const uint32_t*>(scales + r * kScaleRowBytes + 4 * group); };
  const uint32_t h = static_cast<uint32_t>(g) >> 1, sel = h | ((h + 4u) << 4);
  const uint32_t s01 = e4m3x2_scales(__byte_perm(scale_word(row), scale_word(row + 1), sel));
  const uint32_t s89 = e4m3x2_scales(__byte_perm(scale_word(row + 8), scale_word(row + 9), sel));
  uint32_t lo[8], hi[8];
  v_pairs_fp4(word(row), word(row + 1), s01, lo);
  v_pairs_fp4(word(row + 8), word(row + 9), s89, hi);
#pragma unroll
  for (int e = 0; e < 8; ++e) b[e] = FragB{{lo[e], hi[e]}};
}

}  // namespace attnkit::cuda
