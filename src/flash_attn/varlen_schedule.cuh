// The work items of the varlen kernels and their schedulers: which work item a CTA takes and
// which K/V tiles that item (and its split) must visit, and the K/V source arguments of an item.
//
// Work item (x, y, z): x = packed-row tile (sized by max_query_len * group), y = kv_head *
// num_splits + split, z = request. Items past their request's row tiles are empty. Row tiles
// are taken in reverse so that, under the causal mask, the longest ones start first.
// Schedulers: GridScheduler (one CTA per item, the grid's coordinates or a FlashInfer-style
// plan's item: the mma_sync kernel) and PersistentScheduler (a CTA walks the item list: the
// hopper kernel; PlanWalk over a plan).
#pragma once
#include <string>

#include "attnkit/error.h"
#include "cuda/attention_mask.h"
#include "cuda/cp_async.h"
#include "cuda/device_props.h"
#include "cuda/kv_source.cuh"
#include "cuda/metadata_guard.cuh"
#include "cuda/paged_kv_tile.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/varlen_params.h"

namespace attnkit::flash_attn {

struct WorkItem {
  int req, kv_head, split;
  int q_start, q_len, seq_len;
  int m0, rows;                // first packed row of the tile, real rows in it (<= kBlockM)
  int tile_begin, tile_end;    // K/V tiles [begin, end) this CTA visits ...
  int first_key;               // ... tile t's first key: first_key + (t - tile_begin) * kBlockN
  int key_lo, key_hi;          // the item's keys (a planned KV chunk; else [0, seq_len)): rows see no others
  int full_lo, full_hi;        // keys visible to every row of the tile: [full_lo, full_hi)
  int o_col0;                  // the first output column this CTA computes (tiles with o_slices)
  int num_chunks, partial_base;  // planned items (PlanScheduler): chunks of the tile, its partial rows
  bool fault;                  // its metadata broke a rule (cuda/metadata_guard.cuh): NaN rows
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

// Packed row gm of work item w's request and KV head (rows are query x GQA head, the group's heads
// innermost): its query within the request, that query's token and its head.
struct PackedRow {
  int query;
  int64_t token;
  int head;
};
__device__ __forceinline__ PackedRow packed_row(const VarlenKernelParams& p, const WorkItem& w, int gm) {
  int in_group;
  const int query = p.group.divmod(gm, in_group);
  return {query, w.q_start + query, w.kv_head * p.group.divisor + in_group};
}

// The visible keys of the tile's first and last query rows (w's request, rows [m0, m0 + rows)).
// Visible keys are monotone in the query position, so these two bound the keys of all its rows:
// every row sees keys within [first.lo, last.hi), and all rows see [last.lo, first.hi).
__device__ __forceinline__ void tile_row_keys(const VarlenKernelParams& p, const WorkItem& w, cuda::KeyRange& first,
                                              cuda::KeyRange& last) {
  const cuda::KeyVisibility vis{w.seq_len, p.causal, p.window_left, p.window_right};
  const int i_first = p.group.div(w.m0), i_last = p.group.div(w.m0 + w.rows - 1);
  first = vis.of(cuda::query_position(w.seq_len, w.q_len, i_first));
  last = vis.of(cuda::query_position(w.seq_len, w.q_len, i_last));
}

// The keys request `req`'s table row holds: its block-table width, page-table row or contiguous
// rows (the bound of the key-count guard).
__device__ __forceinline__ int64_t key_capacity(const VarlenKernelParams& p, int req) {
  if (p.page_indptr != nullptr)
    return int64_t{__ldg(p.page_indptr + req + 1) - __ldg(p.page_indptr + req)} * p.block_size.divisor;
  if (p.cu_seqlens_k != nullptr) return __ldg(p.cu_seqlens_k + req + 1) - __ldg(p.cu_seqlens_k + req);
  return int64_t{p.max_blocks_per_req} * p.block_size.divisor;
}

// v in [lo, hi] (hi >= lo; v fits an int once clamped).
__device__ __forceinline__ int clamp_to(int64_t v, int64_t lo, int64_t hi) {
  return static_cast<int>(v < lo ? lo : v > hi ? hi : v);
}

// The guards of a work item (cuda/metadata_guard.cuh) on the lengths its scheduler read: query
// rows inside the batch's tokens and at most grid_rows (the packed rows the launch covers, from
// max_seqlen_q), a key count in [0, the request's table row]. Valid lengths cost one combined
// compare inline; a violation takes the out-of-line path, which clamps w.q_len / w.seq_len,
// sets w.fault and, in the `reporter` CTA, records the request's violations (one per request).
namespace guard_detail {
struct Lengths {
  int q_len, seq_len;
};
static __device__ __noinline__ Lengths repair(cuda::DeviceErrorRecord* errors, int64_t num_tokens, int group,
                                              int64_t grid_rows, int64_t key_cap, int req, int q_start, int q_len,
                                              int seq_len, bool reporter) {
  Lengths l{q_len, seq_len};
  if (q_len < 0 || q_start < 0 || int64_t{q_start} + q_len > num_tokens) {
    if (reporter) cuda::record_fault(errors, cuda::DeviceFault::query_rows, req, int64_t{q_start} + q_len);
    l.q_len = (q_start < 0 || q_start > num_tokens) ? 0 : clamp_to(q_len, 0, num_tokens - q_start);
  }
  if (int64_t{l.q_len} * group > grid_rows && reporter)
    cuda::record_fault(errors, cuda::DeviceFault::query_len_past_max, req, l.q_len);
  if (seq_len < 0 || seq_len > key_cap) {
    if (reporter) cuda::record_fault(errors, cuda::DeviceFault::seq_len, req, seq_len);
    l.seq_len = clamp_to(seq_len, 0, key_cap);
  }
  return l;
}
}  // namespace guard_detail

__device__ __forceinline__ void guard_lengths(const VarlenKernelParams& p, WorkItem& w, int64_t grid_rows,
                                              bool reporter) {
  const int64_t cap = key_capacity(p, w.req);
  if (w.q_len < 0 || w.q_start < 0 || int64_t{w.q_start} + w.q_len > p.num_tokens ||
      int64_t{w.q_len} * p.group.divisor > grid_rows || w.seq_len < 0 || w.seq_len > cap) {
    const guard_detail::Lengths l = guard_detail::repair(p.errors, p.num_tokens, p.group.divisor, grid_rows, cap, w.req,
                                                         w.q_start, w.q_len, w.seq_len, reporter);
    w.q_len = l.q_len;
    w.seq_len = l.seq_len;
    w.fault = true;
  }
}

// The work item at grid coordinates (x, y, z); false when x is past the request's row tiles.
// kOSliceCols > 0: the tile's items have output-column slices of that width, the slice outermost
// in y (y = (slice x kv heads + kv_head) x splits + split: a cluster of one item's splits stays
// contiguous in y). split_div: p.num_splits as a precomputed divisor (the persistent walk's, which
// divides per item), or nullptr (divisions by p.num_splits).
template <int kBlockM, int kBlockN, bool kL2Only = false, int kOSliceCols = 0>
__device__ __forceinline__ bool schedule_work(const VarlenKernelParams& p, int x, int y, int z, int grid_row_tiles,
                                              WorkItem& w, bool record = true,
                                              const cuda::FastDivmod* split_div = nullptr) {
  const int splits = p.num_splits;
  auto by_splits = [&](int n) { return split_div != nullptr ? split_div->div(n) : n / splits; };
  w.o_col0 = 0;
  if constexpr (kOSliceCols > 0) {
    const int per_slice = p.num_kv_heads * splits;
    const int slice = y / per_slice;
    y -= slice * per_slice;
    w.o_col0 = slice * kOSliceCols;
  }
  w.req = z;
  w.kv_head = by_splits(y);
  w.split = y - w.kv_head * splits;
  w.q_start = load_meta<kL2Only>(p.cu_seqlens_q + w.req);
  w.q_len = load_meta<kL2Only>(p.cu_seqlens_q + w.req + 1) - w.q_start;
  // (the guards: not before the PDL wait, when the lengths may be stale; not without guards)
  constexpr bool kGuard = !kL2Only && cuda::kDeviceGuards;
  const bool reporter = record && x == 0 && y == 0;
  w.seq_len = load_meta<kL2Only>(p.seqused_k + w.req);
  w.fault = false;
  if constexpr (kGuard) guard_lengths(p, w, int64_t{grid_row_tiles} * kBlockM, reporter);
  const int rows_total = max(w.q_len, 0) * p.group.divisor;
  const int num_row_tiles = (rows_total + kBlockM - 1) / kBlockM;
  if (x >= num_row_tiles) return false;
  w.m0 = (num_row_tiles - 1 - x) * kBlockM;
  w.rows = min(kBlockM, rows_total - w.m0);

  cuda::KeyRange first, last;
  tile_row_keys(p, w, first, last);
  w.full_lo = last.lo;
  w.full_hi = first.hi;
  const int key_lo = first.lo, key_hi = last.hi;
  int t_lo = 0, t_hi = 0;
  if (key_hi > key_lo) {
    t_lo = key_lo / kBlockN;
    t_hi = (key_hi + kBlockN - 1) / kBlockN;
  }
  const int per_split = by_splits(t_hi - t_lo + splits - 1);
  w.tile_begin = min(t_hi, t_lo + w.split * per_split);
  w.tile_end = min(t_hi, w.tile_begin + per_split);
  w.first_key = w.tile_begin * kBlockN;
  w.key_lo = 0;
  w.key_hi = w.seq_len;
  w.num_chunks = splits;
  w.partial_base = -1;
  return true;
}

// The work item of this CTA in a grid of one CTA per item.
template <int kBlockM, int kBlockN, bool kL2Only = false, int kOSliceCols = 0>
__device__ __forceinline__ bool schedule_work(const VarlenKernelParams& p, WorkItem& w, bool record = true) {
  return schedule_work<kBlockM, kBlockN, kL2Only, kOSliceCols>(p, blockIdx.x, blockIdx.y, blockIdx.z,
                                                               static_cast<int>(gridDim.x), w, record);
}

// The plan scheduler (FlashInfer-style, src/flashinfer/plan.h): CTA b of a 1-D grid runs planned
// work item b / num_kv_heads (request, packed-row tile of plan_tile_q rows, KV chunk [kv_begin,
// kv_end), chunk j of n, partial base) for KV head b % num_kv_heads, so the CTAs running together
// read every KV head of the same pages (the block-table grid's order; item-major, one head at a
// time, ran fp8 256 x 32k at 70% of read BW instead of 87%). Items at or past the device-side
// count have none (a grid sized to the plan's capacity stays valid for every re-plan: CUDA
// graphs). The item's rows see the chunk's keys only; its tiles start at the chunk's first
// 16-key group.
template <int kBlockM, int kBlockN>
struct PlanScheduler {
  static constexpr bool kGridItems = false;
  static constexpr int kItemInts = 7;  // WorkItem of plan.h: request, q_tile, kv_begin, kv_end, chunk, num_chunks, partial_base
  __device__ __forceinline__ static bool take(const VarlenKernelParams& p, WorkItem& w) {
    const int item = static_cast<int>(blockIdx.x / p.num_kv_heads);
    if (item >= __ldg(p.plan_num_items)) return false;
    take(p, item, static_cast<int>(blockIdx.x - static_cast<unsigned>(item) * p.num_kv_heads), w);
    return true;
  }
  // Item `item` (below the plan's count) for KV head kv_head.
  __device__ __forceinline__ static void take(const VarlenKernelParams& p, int item, int kv_head, WorkItem& w) {
    const int32_t* it = p.plan_items + static_cast<int64_t>(item) * kItemInts;
    w.o_col0 = 0;
    w.req = __ldg(it + 0);
    const int q_tile = __ldg(it + 1), kv_begin = __ldg(it + 2), kv_end = __ldg(it + 3);
    w.split = __ldg(it + 4);
    w.num_chunks = __ldg(it + 5);
    w.partial_base = __ldg(it + 6);
    w.kv_head = kv_head;
    w.q_start = __ldg(p.cu_seqlens_q + w.req);
    w.q_len = __ldg(p.cu_seqlens_q + w.req + 1) - w.q_start;
    w.m0 = q_tile * p.plan_tile_q;
    w.rows = min(p.plan_tile_q, w.q_len * p.group.divisor - w.m0);
    w.seq_len = __ldg(p.seqused_k + w.req);
    cuda::KeyRange first, last;
    tile_row_keys(p, w, first, last);
    w.key_lo = max(first.lo, kv_begin);
    w.key_hi = min(last.hi, kv_end);
    w.full_lo = max(last.lo, kv_begin);
    w.full_hi = min(first.hi, kv_end);
    w.first_key = w.key_lo & ~15;
    w.fault = false;  // (its lengths and offsets are the host plan's, checked there; block ids: the scan)
    w.tile_begin = 0;
    w.tile_end = w.key_hi > w.key_lo ? (w.key_hi - w.first_key + kBlockN - 1) / kBlockN : 0;
  }
};

// The mma_sync kernel's scheduler: one work item per CTA, its grid coordinates (schedule_work),
// or, in a planned launch (p.plan_items set: the FlashInfer-style parts), the plan's item
// (PlanScheduler). One kernel serves both launches; the choice is made once per CTA.
template <int kBlockM, int kBlockN, int kOSliceCols = 0>
struct GridScheduler {
  static constexpr bool kGridItems = true;  // (the early L2 prefetch can guess the item: grid launches, p.l2_prefetch)
  // This CTA's item; false: it has none (past its request's row tiles, or past the plan's count).
  __device__ __forceinline__ static bool take(const VarlenKernelParams& p, WorkItem& w) {
    if constexpr (kOSliceCols == 0) {  // (tiles of output-column slices have no planned launches)
      if (p.plan_items != nullptr) return PlanScheduler<kBlockM, kBlockN>::take(p, w);
    }
    return schedule_work<kBlockM, kBlockN, false, kOSliceCols>(p, w);
  }
};

// The plan's items as the hopper kernel's producer walks them (next(p, r, w), as
// PersistentScheduler): gridDim.x CTAs walk the list of n items x KV heads (n: the plan's
// device-side count, at most its `capacity` of item slots) in rounds, CTA b taking index
// i = r * G + b, counted from the other end in odd rounds; one CTA per entry where the grid has
// them all. Index i is KV head i / n and the plan's item n - 1 - i % n: KV heads outermost, the
// items from the last (the plan lists a request's row tiles first to last, so each request's
// causal tiles come longest first), the order of the persistent grid walk (row tiles fastest,
// reversed): neighbouring CTAs share a request's K/V and each round mixes long and short
// tiles (item-major with KV heads inner gave a CTA the same row tile round after round where a
// request's entries spanned two rounds: 0.77x the grid walk at causal 1k x 16). The index grows
// with the round, so the first one past n x KV heads ends the walk. The same
// kernel walks either list (HopperWalk, below).
template <int kBlockM, int kBlockN>
struct PlanWalk {
  int capacity;
  __device__ __forceinline__ bool next(const VarlenKernelParams& p, int64_t& r, WorkItem& w) const {
    const int64_t G = gridDim.x, b = blockIdx.x;
    const int64_t i = r * G + ((r & 1) ? G - 1 - b : b);
    const int n = min(__ldg(p.plan_num_items), capacity);
    if (i >= int64_t{n} * p.num_kv_heads) return false;
    const int head = static_cast<int>(i / n);
    PlanScheduler<kBlockM, kBlockN>::take(p, n - 1 - static_cast<int>(i - int64_t{head} * n), head, w);
    return true;
  }
};

// The persistent scheduler: gridDim.x CTAs walk the items of a grid of nx x ny x nz, item i in
// the order of the one-CTA-per-item grid (x = row tile fastest, then KV head, then request), so
// the CTAs running at one time share a KV head's tiles in L2. Round r gives CTA b item
// r * G + b (G CTAs), counted from the other end in odd rounds (r * G + G - 1 - b): a CTA that
// drew one of the longer items of a stretch draws one of the shorter ones next (plain striding
// by G gave every CTA the same row tile of each request when the row-tile count divides G:
// causal work then piles up on a quarter of the CTAs, e.g. 4 row tiles, 132 SMs). Row tiles
// are taken in reverse, so under a causal mask each (request, head) starts with its longest
// items. Every role of a CTA that walks the list counts the same rounds. Item indices are 32-bit
// (total < 2^31: the launcher checks), split by precomputed divisors (y: KV head x splits +
// split, as the grid's).
template <int kBlockM, int kBlockN>
struct PersistentScheduler {
  cuda::FastDivmod nx, ny, splits;  // (grid x, grid y, p.num_splits)
  int total;
  // The next item with rows from round r on (r advances past it); false when none is left.
  __device__ __forceinline__ bool next(const VarlenKernelParams& p, int64_t& r, WorkItem& w) const {
    const int64_t G = gridDim.x, b = blockIdx.x;
    for (; r * G < total; ++r) {
      const int64_t i = r * G + ((r & 1) ? G - 1 - b : b);
      if (i >= total) continue;
      int x, y;
      const int z = ny.divmod(nx.divmod(static_cast<int>(i), x), y);
      if (schedule_work<kBlockM, kBlockN>(p, x, y, z, nx.divisor, w, true, &splits)) return true;
    }
    return false;
  }
};

// The hopper kernel's walk: the plan's items in a planned launch (p.plan_items set: PlanWalk),
// else the launch grid's (PersistentScheduler). One kernel serves both launches; only the
// producer walks (hopper_kernel.cuh), so the choice costs the consumers nothing. kPlans: the
// tile has planned launches (HopperTraits::kPlanned; else the plan's walk is not compiled).
template <int kBlockM, int kBlockN, bool kPlans>
struct HopperWalk {
  PersistentScheduler<kBlockM, kBlockN> grid;  // (unused in planned launches)
  PlanWalk<kBlockM, kBlockN> plan;             // (unused in grid launches)
  __device__ __forceinline__ bool next(const VarlenKernelParams& p, int64_t& r, WorkItem& w) const {
    if constexpr (kPlans) {
      if (p.plan_items != nullptr) return plan.next(p, r, w);
    }
    return grid.next(p, r, w);
  }
};

// The cache's block count as a page map bounds ids (< 2^31: varlen_kernel_params checks; read
// straight from the parameters, so the loaders may reload it rather than hold a register).
__device__ __forceinline__ uint32_t cache_blocks(const VarlenKernelParams& p) { return static_cast<uint32_t>(p.num_blocks); }

// The page map (cuda/paged_kv_tile.h) of the work item's request: its first row of contiguous
// K/V (cu_seqlens_k set), its page-table row (a planned launch: page_indptr set), or its
// block-table row (kL2Only: metadata reads before the PDL wait).
template <bool kL2Only = false>
__device__ __forceinline__ cuda::KvPages page_map_for(const VarlenKernelParams& p, const WorkItem& w) {
  cuda::KvPages pages;
  if (p.cu_seqlens_k != nullptr) {
    pages.first_row = load_meta<kL2Only>(p.cu_seqlens_k + w.req);
  } else {
    pages.row = p.block_table + (p.page_indptr != nullptr ? static_cast<int64_t>(load_meta<kL2Only>(p.page_indptr + w.req))
                                                          : static_cast<int64_t>(w.req) * p.max_blocks_per_req);
    pages.num_blocks = cache_blocks(p);
  }
  return pages;
}

// The block-id guard of a work item (cuda/metadata_guard.cuh pages_fault) over its tiles' keys
// [w.first_key, key_end).
__device__ __forceinline__ bool item_pages_fault(const VarlenKernelParams& p, const WorkItem& w, int key_end, int tid,
                                                 int nthreads) {
  return cuda::pages_fault(page_map_for(p, w), p.block_size, w.first_key, key_end, w.seq_len, w.req, p.errors, tid,
                           nthreads);
}

// A paged K/V tile loader (cuda/paged_kv_tile.h) over the work item's request and KV head.
template <class Loader, bool kL2Only = false>
__device__ __forceinline__ Loader kv_loader_for(const VarlenKernelParams& p, const WorkItem& w) {
  Loader loader;
  loader.k = {static_cast<const char*>(p.k_cache) + w.kv_head * p.k_stride_head, p.k_stride_block, p.k_stride_slot};
  loader.v = {static_cast<const char*>(p.v_cache) + w.kv_head * p.v_stride_head, p.v_stride_block, p.v_stride_slot};
  loader.page_map = page_map_for<kL2Only>(p, w);
  loader.block_size = p.block_size;
  loader.seq_len = w.seq_len;
  loader.row_bytes = p.kv_row_bytes;
  return loader;
}

// Q rows of the tile -> shared memory laid out by Layout (zero rows past the tile's real rows,
// zero columns past the head size).
template <class Tr, class Layout = cuda::PitchedTile<Tr::kPitch * 2>, int kLoaders = Tr::kThreads>
__device__ __forceinline__ void load_q_tile(const VarlenKernelParams& p, const WorkItem& w,
                                            uint32_t sq, int tid) {
  using T = typename Tr::Elem;
  constexpr int kChunksPerRow = Tr::kHeadDim / 8;
  const T* q = static_cast<const T*>(p.q);
  for (int idx = tid; idx < Tr::kBlockM * kChunksPerRow; idx += kLoaders) {
    const int m = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
    const bool valid = m < w.rows && chunk * 8 < p.head_size;
    const T* src = q;
    if (valid) {
      const PackedRow r = packed_row(p, w, w.m0 + m);
      src = q + r.token * p.q_stride_token + r.head * p.q_stride_head + chunk * 8;
    }
    cuda::cp_async_16(sq + Layout::offset(m, chunk), src, valid);
  }
}

// What a K/V source (cuda/kv_source.cuh) reads for work item w, with its stages.
template <int kBlockN>
__device__ __forceinline__ cuda::KvSourceArgs kv_source_args(const VarlenKernelParams& p, const WorkItem& w,
                                                                     uint32_t stages, unsigned char* stages_ptr) {
  cuda::KvSourceArgs a;
  a.k = {static_cast<const char*>(p.k_cache) + w.kv_head * p.k_stride_head, p.k_stride_block, p.k_stride_slot};
  a.v = {static_cast<const char*>(p.v_cache) + w.kv_head * p.v_stride_head, p.v_stride_block, p.v_stride_slot};
  if (p.k_block_scales != nullptr) {  // (NVFP4)
    a.k_scales = {static_cast<const char*>(p.k_block_scales) + w.kv_head * p.k_bscale_stride_head,
                  p.k_bscale_stride_block, p.k_bscale_stride_slot};
    a.v_scales = {static_cast<const char*>(p.v_block_scales) + w.kv_head * p.v_bscale_stride_head,
                  p.v_bscale_stride_block, p.v_bscale_stride_slot};
  }
  a.pages = page_map_for(p, w);
  a.block_size = p.block_size;
  a.seq_len = w.seq_len;
  a.kv_head = w.kv_head;
  a.row_bytes = p.kv_row_bytes;
  a.k_map = &p.k_map;
  a.v_map = &p.v_map;
  a.evict_first = p.kv_evict_first;
  a.first_key = w.first_key;
  a.n_tiles = w.tile_end - w.tile_begin;
  a.stages = stages;
  a.stages_ptr = stages_ptr;
  return a;
}

// Before pdl_wait (VarlenKernelParams::l2_prefetch): L2 prefetch of the first kTiles K/V tiles
// of this CTA's work item. The metadata may still be being written by the previous kernel, so
// the item is only a guess: keys are clamped to the request's block-table row and page ids to
// the cache (PagedKVTileLoader::prefetch_l2), and nothing here is kept. (Contiguous K/V have
// no block-table row: the clamp leaves nothing to prefetch.)
template <int kBlockM, int kBlockN, class Loader, int kTiles, int kOSliceCols = 0>
__device__ __forceinline__ void prefetch_first_tiles(const VarlenKernelParams& p, int tid) {
  WorkItem w;
  if (!schedule_work<kBlockM, kBlockN, /*kL2Only=*/true, kOSliceCols>(p, w)) return;
  Loader loader = kv_loader_for<Loader, /*kL2Only=*/true>(p, w);
  loader.seq_len = min(w.seq_len, p.max_blocks_per_req * p.block_size.divisor);
  const int n = min(w.tile_end - w.tile_begin, kTiles);
  for (int i = 0; i < n; ++i) loader.prefetch_l2((w.tile_begin + i) * kBlockN, p.num_blocks, tid);
}

// The row facts of the two row slots a thread holds in layout Lay (cuda/frag_rows.h).
// per_request_alibi false: the kernel serves per-head slopes only (a constant: the request index
// then need not stay live; the hopper consumers, at their register limit, spilled for it).
template <class Lay = cuda::RowsOnM>
__device__ __forceinline__ cuda::RowFacts row_facts(const VarlenKernelParams& p, const WorkItem& w,
                                                    int warp_row0, int lane, bool per_request_alibi = true) {
  const cuda::KeyVisibility vis{w.seq_len, p.causal, p.window_left, p.window_right};
  cuda::RowFacts f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const PackedRow row = packed_row(p, w, w.m0 + warp_row0 + Lay::row(lane, r));
    f.pos[r] = cuda::query_position(w.seq_len, w.q_len, row.query);
    f.keys[r] = vis.of(f.pos[r]);
    f.keys[r].lo = max(f.keys[r].lo, w.key_lo);  // (the item's keys: a planned chunk's)
    f.keys[r].hi = max(f.keys[r].lo, min(f.keys[r].hi, w.key_hi));
    f.alibi_slope[r] =
        p.alibi_slopes != nullptr
            ? p.alibi_slopes[(per_request_alibi ? w.req * p.alibi_req_stride : 0) + row.head * p.alibi_stride]
            : 0.f;
  }
  return f;
}

// The grid of a launch (x = packed-row tiles, y = output slice x KV head x split, z = request) and the checks
// every generation's launcher makes: false = nothing to launch.
inline bool varlen_grid(const VarlenKernelParams& p, const LaunchPlan& plan, size_t smem_bytes, const char* where,
                        dim3& grid) {
  if (plan.row_tiles == 0 || p.num_reqs == 0) return false;
  ATTNKIT_REQUIRE(plan.row_tiles <= 0x7fffffff, where, "max_query_len * group", plan.row_tiles,
                  "must fit one grid (in tiles of " + std::to_string(plan.config.rows) + " rows)");
  ATTNKIT_REQUIRE(p.num_reqs <= 65535, where, "num_reqs", p.num_reqs, "must be <= 65535 (grid z)");
  const int64_t y = static_cast<int64_t>(p.num_kv_heads) * p.num_splits * plan.config.o_slices;
  ATTNKIT_REQUIRE(y <= 65535, where, "num_kv_heads * num_splits * output slices", y, "must be <= 65535 (grid y)");
  const cuda::DeviceProps& dev = cuda::current_device_props();
  ATTNKIT_REQUIRE(smem_bytes <= dev.smem_per_block_optin, where, "shared memory per block", smem_bytes,
                  "must fit the device's opt-in limit of " + std::to_string(dev.smem_per_block_optin) + " bytes");
  grid = dim3(static_cast<unsigned>(plan.row_tiles), static_cast<unsigned>(y), static_cast<unsigned>(p.num_reqs));
  return true;
}

}  // namespace attnkit::flash_attn
