// Masks and score modifications (docs/architecture.md section 4) as small policies over a score tile.
//
//  * KeyVisibility: which keys j a query at position p sees: causal bottom-right (j <= p),
//    sliding window (p - left <= j <= p + right), always j < seq_len. Positions come from
//    query_position(): the new tokens are the last query_len of seq_len keys; with a query
//    longer than its keys (the varlen-kernel contract) p is negative for the first rows, and
//    under the causal mask those rows see nothing.
//  * ScoreMod: scale (with any K dequant scale folded in), softcap c * tanh(s / c), ALiBi
//    -slope * |p - j|. Without softcap / ALiBi the raw q.k stays in the tile and the softmax
//    folds the scale into its exp2 (ScoreMod::unit); with them, apply() converts the tile to
//    log2 units and unit() is 1.
//  * Sinks are not a tile policy: a sink is a partial result with LSE = sink logit and no
//    value, merged in the epilogue with the LSE merge rule.
#pragma once
#include <cstdint>

#include "cuda/frag_rows.h"
#include "cuda/mma_sm80.h"
#include "cuda/online_softmax.h"

namespace attnkit::cuda {

struct KeyRange {
  int lo = 0, hi = 0;  // visible keys are [lo, hi)
  __device__ __forceinline__ bool empty() const { return hi <= lo; }
};

__device__ __forceinline__ int query_position(int seq_len, int query_len, int i) {
  return seq_len - query_len + i;
}

struct KeyVisibility {
  int seq_len;
  bool causal;
  int window_left, window_right;  // -1 = unbounded

  // Monotone in p (lo and hi never decrease as p grows): the keys of a run of consecutive
  // queries lie in [of(p_first).lo, of(p_last).hi), and every key of
  // [of(p_last).lo, of(p_first).hi) is visible to all of them.
  __device__ __forceinline__ KeyRange of(int p) const {
    int64_t lo = 0, hi = seq_len;
    if (causal) hi = hi < p + 1ll ? hi : p + 1ll;
    if (window_left >= 0) lo = lo > int64_t(p) - window_left ? lo : int64_t(p) - window_left;
    if (window_right >= 0) hi = hi < int64_t(p) + window_right + 1 ? hi : int64_t(p) + window_right + 1;
    KeyRange r;
    r.lo = static_cast<int>(lo);
    r.hi = static_cast<int>(hi < lo ? lo : hi);
    return r;
  }
};

// Per-row facts a thread needs for its two row slots (frag_rows.h: rows g and g + 8 of its
// warp's m16 tile, or 2t and 2t + 1 of the transposed decode tile).
struct RowFacts {
  KeyRange keys[2];
  int pos[2];
  float alibi_slope[2];
};

struct ScoreMod {
  float scale;    // softmax scale times the K dequant scale
  float softcap;  // > 0: s = softcap * tanh(s / softcap)
  bool alibi;

  __device__ __forceinline__ bool active() const { return softcap > 0.f || alibi; }
  __device__ __forceinline__ float unit() const { return active() ? 1.f : scale * kLog2e; }

  // Raw q.k -> log2 units with softcap and ALiBi (only called when active()).
  template <class Lay = RowsOnM, int N>
  __device__ __forceinline__ void apply(FragC (&s)[N], const RowFacts& rows, int key0, int lane) const {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = Lay::slot(e);
        const int j = key0 + Lay::key(lane, i, e);
        float v = s[i].c[e] * scale;
        if (softcap > 0.f) v = softcap * tanhf(v / softcap);
        if (alibi) v -= rows.alibi_slope[r] * fabsf(static_cast<float>(rows.pos[r] - j));
        s[i].c[e] = v * kLog2e;
      }
  }
};

// Scores of keys a row does not see become -inf (exp2 -> exactly 0).
template <class Lay = RowsOnM, int N>
__device__ __forceinline__ void apply_mask(FragC (&s)[N], const RowFacts& rows, int key0, int lane) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const KeyRange& k = rows.keys[Lay::slot(e)];
      const int j = key0 + Lay::key(lane, i, e);
      if (j < k.lo || j >= k.hi) s[i].c[e] = -INFINITY;
    }
}

}  // namespace attnkit::cuda
