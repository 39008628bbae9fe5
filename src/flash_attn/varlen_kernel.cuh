// The varlen paged attention kernel (mma.sync generation, sm80+): one template, configured by
// VarlenTraits, explicitly instantiated in varlen_hd*.cu. Reads like the algorithm:
//
//   load Q tile; start K/V tiles 0 .. kStages-2
//   for each K/V tile of the work item:
//     wait for it; start the tile kStages-1 ahead
//     S = Q K^T                  (ldmatrix + mma.sync m16n8k16, fp32)
//     score mod, mask            (attention_mask.h policies)
//     online softmax: S -> P, rescale O
//     O += P V
//   epilogue: merge warps, normalise, sinks, write O and LSE (or split partials; the last
//             split CTA of the work item then merges all splits into O and LSE)
//
// Programmatic dependent launch (cuda/pdl.h): the kernel waits for the kernels before it only
// at its start, and lets the next kernel launch as soon as its prologue loads are issued. The
// one thing before the wait is an L2 prefetch of the work item's first K/V tiles (reads of
// the metadata that may be stale, through L2 only and clamped; no data is kept), which keeps
// HBM busy while the previous kernel drains.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "attnkit/detail/merge_rule.h"
#include "attnkit/error.h"
#include "cuda/atomic_order.h"
#include "cuda/attention_mask.h"
#include "cuda/cluster_sm90.h"
#include "cuda/cp_async.h"
#include "cuda/cta_trace.h"
#include "cuda/cuda_check.h"
#include "cuda/fp8_dequant.h"
#include "cuda/kv_smem_layout.h"
#include "cuda/mma_sm80.h"
#include "cuda/online_softmax.h"
#include "cuda/output_store.h"
#include "cuda/paged_kv_tile.h"
#include "cuda/device_props.h"
#include "cuda/pdl.h"
#include "cuda/sync_sm90.h"
#include "cuda/tensor_map.h"
#include "cuda/tma_sm90.h"
#include "cuda/split_merge_row.cuh"
#include "flash_attn/varlen_decode_transposed.cuh"
#include "flash_attn/split_kv.h"
#include "flash_attn/varlen_schedule.cuh"
#include "flash_attn/varlen_tile_softmax.cuh"
#include "flash_attn/varlen_launch.h"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn {

namespace detail {

using namespace attnkit::cuda;

// Q rows of the tile -> shared memory laid out by Layout (zero rows past the tile's real rows).
template <class Tr, class Layout = PitchedTile<Tr::kPitch * 2>, int kLoaders = Tr::kThreads>
__device__ __forceinline__ void load_q_tile(const VarlenKernelParams& p, const WorkItem& w,
                                            uint32_t sq, int tid) {
  using T = typename Tr::Elem;
  constexpr int kChunksPerRow = Tr::kHeadDim / 8;
  const T* q = static_cast<const T*>(p.q);
  for (int idx = tid; idx < Tr::kBlockM * kChunksPerRow; idx += kLoaders) {
    const int m = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    const bool valid = m < w.rows;
    const T* src = q;
    if (valid) {
      const int gm = w.m0 + m;
      const int64_t token = w.q_start + gm / p.group;
      const int head = w.kv_head * p.group + gm % p.group;
      src = q + token * p.q_stride_token + head * p.q_stride_head + chunk * 8;
    }
    cp_async_16(sq + Layout::offset(m, chunk), src, valid);
  }
}

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
  int e = 0;
  frexpf(mx, &e);  // mx < 2^e
  const float factor = (mx > 0.f && mx <= 3.0e38f) ? ldexpf(1.f, 15 - e) : 1.f;
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
  if constexpr (Tr::kFp8Cache) {
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

// O (kMFrags x 16 rows x head_dim) += P V, P taken from the softmaxed S fragments.
template <class Tr, Fp8Format kFmt, class KvL>
__device__ __forceinline__ void pv_tile(FragC (&o)[Tr::kMFrags][Tr::kOFrags],
                                        const FragC (&s)[Tr::kMFrags][Tr::kSFrags], const unsigned char* smem,
                                        uint32_t s_base, uint32_t sv, int key0, int lane) {
  using M = typename Tr::MmaElem;
#pragma unroll
  for (int kk = 0; kk < Tr::kSFrags / 2; ++kk) {
    FragA pa[Tr::kMFrags];
#pragma unroll
    for (int mf = 0; mf < Tr::kMFrags; ++mf) pa[mf] = c_pair_to_a<M>(s[mf][2 * kk], s[mf][2 * kk + 1]);
    if constexpr (Tr::kFp8Cache) {
      // O's columns permuted within 32-dim groups (fp8_dequant.h); undone in the epilogue.
      const unsigned char* v_tile = smem + (sv - s_base);
#pragma unroll
      for (int group = 0; group < Tr::kHeadDim / 32; ++group) {
        FragB b[4];
        v_frags_fp8<kFmt, KvL>(v_tile, key0 + kk * 16, group, lane, b);
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf)
#pragma unroll
          for (int e = 0; e < 4; ++e) mma_16816<M>(o[mf][4 * group + e], pa[mf], b[e]);
      }
    } else {
#pragma unroll
      for (int dn = 0; dn < Tr::kOFrags; dn += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, b_frag_addr_trans_in<KvL>(sv, key0 + kk * 16, dn * 8, lane));
#pragma unroll
        for (int mf = 0; mf < Tr::kMFrags; ++mf) {
          mma_16816<M>(o[mf][dn], pa[mf], FragB{{b[0], b[1]}});
          mma_16816<M>(o[mf][dn + 1], pa[mf], FragB{{b[2], b[3]}});
        }
      }
    }
  }
}

// Before pdl_wait (VarlenKernelParams::l2_prefetch): L2 prefetch of the first kTiles K/V tiles
// of this CTA's work item. The metadata may still be being written by the previous kernel, so
// the item is only a guess: keys are clamped to the request's block-table row and page ids to
// the cache (PagedKVTileLoader::prefetch_l2), and nothing here is kept.
template <class Tr, class Loader, int kTiles>
__device__ __forceinline__ void prefetch_first_tiles(const VarlenKernelParams& p, int tid) {
  WorkItem w;
  if (!schedule_work<Tr::kBlockM, Tr::kBlockN, /*kL2Only=*/true>(p, w)) return;
  Loader loader = kv_loader_for<Loader>(p, w);
  loader.seq_len = min(w.seq_len, p.max_blocks_per_req * p.block_size.divisor);
  const int n = min(w.tile_end - w.tile_begin, kTiles);
  for (int i = 0; i < n; ++i) loader.prefetch_l2((w.tile_begin + i) * Tr::kBlockN, p.num_blocks, tid);
}

__device__ __forceinline__ float scale_of(const float* scale, int64_t stride, int kv_head) {
  return scale != nullptr ? scale[kv_head * stride] : 1.f;
}

// Where the merge of row m of work item w goes: its output row, LSE (or nullptr) and sink logit
// (or nullptr).
template <class T>
struct MergedRow {
  int64_t token;
  int head;
  T* out;
  float* lse;
  const float* sink;
};
template <class T>
__device__ __forceinline__ MergedRow<T> merged_row(const VarlenKernelParams& p, const WorkItem& w, int m) {
  MergedRow<T> r;
  const int gm = w.m0 + m;
  r.token = w.q_start + gm / p.group;
  r.head = w.kv_head * p.group + gm % p.group;
  r.out = static_cast<T*>(p.out) + r.token * p.out_stride_token + r.head * p.out_stride_head;
  r.lse = p.lse != nullptr ? p.lse + r.head * p.lse_stride_head + r.token * p.lse_stride_token : nullptr;
  r.sink = p.sinks != nullptr ? p.sinks + r.head * p.sinks_stride : nullptr;
  return r;
}

// Split-KV, after every thread wrote its partials: the last of the work item's num_splits
// CTAs to arrive merges all splits' partials of the tile's rows into out / LSE (one warp per
// row, the combine kernel's merge) and puts the item's counter back to 0 for the next launch.
// Counter of the item: its first packed row over all KV heads, unique among the launch's items
// and < num_tokens * num_heads (the host checks the workspace holds that many counters).
// The work item is taken again from the scheduler rather than passed in: with the main loop's
// WorkItem kept live for this tail, the register-bound prefill kernels spilled more in their loop.
template <class Tr>
__device__ __forceinline__ void combine_splits_if_last(const VarlenKernelParams& p) {
  using T = typename Tr::Elem;
  constexpr int kMaxChunks = (Tr::kHeadDim / 4 + 31) / 32;
  __shared__ int s_last;
  const int tid = threadIdx.x;
  WorkItem w;
  schedule_work<Tr::kBlockM, Tr::kBlockN>(p, w);  // (true: this CTA has a tile)
  __syncthreads();  // every thread's partials are written before thread 0 releases them
  if (tid == 0) {
    unsigned int* counter =
        p.partials.counters + (static_cast<int64_t>(w.kv_head) * p.num_tokens + w.q_start) * p.group + w.m0;
    // Releases this CTA's partials; the last arrival acquires everybody's.
    const unsigned int arrived = atomic_add_acq_rel_gpu(counter, 1u);
    s_last = arrived == static_cast<unsigned int>(p.num_splits - 1);
    if (s_last) atomicExch(counter, 0u);  // every split has counted: nobody else touches it this launch
  }
  __syncthreads();  // (the other threads' reads below are ordered after thread 0's acquire)
  if (!s_last) return;
  cta_trace_flag(p.cta_trace, 1);
  for (int m = tid >> 5; m < w.rows; m += Tr::kThreads / 32) {
    const MergedRow<T> r = merged_row<T>(p, w, m);
    merge_split_row<T, kMaxChunks>(p.partials, r.token, r.head, r.sink, r.out, r.lse, tid & 31);
  }
}

// One row's split partials in the shared memory of each CTA of the cluster (rank = split).
struct ClusterRowParts {
  uint32_t o_addr, lse_addr;  // shared::cta addresses of the row's values and LSE (same in every CTA)
  __device__ __forceinline__ float lse(int s) const { return cluster_load_f32(cluster_map(lse_addr, s)); }
  template <int kMaxChunks>
  __device__ __forceinline__ void values(int s, float4 (&v)[kMaxChunks], int chunks, int lane) const {
    const uint32_t a = cluster_map(o_addr, s);
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i)
      if (lane + 32 * i < chunks) v[i] = cluster_load_f32x4(a + 16 * (lane + 32 * i));
  }
};

// Split-KV with cluster_merge, after the epilogue left this CTA's partials in its shared
// memory: rank 0 merges every split's rows (one warp per row, the workspace merge's rule) into
// out / LSE; the second barrier keeps the other CTAs' shared memory alive until it has read them.
// Every thread of every CTA of the cluster calls this (cluster barriers are aligned).
template <class Tr>
__device__ __forceinline__ void merge_splits_in_cluster(const VarlenKernelParams& p, const unsigned char* smem) {
  using T = typename Tr::Elem;
  constexpr int kMaxChunks = (Tr::kHeadDim / 4 + 31) / 32;
  cluster_sync();  // every split's partials are in its shared memory
  if (cluster_rank() == 0) {
    WorkItem w;
    schedule_work<Tr::kBlockM, Tr::kBlockN>(p, w);  // (the item, taken again: see combine_splits_if_last)
    const int tid = threadIdx.x;
    const uint32_t parts = smem_addr(smem + Tr::kClusterPartOffset);
    for (int m = tid >> 5; m < w.rows; m += Tr::kThreads / 32) {
      const MergedRow<T> r = merged_row<T>(p, w, m);
      const ClusterRowParts row{parts + m * Tr::kHeadDim * 4, parts + Tr::kBlockM * Tr::kHeadDim * 4 + m * 4};
      merge_parts_row<T, kMaxChunks>(row, p.num_splits, Tr::kHeadDim, r.sink, r.out, r.lse, tid & 31);
    }
    cta_trace_flag(p.cta_trace, 1);
  }
  cluster_sync();
}

// Split-KV, after the epilogue: the merge of the work item's splits, in the cluster or through
// the workspace (VarlenKernelParams::cluster_merge).
template <class Tr>
__device__ __forceinline__ void merge_splits(const VarlenKernelParams& p, const unsigned char* smem) {
  if constexpr (Tr::kClusterMerge) {
    if (p.cluster_merge) {
      merge_splits_in_cluster<Tr>(p, smem);
      return;
    }
  }
  combine_splits_if_last<Tr>(p);
}

// Epilogue: the warps' partial (O, max, sum) -> normalised output rows and LSE, or split
// partials (then merged by the work item's last split CTA). Runs after the pipeline has
// drained; reuses all shared memory.
template <class Tr>
__device__ __forceinline__ void epilogue(const VarlenKernelParams& p, const WorkItem& w,
                                         unsigned char* smem, const FragC (&o)[Tr::kMFrags][Tr::kAccOFrags],
                                         const RowSoftmax (&softmax)[Tr::kMFrags], float unit,
                                         bool warp_active, int warp_m, int warp_n, int lane, int tid) {
  using T = typename Tr::Elem;
  constexpr int kN = Tr::kWarpsN;
  float* s_o = reinterpret_cast<float*>(smem);                           // [kN][kBlockM][kOPitch]
  float2* s_stat = reinterpret_cast<float2*>(smem + Tr::kEpiOBytes);     // [kN][kBlockM]
  float* s_weight = reinterpret_cast<float*>(smem + Tr::kEpiOBytes + Tr::kEpiStatBytes);

  if constexpr (Tr::kTransposed) {  // rows 2t, 2t + 1 (lanes with g = 0 hold the stats)
    if (warp_active) {
      float max_log2[2], sum[2];
      softmax[0].template finish<RowsOnN>(unit, max_log2, sum);
      store_o_transposed<Tr>(s_o + warp_n * Tr::kBlockM * Tr::kOPitch, Tr::kOPitch, o[0], lane);
      if (lane < 4) {
        s_stat[warp_n * Tr::kBlockM + 2 * lane] = make_float2(max_log2[0], sum[0]);
        s_stat[warp_n * Tr::kBlockM + 2 * lane + 1] = make_float2(max_log2[1], sum[1]);
      }
    }
  } else if (warp_active) {  // (kTransposed is false here: the discarded branch is not compiled)
#pragma unroll
    for (int mf = 0; mf < Tr::kMFrags; ++mf) {
      float max_log2[2], sum[2];
      softmax[mf].finish(unit, max_log2, sum);
      const int row = warp_m * Tr::kWarpRows + 16 * mf + (lane >> 2);
      float* base = s_o + (warp_n * Tr::kBlockM + row) * Tr::kOPitch + 2 * (lane & 3);
      if constexpr (Tr::kFp8Cache) {
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
        s_stat[warp_n * Tr::kBlockM + row] = make_float2(max_log2[0], sum[0]);
        s_stat[warp_n * Tr::kBlockM + row + 8] = make_float2(max_log2[1], sum[1]);
      }
    }
  }
  __syncthreads();

  // Per row: merge the warps' parts, fold in v_scale and the sink, write the LSE.
  const bool split = p.num_splits > 1;
  const float v_scale = Tr::kFp8Cache ? scale_of(p.v_scale, p.v_scale_stride, w.kv_head) : 1.f;
  for (int m = tid; m < w.rows; m += Tr::kThreads) {
    float mx[kN], sm[kN], wt[kN];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const float2 st = s_stat[n * Tr::kBlockM + m];
      mx[n] = st.x;
      sm[n] = st.y;
    }
    float lse = combine_row_parts<kN>(mx, sm, wt);
    const int gm = w.m0 + m;
    const int64_t token = w.q_start + gm / p.group;
    const int head = w.kv_head * p.group + gm % p.group;
    float sink_weight = 1.f;
    if (!split && p.sinks != nullptr) {  // a part with LSE = sink logit and no value
      float w_sink;
      lse = merge_weights(lse, p.sinks[head * p.sinks_stride], &sink_weight, &w_sink);
    }
#pragma unroll
    for (int n = 0; n < kN; ++n) s_weight[m * kN + n] = wt[n] * v_scale * sink_weight;
    if (split && p.cluster_merge) {
      reinterpret_cast<float*>(smem + Tr::kClusterPartOffset + Tr::kBlockM * Tr::kHeadDim * 4)[m] = lse;
    } else if (split) {
      p.partials.lse[p.partials.lse_index(w.split, token, head)] = lse;
    } else if (p.lse != nullptr) {
      p.lse[head * p.lse_stride_head + token * p.lse_stride_token] = lse;
    }
  }
  __syncthreads();

  // Output rows, 8 values per thread per step (16-byte stores for 16-bit outputs).
  constexpr int kChunks = Tr::kHeadDim / 8;
  for (int idx = tid; idx < w.rows * kChunks; idx += Tr::kThreads) {
    const int m = idx / kChunks, c = (idx % kChunks) * 8;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const float wn = s_weight[m * kN + n];
      if (wn == 0.f) continue;  // a part that saw nothing contributes exactly 0
      const float4* src = reinterpret_cast<const float4*>(s_o + (n * Tr::kBlockM + m) * Tr::kOPitch + c);
      const float4 a = src[0], b = src[1];
      v[0] += wn * a.x; v[1] += wn * a.y; v[2] += wn * a.z; v[3] += wn * a.w;
      v[4] += wn * b.x; v[5] += wn * b.y; v[6] += wn * b.z; v[7] += wn * b.w;
    }
    const int gm = w.m0 + m;
    const int64_t token = w.q_start + gm / p.group;
    const int head = w.kv_head * p.group + gm % p.group;
    if (split && p.cluster_merge) {
      float4* dst = reinterpret_cast<float4*>(smem + Tr::kClusterPartOffset) + (m * Tr::kHeadDim + c) / 4;
      dst[0] = make_float4(v[0], v[1], v[2], v[3]);
      dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else if (split) {
      store8(p.partials.o + p.partials.o_index(w.split, token, head) + c, v);
    } else {
      store8(static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head + c, v);
    }
  }
}

// TMA fills of the decode stages (kTma; sm90): warp 0's lanes 0..kGroups-1 each own one 16-key
// page group of a tile and copy its K and V boxes (tensor_map.h) onto the stage's mbarrier,
// which lane 0 arms with the tile's byte count first. Groups at or past seq_len are not
// copied (their block-table entries are never read); the tail tile's rows past seq_len are
// zeroed by zero_tail_rows once it has landed, as cp.async's zero fill does.
template <class Tr>
struct TmaStageLoader {
  static constexpr int kGroups = Tr::kBlockN / 16;
  static constexpr uint32_t kGroupBytes = 16 * Tr::kKvRowBytes;
  static_assert(kGroups <= 32, "one lane per page group");
  const cuda::TmaDesc* k_map;
  const cuda::TmaDesc* v_map;
  const int32_t* block_row;
  cuda::FastDivmod block_size;
  int seq_len, kv_head, lane;
  bool evict_first;     // K/V boxes under l2_policy (VarlenKernelParams::kv_evict_first), else none
  uint64_t l2_policy;

  // Whether this lane owns a group of tile_key0's tile: a lane per group below seq_len.
  __device__ __forceinline__ bool owns_group(int tile_key0) const {
    return lane < kGroups && tile_key0 + 16 * lane < seq_len;
  }
  // Page ids come in batches of 32 page groups (kTilesPerBatch tiles): one block-table read per
  // lane of warp 0 and batch, the next batch read while the current one is issued, and a tile's
  // issue takes its groups' pages from their lanes by shuffle. The reads' latency stays off the
  // loop: read one tile ahead per tile, it was on it (warp 0 waited for them under full HBM
  // load, when L2 queues are long). H200, bench decode-ab in turns with per-tile reads (same
  // run): fp8 16 x 4k +3.0%, 16 x 32k +3.5%, 64 x 32k +1.9%, 1 x 32k +2.1%; bf16 within +-0.6%.
  static constexpr int kTilesPerBatch = 32 / kGroups;
  static_assert(32 % kGroups == 0, "whole tiles per batch of 32 page groups");
  struct Pages {
    int32_t cur = 0, next = 0;  // this lane's group of the current / next batch
  };
  // This lane's page of the batch whose first tile starts at key0 (0 past seq_len).
  __device__ __forceinline__ int32_t batch_page(int key0) const {
    const int key = key0 + 16 * lane;
    return key < seq_len ? __ldg(block_row + block_size.div(key)) : 0;
  }
  // The first two batches of a work item whose tile t starts at key0 + t * kBlockN.
  __device__ __forceinline__ void start(Pages& pg, int key0, int n_tiles) const {
    pg.cur = batch_page(key0);
    pg.next = n_tiles > kTilesPerBatch ? batch_page(key0 + kTilesPerBatch * Tr::kBlockN) : 0;
  }
  // This lane's page of tile t (called for t = 0, 1, ... in order, by all of warp 0; 0 where
  // the lane owns no group of it).
  __device__ __forceinline__ int32_t page_of_tile(Pages& pg, int t, int key0, int n_tiles) const {
    const int pos = t % kTilesPerBatch;
    if (pos == 0 && t > 0) {
      pg.cur = pg.next;
      const int t_next = t + kTilesPerBatch;
      pg.next = t_next < n_tiles ? batch_page(key0 + t_next * Tr::kBlockN) : 0;
    }
    return __shfl_sync(0xffffffffu, pg.cur, (pos * kGroups + lane) & 31);
  }
  // Called by all of warp 0. A page id outside the cache reads as zeros (TMA bounds) and still
  // completes its bytes: a bad block table cannot hang or fault the kernel.
  __device__ __forceinline__ void issue(int tile_key0, int32_t blk, uint32_t k_tile, uint32_t bar) const {
    if (lane == 0) {
      const int groups = min(kGroups, (seq_len - tile_key0 + 15) / 16);
      cuda::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(groups) * 2u * kGroupBytes);
    }
    __syncwarp();
    if (owns_group(tile_key0)) {
      const int key = tile_key0 + 16 * lane;
      const int slot = key - block_size.div(key) * block_size.divisor;
      const uint32_t dst = k_tile + lane * kGroupBytes;
      if (evict_first) {
        cuda::tma_load_5d(dst, k_map, bar, 0, slot, 0, kv_head, blk, l2_policy);
        cuda::tma_load_5d(dst + Tr::kStageTileBytes, v_map, bar, 0, slot, 0, kv_head, blk, l2_policy);
      } else {
        cuda::tma_load_5d(dst, k_map, bar, 0, slot, 0, kv_head, blk);
        cuda::tma_load_5d(dst + Tr::kStageTileBytes, v_map, bar, 0, slot, 0, kv_head, blk);
      }
    }
  }
};

// Rows [rows_left, kBlockN) of a landed K / V stage tile in layout KvL -> 0 (all threads).
template <class Tr, class KvL>
__device__ __forceinline__ void zero_tail_rows(unsigned char* k_tile, int rows_left, int tid) {
  constexpr int kChunks = Tr::kKvRowBytes / 16;
  const int first = max(rows_left, 0) * kChunks;
  for (int i = first + tid; i < Tr::kBlockN * kChunks; i += Tr::kThreads) {
    const uint32_t off = KvL::at(i / kChunks, (i % kChunks) * 16);
    *reinterpret_cast<uint4*>(k_tile + off) = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(k_tile + Tr::kStageTileBytes + off) = make_uint4(0, 0, 0, 0);
  }
}

}  // namespace detail

// kFmt: the fp8 cache format, a template parameter so the loop converts with one instruction
// sequence (a runtime format costs both conversions' issue slots, fp8_dequant.h); ignored for
// 16-bit caches. The launcher picks the instantiation from p.fp8_format.
// Tr::kTmaStages (DecodeTmaTraits, sm90, VarlenKernelParams::k_map / v_map encoded): K/V stages
// filled by TMA boxes of whole page groups instead of every thread's 16-byte cp.async copies
// (their address math was about a third of the decode loop's instructions), in dense stages.
template <class Tr, cuda::Fp8Format kFmt>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm) varlen_attention_kernel(const __grid_constant__ VarlenKernelParams p) {
  using namespace attnkit::cuda;
  using T = typename Tr::Elem;
  using Ring = StageRing<Tr::kStages>;
  using Loader = PagedKVTileLoader<Tr::kBlockN, Tr::kKvRowBytes, PitchedTile<Tr::kStagePitchBytes>, Tr::kThreads>;
  constexpr bool kTma = Tr::kTmaStages;
  using KvL = std::conditional_t<kTma, PagedSwizzle128<Tr::kKvRowBytes>, PitchedTile<Tr::kStagePitchBytes>>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(8) uint64_t stage_bars[kTma ? Tr::kStages : 1];

  cta_trace_mark(p.cta_trace, kTraceEntry);
  if constexpr (kTma) {  // (parameters: valid before the wait) the descriptors' first fetch off the start
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&p.k_map);
      prefetch_tensor_map(&p.v_map);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.l2_prefetch && static_cast<int64_t>(linear_block_index()) < p.l2_prefetch_ctas)
    detail::prefetch_first_tiles<Tr, Loader, Tr::kStages>(p, threadIdx.x);
#endif
  pdl_wait();  // everything below may read what the previous kernel wrote (metadata, q, cache)
  cta_trace_mark(p.cta_trace, kTraceReleased);
  WorkItem w;
  if (!schedule_work<Tr::kBlockM, Tr::kBlockN>(p, w)) return;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % Tr::kWarpsM, warp_n = warp / Tr::kWarpsM;
  const int warp_row0 = warp_m * Tr::kWarpRows, warp_key0 = warp_n * Tr::kWarpKeys;
  const bool warp_active = warp_row0 < w.rows;  // warps of padding rows only load and sync

  const uint32_t s_q = smem_addr(smem);
  // (TMA: stage tiles 1024-byte aligned for the swizzle; kTmaSlack reserves the round-up.)
  const uint32_t s_stages = kTma ? ((s_q + Tr::kStagesOffset + 1023u) & ~1023u) : s_q + Tr::kStagesOffset;

  const Loader loader = kv_loader_for<Loader>(p, w);
  auto stage_k = [&](int tile) { return s_stages + Ring::stage_of(tile) * Tr::kStageBytes; };
  auto stage_bar = [&](int tile) { return smem_addr(&stage_bars[kTma ? Ring::stage_of(tile) : 0]); };
  auto tile_key = [&](int i) { return (w.tile_begin + i) * Tr::kBlockN; };
  const detail::TmaStageLoader<Tr> tma{&p.k_map, &p.v_map, loader.block_row, p.block_size, w.seq_len, w.kv_head, lane,
                                           p.kv_evict_first, kTma && warp == 0 ? l2_policy_evict_first() : 0};

  // Prologue: Q in its own group, then kStages - 1 K/V tiles (one group each, maybe empty).
  const int n_tiles = w.tile_end - w.tile_begin;
  if constexpr (kTma) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < Tr::kStages; ++s) mbar_init(smem_addr(&stage_bars[s]), 1);
      fence_mbarrier_init();
    }
    __syncthreads();  // the barriers exist before anyone waits on them or arms them
  }
  detail::load_q_tile<Tr>(p, w, s_q, tid);
  cp_async_commit();
  typename detail::TmaStageLoader<Tr>::Pages pages;  // (kTma, warp 0) page ids, batched
  if constexpr (kTma) {
    if (warp == 0) {
      tma.start(pages, tile_key(0), n_tiles);
#pragma unroll
      for (int s = 0; s < Tr::kStages - 1; ++s)
        if (s < n_tiles)
          tma.issue(tile_key(s), tma.page_of_tile(pages, s, tile_key(0), n_tiles), stage_k(s), stage_bar(s));
    }
  } else {
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) {
      if (s < n_tiles) loader.load(tile_key(s), stage_k(s), stage_k(s) + Tr::kStageTileBytes, tid);
      cp_async_commit();
    }
  }
  pdl_launch_dependents();  // the next kernel's CTAs may take SM slots as this grid frees them
  // Block-table entries of the next tile to load, read one iteration ahead (where the loader
  // copies by 16-key groups): their latency overlaps the MMAs instead of stalling the copy
  // issue after each barrier.
  constexpr bool kPagesAhead = Loader::kByGroups && !kTma;
  typename Loader::Pages next_pages{};
  if constexpr (kPagesAhead)
    if (Tr::kStages - 1 < n_tiles) next_pages = loader.pages(tile_key(Tr::kStages - 1), tid);

  // Q: wait for its group when it is read before the loop (into registers, or converted).
  constexpr bool kConvertQ = Tr::kFp8Cache && std::is_same_v<T, __nv_bfloat16>;
  float q_factor = 1.f;
  using QFrag = std::conditional_t<Tr::kTransposed, FragB, FragA>;  // Q (A) or Q^T (B, transposed tile)
  QFrag q_regs[Tr::kQInRegs ? Tr::kKSteps : 1];
  if constexpr (Tr::kQInRegs || kConvertQ) {
    cp_async_wait<kTma ? 0 : Tr::kStages - 1>();  // the Q group
    __syncthreads();
    if constexpr (kConvertQ) q_factor = detail::q_tile_to_f16<Tr>(smem, tid);
    if constexpr (Tr::kQInRegs) {
#pragma unroll
      for (int ks = 0; ks < Tr::kKSteps; ++ks) {
        if constexpr (Tr::kTransposed)
          q_regs[ks] = b_frag_dim_permuted(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch, warp_row0, ks, lane);
        else if constexpr (Tr::kFp8Cache)
          q_regs[ks] = a_frag_dim_permuted(reinterpret_cast<const uint16_t*>(smem), Tr::kPitch, warp_row0, ks, lane);
        else
          ldmatrix_x4(q_regs[ks].r, a_frag_addr(s_q, Tr::kPitch, warp_row0, ks * 16, lane));
      }
    }
  }

  const float k_scale = Tr::kFp8Cache ? detail::scale_of(p.k_scale, p.k_scale_stride, w.kv_head) : 1.f;
  const ScoreMod mod{p.scale * k_scale / q_factor, p.softcap, p.alibi_slopes != nullptr};
  const float unit = mod.unit();

  RowSoftmax softmax[Tr::kMFrags];
#pragma unroll
  for (int mf = 0; mf < Tr::kMFrags; ++mf) softmax[mf].init();
  FragC o[Tr::kMFrags][Tr::kAccOFrags];
  // (transposed tile: this lane's fragment addresses within a stage, the same for every tile)
  struct NoOffsets {
    __device__ NoOffsets(int, int) {}
  };
  using LaneOffsets = std::conditional_t<Tr::kTransposed, detail::TransposedLaneOffsets<Tr, KvL>, NoOffsets>;
  const LaneOffsets lane_offsets(warp_key0, lane);

  for (int it = 0; it < n_tiles; ++it) {
    if constexpr (kTma) {
      if constexpr (!Tr::kQInRegs && !kConvertQ) cp_async_wait<0>();  // (Q, before the first tile)
      mbar_wait(stage_bar(it), static_cast<uint32_t>(it / Tr::kStages) & 1u);
      const int rows_left = w.seq_len - tile_key(it);
      if (rows_left < Tr::kBlockN) detail::zero_tail_rows<Tr, KvL>(smem + (stage_k(it) - s_q), rows_left, tid);
    } else {
      Ring::wait_oldest();
    }
    __syncthreads();  // tile `it` visible to all; the stage of tile it-1 is free again
    if (it == 0) cta_trace_mark(p.cta_trace, kTraceFirstTile);
    const int ahead = it + Tr::kStages - 1;
    if constexpr (kTma) {
      if (warp == 0 && ahead < n_tiles)
        tma.issue(tile_key(ahead), tma.page_of_tile(pages, ahead, tile_key(0), n_tiles), stage_k(ahead),
                  stage_bar(ahead));
    } else if constexpr (kPagesAhead) {
      if (ahead < n_tiles) loader.load(tile_key(ahead), next_pages, stage_k(ahead), stage_k(ahead) + Tr::kStageTileBytes, tid);
      cp_async_commit();
      if (ahead + 1 < n_tiles) next_pages = loader.pages(tile_key(ahead + 1), tid);
    } else {
      if (ahead < n_tiles) loader.load(tile_key(ahead), stage_k(ahead), stage_k(ahead) + Tr::kStageTileBytes, tid);
      cp_async_commit();
    }

    const uint32_t s_k = stage_k(it), s_v = s_k + Tr::kStageTileBytes;
    if (!warp_active) continue;

    const int tile_key0 = tile_key(it);
    const bool whole_tile_visible = tile_key0 >= w.full_lo && tile_key0 + Tr::kBlockN <= w.full_hi;
    FragC s[Tr::kMFrags][Tr::kAccSFrags];
    if constexpr (Tr::kTransposed) {
      detail::qk_tile_transposed<Tr, kFmt, KvL>(s[0], q_regs, s_k, lane_offsets);
      softmax_tile<RowsOnN>(s[0], o[0], softmax[0], mod, unit, whole_tile_visible, p, w, warp_row0,
                            tile_key0 + warp_key0, lane);
      detail::pv_tile_transposed<Tr, kFmt, KvL>(o[0], s[0], smem + (s_v - s_q), lane_offsets);
    } else {
      detail::qk_tile<Tr, kFmt, KvL>(s, q_regs, smem, s_q, warp_row0, s_k, warp_key0, lane);
#pragma unroll
      for (int mf = 0; mf < Tr::kMFrags; ++mf)
        softmax_tile(s[mf], o[mf], softmax[mf], mod, unit, whole_tile_visible, p, w, warp_row0 + 16 * mf,
                     tile_key0 + warp_key0, lane);
      detail::pv_tile<Tr, kFmt, KvL>(o, s, smem, s_q, s_v, warp_key0, lane);
    }
  }

  Ring::drain();
  __syncthreads();
  cta_trace_mark(p.cta_trace, kTraceLoopDone);
  detail::epilogue<Tr>(p, w, smem, o, softmax, unit, warp_active, warp_m, warp_n, lane, tid);
  cta_trace_mark(p.cta_trace, kTraceEpilogue);
  if (p.num_splits > 1) detail::merge_splits<Tr>(p, smem);
  cta_trace_mark(p.cta_trace, kTraceExit);
}

// The grid of a varlen launch (x = packed-row tiles of kBlockM rows, y = KV head x split,
// z = request), and the checks every generation's launcher makes: false = nothing to launch.
inline bool varlen_grid(const VarlenKernelParams& p, const VarlenLaunchShape& shape, int block_m, size_t smem_bytes,
                        const char* where, dim3& grid) {
  const int64_t row_tiles = (static_cast<int64_t>(shape.max_query_len) * p.group + block_m - 1) / block_m;
  if (row_tiles == 0 || p.num_reqs == 0) return false;
  ATTNKIT_REQUIRE(row_tiles <= 0x7fffffff, where, "max_query_len * group", shape.max_query_len,
                  "must fit one grid");
  ATTNKIT_REQUIRE(p.num_reqs <= 65535, where, "num_reqs", p.num_reqs, "must be <= 65535 (grid z)");
  const int64_t y = static_cast<int64_t>(p.num_kv_heads) * p.num_splits;
  ATTNKIT_REQUIRE(y <= 65535, where, "num_kv_heads * num_splits", y, "must be <= 65535 (grid y)");
  const cuda::DeviceProps& dev = cuda::current_device_props();
  ATTNKIT_REQUIRE(smem_bytes <= dev.smem_per_block_optin, where, "shared memory per block", smem_bytes,
                  "must fit the device's opt-in limit of " + std::to_string(dev.smem_per_block_optin) + " bytes");
  grid = dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(y), static_cast<unsigned>(p.num_reqs));
  return true;
}

template <class Tr>
void launch_varlen(const VarlenKernelParams& p, const VarlenLaunchShape& shape, cudaStream_t stream) {
  dim3 grid;
  if (!varlen_grid(p, shape, Tr::kBlockM, Tr::kSmemBytes, "flash_attn varlen attention", grid)) return;
  auto kernel = varlen_attention_kernel<Tr, cuda::Fp8Format::e4m3>;
  if constexpr (Tr::kFp8Cache)
    if (p.fp8_format == static_cast<int>(cuda::Fp8Format::e5m2)) kernel = varlen_attention_kernel<Tr, cuda::Fp8Format::e5m2>;
  ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const cuda::DeviceProps& dev = cuda::current_device_props();
  const bool sm90 = dev.cc_major >= 9;
  const int64_t slots = static_cast<int64_t>(Tr::kMinBlocksPerSm) * dev.sm_count;
  const int64_t ctas = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  const bool pdl = shape.enable_pdl && sm90 && pdl_for_grid(ctas, slots, Tr::kTransposed);  // (not for part of a wave)
  VarlenKernelParams q = p;
  // The early L2 prefetch for the first wave only (blocks are dispatched in linear order): fp8
  // 64 x 4k (2.6 waves) ran at 66% of read BW with every CTA prefetching, 69-70% without it.
  q.l2_prefetch_ctas = slots;
  q.l2_prefetch = p.l2_prefetch && pdl;  // (without PDL nothing runs before the previous kernel ends)
  // Split merge in clusters of one work item's splits (grid y = kv_head * num_splits + split, so
  // clusters of 1 x num_splits x 1 hold exactly those), for 2 splits only: on the H200, clusters
  // of 3 CTAs of the fp8 decode kernel (3 CTAs per SM) did not all fit one wave (fp8 16 x 4k:
  // 71.6 us against 45.6 us with the workspace merge, commit c6dab3d).
  // Clusters of 3 lost with the transposed tile (4 CTAs per SM) too: fp8 16 x 4k / 16 x 32k 62 /
  // 68% of read BW against 68 / 81% with the workspace merge (bench decode-ab at 33912b3).
  q.cluster_merge = Tr::kClusterMerge && shape.cluster_merge && sm90 && p.num_splits == 2;
  const dim3 cluster(1, q.cluster_merge ? static_cast<unsigned>(p.num_splits) : 1u, 1);
  cuda::launch_kernel(kernel, grid, dim3(Tr::kThreads), Tr::kSmemBytes, stream, pdl, cluster, q);
}

// The tensor maps of the K and V sides for TMA stage fills of rows of row_bytes, or false where
// the cache has none.
inline bool encode_kv_maps(VarlenKernelParams& q, int row_bytes) {
  cuda::PagedSideGeometry g;
  g.row_bytes = row_bytes;
  g.block_size = q.block_size.divisor;
  g.num_kv_heads = q.num_kv_heads;
  g.num_blocks = q.num_blocks;
  g.base = q.k_cache;
  g.stride_block = q.k_stride_block, g.stride_slot = q.k_stride_slot, g.stride_head = q.k_stride_head;
  if (!cuda::encode_paged_side_map(g, q.k_map, nullptr)) return false;
  g.base = q.v_cache;
  g.stride_block = q.v_stride_block, g.stride_slot = q.v_stride_slot, g.stride_head = q.v_stride_head;
  return cuda::encode_paged_side_map(g, q.v_map, nullptr);
}

// TMA stage fills (KvFill::automatic) for fp8 caches in grids of more than one wave of CTA
// slots. H200, bench decode-ab timed in turns with the default (time_interleaved, free of the
// clock drift): fp8 64 x 4k 159.0 vs 164.8 us with cp.async, 64 x 32k 1122 vs 1142 us; grids of
// one wave or less gain nothing (fp8 16 x 4k 45.2 vs 45.0, 1 x 32k 37.4 vs 37.2) and bf16 loses
// 0.7-2.5% (16 x 4k 72.6 vs 70.8 us, 64 x 4k 262.5 vs 260.0, 64 x 32k 2033 vs 2020; 1 x 32k gains
// 1.3%): where the loop is bound by bytes, one lane per page group reading the block table
// before its copies starts each tile later than 128 threads do; fp8's loop is partly bound by
// issue, and TMA takes the copy address math (~110 of ~450 instructions per warp and tile) out.
inline bool decode_tma_for_grid(const VarlenKernelParams& p, const VarlenLaunchShape& shape, int ctas_per_sm) {
  const int64_t row_tiles = (static_cast<int64_t>(shape.max_query_len) * p.group + 15) / 16;
  const int64_t ctas = row_tiles * p.num_kv_heads * p.num_splits * p.num_reqs;
  return ctas > static_cast<int64_t>(ctas_per_sm) * cuda::current_device_props().sm_count;
}

template <class Elem, int kHeadDim, bool kFp8Cache>
void launch_decode(const VarlenKernelParams& p, const VarlenLaunchShape& shape, cudaStream_t stream) {
  if constexpr (kDecodeTmaRows<Elem, kHeadDim, kFp8Cache>) {
    using Tma = DecodeTmaTraits<Elem, kHeadDim, kFp8Cache>;
    static_assert(Tma::kBlockM == 16, "decode tiles are 16 packed rows");
    const auto fill = static_cast<KvFill>(shape.kv_fill);
    const int cc_major = cuda::current_device_props().cc_major;
    const bool sm90 = cc_major >= 9;
    if constexpr (kFp8Cache && kHeadDim <= 128) {
      using Tt = DecodeTransposedTraits<Elem, kHeadDim>;
      static_assert(Tt::kMaxRows == kTransposedMaxRows);
      if (shape.transposed_decode && fill != KvFill::cp_async &&
          transposed_decode_tile(true, kHeadDim, cc_major, static_cast<int64_t>(shape.max_query_len) * p.group)) {
        VarlenKernelParams q = p;
        if (encode_kv_maps(q, Tt::kKvRowBytes)) {
          using Two = DecodeTransposedTwoStageTraits<Elem, kHeadDim>;
          // (decode_tma_for_grid(.., 3): the grid has more than 3 CTAs per SM)
          const bool two =
              shape.transposed_stages == 2 || (shape.transposed_stages == 0 && decode_tma_for_grid(p, shape, 3));
          if (two)
            launch_varlen<Two>(q, shape, stream);
          else
            launch_varlen<Tt>(q, shape, stream);
          return;
        }
      }
    }
    if constexpr (!kFp8Cache && kHeadDim <= 128) {
      using Two = DecodeTwoStageTraits<Elem, kHeadDim>;
      // (grids of one to two CTAs per SM: bench decode at bf40166, bf16 1 x 4k with 64 CTAs ran
      // 1114 GB/s on it against 1151 on the cp.async tile in the same turns)
      if (fill != KvFill::cp_async && sm90 && decode_tma_for_grid(p, shape, 1) && !decode_tma_for_grid(p, shape, 2)) {
        VarlenKernelParams q = p;
        if (encode_kv_maps(q, Two::kKvRowBytes)) {
          launch_varlen<Two>(q, shape, stream);
          return;
        }
      }
    }
    if (fill != KvFill::cp_async && sm90 &&
        (fill == KvFill::tma || (kFp8Cache && decode_tma_for_grid(p, shape, Tma::kMinBlocksPerSm)))) {
      VarlenKernelParams q = p;
      if (encode_kv_maps(q, Tma::kKvRowBytes)) {
        launch_varlen<Tma>(q, shape, stream);
        return;
      }
    }
  }
  launch_varlen<DecodeTraits<Elem, kHeadDim, kFp8Cache>>(p, shape, stream);
}

}  // namespace attnkit::flash_attn

// Explicit instantiation of both tile configurations of one (dtype, head size, cache kind).
#define ATTNKIT_VARLEN_INSTANTIATE(ELEM, HEAD_DIM, FP8)                                          \
  template void launch_varlen<PrefillTraits<ELEM, HEAD_DIM, FP8>>(                               \
      const VarlenKernelParams&, const VarlenLaunchShape&, cudaStream_t);                        \
  template void launch_decode<ELEM, HEAD_DIM, FP8>(const VarlenKernelParams&, const VarlenLaunchShape&, \
                                                   cudaStream_t);
