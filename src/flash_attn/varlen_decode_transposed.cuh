// The transposed decode tile of the mma_sync kernel (fp8 caches, <= 8 packed query rows per
// work item, e.g. one decode token x a GQA group of <= 8; VarlenTraits::kTransposed).
//
// The 16-row tile wastes most of each m16n8k16 MMA on a decode: with 4 packed rows, 12 of its
// 16 M rows are padding, and the exp2, the row maxima and the fp32 output all carry them. Here
// the warp's 16 keys of a K/V tile are the MMA's M and the rows its N (8):
//   S^T (16 keys x 8 rows) = K (16 x d) Q^T (d x 8)       K: A fragments, Q^T: B, in registers
//   P^T = softmax over each column of S^T               (cuda/frag_rows.h RowsOnN)
//   O^T (d x 8 rows) += V^T (d x 16 keys) P^T (16 x 8)   V^T: A fragments, P^T: B
// Per warp and 16 keys at head size 128: 8 + 8 MMAs instead of 16 + 16, 4 exp2 instead of 8, and
// O^T takes 32 fp32 registers instead of 64 (so 4 CTAs fit per SM under 128 registers).
// The fp8 codes are loaded and converted exactly as for the 16-row tile (fp8_dequant.h: the
// same instructions, the registers handed to the other operand: a_from_b_pair); P^T reaches
// the B operand through two movmatrix transposes per 16 keys.
#pragma once
#include "cuda/fp8_dequant.h"
#include "cuda/frag_rows.h"
#include "cuda/mma_sm80.h"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn::detail {

using cuda::FragA;
using cuda::FragB;
using cuda::FragC;

// Where this lane's fp8 codes sit in a K / V stage tile of layout KvL, the same for every tile
// of the warp's key range: computed once before the main loop (with the 128-byte swizzle the
// addresses took ~50 instructions per warp and tile when derived inside it). Rows 16 i further
// (fragment i) and the keys 2t + 8 / 2t + 9 of the V words are constant steps of the layout.
template <class Tr, class KvL>
struct TransposedLaneOffsets {
  static constexpr int kGroups = Tr::kHeadDim / 32;
  uint32_t k[Tr::kKSteps / 2];  // ldmatrix row address of k-step pair j (k_frags_fp8_offset)
  uint32_t v[kGroups][2];       // 32-bit word of keys 2t / 2t + 1 of 32-dim group grp
  __device__ __forceinline__ static uint32_t frag_step() { return KvL::at(16, 0) - KvL::at(0, 0); }
  __device__ __forceinline__ static uint32_t row8_step() { return KvL::at(8, 0) - KvL::at(0, 0); }
  __device__ __forceinline__ TransposedLaneOffsets(int key0, int lane) {
#pragma unroll
    for (int j = 0; j < Tr::kKSteps / 2; ++j) k[j] = cuda::k_frags_fp8_offset<KvL>(key0, 2 * j, lane);
    const int row = key0 + 2 * (lane & 3), byte = 4 * (lane >> 2);
#pragma unroll
    for (int grp = 0; grp < kGroups; ++grp) {
      v[grp][0] = KvL::at(row, grp * 32 + byte);
      v[grp][1] = KvL::at(row + 1, grp * 32 + byte);
    }
  }
};

// S^T over this warp's keys (fragment i: keys 16 i .. 16 i + 15 of its range) of the tile at sk.
// Even and odd k16 steps accumulate in two chains (one chain of 8 dependent MMAs otherwise),
// summed at the end.
template <class Tr, cuda::Fp8Format kFmt, class KvL>
__device__ __forceinline__ void qk_tile_transposed(FragC (&s)[Tr::kAccSFrags], const FragB (&q)[Tr::kKSteps],
                                                   uint32_t sk, const TransposedLaneOffsets<Tr, KvL>& off) {
#pragma unroll
  for (int i = 0; i < Tr::kAccSFrags; ++i) {
    FragC odd{};
    s[i] = FragC{};
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ks += 2) {
      FragB b[4];
      cuda::k_frags_fp8_at<kFmt>(sk + i * off.frag_step() + off.k[ks / 2], b);
      cuda::mma_16816<__half>(s[i], cuda::a_from_b_pair(b, 0), q[ks]);
      cuda::mma_16816<__half>(odd, cuda::a_from_b_pair(b, 1), q[ks + 1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i].c[e] += odd.c[e];
  }
}

// O^T += V^T P^T with P^T from the softmaxed S^T. O^T fragment 2 * grp + j holds dims
// 32 grp + 4 g + 2 j (c[0], c[1]) and + 1 (c[2], c[3]) of rows 2t (c[0], c[2]) and 2t + 1
// (c[1], c[3]) -- the head dimension permuted as in v_frags_fp8, undone by store_o_transposed.
template <class Tr, cuda::Fp8Format kFmt, class KvL>
__device__ __forceinline__ void pv_tile_transposed(FragC (&o)[Tr::kAccOFrags], const FragC (&s)[Tr::kAccSFrags],
                                                   const unsigned char* v_tile, const TransposedLaneOffsets<Tr, KvL>& off) {
#pragma unroll
  for (int i = 0; i < Tr::kAccSFrags; ++i) {
    const FragB pb{{cuda::movmatrix_trans(cuda::pack2<__half>(s[i].c[0], s[i].c[1])),
                    cuda::movmatrix_trans(cuda::pack2<__half>(s[i].c[2], s[i].c[3]))}};
#pragma unroll
    for (int grp = 0; grp < Tr::kHeadDim / 32; ++grp) {
      const unsigned char* w = v_tile + i * off.frag_step();
      auto word = [&](uint32_t o) { return *reinterpret_cast<const uint32_t*>(w + o); };
      FragB b[4];
      cuda::v_frags_fp8_from_words<kFmt>(word(off.v[grp][0]), word(off.v[grp][1]), word(off.v[grp][0] + off.row8_step()),
                                         word(off.v[grp][1] + off.row8_step()), b);
      cuda::mma_16816<__half>(o[2 * grp], cuda::a_from_b_pair(b, 0), pb);
      cuda::mma_16816<__half>(o[2 * grp + 1], cuda::a_from_b_pair(b, 1), pb);
    }
  }
}

// O^T -> the epilogue's fp32 [row][dim] rows (row pitch `pitch` floats): rows 2t and 2t + 1,
// four consecutive dims 32 grp + 4 g .. + 3 per 32-dim group, one float4 each.
template <class Tr>
__device__ __forceinline__ void store_o_transposed(float* rows, int pitch, const FragC (&o)[Tr::kAccOFrags], int lane) {
  float* r0 = rows + 2 * (lane & 3) * pitch + 4 * (lane >> 2);
#pragma unroll
  for (int grp = 0; grp < Tr::kHeadDim / 32; ++grp) {
    const FragC& a = o[2 * grp];
    const FragC& b = o[2 * grp + 1];
    *reinterpret_cast<float4*>(r0 + 32 * grp) = make_float4(a.c[0], a.c[2], b.c[0], b.c[2]);
    *reinterpret_cast<float4*>(r0 + pitch + 32 * grp) = make_float4(a.c[1], a.c[3], b.c[1], b.c[3]);
  }
}

}  // namespace attnkit::flash_attn::detail
