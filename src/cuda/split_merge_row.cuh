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

// kMaxChunks: float4 chunks per lane, head_size <= 128 * kMaxChunks. `sink`: nullptr or the
// head's sink logit; `lse_out`: nullptr or where the row's LSE goes (written by lane 0).
template <class T, int kMaxChunks>
__device__ __forceinline__ void merge_split_row(const SplitPartials& parts, int64_t token, int head,
                                                const float* sink, T* out_row, float* lse_out, int lane) {
  const int num_splits = parts.num_splits;
  const float* lse = parts.lse + parts.lse_index(0, token, head);
  const int64_t lse_split_stride = static_cast<int64_t>(parts.num_heads) * parts.num_tokens;
  const float sink_lse = sink != nullptr ? sanitize_lse(*sink) : -INFINITY;

  // Largest LSE over the parts, then the sum of their exponentials (lanes stride the splits).
  float mx = sink_lse;
  for (int s = lane; s < num_splits; s += 32) mx = fmaxf(mx, sanitize_lse(__ldcg(lse + s * lse_split_stride)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float acc[kMaxChunks][4] = {};
  float row_lse = -INFINITY;
  const int chunks = parts.head_size / 4;
  if (mx != -INFINITY) {  // warp-uniform
    float sum = 0.f;
    for (int s = lane; s < num_splits; s += 32) sum += expf(sanitize_lse(__ldcg(lse + s * lse_split_stride)) - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    sum += expf(sink_lse - mx);  // exp(-inf) = 0 without a sink
    row_lse = mx + logf(sum);
    const float inv_sum = 1.f / sum;
    // Every split's loads are independent of the others: unrolled, they overlap in flight.
#pragma unroll 4
    for (int s = 0; s < num_splits; ++s) {
      const float w = expf(sanitize_lse(__ldcg(lse + s * lse_split_stride)) - mx) * inv_sum;
      const float4* o = reinterpret_cast<const float4*>(parts.o + parts.o_index(s, token, head));
#pragma unroll
      for (int i = 0; i < kMaxChunks; ++i) {
        const int c = lane + 32 * i;
        if (c >= chunks) break;
        const float4 v = __ldcg(o + c);
        acc[i][0] = merge_value(acc[i][0], 1.f, v.x, w);
        acc[i][1] = merge_value(acc[i][1], 1.f, v.y, w);
        acc[i][2] = merge_value(acc[i][2], 1.f, v.z, w);
        acc[i][3] = merge_value(acc[i][3], 1.f, v.w, w);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int c = lane + 32 * i;
    if (c >= chunks) break;
    store4(out_row + 4 * c, acc[i]);
  }
  if (lse_out != nullptr && lane == 0) *lse_out = row_lse;
}

}  // namespace attnkit::cuda
