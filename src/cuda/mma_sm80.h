// Warp-level tensor-core vocabulary of the mma.sync generation (sm80+): register fragments of
// m16n8k16, the MMA itself, ldmatrix loads from shared memory and fp32 -> 16-bit packing.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), lane = threadIdx.x % 32, g = lane / 4, t = lane % 4:
//   A (16x16, row-major): r[0] = (g, 2t..2t+1)   r[1] = (g+8, 2t..)   r[2] = (g, 8+2t..)   r[3] = (g+8, 8+2t..)
//   B (16x8, "col"):      r[0] = (k 2t..2t+1, n g)                     r[1] = (k 8+2t.., n g)
//   C (16x8, fp32):       c[0..1] = (g, 2t..2t+1)                      c[2..3] = (g+8, 2t..2t+1)
// So the C fragments of two adjacent n8 tiles are exactly the A fragment of one k16 step: the
// softmax probabilities P never leave registers on their way into O += P V.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace attnkit::cuda {

struct FragA {
  uint32_t r[4];
};
struct FragB {
  uint32_t r[2];
};
struct FragC {
  float c[4] = {0.f, 0.f, 0.f, 0.f};
};

// D = A * B + D with fp32 accumulation; T is __nv_bfloat16 or __half.
template <class T>
__device__ __forceinline__ void mma_16816(FragC& d, const FragA& a, const FragB& b);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(FragC& d, const FragA& a, const FragB& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(FragC& d, const FragA& a, const FragB& b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d.c[0]), "+f"(d.c[1]), "+f"(d.c[2]), "+f"(d.c[3])
      : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[1]));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane i supplies the row address of matrix i / 8, row i % 8.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// One 8x8 b16 matrix transposed across the warp (lane i holds row i / 4, columns 2 (i % 4) and
// 2 (i % 4) + 1, before and after): turns the C-fragment half (rows g, columns 2t..) of S^T into
// the B-fragment half (k 2t.., n g) of P^T in the transposed decode tile.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}

// Two floats -> one register of two 16-bit values (lo in the low half), round to nearest even.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment of k16 step made from the fp32 C fragments of two adjacent n8 tiles.
template <class T>
__device__ __forceinline__ FragA c_pair_to_a(const FragC& lo, const FragC& hi) {
  FragA a;
  a.r[0] = pack2<T>(lo.c[0], lo.c[1]);
  a.r[1] = pack2<T>(lo.c[2], lo.c[3]);
  a.r[2] = pack2<T>(hi.c[0], hi.c[1]);
  a.r[3] = pack2<T>(hi.c[2], hi.c[3]);
  return a;
}

// ---- shared-memory tile addressing for ldmatrix -------------------------------------------------
// Tiles are row-major with a padded row pitch (in elements) so that the eight 16-byte rows an
// ldmatrix phase reads fall into distinct banks.

// A operand (16 x 16) at (row0, col0): lanes 0-15 give rows 0-15 at col0, lanes 16-31 at col0 + 8.
__device__ __forceinline__ uint32_t a_frag_addr(uint32_t tile, int pitch, int row0, int col0, int lane) {
  return tile + 2u * static_cast<uint32_t>((row0 + (lane & 15)) * pitch + col0 + ((lane >> 4) << 3));
}
// (K / V tiles: kv_smem_layout.h, which takes the tile layout as a parameter.)

}  // namespace attnkit::cuda
