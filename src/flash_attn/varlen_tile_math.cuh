// The tile math of the mma_sync generation: what one warp computes on one K/V tile, as a policy
// of the kernel skeleton (varlen_kernel.cuh) chosen by the tile's fragment layout:
//   TileMath<Tr, ..., rows on M>   S = Q K^T, softmax, O += P V   (every tile but the transposed)
//   TileMath<Tr, ..., transposed>  S^T = K Q^T, O^T += V^T P^T    (varlen_decode_transposed.cuh)
// Both hold the warp's Q fragments (when in registers), its online-softmax state and its output
// accumulator, and offer: load_q (Q has landed in shared memory), step (one K/V tile), and
// store_parts (the epilogue's per-warp rows and softmax stats into shared memory).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda/attention_mask.h"
#include "cuda/cp_async.h"
#include "cuda/fp4_dequant.h"
#include "cuda/fp8_dequant.h"
#include "cuda/frag_rows.h"
#include "cuda/kv_smem_layout.h"
#include "cuda/mma_sm80.h"
#include "cuda/online_softmax.h"
#include "cuda/paged_kv_tile.h"
#include "flash_attn/varlen_decode_transposed.cuh"
#include "flash_attn/varlen_schedule.cuh"
#include "flash_attn/varlen_tile_softmax.cuh"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn::detail {

using namespace attnkit::cuda;

// fp8 caches with a bf16 Q: Q tile (in shared memory, landed) -> f16 in place, times a power
// of two that keeps the tile's largest value below 2^15. Returns that factor (the caller
// divides the softmax scale by it; bf16 values are exact in f16 in its normal range).
template <class Tr>
__device__ __forceinline__ float q_tile_to_f16(unsigned char* smem, int tid) {
  __shared__ float s_warp_max[Tr::kThreads / 32];
  uint32_t* q = reinterpret_cast<uint32_t*>(smem);  // pairs of values
  constexpr int kPairsPerRow = Tr::kHeadDim / 2, kPitchPairs = Tr::kPitch / 2;
  float mx = 0.f;
  for (int i = tid; i < Tr::kBlockM * kPairsPerRow; i += Tr::kThreads) {
    const uint32_t v = q[(i / kPairsPerRow) * kPitchPairs + i % kPairsPerRow];
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
    mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) s_warp_max[tid >> 5] = mx;
  __syncthreads();
  mx = 0.f;
#pragma unroll
  for (int w = 0; w < Tr::kThreads / 32; ++w) mx = fmaxf(mx, s_warp_max[w]);
  const float factor = f16_range_factor(mx);
  for (int i = tid; i < Tr::kBlockM * kPairsPerRow; i += Tr::kThreads) {
    uint32_t& v = q[(i / kPairsPerRow) * kPitchPairs + i % kPairsPerRow];
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
    v = pack2<__half>(f.x * factor, f.y * factor);
  }
  __syncthreads();
  return factor;
}

// S (this warp's kMFrags x 16 rows x kWarpKeys keys) = Q K^T. Each K fragment read from
// shared memory feeds every row fragment.
template <class Tr, Fp8Format kFmt, class KvL>
__device__ __forceinline__ void qk_tile(FragC (&s)[Tr::kMFrags][Tr::kSFrags],
                                        const FragA (&q_regs)[Tr::kQInRegs ? Tr::kKSteps : 1],
                                        const unsigned char* smem, uint32_t sq, int warp_row0, uint32_t sk,
                                        int key0, int lane) {
  using M = typename Tr::MmaElem;
#pragma unroll
  for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
    for (int i = 0; i < Tr::kSFrags; ++i) s[mf][i] = FragC{};
  if constexpr (Tr::kFp4Cache) {
    // Codes of 32-dim groups in the order of fp4_dequant.h; groups j, j + 1 per ldmatrix.
    const unsigned char* k_scales = smem + (sk - sq) + Tr::kStageDataBytes;
    const int g = lane >> 2;
#pragma unroll
    for (int j = 0; j < Tr::kHeadDim / 32; j += 2) {
      FragA a[Tr::kMFrags][4];  // k-steps 2j .. 2j + 3
#pragma unroll
      for (int mf = 0; mf < Tr::kMFrags; ++mf) {
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int h = 0; h < 4; ++h) a[mf][h] = q_regs[2 * j + h];
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            a_frags_fp4_order(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch, warp_row0 + 16 * mf, j + h, lane,
                              a[mf][2 * h], a[mf][2 * h + 1]);
        }
      }
#pragma unroll
      for (int nf = 0; nf < Tr::kSFrags; nf += 2) {
        uint32_t r[4];  // (keys g, g + 8) x (groups j, j + 1)
        ldmatrix_x4(r, sk + k_frags_fp8_offset<KvL>(key0 + nf * 8, j, lane));
        const uint32_t s_g = k_scales_fp4(k_scales + (key0 + nf * 8 + g) * Tr::kScaleRowBytes, j, lane);
        const uint32_t s_g8 = k_scales_fp4(k_scales + (key0 + nf * 8 + 8 + g) * Tr::kScaleRowBytes, j, lane);
        FragB b[2][4];  // [key half][k-step 2j .. 2j + 3]
        k_frags_fp4_from_word(r[0], low_twice(s_g), b[0][0], b[0][1]);
        k_frags_fp4_from_word(r[2], high_twice(s_g), b[0][2], b[0][3]);
        k_frags_fp4_from_word(r[1], low_twice(s_g8), b[1][0], b[1][1]);
        k_frags_fp4_from_word(r[3], high_twice(s_g8), b[1][2], b[1][3]);
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
          for (int h = 0; h < 4; ++h) {
            mma_16816<M>(s[mf][nf], a[mf][h], b[0][h]);
            mma_16816<M>(s[mf][nf + 1], a[mf][h], b[1][h]);
          }
      }
    }
    return;
  } else if constexpr (Tr::kFp8Cache) {
    // Head dimension permuted within each k16 step (fp8_dequant.h): 4 codes per lane.
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ks += 2) {
      FragA a[Tr::kMFrags][2];
#pragma unroll
      for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (Tr::kQInRegs) {
            a[mf][h] = q_regs[ks + h];
          } else {
            a[mf][h] = a_frag_dim_permuted(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch,
                                           warp_row0 + 16 * mf, ks + h, lane);
          }
        }
#pragma unroll
      for (int nf = 0; nf < Tr::kSFrags; nf += 2) {
        FragB b[4];
        k_frags_fp8<kFmt, KvL>(sk, key0 + nf * 8, ks, lane, b);
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf) {
          mma_16816<M>(s[mf][nf], a[mf][0], b[0]);
          mma_16816<M>(s[mf][nf + 1], a[mf][0], b[1]);
          mma_16816<M>(s[mf][nf], a[mf][1], b[2]);
          mma_16816<M>(s[mf][nf + 1], a[mf][1], b[3]);
        }
      }
    }
    return;
  } else {
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      FragA a[Tr::kMFrags];
#pragma unroll
      for (int mf = 0; mf < Tr::kMFrags; ++mf) {
        if constexpr (Tr::kQInRegs) {
          a[mf] = q_regs[ks];
        } else {
          ldmatrix_x4(a[mf].r, a_frag_addr(sq, Tr::kPitch, warp_row0 + 16 * mf, ks * 16, lane));
        }
      }
#pragma unroll
      for (int nf = 0; nf < Tr::kSFrags; nf += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, bt_frag_addr_in<KvL>(sk, key0 + nf * 8, ks * 16, lane));
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf) {
          mma_16816<M>(s[mf][nf], a[mf], FragB{{b[0], b[1]}});
          mma_16816<M>(s[mf][nf + 1], a[mf], FragB{{b[2], b[3]}});
        }
      }
    }
  }
}

// O (kMFrags x 16 rows x kODim columns from o_col0) += P V, P taken from the softmaxed S fragments.
template <class Tr, Fp8Format kFmt, class KvL>
__device__ __forceinline__ void pv_tile(FragC (&o)[Tr::kMFrags][Tr::kOFrags],
                                        const FragC (&s)[Tr::kMFrags][Tr::kSFrags], const unsigned char* smem,
                                        uint32_t s_base, uint32_t sv, int key0, int o_col0, int lane) {
  using M = typename Tr::MmaElem;
#pragma unroll
  for (int kk = 0; kk < Tr::kSFrags / 2; ++kk) {
    FragA pa[Tr::kMFrags];
#pragma unroll
    for (int mf = 0; mf < Tr::kMFrags; ++mf) pa[mf] = c_pair_to_a<M>(s[mf][2 * kk], s[mf][2 * kk + 1]);
    if constexpr (Tr::kFp4Cache) {
      // O's columns permuted within 64-dim groups (fp4_dequant.h); undone in the epilogue.
      const unsigned char* v_tile = smem + (sv - s_base);
#pragma unroll
      for (int group = 0; group < Tr::kODim / 64; ++group) {
        FragB b[8];
        v_frags_fp4<KvL, Tr::kScaleRowBytes>(v_tile, v_tile + Tr::kStageDataBytes, key0 + kk * 16, group, lane, b);
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
          for (int e = 0; e < 8; ++e) mma_16816<M>(o[mf][8 * group + e], pa[mf], b[e]);
      }
    } else if constexpr (Tr::kFp8Cache) {
      // O's columns permuted within 32-dim groups (fp8_dequant.h); undone in the epilogue.
      const unsigned char* v_tile = smem + (sv - s_base);
#pragma unroll
      for (int group = 0; group < Tr::kODim / 32; ++group) {
        FragB b[4];
        v_frags_fp8<kFmt, KvL>(v_tile, key0 + kk * 16, o_col0 / 32 + group, lane, b);
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
          for (int e = 0; e < 4; ++e) mma_16816<M>(o[mf][4 * group + e], pa[mf], b[e]);
      }
    } else {
#pragma unroll
      for (int dn = 0; dn < Tr::kOFrags; dn += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, b_frag_addr_trans_in<KvL>(sv, key0 + kk * 16, o_col0 + dn * 8, lane));
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf) {
          mma_16816<M>(o[mf][dn], pa[mf], FragB{{b[0], b[1]}});
          mma_16816<M>(o[mf][dn + 1], pa[mf], FragB{{b[2], b[3]}});
        }
      }
    }
  }
}

// ---- the policies -------------------------------------------------------------------------

template <class Tr, Fp8Format kFmt, class KvL, bool kTransposed = Tr::kTransposed>
struct TileMath;

// Rows on M: each warp holds kMFrags m16 fragments of rows x its kWarpKeys keys of every tile.
template <class Tr, Fp8Format kFmt, class KvL>
struct TileMath<Tr, kFmt, KvL, false> {
  FragA q_regs[Tr::kQInRegs ? Tr::kKSteps : 1];
  RowSoftmax softmax[Tr::kMFrags];
  FragC o[Tr::kMFrags][Tr::kAccOFrags];
  int warp_row0, warp_key0, lane;
  int o_col0;  // the first of the kODim output columns this CTA computes (V's columns read)

  __device__ __forceinline__ TileMath(int warp_row0_, int warp_key0_, int lane_, int o_col0_ = 0)
      : warp_row0(warp_row0_), warp_key0(warp_key0_), lane(lane_), o_col0(o_col0_) {
#pragma unroll
    for (int mf = 0; mf < Tr::kMFrags; ++mf) softmax[mf].init();
  }
  // Q has landed in shared memory (at smem / s_q): its fragments into registers.
  __device__ __forceinline__ void load_q(const unsigned char* smem, uint32_t s_q) {
    if constexpr (Tr::kFp4Cache) {
#pragma unroll
      for (int j = 0; j < Tr::kHeadDim / 32; ++j)
        a_frags_fp4_order(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch, warp_row0, j, lane, q_regs[2 * j],
                          q_regs[2 * j + 1]);
    } else {
#pragma unroll
      for (int ks = 0; ks < Tr::kKSteps; ++ks) {
        if constexpr (Tr::kFp8Cache)
          q_regs[ks] = a_frag_dim_permuted(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch, warp_row0, ks, lane);
        else
          ldmatrix_x4(q_regs[ks].r, a_frag_addr(s_q, Tr::kPitch, warp_row0, ks * 16, lane));
      }
    }
  }
  // One K/V tile (K at s_k, V at s_v) whose first key is tile_key0.
  __device__ __forceinline__ void step(const unsigned char* smem, uint32_t s_q, uint32_t s_k, uint32_t s_v,
                                       const ScoreMod& mod, float unit, bool whole_tile_visible,
                                       const VarlenKernelParams& p, const WorkItem& w, int tile_key0) {
    FragC s[Tr::kMFrags][Tr::kAccSFrags];
    qk_tile<Tr, kFmt, KvL>(s, q_regs, smem, s_q, warp_row0, s_k, warp_key0, lane);
#pragma unroll
    for (int mf = 0; mf < Tr::kMFrags; ++mf)
      softmax_tile(s[mf], o[mf], softmax[mf], mod, unit, whole_tile_visible, p, w, warp_row0 + 16 * mf,
                   tile_key0 + warp_key0, lane);
    pv_tile<Tr, kFmt, KvL>(o, s, smem, s_q, s_v, warp_key0, Tr::kOSlices > 1 ? o_col0 : 0, lane);
  }
  // The warp's unnormalised rows (fp32, pitch kOPitch, starting at its row 0) and (max, sum).
  __device__ __forceinline__ void store_parts(float* s_o, float2* s_stat, float unit, int warp_m) const {
#pragma unroll
    for (int mf = 0; mf < Tr::kMFrags; ++mf) {
      float max_log2[2], sum[2];
      softmax[mf].finish(unit, max_log2, sum);
      const int row = warp_m * Tr::kWarpRows + 16 * mf + (lane >> 2);
      float* base = s_o + row * Tr::kOPitch + 2 * (lane & 3);
      if constexpr (Tr::kFp4Cache) {
        // Undo the column permutation of the NVFP4 P V (v_frags_fp4): in each 64-dim group the
        // lane's columns are dims 64 G + 16 t + e (c[0] of fragment e) and + 8 + e (c[1]).
        float* row_lo = base - 2 * (lane & 3) + 16 * (lane & 3);
#pragma unroll
        for (int g = 0; g < Tr::kOFrags / 8; ++g) {
          const FragC* f = &o[mf][8 * g];
          float* d = row_lo + 64 * g;
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // rows lane / 4 and + 8
            float* dr = d + h * 8 * Tr::kOPitch;
            const int c0 = 2 * h, c1 = 2 * h + 1;
            *reinterpret_cast<float4*>(dr) = make_float4(f[0].c[c0], f[1].c[c0], f[2].c[c0], f[3].c[c0]);
            *reinterpret_cast<float4*>(dr + 4) = make_float4(f[4].c[c0], f[5].c[c0], f[6].c[c0], f[7].c[c0]);
            *reinterpret_cast<float4*>(dr + 8) = make_float4(f[0].c[c1], f[1].c[c1], f[2].c[c1], f[3].c[c1]);
            *reinterpret_cast<float4*>(dr + 12) = make_float4(f[4].c[c1], f[5].c[c1], f[6].c[c1], f[7].c[c1]);
          }
        }
      } else if constexpr (Tr::kFp8Cache) {
        // Undo the column permutation of the fp8 P V (v_frags_fp8): in each 32-dim group the
        // lane's columns are the 8 consecutive dims 32 g + 8 t .. + 7, c[0] / c[2] of the group's
        // four fragments the first four, c[1] / c[3] the next: two float4 stores per row.
        float* row_lo = base - 2 * (lane & 3) + 8 * (lane & 3);
#pragma unroll
        for (int g = 0; g < Tr::kOFrags / 4; ++g) {
          const FragC* f = &o[mf][4 * g];
          float* d = row_lo + 32 * g;
          *reinterpret_cast<float4*>(d) = make_float4(f[0].c[0], f[1].c[0], f[2].c[0], f[3].c[0]);
          *reinterpret_cast<float4*>(d + 4) = make_float4(f[0].c[1], f[1].c[1], f[2].c[1], f[3].c[1]);
          *reinterpret_cast<float4*>(d + 8 * Tr::kOPitch) = make_float4(f[0].c[2], f[1].c[2], f[2].c[2], f[3].c[2]);
          *reinterpret_cast<float4*>(d + 8 * Tr::kOPitch + 4) = make_float4(f[0].c[3], f[1].c[3], f[2].c[3], f[3].c[3]);
        }
      } else {
#pragma unroll
        for (int dn = 0; dn < Tr::kOFrags; ++dn) {
          *reinterpret_cast<float2*>(base + dn * 8) = make_float2(o[mf][dn].c[0], o[mf][dn].c[1]);
          *reinterpret_cast<float2*>(base + 8 * Tr::kOPitch + dn * 8) = make_float2(o[mf][dn].c[2], o[mf][dn].c[3]);
        }
      }
      if ((lane & 3) == 0) {
        s_stat[row] = make_float2(max_log2[0], sum[0]);
        s_stat[row + 8] = make_float2(max_log2[1], sum[1]);
      }
    }
  }
};

// Transposed (fp8 decode, <= 8 packed rows): keys on the MMA's M, the rows on N.
template <class Tr, Fp8Format kFmt, class KvL>
struct TileMath<Tr, kFmt, KvL, true> {
  FragB q_regs[Tr::kKSteps];  // Q^T
  RowSoftmax softmax;
  FragC o[Tr::kAccOFrags];
  TransposedLaneOffsets<Tr, KvL> offsets;  // this lane's fragment addresses within a stage
  int warp_row0, warp_key0, lane;

  __device__ __forceinline__ TileMath(int warp_row0_, int warp_key0_, int lane_, int = 0)
      : offsets(warp_key0_, lane_), warp_row0(warp_row0_), warp_key0(warp_key0_), lane(lane_) {
    softmax.init();
  }
  __device__ __forceinline__ void load_q(const unsigned char* smem, uint32_t) {
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks)
      q_regs[ks] = b_frag_dim_permuted(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch, warp_row0, ks, lane);
  }
  __device__ __forceinline__ void step(const unsigned char* smem, uint32_t s_q, uint32_t s_k, uint32_t s_v,
                                       const ScoreMod& mod, float unit, bool whole_tile_visible,
                                       const VarlenKernelParams& p, const WorkItem& w, int tile_key0) {
    FragC s[Tr::kAccSFrags];
    qk_tile_transposed<Tr, kFmt, KvL>(s, q_regs, s_k, offsets);
    softmax_tile<RowsOnN>(s, o, softmax, mod, unit, whole_tile_visible, p, w, warp_row0, tile_key0 + warp_key0, lane);
    pv_tile_transposed<Tr, kFmt, KvL>(o, s, smem + (s_v - s_q), offsets);
  }
  // Rows 2t, 2t + 1 (the lanes with g = 0 hold the stats).
  __device__ __forceinline__ void store_parts(float* s_o, float2* s_stat, float unit, int) const {
    float max_log2[2], sum[2];
    softmax.template finish<RowsOnN>(unit, max_log2, sum);
    store_o_transposed<Tr>(s_o, Tr::kOPitch, o, lane);
    if (lane < 4) {
      s_stat[2 * lane] = make_float2(max_log2[0], sum[0]);
      s_stat[2 * lane + 1] = make_float2(max_log2[1], sum[1]);
    }
  }
};

}  // namespace attnkit::flash_attn::detail
