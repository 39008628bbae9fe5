// Loading tiles of consecutive keys of one KV head from a paged cache into shared memory with
// cp.async, resolving each key's page through a page map: the request's block-table row, or
// contiguous rows (K/V of [total_keys, kv_heads, head_size], seen as 16-key "pages" that start
// at the request's first row). Tiles may cross page boundaries (any block size works, including
// ones smaller than the tile); keys at or past seq_len are zero-filled and their pages are
// never looked up, and so are the columns of a row past its cache bytes (a head size padded up
// to the tile's head dim). A block id outside the cache is read as block 0, inside it (the page
// map's readable()); the kernel then writes the item's rows as NaN (cuda/metadata_guard.cuh).
#pragma once
#include <cstdint>

#include "cuda/cp_async.h"
#include "cuda/fast_divmod.h"
#include "cuda/tile_copy_layout.h"

namespace attnkit::cuda {

// One side (K or V) of the cache as the loader sees it: base already offset to the KV head,
// 32-bit byte strides (the host checks that a block and a slot offset fit).
struct PagedSideBytes {
  const char* head_base;
  int32_t stride_block, stride_slot;
};

// The page map of one request: `at(page)` is the block id of its page `page` (of block_size
// keys), read through L1 (`at_l2`: L2 only, for reads before the PDL wait). A side's address of
// key j is at(j / block_size) * stride_block + (j % block_size) * stride_slot. Two kinds, one
// type (the choice is a select per page lookup, so every kernel is compiled once for both):
//  - a block-table row (vLLM's block table, one row per request; FlashInfer's page table, the
//    row starting at indptr[r]): ids read from memory;
//  - contiguous rows (varlen K/V with cu_seqlens_k; `row` null): "pages" of kContiguousPageKeys
//    keys whose block id is the row index of their first key, over a view whose block stride is
//    one row (stride_block == stride_slot): key j of the request is row first_row + j, and no
//    memory is read.
// `holds(blk)`: whether a block id read from the map lies inside the cache (contiguous rows
// always do); `readable(blk)`: the block a loader reads for it, blk or block 0 for one outside
// the cache (the kernel then writes the item's rows as NaN: cuda/metadata_guard.cuh).
struct KvPages {
  static constexpr int kContiguousPageKeys = 16;  // (the contiguous view's block size)
  const int32_t* row = nullptr;       // the request's block-table row; null: contiguous rows
  int32_t first_row = 0;              // contiguous rows: the request's first
  uint32_t num_blocks = 0xffffffffu;  // the cache's blocks: ids in [0, num_blocks) are inside it
  __device__ __forceinline__ bool contiguous() const { return row == nullptr; }
  __device__ __forceinline__ int32_t at(int page) const {
    return contiguous() ? first_row + kContiguousPageKeys * page : __ldg(row + page);
  }
  __device__ __forceinline__ int32_t at_l2(int page) const {
    return contiguous() ? first_row + kContiguousPageKeys * page : __ldcg(row + page);
  }
  __device__ __forceinline__ bool holds(int32_t blk) const {
#if defined(ATTNKIT_DEVICE_GUARDS) && !ATTNKIT_DEVICE_GUARDS
    return true;  // (a build without the guards: cuda/metadata_guard.cuh)
#else
    return static_cast<uint32_t>(blk) < num_blocks;
#endif
  }
  __device__ __forceinline__ int32_t readable(int32_t blk) const { return holds(blk) ? blk : 0; }
};

// Where 16-byte chunk `chunk` of tile row `row` lands in shared memory (bytes from the tile).
// Rows at a fixed pitch (padding keeps ldmatrix phases on distinct banks):
template <int kPitchBytes>
struct PitchedTile {
  static constexpr int kRowStride = kPitchBytes;  // offset(row + d) = offset(row) + d * kRowStride
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>(row * kPitchBytes + chunk * 16);
  }
  // Byte `byte` of row `row` (kv_smem_layout.h: the fragment loaders' view of a stage layout).
  __device__ __forceinline__ static uint32_t at(int row, int byte) {
    return static_cast<uint32_t>(row * kPitchBytes + byte);
  }
};
// The 128-byte-swizzled layout wgmma descriptors read: Swizzle128Tile (cuda/tile_copy_layout.h).

// kRows keys x kRowBytes bytes per key, copied by kThreads threads in kChunk-byte chunks (16;
// 4 or 8 for small rows such as NVFP4 block scales, with a PitchedTile layout) into a shared
// tile laid out by Layout. K and V of the same keys are loaded together: the page
// lookup is shared. All page lookups of a tile are issued before the first copy so their
// latencies overlap.
template <int kRows, int kRowBytes, class Layout, int kThreads, int kChunk = 16>
struct PagedKVTileLoader {
  static_assert(kChunk == 16 || kChunk == 8 || kChunk == 4, "cp.async copies 4, 8 or 16 bytes");
  static_assert(kRowBytes % kChunk == 0, "rows must be whole chunks");
  static_assert(kRows % 16 == 0, "tiles are whole 16-key groups");
  static constexpr int kChunksPerRow = kRowBytes / kChunk;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr int kIters = (kChunks + kThreads - 1) / kThreads;

  PagedSideBytes k, v;
  KvPages page_map;  // this request's pages
  FastDivmod block_size;
  int seq_len;
  // Bytes of a row in the cache (a multiple of kChunk, <= kRowBytes): chunks past it are
  // zero-filled and read nothing (a head size padded up to the tile's head dim).
  int row_bytes = kRowBytes;

  // Each thread copies one chunk column of whole 16-key groups (one block-table read per
  // group) when the thread count allows; else row by row.
  static constexpr bool kByGroups = kChunks % kThreads == 0 && kThreads % kChunksPerRow == 0 &&
                                    (kThreads / kChunksPerRow >= 16 || 16 % (kThreads / kChunksPerRow) == 0);
  static constexpr int kRowsPerIter = kThreads / kChunksPerRow;
  static constexpr int kItersPerGroup = kRowsPerIter >= 16 ? 1 : 16 / kRowsPerIter;
  static constexpr int kGroups = kIters / kItersPerGroup;

  // The pages of this thread's 16-key groups of a tile (by-groups loaders): read ahead of
  // load() so the block-table latency overlaps other work.
  struct Pages {
    int32_t blk[kGroups];
  };
  __device__ __forceinline__ Pages pages(int first_key, int tid) const {
    static_assert(kByGroups, "pages() needs the by-groups copy pattern");
    Pages pg;
    const int r0 = tid / kChunksPerRow;
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) pg.blk[gi] = page_map.at(block_size.div(group_key(first_key, r0, gi)));
    return pg;
  }

  // Keys [first_key, first_key + kRows) -> k_tile / v_tile (shared addresses). Needs
  // seq_len > 0 and first_key a multiple of 16; keys >= seq_len are zero-filled without
  // reading their block-table entry.
  __device__ __forceinline__ void load(int first_key, uint32_t k_tile, uint32_t v_tile, int tid) const {
    if constexpr (kByGroups) {
      load(first_key, pages(first_key, tid), k_tile, v_tile, tid);
    } else {
      load_by_rows(first_key, k_tile, v_tile, tid);
    }
  }
  // The same with the pages read earlier by pages(first_key, tid).
  __device__ __forceinline__ void load(int first_key, const Pages& pg, uint32_t k_tile, uint32_t v_tile,
                                       int tid) const {
    const Offsets ko = offsets(k, first_key, pg, tid);
    copy_side(k.head_base, ko, first_key, k_tile, tid);
    if (same_strides()) {
      copy_side(v.head_base, ko, first_key, v_tile, tid);
    } else {
      copy_side(v.head_base, offsets(v, first_key, pg, tid), first_key, v_tile, tid);
    }
  }

  // Byte offsets from a side's head base of the 16-key groups this thread copies in a tile,
  // with the thread's row and chunk folded in. K and V share them when their strides agree.
  struct Offsets {
    int64_t g[kGroups];
    int32_t stride_slot;
  };
  __device__ __forceinline__ bool same_strides() const {
    return k.stride_block == v.stride_block && k.stride_slot == v.stride_slot;
  }
  __device__ __forceinline__ Offsets offsets(const PagedSideBytes& side, int first_key, const Pages& pg,
                                             int tid) const {
    const int r0 = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
    const int32_t thread_off = (r0 & 15) * side.stride_slot + (in_row(chunk) ? chunk * kChunk : 0);
    Offsets o;
    o.stride_slot = side.stride_slot;
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      const int kc = group_key(first_key, r0, gi);  // block sizes are multiples of 16: one page
      const int slot0 = kc - block_size.div(kc) * block_size.divisor;
      const int32_t blk = page_map.readable(pg.blk[gi]);
      o.g[gi] = static_cast<int64_t>(blk) * side.stride_block + (slot0 * side.stride_slot + thread_off);
    }
    return o;
  }
  // Copies one side's tile (keys [first_key, first_key + kRows)) from its offsets.
  __device__ __forceinline__ void copy_side(const char* head_base, const Offsets& o, int first_key, uint32_t tile,
                                            int tid) const {
    const int r0 = tid / kChunksPerRow, chunk = tid % kChunksPerRow;
    const uint32_t dst0 = tile + chunk_at(r0, chunk);
    const int rows_left = in_row(chunk) ? seq_len - first_key : 0;  // (a padding chunk: zeros)
    const int32_t slot_step = kRowsPerIter * o.stride_slot;
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int row = r0 + i * kRowsPerIter;
      const char* src = head_base + o.g[i / kItersPerGroup] + (i % kItersPerGroup) * slot_step;
      uint32_t dst;
      if constexpr (kRowsPerIter % 8 == 0) {
        dst = dst0 + i * kRowsPerIter * Layout::kRowStride;  // same swizzle phase: a constant step
      } else {
        dst = tile + chunk_at(row, chunk);
      }
      cp_async_n<kChunk>(dst, src, row < rows_left);
    }
  }

  // Asks L2 for the K and V rows of keys [first_key, first_key + kRows) (one row of one side per
  // thread and step; no shared memory, no commit group). Made for the time before the kernel
  // may read what the previous kernel wrote (pdl.h): the page map and seq_len may then be stale,
  // so keys must lie in [0, seq_len) with seq_len clamped by the caller to the block-table row,
  // and a page outside [0, num_blocks) is skipped: a stale entry costs a useless prefetch,
  // never an access outside the cache.
  __device__ __forceinline__ void prefetch_l2(int first_key, int64_t num_blocks, int tid) const {
    for (int i = tid; i < 2 * kRows; i += kThreads) {
      const int key = first_key + (i % kRows);
      if (key < 0 || key >= seq_len) continue;
      const int page = block_size.div(key);
      const int32_t blk = page_map.at_l2(page);  // (L2 only: not left in L1 for the reads after the wait)
      if (blk < 0 || blk >= num_blocks) continue;
      const PagedSideBytes& side = i < kRows ? k : v;
      const int32_t slot = key - page * block_size.divisor;
      prefetch_l2_bulk(side.head_base + static_cast<int64_t>(blk) * side.stride_block + slot * side.stride_slot,
                       row_bytes);
    }
  }

 private:
  // Whether chunk `chunk` of a row holds cache bytes (else it is padding).
  __device__ __forceinline__ bool in_row(int chunk) const { return chunk * kChunk < row_bytes; }
  // Where chunk `chunk` of tile row `row` lands (bytes from the tile).
  __device__ __forceinline__ static uint32_t chunk_at(int row, int chunk) {
    if constexpr (kChunk == 16) return Layout::offset(row, chunk);
    else return Layout::at(row, chunk * kChunk);
  }
  // The first key of this thread's group gi, or key 0 (always backed by a block) past seq_len.
  __device__ __forceinline__ int group_key(int first_key, int r0, int gi) const {
    const int key = first_key + ((r0 + gi * kItersPerGroup * kRowsPerIter) & ~15);
    return key < seq_len ? key : 0;
  }

  __device__ __forceinline__ void copy_chunk(const PagedSideBytes& side, int row, int chunk, int32_t blk,
                                             int32_t slot, bool valid, uint32_t tile) const {
    const bool col = in_row(chunk);
    const int32_t b = page_map.readable(blk);
    const char* src =
        side.head_base + static_cast<int64_t>(b) * side.stride_block + (slot * side.stride_slot + (col ? chunk * kChunk : 0));
    cp_async_n<kChunk>(tile + chunk_at(row, chunk), src, valid && col);
  }

  __device__ __forceinline__ void load_by_rows(int first_key, uint32_t k_tile, uint32_t v_tile, int tid) const {
    int32_t blk[kIters], slot[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads;
      const int key = first_key + idx / kChunksPerRow;
      const int kc = key < seq_len ? key : 0;
      const int page = block_size.div(kc);
      blk[i] = (kChunks % kThreads != 0 && idx >= kChunks) ? 0 : page_map.at(page);
      slot[i] = kc - page * block_size.divisor;
    }
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int row = idx / kChunksPerRow;
      copy_chunk(k, row, idx % kChunksPerRow, blk[i], slot[i], first_key + row < seq_len, k_tile);
      copy_chunk(v, row, idx % kChunksPerRow, blk[i], slot[i], first_key + row < seq_len, v_tile);
    }
  }
};

}  // namespace attnkit::cuda
