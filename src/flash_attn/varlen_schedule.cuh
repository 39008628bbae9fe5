// The tile scheduler of the varlen kernel: which work item a CTA takes and which K/V tiles
// that item (and its split) must visit.
//
// Grid: x = packed-row tiles (sized by max_query_len * group), y = kv_head * num_splits + split,
// z = request. CTAs past their request's row tiles exit at once. Row tiles are taken in
// reverse so that, under the causal mask, the longest ones start first.
#pragma once
#include "cuda/attention_mask.h"
#include "flash_attn/varlen_params.h"

namespace attnkit::flash_attn {

struct WorkItem {
  int req, kv_head, split;
  int q_start, q_len, seq_len;
  int m0, rows;                // first packed row of the tile, real rows in it (<= kBlockM)
  int tile_begin, tile_end;    // K/V tiles [begin, end) this CTA visits
  int full_lo, full_hi;        // keys visible to every row of the tile: [full_lo, full_hi)
};

// A metadata read; kL2Only bypasses L1 (reads before the PDL wait: a line cached then could be
// stale once the previous kernel's writes are visible, and the same addresses are read again
// after the wait).
template <bool kL2Only>
__device__ __forceinline__ int32_t load_meta(const int32_t* p) {
  if constexpr (kL2Only) {
    return __ldcg(p);
  } else {
    return *p;
  }
}

// The work item at grid coordinates (x, y, z); false when x is past the request's row tiles.
template <int kBlockM, int kBlockN, bool kL2Only = false>
__device__ __forceinline__ bool schedule_work(const VarlenKernelParams& p, int x, int y, int z, WorkItem& w) {
  w.req = z;
  w.kv_head = y / p.num_splits;
  w.split = y % p.num_splits;
  w.q_start = load_meta<kL2Only>(p.cu_seqlens_q + w.req);
  w.q_len = load_meta<kL2Only>(p.cu_seqlens_q + w.req + 1) - w.q_start;
  const int rows_total = w.q_len * p.group;
  const int num_row_tiles = (rows_total + kBlockM - 1) / kBlockM;
  if (x >= num_row_tiles) return false;
  w.m0 = (num_row_tiles - 1 - x) * kBlockM;
  w.rows = min(kBlockM, rows_total - w.m0);
  w.seq_len = load_meta<kL2Only>(p.seqused_k + w.req);

  // Visible keys are monotone in the query position, so the first and last token of the
  // tile bound the keys of all its rows.
  const cuda::KeyVisibility vis{w.seq_len, p.causal, p.window_left, p.window_right};
  const int i_first = w.m0 / p.group, i_last = (w.m0 + w.rows - 1) / p.group;
  const cuda::KeyRange first = vis.of(cuda::query_position(w.seq_len, w.q_len, i_first));
  const cuda::KeyRange last = vis.of(cuda::query_position(w.seq_len, w.q_len, i_last));
  w.full_lo = last.lo;
  w.full_hi = first.hi;
  const int key_lo = first.lo, key_hi = last.hi;
  int t_lo = 0, t_hi = 0;
  if (key_hi > key_lo) {
    t_lo = key_lo / kBlockN;
    t_hi = (key_hi + kBlockN - 1) / kBlockN;
  }
  const int per_split = (t_hi - t_lo + p.num_splits - 1) / p.num_splits;
  w.tile_begin = min(t_hi, t_lo + w.split * per_split);
  w.tile_end = min(t_hi, w.tile_begin + per_split);
  return true;
}

// The work item of this CTA in a grid of one CTA per item.
template <int kBlockM, int kBlockN, bool kL2Only = false>
__device__ __forceinline__ bool schedule_work(const VarlenKernelParams& p, WorkItem& w) {
  return schedule_work<kBlockM, kBlockN, kL2Only>(p, blockIdx.x, blockIdx.y, blockIdx.z, w);
}

// A paged K/V tile loader (cuda/paged_kv_tile.h) over the work item's request and KV head.
template <class Loader>
__device__ __forceinline__ Loader kv_loader_for(const VarlenKernelParams& p, const WorkItem& w) {
  Loader loader;
  loader.k = {static_cast<const char*>(p.k_cache) + w.kv_head * p.k_stride_head, p.k_stride_block, p.k_stride_slot};
  loader.v = {static_cast<const char*>(p.v_cache) + w.kv_head * p.v_stride_head, p.v_stride_block, p.v_stride_slot};
  loader.block_row = p.block_table + static_cast<int64_t>(w.req) * p.max_blocks_per_req;
  loader.block_size = p.block_size;
  loader.seq_len = w.seq_len;
  return loader;
}

// The row facts of the two row slots a thread holds in layout Lay (cuda/frag_rows.h).
template <class Lay = cuda::RowsOnM>
__device__ __forceinline__ cuda::RowFacts row_facts(const VarlenKernelParams& p, const WorkItem& w,
                                                    int warp_row0, int lane) {
  const cuda::KeyVisibility vis{w.seq_len, p.causal, p.window_left, p.window_right};
  cuda::RowFacts f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = w.m0 + warp_row0 + Lay::row(lane, r);
    const int token = m / p.group;
    const int head = w.kv_head * p.group + m % p.group;
    f.pos[r] = cuda::query_position(w.seq_len, w.q_len, token);
    f.keys[r] = vis.of(f.pos[r]);
    f.alibi_slope[r] = p.alibi_slopes != nullptr ? p.alibi_slopes[head * p.alibi_stride] : 0.f;
  }
  return f;
}

}  // namespace attnkit::flash_attn
