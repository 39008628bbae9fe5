// K/V sources of the attention kernel skeleton: where a work item's K/V tiles come from and how
// they reach the shared-memory stages. Each source keeps kStages - 1 tiles in flight and
// offers the same five calls, so the main loop reads the same whatever fills the stages:
//
//   stages_at(a)        (static) where its stages start, given the first free shared address
//   prefetch_maps(k, v) (static) before the PDL wait: the first fetch of its descriptors, if any
//   init()              its barriers, before anything else (all threads)
//   start()             the first kStages - 1 tiles (after Q's cp.async group is committed)
//   wait<kQPending>(i)  tile i has landed (the caller then syncs the CTA); kQPending: Q's
//                       cp.async group was not waited for yet
//   issue_ahead(i)      tile i + kStages - 1, into the stage tile i - 1 has just freed
//   drain()             nothing in flight any more
//
// Today: pages by cp.async (every thread, any cache geometry, through a page map of
// paged_kv_tile.h: the block table or contiguous rows; NVFP4 caches also copy each side's block
// scale rows, right after its tile of packed rows) and the block table by TMA (warp 0, one box
// per 16-key page group, sm90, rows of whole 128-byte segments). G is the tile geometry:
// kBlockN, kKvRowBytes, kScaleRowBytes, kStages, kThreads, kStageDataBytes, kStageTileBytes,
// kStageBytes, kStagePitchBytes.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/cp_async.h"
#include "cuda/fast_divmod.h"
#include "cuda/kv_smem_layout.h"
#include "cuda/paged_kv_tile.h"
#include "cuda/pipeline_sm90.h"
#include "cuda/tma_sm90.h"

namespace attnkit::cuda {

// What a source reads: one request's pages and one KV head of both cache sides, the item's
// tiles [first_key, first_key + n_tiles * kBlockN), and its stages.
struct KvSourceArgs {
  PagedSideBytes k, v;         // bases offset to the KV head, byte strides
  PagedSideBytes k_scales, v_scales;  // NVFP4 block scales of the two sides (else unused)
  KvPages pages;               // the request's pages
  FastDivmod block_size;
  int seq_len, kv_head;
  int row_bytes;               // bytes of a row in the cache (<= G::kKvRowBytes; cp.async sources)
  const TmaDesc* k_map;        // TMA maps of the two sides (TMA sources only)
  const TmaDesc* v_map;
  bool evict_first;            // TMA boxes with an L2 evict-first policy
  int first_key, n_tiles;
  uint32_t stages;             // shared address of stage 0
  unsigned char* stages_ptr;   // ... and its generic pointer
};

// The rows of NVFP4 block scales (G::kScaleRowBytes > 0): 4-byte chunks into dense rows right
// after each side's tile of packed rows, by the first kThreads threads (a tile of short rows
// has fewer chunks than the CTA has threads), in 16-key groups whose pages are read one tile
// ahead, as the packed rows' are. Without scales, every call is a no-op.
template <class G, bool = (G::kScaleRowBytes > 0)>
struct ScaleRows {
  struct Pages {};
  __device__ __forceinline__ ScaleRows(const KvSourceArgs&, int) {}
  __device__ __forceinline__ Pages pages(int, int) const { return {}; }
  __device__ __forceinline__ void load(int, uint32_t, uint32_t, int) const {}
  __device__ __forceinline__ void load(int, const Pages&, uint32_t, uint32_t, int) const {}
};
template <class G>
struct ScaleRows<G, true> {
  static constexpr int kChunksPerTile = G::kBlockN * G::kScaleRowBytes / 4;
  static constexpr int kThreads = kChunksPerTile < G::kThreads ? kChunksPerTile : G::kThreads;
  using Loader = PagedKVTileLoader<G::kBlockN, G::kScaleRowBytes, PitchedTile<G::kScaleRowBytes>, kThreads, 4>;
  static_assert(Loader::kByGroups, "scale rows are copied by 16-key groups");
  using Pages = typename Loader::Pages;
  const Loader loader;
  const bool active;  // this thread copies scale chunks
  __device__ __forceinline__ ScaleRows(const KvSourceArgs& a, int tid)
      : loader{a.k_scales, a.v_scales, a.pages, a.block_size, a.seq_len, G::kScaleRowBytes}, active(tid < kThreads) {}
  __device__ __forceinline__ Pages pages(int first_key, int tid) const {
    return active ? loader.pages(first_key, tid) : Pages{};
  }
  // The scale rows of keys [first_key, + kBlockN) after the packed rows of the K / V stages.
  __device__ __forceinline__ void load(int first_key, uint32_t k_stage, uint32_t v_stage, int tid) const {
    if (active) loader.load(first_key, k_stage + G::kStageDataBytes, v_stage + G::kStageDataBytes, tid);
  }
  __device__ __forceinline__ void load(int first_key, const Pages& pg, uint32_t k_stage, uint32_t v_stage,
                                       int tid) const {
    if (active) loader.load(first_key, pg, k_stage + G::kStageDataBytes, v_stage + G::kStageDataBytes, tid);
  }
};

template <class G>
struct CpAsyncPagedSource {
  using Ring = StageRing<G::kStages>;
  using Layout = PitchedTile<G::kStagePitchBytes>;  // where a stage's bytes lie (fragment loaders)
  using Loader = PagedKVTileLoader<G::kBlockN, G::kKvRowBytes, Layout, G::kThreads>;
  using Scales = ScaleRows<G>;
  struct Barriers {};  // cp.async groups need none
  // Block-table entries of the next tile to load, read one iteration ahead (where the loader
  // copies by 16-key groups): their latency overlaps the MMAs instead of stalling the copies.
  static constexpr bool kPagesAhead = Loader::kByGroups;
  static_assert(G::kScaleRowBytes == 0 || kPagesAhead, "tiles with scale rows read their pages ahead");

  const Loader loader;
  const Scales scales;
  const uint32_t stages;
  const int first_key, n_tiles, tid;
  typename Loader::Pages next_pages;  // (written before any read: start, issue_ahead)
  typename Scales::Pages next_scale_pages;

  __device__ __forceinline__ CpAsyncPagedSource(const KvSourceArgs& a, Barriers&, int tid_)
      : loader{a.k, a.v, a.pages, a.block_size, a.seq_len, a.row_bytes}, scales(a, tid_), stages(a.stages),
        first_key(a.first_key), n_tiles(a.n_tiles), tid(tid_) {}
  __device__ __forceinline__ int tile_key(int i) const { return first_key + i * G::kBlockN; }
  __device__ __forceinline__ uint32_t k_stage(int i) const { return stages + Ring::stage_of(i) * G::kStageBytes; }
  __device__ __forceinline__ uint32_t v_stage(int i) const { return k_stage(i) + G::kStageTileBytes; }

  __device__ __forceinline__ static uint32_t stages_at(uint32_t free) { return free; }
  __device__ __forceinline__ static void prefetch_maps(const TmaDesc*, const TmaDesc*) {}
  __device__ __forceinline__ void init() {}
  __device__ __forceinline__ void start() {
#pragma unroll
    for (int s = 0; s < G::kStages - 1; ++s) {  // one group each, maybe empty
      if (s < n_tiles) {
        loader.load(tile_key(s), k_stage(s), v_stage(s), tid);
        scales.load(tile_key(s), k_stage(s), v_stage(s), tid);
      }
      cp_async_commit();
    }
    if constexpr (kPagesAhead)
      if (G::kStages - 1 < n_tiles) read_pages_ahead(tile_key(G::kStages - 1));
  }
  // Q's group was committed before the kStages - 1 groups of start().
  __device__ __forceinline__ void wait_q() const { cp_async_wait<G::kStages - 1>(); }
  template <bool kQPending>
  __device__ __forceinline__ void wait(int) const {
    Ring::wait_oldest();  // (groups complete in order: Q's first)
  }
  __device__ __forceinline__ void issue_ahead(int i) {
    const int ahead = i + G::kStages - 1;
    if constexpr (kPagesAhead) {
      if (ahead < n_tiles) {
        loader.load(tile_key(ahead), next_pages, k_stage(ahead), v_stage(ahead), tid);
        scales.load(tile_key(ahead), next_scale_pages, k_stage(ahead), v_stage(ahead), tid);
      }
      cp_async_commit();
      if (ahead + 1 < n_tiles) read_pages_ahead(tile_key(ahead + 1));
    } else {
      if (ahead < n_tiles) loader.load(tile_key(ahead), k_stage(ahead), v_stage(ahead), tid);
      cp_async_commit();
    }
  }
  __device__ __forceinline__ void drain() const { Ring::drain(); }

 private:
  __device__ __forceinline__ void read_pages_ahead(int key0) {
    next_pages = loader.pages(key0, tid);
    next_scale_pages = scales.pages(key0, tid);
  }
};

// TMA fills of the stages (sm90): warp 0's lanes 0..kGroups-1 each own one 16-key page group of
// a tile and copy its K and V boxes (tensor_map.h) onto the stage's full barrier, which lane 0
// arms with the tile's byte count first. Groups at or past seq_len are not copied (their
// block-table entries are never read); the tail tile's rows past seq_len are zeroed once it
// has landed, as cp.async's zero fill does. Stages are dense, 128-byte swizzled
// (kv_smem_layout.h PagedSwizzle128) and 1024-byte aligned.
// The pages must be a block-table row (the launch plan never takes a TMA tile for contiguous
// K/V: their view has no whole-block boxes).
template <class G>
struct TmaBlockTableSource {
  using Layout = PagedSwizzle128<G::kKvRowBytes>;
  using Pipe = Pipeline<G::kStages, /*kEmpty=*/false>;  // a stage is free once the CTA synced past it
  using State = typename Pipe::State;
  using Barriers = PipelineBarriers<G::kStages, false>;
  static constexpr int kGroups = G::kBlockN / 16;
  static constexpr uint32_t kGroupBytes = 16 * G::kKvRowBytes;
  static_assert(kGroups <= 32, "one lane per page group");
  // Page ids come in batches of 32 page groups (kTilesPerBatch tiles): one block-table read per
  // lane of warp 0 and batch, the next batch read while the current one is issued, and a tile's
  // issue takes its groups' pages from their lanes by shuffle (DECISIONS.md: TMA page ids
  // batched by 32 page groups).
  static constexpr int kTilesPerBatch = 32 / kGroups;
  static_assert(32 % kGroups == 0, "whole tiles per batch of 32 page groups");

  Pipe pipe;
  const TmaDesc* k_map;
  const TmaDesc* v_map;
  KvPages pages;  // the request's block-table row
  FastDivmod block_size;
  int seq_len, kv_head, first_key, n_tiles, tid, lane;
  bool evict_first, issuer;  // issuer: warp 0
  uint64_t l2_policy;
  uint32_t stages;
  unsigned char* stages_ptr;
  int32_t page_cur = 0, page_next = 0;  // this lane's page group of the current / next batch

  __device__ __forceinline__ TmaBlockTableSource(const KvSourceArgs& a, Barriers& bars, int tid_)
      : pipe(bars), k_map(a.k_map), v_map(a.v_map), pages(a.pages), block_size(a.block_size),
        seq_len(a.seq_len), kv_head(a.kv_head), first_key(a.first_key), n_tiles(a.n_tiles), tid(tid_),
        lane(tid_ & 31), evict_first(a.evict_first), issuer(tid_ < 32),
        l2_policy(tid_ < 32 ? l2_policy_evict_first() : 0), stages(a.stages), stages_ptr(a.stages_ptr) {}

  __device__ __forceinline__ int tile_key(int i) const { return first_key + i * G::kBlockN; }
  __device__ __forceinline__ static int stage_of(int i) { return i % G::kStages; }
  __device__ __forceinline__ uint32_t k_stage(int i) const { return stages + stage_of(i) * G::kStageBytes; }
  __device__ __forceinline__ uint32_t v_stage(int i) const { return k_stage(i) + G::kStageTileBytes; }

  // (the 128-byte swizzle reads address bits 7-9: stage tiles start 1024-byte aligned)
  __device__ __forceinline__ static uint32_t stages_at(uint32_t free) { return (free + 1023u) & ~1023u; }
  // The descriptors' first fetch, off the start of the loads (thread 0).
  __device__ __forceinline__ static void prefetch_maps(const TmaDesc* k, const TmaDesc* v) {
    if (threadIdx.x == 0) {
      prefetch_tensor_map(k);
      prefetch_tensor_map(v);
    }
  }
  __device__ __forceinline__ void init() {
    if (tid == 0) {
      pipe.init(1, 0);
      fence_mbarrier_init();
    }
    __syncthreads();  // the barriers exist before anyone waits on them or arms them
  }
  __device__ __forceinline__ void start() {
    if (!issuer) return;
    page_cur = batch_page(tile_key(0));
    page_next = n_tiles > kTilesPerBatch ? batch_page(tile_key(kTilesPerBatch)) : 0;
#pragma unroll
    for (int s = 0; s < G::kStages - 1; ++s)
      if (s < n_tiles) issue(s);
  }
  __device__ __forceinline__ void wait_q() const { cp_async_wait<0>(); }  // (Q's is the only group)
  template <bool kQPending>
  __device__ __forceinline__ void wait(int i) const {
    if constexpr (kQPending) cp_async_wait<0>();
    pipe.wait(State::of(i));
    const int rows_left = seq_len - tile_key(i);
    if (rows_left < G::kBlockN) zero_tail_rows(stages_ptr + (k_stage(i) - stages), rows_left);
  }
  __device__ __forceinline__ void issue_ahead(int i) {
    const int ahead = i + G::kStages - 1;
    if (issuer && ahead < n_tiles) issue(ahead);
  }
  __device__ __forceinline__ void drain() const {}  // (every issued tile was waited for)

 private:
  // This lane's page of the batch whose first tile starts at key0 (0 past seq_len).
  __device__ __forceinline__ int32_t batch_page(int key0) const {
    const int key = key0 + 16 * lane;
    return key < seq_len ? pages.readable(pages.at(block_size.div(key))) : 0;
  }
  // This lane's page of tile t (t = 0, 1, ... in order, all of warp 0; 0 where it owns none).
  __device__ __forceinline__ int32_t page_of_tile(int t) {
    const int pos = t % kTilesPerBatch;
    if (pos == 0 && t > 0) {
      page_cur = page_next;
      const int t_next = t + kTilesPerBatch;
      page_next = t_next < n_tiles ? batch_page(tile_key(t_next)) : 0;
    }
    return __shfl_sync(0xffffffffu, page_cur, (pos * kGroups + lane) & 31);
  }
  // Tile t's boxes, by all of warp 0. (A page id outside the cache was replaced by block 0 when
  // read; the kernel writes the item's rows as NaN: cuda/metadata_guard.cuh.)
  __device__ __forceinline__ void issue(int t) {
    const int32_t blk = page_of_tile(t);
    const int key0 = tile_key(t);
    const uint32_t bar = pipe.full(State::of(t));
    if (lane == 0) {
      const int groups = min(kGroups, (seq_len - key0 + 15) / 16);
      mbar_arrive_expect_tx(bar, static_cast<uint32_t>(groups) * 2u * kGroupBytes);
    }
    __syncwarp();
    if (lane < kGroups && key0 + 16 * lane < seq_len) {
      const int key = key0 + 16 * lane;
      const int slot = key - block_size.div(key) * block_size.divisor;
      const uint32_t dst = k_stage(t) + lane * kGroupBytes;
      if (evict_first) {
        tma_load_5d(dst, k_map, bar, 0, slot, 0, kv_head, blk, l2_policy);
        tma_load_5d(dst + G::kStageTileBytes, v_map, bar, 0, slot, 0, kv_head, blk, l2_policy);
      } else {
        tma_load_5d(dst, k_map, bar, 0, slot, 0, kv_head, blk);
        tma_load_5d(dst + G::kStageTileBytes, v_map, bar, 0, slot, 0, kv_head, blk);
      }
    }
  }
  // Rows [rows_left, kBlockN) of a landed K / V stage -> 0 (all threads).
  __device__ __forceinline__ void zero_tail_rows(unsigned char* k_tile, int rows_left) const {
    constexpr int kChunks = G::kKvRowBytes / 16;
    const int first = max(rows_left, 0) * kChunks;
    for (int i = first + tid; i < G::kBlockN * kChunks; i += G::kThreads) {
      const uint32_t off = Layout::at(i / kChunks, (i % kChunks) * 16);
      *reinterpret_cast<uint4*>(k_tile + off) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(k_tile + G::kStageTileBytes + off) = make_uint4(0, 0, 0, 0);
    }
  }
};

}  // namespace attnkit::cuda
