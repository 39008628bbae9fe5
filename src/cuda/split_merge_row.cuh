// The per-row split-KV merge, written once for the standalone combine kernel
// (split_kv_combine.cu) and for kernels that merge their own splits (the varlen kernel's last
// CTA of a work item): one warp folds the num_splits partials of one (token, head) row and an
// optional sink, and writes the output row and its LSE.
//
// The rule is attnkit/detail/merge_rule.h taken over all parts at once: with m the largest
// (sanitised) LSE, part s weighs exp(lse_s - m) / sum, lse = m + log(sum); +inf / NaN LSEs count
// as empty parts; a part of weight 0 contributes exactly 0 (merge_value) even if its values
// were never written; no visible part gives 0 and -inf; the sink is a part with LSE = its
// logit and no value. All loads go through L2 (__ldcg): other CTAs of the same kernel may have
// written the partials, and this SM's L1 may hold stale lines from an earlier launch.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attnkit/detail/merge_rule.h"
#include "cuda/output_store.h"
#include "cuda/split_kv_combine.h"

namespace attnkit::cuda {

// Adds part `s`'s values (weight w) to the lane's chunks of the row.
template <int kMaxChunks>
__device__ __forceinline__ void merge_part_values(float (&acc)[kMaxChunks][4], const float4 (&v)[kMaxChunks], float w,
                                                  int chunks, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    if (lane + 32 * i >= chunks) break;
    acc[i][0] = merge_value(acc[i][0], 1.f, v[i].x, w);
    acc[i][1] = merge_value(acc[i][1], 1.f, v[i].y, w);
    acc[i][2] = merge_value(acc[i][2], 1.f, v[i].z, w);
    acc[i][3] = merge_value(acc[i][3], 1.f, v[i].w, w);
  }
}

// The merged row (the lane's chunks) and its LSE (lane 0) to their destinations.
template <class T, int kMaxChunks>
__device__ __forceinline__ void store_merged_row(const float (&acc)[kMaxChunks][4], float row_lse, int chunks,
                                                 T* out_row, float* lse_out, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int c = lane + 32 * i;
    if (c >= chunks) break;
    store4(out_row + 4 * c, acc[i]);
  }
  if (lse_out != nullptr && lane == 0) *lse_out = row_lse;
}

// The partials of one (token, head) row in the workspace, read through L2 (__ldcg).
struct WorkspaceRowParts {
  const SplitPartials* parts;
  int64_t token;
  int head;
  __device__ __forceinline__ float lse(int s) const {
    return __ldcg(parts->lse + parts->lse_index(s, token, head));
  }
  template <int kMaxChunks>
  __device__ __forceinline__ void values(int s, float4 (&v)[kMaxChunks], int chunks, int lane) const {
    const float4* o = reinterpret_cast<const float4*>(parts->o + parts->o_index(s, token, head));
#pragma unroll
    for (int i = 0; i < kMaxChunks; ++i)
      if (lane + 32 * i < chunks) v[i] = __ldcg(o + lane + 32 * i);
  }
};

// One warp merges num_parts (<= 32) parts of a row (Parts: lse(s), values<kMaxChunks>(s, v,
// chunks, lane)) and an optional sink into out_row / lse_out. Latency matters here (it runs at
// the end of a launch, on its critical path): lane s loads part s's LSE and the first kPrefetch
// parts' values are loaded alongside, so the common merge of 2-4 parts waits for one round trip.
template <class T, int kMaxChunks, int kPrefetch = 4, class Parts>
__device__ __forceinline__ void merge_parts_row(const Parts& parts, int num_parts, int head_size, const float* sink,
                                                T* out_row, float* lse_out, int lane) {
  const float sink_lse = sink != nullptr ? sanitize_lse(*sink) : -INFINITY;
  const int chunks = head_size / 4;
  float acc[kMaxChunks][4] = {};
  float row_lse = -INFINITY;
  const float my_lse = lane < num_parts ? sanitize_lse(parts.lse(lane)) : -INFINITY;
  float4 pre[kPrefetch][kMaxChunks];
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s)
    if (s < num_parts) parts.template values<kMaxChunks>(s, pre[s], chunks, lane);
  float mx = fmaxf(my_lse, sink_lse);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (mx != -INFINITY) {  // warp-uniform
    float e = expf(my_lse - mx);  // 0 for lanes past num_parts
    float sum = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    sum += expf(sink_lse - mx);  // exp(-inf) = 0 without a sink
    row_lse = mx + logf(sum);
    e *= 1.f / sum;  // this lane's part's weight
#pragma unroll
    for (int s = 0; s < kPrefetch; ++s)
      if (s < num_parts) merge_part_values<kMaxChunks>(acc, pre[s], __shfl_sync(0xffffffffu, e, s), chunks, lane);
    for (int s = kPrefetch; s < num_parts; ++s) {
      float4 v[kMaxChunks];
      parts.template values<kMaxChunks>(s, v, chunks, lane);
      merge_part_values<kMaxChunks>(acc, v, __shfl_sync(0xffffffffu, e, s), chunks, lane);
    }
  }
  store_merged_row<T, kMaxChunks>(acc, row_lse, chunks, out_row, lse_out, lane);
}

// kMaxChunks: float4 chunks per lane, head_size <= 128 * kMaxChunks. `sink`: nullptr or the
// head's sink logit; `lse_out`: nullptr or where the row's LSE goes (written by lane 0).
// Any number of parts (Parts as for merge_parts_row): more than 32 stride the lanes.
template <class T, int kMaxChunks, class Parts>
__device__ __forceinline__ void merge_row(const Parts& row, int num_splits, int head_size, const float* sink,
                                          T* out_row, float* lse_out, int lane) {
  if (num_splits <= 32) {
    merge_parts_row<T, kMaxChunks>(row, num_splits, head_size, sink, out_row, lse_out, lane);
    return;
  }
  // More splits than lanes: the LSE pass strides the splits.
  const float sink_lse = sink != nullptr ? sanitize_lse(*sink) : -INFINITY;
  const int chunks = head_size / 4;
  float acc[kMaxChunks][4] = {};
  float row_lse = -INFINITY;
  float mx = sink_lse;
  for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, sanitize_lse(row.lse(s)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (mx != -INFINITY) {  // warp-uniform
    float sum = 0.f;
    for (int s = lane; s < num_splits; s += 32) sum += expf(sanitize_lse(row.lse(s)) - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    sum += expf(sink_lse - mx);
    row_lse = mx + logf(sum);
    const float inv_sum = 1.f / sum;
    // Every split's loads are independent of the others: unrolled, they overlap in flight.
#pragma unroll 4
    for (int s = 0; s < num_splits; ++s) {
      const float w = expf(sanitize_lse(row.lse(s)) - mx) * inv_sum;
      float4 v[kMaxChunks];
      row.template values<kMaxChunks>(s, v, chunks, lane);
      merge_part_values<kMaxChunks>(acc, v, w, chunks, lane);
    }
  }
  store_merged_row<T, kMaxChunks>(acc, row_lse, chunks, out_row, lse_out, lane);
}

// The split-KV workspace's row (token, head).
template <class T, int kMaxChunks>
__device__ __forceinline__ void merge_split_row(const SplitPartials& parts, int64_t token, int head,
                                                const float* sink, T* out_row, float* lse_out, int lane) {
  merge_row<T, kMaxChunks>(WorkspaceRowParts{&parts, token, head}, parts.num_splits, parts.head_size, sink, out_row,
                           lse_out, lane);
}

}  // namespace attnkit::cuda
