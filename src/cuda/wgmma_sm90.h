// Warpgroup tensor-core vocabulary of the hopper generation (sm_90a only): shared-memory matrix
// descriptors for 128- and 64-byte-swizzled tiles, wgmma.mma_async (16-bit with A from registers
// or shared memory, fp8 with A from registers or shared memory), and the fences that order it against
// ordinary code.
//
// Layout of a tile the descriptors describe ("Swizzle128Tile"): the tile's rows (keys) are
// 128-byte lines (64 16-bit values of one 64-column chunk); the 16-byte chunk j of row n sits at
// position j ^ (n % 8) of its line; chunk c of the columns is a region of kRows lines, regions
// laid out one after the other, each 1024-byte aligned. The same bytes serve two operands:
//   * K of S = Q K^T: B is K-major (head dims contiguous). Descriptor: start = region of the
//     k16 step's dims + 32 bytes per step inside the line, SBO = 1024 (8 rows), LBO unused.
//   * V of O = P V: B is MN-major (head dims contiguous, keys = K dimension), transposed by the
//     instruction. Descriptor: start = region 0 + 2048 bytes per k16 step of keys, LBO = one
//     region (next 64 head dims), SBO = 1024 (next 8 keys).
// A comes from the same K-major layout (SS form) or from registers (RS form, the layout of the
// mma.sync A fragment: each warp of the warpgroup owns 16 of the 64 rows). The fp32
// accumulator of m64nN is, per warp, the mma.sync C fragments of N/8 n8 tiles: the online
// softmax and the masks of the mma_sync generation apply unchanged.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/mma_sm80.h"

namespace attnkit::cuda {

// The matrix descriptor of wgmma (PTX ISA "Matrix Descriptor Format"): start address, leading
// and stride byte offsets (all >> 4), swizzle mode 1 = 128 bytes in bits 62-63. Shared-window
// addresses are below 256 KB, so the start (bits 0-13) needs no mask, and a descriptor moves
// along its tile by one add on its low word (smem_desc_advance).
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t lo = (smem_addr >> 4) | (((lbo_bytes & 0x3FFFF) >> 4) << 16);
  const uint32_t hi = ((sbo_bytes & 0x3FFFF) >> 4) | (1u << 30);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
// The same for a 64-byte-swizzled K-major tile (swizzle mode 2; LBO unused: 16 bytes).
__device__ __forceinline__ uint64_t smem_desc_sw64(uint32_t smem_addr, uint32_t sbo_bytes) {
  const uint32_t lo = (smem_addr >> 4) | (1u << 16);
  const uint32_t hi = ((sbo_bytes & 0x3FFFF) >> 4) | (2u << 30);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
// The descriptor of the operand `bytes` (a multiple of 16) further into the same tile: the
// start field grows, nothing carries out of it (the address stays below 256 KB).
__device__ __forceinline__ uint64_t smem_desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + (bytes >> 4));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy shared-memory writes (cp.async, st.shared) made visible to the async proxy
// that wgmma reads through; each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of accumulator registers across a wgmma
// wait (the asm statements of wgmma only tie the registers at issue time).
template <int N>
__device__ __forceinline__ void wgmma_hold(FragC (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(d[i].c[j])::"memory");
}
// The same for A-operand registers of an RS wgmma: they must keep their values until the wait.
template <int N>
__device__ __forceinline__ void wgmma_hold(FragA (&a)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(a[i].r[j])::"memory");
}

// D (m64 x kN, fp32) += A (m64 x k16, registers) * B (k16 x kN, descriptor); kTransB = 1
// for an MN-major B. Defined for T = __nv_bfloat16 / __half and kN = 32 / 64 / 128 (wider
// outputs are several of these on column ranges of one accumulator: hopper_kernel.cuh; 32: the
// lower half of a 128-byte-swizzled region, head dim 96's last columns).
template <class T, int kN>
struct WgmmaRS;
// D (m64 x kN, fp32) += A (m64 x k16) * B (k16 x kN), both K-major by descriptor (kN = 64 / 128).
template <class T, int kN>
struct WgmmaSS;
// D (m64 x kN, fp32) += A (m64 x k32, e4m3 codes) * B (k32 x kN, e4m3 or e5m2 codes: kBE5m2),
// both K-major by descriptor from 64-byte-swizzled tiles (kN = 64 / 128).
template <bool kBE5m2, int kN>
struct WgmmaSSFp8;
// D (m64 x kN, fp32) += A (m64 x k32, e4m3 codes in four registers: c_quad_to_a_e4m3) * B (k32 x
// kN, e4m3 or e5m2 codes), B K-major by descriptor (kN = 64 / 128).
template <bool kBE5m2, int kN>
struct WgmmaRSFp8;

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTNKIT_HAS_WGMMA 1
#else
#define ATTNKIT_HAS_WGMMA 0
#endif

#if ATTNKIT_HAS_WGMMA
// The accumulator operands of m64n64 / m64n128 (FragC d[8] / d[16]) and their register lists.
#define ATTNKIT_WGMMA_F4(i) "+f"(d[i].c[0]), "+f"(d[i].c[1]), "+f"(d[i].c[2]), "+f"(d[i].c[3])
#define ATTNKIT_WGMMA_D32 ATTNKIT_WGMMA_F4(0), ATTNKIT_WGMMA_F4(1), ATTNKIT_WGMMA_F4(2), ATTNKIT_WGMMA_F4(3)
#define ATTNKIT_WGMMA_D64                                                                          \
  ATTNKIT_WGMMA_D32, ATTNKIT_WGMMA_F4(4), ATTNKIT_WGMMA_F4(5), ATTNKIT_WGMMA_F4(6), ATTNKIT_WGMMA_F4(7)
#define ATTNKIT_WGMMA_D128                                                                          \
  ATTNKIT_WGMMA_D64, ATTNKIT_WGMMA_F4(8), ATTNKIT_WGMMA_F4(9), ATTNKIT_WGMMA_F4(10), ATTNKIT_WGMMA_F4(11), \
      ATTNKIT_WGMMA_F4(12), ATTNKIT_WGMMA_F4(13), ATTNKIT_WGMMA_F4(14), ATTNKIT_WGMMA_F4(15)
#define ATTNKIT_WGMMA_R32 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define ATTNKIT_WGMMA_R64 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define ATTNKIT_WGMMA_R128 ATTNKIT_WGMMA_R64 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"

// One wgmma.mma_async with an N-wide fp32 accumulator: PRED is the operand number of the
// accumulate flag, OPERANDS the instruction's text after the accumulator list.
#define ATTNKIT_WGMMA_ASM(N, PTX_TYPE, PRED, OPERANDS)                                          \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %" PRED ", 0;\n"                                             \
  "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX_TYPE "." PTX_TYPE " {" ATTNKIT_WGMMA_R##N \
  "}, " OPERANDS ";\n}\n"

// RS: A in four registers, B by descriptor, trans-B an immediate.
#define ATTNKIT_WGMMA_RS(N, CXX_TYPE, PTX_TYPE, PRED, OPERANDS)                                   \
  template <>                                                                                   \
  struct WgmmaRS<CXX_TYPE, N> {                                                                 \
    template <int kTransB>                                                                      \
    __device__ __forceinline__ static void run(FragC (&d)[N / 8], const FragA& a, uint64_t desc_b, \
                                               bool accumulate) {                               \
      asm volatile(ATTNKIT_WGMMA_ASM(N, PTX_TYPE, PRED, OPERANDS)                                \
                   : ATTNKIT_WGMMA_D##N                                                        \
                   : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(desc_b),          \
                     "r"(static_cast<int>(accumulate)), "n"(kTransB));                         \
    }                                                                                           \
  };
// SS: A and B by descriptor, both K-major.
#define ATTNKIT_WGMMA_SS(N, CXX_TYPE, PTX_TYPE, PRED, OPERANDS)                                   \
  template <>                                                                                   \
  struct WgmmaSS<CXX_TYPE, N> {                                                                 \
    __device__ __forceinline__ static void run(FragC (&d)[N / 8], uint64_t desc_a, uint64_t desc_b, \
                                               bool accumulate) {                               \
      asm volatile(ATTNKIT_WGMMA_ASM(N, PTX_TYPE, PRED, OPERANDS)                                \
                   : ATTNKIT_WGMMA_D##N                                                        \
                   : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));             \
    }                                                                                           \
  };

ATTNKIT_WGMMA_RS(32, __nv_bfloat16, "bf16", "21", "{%16,%17,%18,%19}, %20, p, 1, 1, %22")
ATTNKIT_WGMMA_RS(32, __half, "f16", "21", "{%16,%17,%18,%19}, %20, p, 1, 1, %22")
ATTNKIT_WGMMA_RS(64, __nv_bfloat16, "bf16", "37", "{%32,%33,%34,%35}, %36, p, 1, 1, %38")
ATTNKIT_WGMMA_RS(64, __half, "f16", "37", "{%32,%33,%34,%35}, %36, p, 1, 1, %38")
ATTNKIT_WGMMA_RS(128, __nv_bfloat16, "bf16", "69", "{%64,%65,%66,%67}, %68, p, 1, 1, %70")
ATTNKIT_WGMMA_RS(128, __half, "f16", "69", "{%64,%65,%66,%67}, %68, p, 1, 1, %70")
ATTNKIT_WGMMA_SS(64, __nv_bfloat16, "bf16", "34", "%32, %33, p, 1, 1, 0, 0")
ATTNKIT_WGMMA_SS(64, __half, "f16", "34", "%32, %33, p, 1, 1, 0, 0")
ATTNKIT_WGMMA_SS(128, __nv_bfloat16, "bf16", "66", "%64, %65, p, 1, 1, 0, 0")
ATTNKIT_WGMMA_SS(128, __half, "f16", "66", "%64, %65, p, 1, 1, 0, 0")

// fp8 SS: m64nNk32 with an e4m3 A and a B of B_TYPE; no transpose immediates (fp8 operands are
// K-major only).
#define ATTNKIT_WGMMA_SS_FP8(N, B_E5M2, B_TYPE, PRED, OPERANDS)                                    \
  template <>                                                                                   \
  struct WgmmaSSFp8<B_E5M2, N> {                                                                \
    __device__ __forceinline__ static void run(FragC (&d)[N / 8], uint64_t desc_a, uint64_t desc_b, \
                                               bool accumulate) {                               \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" PRED ", 0;\n"                             \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3." B_TYPE " {" ATTNKIT_WGMMA_R##N \
                   "}, " OPERANDS ";\n}\n"                                                       \
                   : ATTNKIT_WGMMA_D##N                                                        \
                   : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));             \
    }                                                                                           \
  };
ATTNKIT_WGMMA_SS_FP8(64, false, "e4m3", "34", "%32, %33, p, 1, 1")
ATTNKIT_WGMMA_SS_FP8(64, true, "e5m2", "34", "%32, %33, p, 1, 1")
ATTNKIT_WGMMA_SS_FP8(128, false, "e4m3", "66", "%64, %65, p, 1, 1")
ATTNKIT_WGMMA_SS_FP8(128, true, "e5m2", "66", "%64, %65, p, 1, 1")
// fp8 RS: the same with A in four registers.
#define ATTNKIT_WGMMA_RS_FP8(N, B_E5M2, B_TYPE, PRED, OPERANDS)                                    \
  template <>                                                                                   \
  struct WgmmaRSFp8<B_E5M2, N> {                                                                \
    __device__ __forceinline__ static void run(FragC (&d)[N / 8], const FragA& a, uint64_t desc_b, \
                                               bool accumulate) {                               \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" PRED ", 0;\n"                             \
                   "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3." B_TYPE " {" ATTNKIT_WGMMA_R##N \
                   "}, " OPERANDS ";\n}\n"                                                       \
                   : ATTNKIT_WGMMA_D##N                                                        \
                   : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "l"(desc_b),          \
                     "r"(static_cast<int>(accumulate)));                                       \
    }                                                                                           \
  };
ATTNKIT_WGMMA_RS_FP8(64, false, "e4m3", "37", "{%32,%33,%34,%35}, %36, p, 1, 1")
ATTNKIT_WGMMA_RS_FP8(64, true, "e5m2", "37", "{%32,%33,%34,%35}, %36, p, 1, 1")
ATTNKIT_WGMMA_RS_FP8(128, false, "e4m3", "69", "{%64,%65,%66,%67}, %68, p, 1, 1")
ATTNKIT_WGMMA_RS_FP8(128, true, "e5m2", "69", "{%64,%65,%66,%67}, %68, p, 1, 1")
#undef ATTNKIT_WGMMA_RS_FP8
#undef ATTNKIT_WGMMA_SS_FP8
#undef ATTNKIT_WGMMA_SS
#undef ATTNKIT_WGMMA_RS
#undef ATTNKIT_WGMMA_ASM
#undef ATTNKIT_WGMMA_R128
#undef ATTNKIT_WGMMA_R64
#undef ATTNKIT_WGMMA_R32
#undef ATTNKIT_WGMMA_D128
#undef ATTNKIT_WGMMA_D64
#undef ATTNKIT_WGMMA_D32
#undef ATTNKIT_WGMMA_F4
#endif  // ATTNKIT_HAS_WGMMA

// The A fragment of an fp8 k32 step (P over 32 keys in slot order: cuda::Fp8VTranspose,
// tile_copy_layout.h) from the fp32 C fragments of its four n8 chunks, rounded to e4m3
// (saturating): register j packs chunks 2 (j / 2) and 2 (j / 2) + 1 of row g (j even) or g + 8.
__device__ __forceinline__ FragA c_quad_to_a_e4m3(const FragC& c0, const FragC& c1, const FragC& c2, const FragC& c3) {
  auto pack4 = [](float a, float b, float c, float d) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return lo | (hi << 16);
  };
  FragA a;
  a.r[0] = pack4(c0.c[0], c0.c[1], c1.c[0], c1.c[1]);
  a.r[1] = pack4(c0.c[2], c0.c[3], c1.c[2], c1.c[3]);
  a.r[2] = pack4(c2.c[0], c2.c[1], c3.c[0], c3.c[1]);
  a.r[3] = pack4(c2.c[2], c2.c[3], c3.c[2], c3.c[3]);
  return a;
}

// Four 8x8 b16 matrices from registers into shared memory (stmatrix): lane i gives the address
// of row i % 8 of matrix i / 8 (16 contiguous bytes); register j of lane i holds row i / 4,
// columns 2 (i % 4) and 2 (i % 4) + 1 of matrix j, the layout of half a C fragment packed to b16.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
#if ATTNKIT_HAS_WGMMA
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
#else
  __trap();  // (sm_90a code only: the hopper kernel)
#endif
}

}  // namespace attnkit::cuda
