// The epilogue of the mma_sync kernel skeleton (varlen_kernel.cuh): after the pipeline has
// drained, the warps' partial (O, max, sum) rows become normalised output rows and LSE, or, with
// num_splits > 1, split partials that the work item's splits merge (cuda/split_merge_row.cuh):
//   through the workspace: the last split CTA to finish merges every split's partials;
//   in a cluster (decode tiles, LaunchPlan::cluster_merge): the item's splits run as one
//     thread-block cluster and rank 0 merges the others' partials from their shared memory.
// One policy serves the three: the destination is chosen per launch at run time (a branch per
// row after the loop; instantiating each separately would triple the decode kernels' compile
// time for no measured gain).
#pragma once
#include <cfloat>

#include "attnkit/detail/merge_rule.h"
#include "cuda/atomic_order.h"
#include "cuda/cluster_sm90.h"
#include "cuda/cta_trace.h"
#include "cuda/fp4_dequant.h"
#include "cuda/online_softmax.h"
#include "cuda/output_store.h"
#include "cuda/split_merge_row.cuh"
#include "flash_attn/varlen_schedule.cuh"

namespace attnkit::flash_attn::detail {

using namespace attnkit::cuda;

__device__ __forceinline__ float scale_of(const float* scale, int64_t stride, int kv_head) {
  return scale != nullptr ? scale[kv_head * stride] : 1.f;
}
// The fp32 factor of a cache side's values: 1 for 16-bit caches, the fp8 dequant scale, the
// NVFP4 global scale over the fragments' bias (cuda/fp4_dequant.h kFp4ScaleBias).
template <class Tr>
__device__ __forceinline__ float cache_scale(const float* scale, int64_t stride, int kv_head) {
  if constexpr (Tr::kFp4Cache) return scale_of(scale, stride, kv_head) / kFp4ScaleBias;
  else if constexpr (Tr::kFp8Cache) return scale_of(scale, stride, kv_head);
  else return 1.f;
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
  const PackedRow row = packed_row(p, w, w.m0 + m);
  r.token = row.token;
  r.head = row.head;
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
  schedule_work<Tr::kBlockM, Tr::kBlockN, false, Tr::kOSliceCols>(p, w, /*record=*/false);  // (true: this CTA has a tile)
  __syncthreads();  // every thread's partials are written before thread 0 releases them
  if (tid == 0) {
    unsigned int* counter =
        p.partials.counters + (static_cast<int64_t>(w.kv_head) * p.num_tokens + w.q_start) * p.group.divisor + w.m0;
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
    schedule_work<Tr::kBlockM, Tr::kBlockN, false, Tr::kOSliceCols>(p, w, /*record=*/false);  // (taken again: see combine_splits_if_last)
    const int tid = threadIdx.x;
    const uint32_t parts = smem_addr(smem + Tr::kClusterPartOffset);
    for (int m = tid >> 5; m < w.rows; m += Tr::kThreads / 32) {
      const MergedRow<T> r = merged_row<T>(p, w, m);
      const ClusterRowParts row{parts + m * Tr::kODim * 4, parts + Tr::kBlockM * Tr::kODim * 4 + m * 4};
      merge_parts_row<T, kMaxChunks>(row, p.num_splits, p.head_size, r.sink, r.out, r.lse, tid & 31);
    }
    cta_trace_flag(p.cta_trace, 1);
  }
  cluster_sync();
}

// Where a split work item's partial rows go, and who merges them; one policy, chosen per launch
// at run time:
//  - a FlashAttention-style launch: the split workspace, partials [split][token][head]; the
//    item's last split CTA (or the cluster) merges them in the kernel (finish, num_splits > 1);
//  - a FlashInfer-style planned launch (p.plan_items set, num_splits 1): the plan's partial rows,
//    tile row m of chunk j is partial row partial_base + m * num_chunks + j (per KV head); a merge
//    kernel after the launch folds them (merge_indptr).
struct SplitPartials {
  __device__ __forceinline__ static bool planned(const VarlenKernelParams& p) { return p.plan_items != nullptr; }
  __device__ __forceinline__ static bool split(const VarlenKernelParams& p, const WorkItem& w) {
    return planned(p) ? w.num_chunks > 1 : p.num_splits > 1;
  }
  __device__ __forceinline__ static int64_t plan_row(const VarlenKernelParams& p, const WorkItem& w, int m) {
    return (static_cast<int64_t>(w.partial_base) + static_cast<int64_t>(m) * w.num_chunks + w.split) * p.num_kv_heads +
           w.kv_head;
  }
  __device__ __forceinline__ static float* o(const VarlenKernelParams& p, const WorkItem& w, int m, int64_t token, int head) {
    return planned(p) ? p.plan_part_o + plan_row(p, w, m) * p.head_size
                      : p.partials.o + p.partials.o_index(w.split, token, head);
  }
  __device__ __forceinline__ static float* lse(const VarlenKernelParams& p, const WorkItem& w, int m, int64_t token,
                                               int head) {
    return planned(p) ? p.plan_part_lse + plan_row(p, w, m) : p.partials.lse + p.partials.lse_index(w.split, token, head);
  }
};

// The epilogue policy: direct (one split), or split partials (SplitPartials) merged through the
// workspace or in the cluster, or by a later kernel.
template <class Tr>
struct SplitKvEpilogue {
  // All threads, after the main loop and a CTA barrier; reuses all shared memory. Math: the
  // tile math policy (varlen_tile_math.cuh) holding the warp's O and softmax state.
  template <class Math>
  __device__ __forceinline__ static void run(const VarlenKernelParams& p, const WorkItem& w, unsigned char* smem,
                                             const Math& math, float unit, bool warp_active, int warp_m, int warp_n,
                                             int tid) {
    using T = typename Tr::Elem;
    constexpr int kN = Tr::kWarpsN;
    float* s_o = reinterpret_cast<float*>(smem);                        // [kN][kBlockM][kOPitch]
    float2* s_stat = reinterpret_cast<float2*>(smem + Tr::kEpiOBytes);  // [kN][kBlockM]
    float* s_weight = reinterpret_cast<float*>(smem + Tr::kEpiOBytes + Tr::kEpiStatBytes);
    if (warp_active)
      math.store_parts(s_o + warp_n * Tr::kBlockM * Tr::kOPitch, s_stat + warp_n * Tr::kBlockM, unit, warp_m);
    __syncthreads();

    // Per row: merge the warps' parts, fold in v_scale and the sink, write the LSE.
    const bool split = SplitPartials::split(p, w);
    const int col0 = Tr::kOSlices > 1 ? w.o_col0 : 0;  // this CTA's first output column
    const float v_scale = cache_scale<Tr>(p.v_scale, p.v_scale_stride, w.kv_head);
    for (int m = tid; m < w.rows; m += Tr::kThreads) {
      float mx[kN], sm[kN], wt[kN];
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        const float2 st = s_stat[n * Tr::kBlockM + m];
        mx[n] = st.x;
        sm[n] = st.y;
      }
      float lse = combine_row_parts<kN>(mx, sm, wt);
      // A faulted item (cuda/metadata_guard.cuh): NaN values below; a split part claims the
      // largest finite LSE, so that the merge gives it all the weight (the other parts' weights
      // round to 0, however far the scores) and its NaN reaches the output.
      if (w.fault) lse = split ? FLT_MAX : __int_as_float(0x7fffffff);
      const PackedRow row = packed_row(p, w, w.m0 + m);
      float sink_weight = 1.f;
      if (!split && p.sinks != nullptr) {  // a part with LSE = sink logit and no value
        float w_sink;
        lse = merge_weights(lse, p.sinks[row.head * p.sinks_stride], &sink_weight, &w_sink);
      }
#pragma unroll
      for (int n = 0; n < kN; ++n) s_weight[m * kN + n] = wt[n] * v_scale * sink_weight;
      if (split && p.cluster_merge) {
        reinterpret_cast<float*>(smem + Tr::kClusterPartOffset + Tr::kBlockM * Tr::kODim * 4)[m] = lse;
      } else if (split) {
        if (col0 == 0) *SplitPartials::lse(p, w, m, row.token, row.head) = lse;
      } else if (p.lse != nullptr && col0 == 0) {  // (every output slice has the row's LSE: the first writes it)
        p.lse[row.head * p.lse_stride_head + row.token * p.lse_stride_token] = lse;
      }
    }
    __syncthreads();

    // Output rows, 8 values per thread per step (16-byte stores for 16-bit outputs); the columns
    // of the head size only.
    constexpr int kChunks = Tr::kODim / 8;
    for (int idx = tid; idx < w.rows * kChunks; idx += Tr::kThreads) {
      const int m = idx / kChunks, c = (idx % kChunks) * 8;
      if (col0 + c >= p.head_size) continue;
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
      if (w.fault)
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = __int_as_float(0x7fffffff);
      const PackedRow row = packed_row(p, w, w.m0 + m);
      if (split && p.cluster_merge) {
        float4* dst = reinterpret_cast<float4*>(smem + Tr::kClusterPartOffset) + (m * Tr::kODim + c) / 4;
        dst[0] = make_float4(v[0], v[1], v[2], v[3]);
        dst[1] = make_float4(v[4], v[5], v[6], v[7]);
      } else if (split) {
        store8(SplitPartials::o(p, w, m, row.token, row.head) + col0 + c, v);
      } else {
        store8(static_cast<T*>(p.out) + row.token * p.out_stride_token + row.head * p.out_stride_head + col0 + c, v);
      }
    }
  }

  // After run (all threads): the merge of the item's splits, in the cluster or by the last
  // split CTA through the workspace.
  __device__ __forceinline__ static void finish(const VarlenKernelParams& p, const unsigned char* smem) {
    if (p.num_splits <= 1) return;  // (planned launches too: their merge kernel runs after)
    if constexpr (Tr::kClusterMerge) {
      if (p.cluster_merge) {
        merge_splits_in_cluster<Tr>(p, smem);
        return;
      }
    }
    combine_splits_if_last<Tr>(p);
  }
};

}  // namespace attnkit::flash_attn::detail
