// Online softmax over the rows of an m16 accumulator tile, in fp32, base 2.
//
// A thread holds two query rows of each C fragment; which values belong to which row, and
// which lanes share a row, is the layout policy Lay (frag_rows.h: RowsOnM, rows g and g + 8
// shared by a quad; RowsOnN, the transposed decode tile's rows 2t and 2t + 1). Scores arrive in "score
// units" and `unit` converts them to log2 units: the plain path keeps raw q.k and passes
// scale * log2(e) (one FFMA per exp2), score modifications pass already-converted scores and 1.
// The running sum stays per thread (a partial over the thread's columns) until finish(): only
// the maximum must agree across the quad while the loop runs.
#pragma once
#include <cmath>

#include "cuda/frag_rows.h"
#include "cuda/mma_sm80.h"

namespace attnkit::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// 2^x on the special-function unit (relative error ~2^-22; 2^-inf = +0, subnormals flush).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Multiplies the two rows of every C fragment by f[0] / f[1].
template <class Lay = RowsOnM, int N>
__device__ __forceinline__ void scale_rows(FragC (&acc)[N], const float (&f)[2]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i].c[e] *= f[Lay::slot(e)];
}

// This thread's maximum of each of its two rows over a tile: a tree of fmaxf, log2(2N) deep
// (a running maximum was a chain of 2N dependent instructions on the softmax's critical path).
template <class Lay = RowsOnM, int N>
__device__ __forceinline__ void tile_row_max(const FragC (&s)[N], float (&m)[2]) {
  float v[2][2 * N];
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      v[r][2 * i] = s[i].c[Lay::elem(r, 0)];
      v[r][2 * i + 1] = s[i].c[Lay::elem(r, 1)];
    }
#pragma unroll
  for (int stride = 1; stride < 2 * N; stride *= 2)
#pragma unroll
    for (int k = 0; k + stride < 2 * N; k += 2 * stride)
#pragma unroll
      for (int r = 0; r < 2; ++r) v[r][k] = fmaxf(v[r][k], v[r][k + stride]);
  m[0] = v[0][0];
  m[1] = v[1][0];
}

struct RowSoftmax {
  float max[2];  // running row maximum in score units (-inf: nothing visible yet)
  float sum[2];  // this thread's partial of sum(exp2((s - max) * unit))
  // P's scale, log2: P = 2^p_log2 exp2((S - max) * unit), the sums alike (free: one FFMA's
  // addend); finish() takes it back out of the maxima, so LSE and the normalised rows are as
  // without. fp8 P (the hopper kernel on fp8 caches) takes 8: P in [0, 256], e4m3's normal
  // range reaching 2^-14 of the row maximum instead of 2^-6.
  float p_log2;

  __device__ __forceinline__ void init(float p_log2_scale = 0.f) {
    max[0] = max[1] = -INFINITY;
    sum[0] = sum[1] = 0.f;
    p_log2 = p_log2_scale;
  }

  // Folds one tile of scores into the state: S becomes P = exp2((S - max) * unit) in place
  // (masked -inf scores give exactly 0) and `rescale` receives the factor by which the
  // output accumulator of each row must be multiplied. kMaxSlackLog2 > 0: the running
  // maxima stay as they are while no score of the warp's rows exceeds its row's maximum by
  // more than kMaxSlackLog2 (log2 units), so P reaches at most 2^kMaxSlackLog2 (16-bit P
  // keeps its relative precision; the fp32 sums and output take it): each thread checks its
  // own scores against the stored maxima and a vote of the warp decides, so the quad's lanes
  // keep agreeing; the kept path has no shuffles across the quad and no rescale. Any later
  // use of the maxima (finish, the split partials, the sinks) is exact with a stale maximum.
  template <class Lay = RowsOnM, int kMaxSlackLog2 = 0, int N>
  __device__ __forceinline__ void step(FragC (&s)[N], float unit, float (&rescale)[2]) {
    float m[2];
    tile_row_max<Lay>(s, m);
    float base[2];
    bool keep = false;
    if constexpr (kMaxSlackLog2 > 0) {
      // (a row that has seen nothing has max -inf: its difference is +inf or NaN, never kept;
      // a thread whose scores are all masked has m = -inf: kept)
      const bool fits = (m[0] - max[0]) * unit <= kMaxSlackLog2 && (m[1] - max[1]) * unit <= kMaxSlackLog2;
      keep = __all_sync(0xffffffffu, fits);
    }
    if (keep) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        rescale[r] = 1.f;
        base[r] = max[r] * unit - p_log2;
      }
    } else {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m[r] = Lay::reduce_max(fmaxf(m[r], max[r]));
        // A row that has seen nothing keeps max = -inf; subtract 0 instead so no (-inf) - (-inf).
        base[r] = (m[r] == -INFINITY) ? 0.f : m[r] * unit;
        rescale[r] = fast_exp2(max[r] * unit - base[r]);  // old max -inf -> 0 (accumulators are 0 too)
        max[r] = m[r];
        sum[r] *= rescale[r];
        base[r] -= p_log2;
      }
    }
    exp_rows<Lay>(s, unit, base, sum);
  }

  // The speculative step's first half: P = exp2((S - max) * unit) in place at the stored maxima,
  // before (and without) any maximum of the tile; `part` receives this thread's sums of it. True
  // where the thread's rows may keep their maxima: both have one (not -inf) and each part is at
  // most 2^kLimitLog2, so every P is (+inf and NaN fail). Then add_sums(part) completes the step
  // (no rescale); else S must come again and take step() (varlen_tile_softmax.cuh).
  template <class Lay = RowsOnM, int kLimitLog2 = 8, int N>
  __device__ __forceinline__ bool exp_at_stored_max(FragC (&s)[N], float unit, float (&part)[2]) const {
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      base[r] = max[r] * unit - p_log2;
      part[r] = 0.f;
    }
    exp_rows<Lay>(s, unit, base, part);
    constexpr float kLimit = static_cast<float>(1 << kLimitLog2);
    return max[0] != -INFINITY && max[1] != -INFINITY && part[0] <= kLimit && part[1] <= kLimit;
  }
  __device__ __forceinline__ void add_sums(const float (&part)[2]) {
    sum[0] += part[0];
    sum[1] += part[1];
  }

 private:
  // S = exp2(S * unit - base) in place, each row's values added to acc.
  template <class Lay, int N>
  __device__ __forceinline__ static void exp_rows(FragC (&s)[N], float unit, const float (&base)[2], float (&acc)[2]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = fmaf(s[i].c[e], unit, -base[Lay::slot(e)]);
        s[i].c[e] = fast_exp2(x);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) acc[r] += s[i].c[Lay::elem(r, 0)] + s[i].c[Lay::elem(r, 1)];
    }
  }

 public:
  // Completes the row sums across the row's lanes and returns the maxima in log2 units.
  template <class Lay = RowsOnM>
  __device__ __forceinline__ void finish(float unit, float (&max_log2)[2], float (&row_sum)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      row_sum[r] = Lay::reduce_sum(sum[r]);
      max_log2[r] = max[r] == -INFINITY ? -INFINITY : max[r] * unit - p_log2;
    }
  }
};

// Merges partial softmax states of one row computed over disjoint key sets (by the warps of
// a CTA that split the keys): given each part's (max_log2, sum), returns the weight of each
// part's unnormalised output in the normalised result and the row's LSE (natural log).
// Parts with sum 0 (nothing visible) get weight 0; a row with nothing visible gets LSE -inf.
template <int kParts>
__device__ __forceinline__ float combine_row_parts(const float (&max_log2)[kParts],
                                                   const float (&sum)[kParts],
                                                   float (&weight)[kParts]) {
  float m = -INFINITY;
#pragma unroll
  for (int p = 0; p < kParts; ++p)
    if (sum[p] > 0.f) m = fmaxf(m, max_log2[p]);
  float total = 0.f;
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
    weight[p] = sum[p] > 0.f ? exp2f(max_log2[p] - m) : 0.f;
    total += weight[p] * sum[p];
  }
  if (!(total > 0.f)) {
#pragma unroll
    for (int p = 0; p < kParts; ++p) weight[p] = 0.f;
    return -INFINITY;
  }
  const float inv = 1.f / total;
#pragma unroll
  for (int p = 0; p < kParts; ++p) weight[p] *= inv;
  return (m + log2f(total)) * kLn2;
}

}  // namespace attnkit::cuda
