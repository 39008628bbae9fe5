// How the hopper kernel's producer fills its K and V stages (the tile's KvFill and the cache
// kind, launch_plan.cpp; hopper_kernel.cuh with_fill): three policies of one interface, so the
// producer loop (hopper_kernel.cuh) is the same for all.
//
//   Fill f(p, w, n, ptid);       all 128 producer threads, per work item of n tiles
//   f.k(t, dst, pipe, at);       K of tile t -> stage dst, completing the full barrier `at`
//   f.v(t, dst, pipe, at);       V of tile t (called after k(t), before k(t + 1))
//   f.drain();                   after the item's last v: what the fill still owes (ConvertFill)
//   Fill::kFullArrivals          arrivals that complete a full barrier (its init count)
//   Fill::kProducerRegs, ...     the warpgroups' registers after setmaxnreg (hopper_traits.h)
//   Fill::fix_tail_v(...)        consumers, the item's last V tile: rows past seq_len -> 0
//   f.pages_fault(p, req)        the block-id guard over the item's pages (metadata_guard.cuh)
//
// CpAsyncFill (16-bit rows): each producer thread copies 16-byte chunks of one 16-key group of
// every tile, one chunk column of it (all 128 threads but at head dim 192: 96), resolving the
// group's page once per tile through any page map (block table, page table, contiguous rows);
// rows past seq_len are zero-filled by the copies themselves. TmaFill: lanes of the producer's
// warp 0 each own one (16-key page group, 128-byte segment) of a tile and copy it as one TMA box (cuda/tensor_map.h,
// boxes of one segment: the stage is [segment][128 keys][128 bytes], the layout wgmma reads);
// the other producer threads only load Q. Groups past seq_len are copied from block -1, which
// the map's bounds turn into zeros without a read; a block id outside the cache is read as
// block 0 (the metadata guards then write the item's rows as NaN). The group holding seq_len's end brings its
// block's slots past it, which the consumers zero in V (fix_tail_v; K's are masked).
// ConvertFill (fp8 caches): codes copied into their stage, converted to f16 in place (below).
#pragma once
#include <cstdint>
#include <type_traits>

#include "cuda/fast_divmod.h"
#include "cuda/fp8_dequant.h"
#include "cuda/ld_st.h"
#include "cuda/metadata_guard.cuh"
#include "cuda/paged_kv_tile.h"
#include "cuda/pipeline_sm90.h"
#include "cuda/sync_sm90.h"
#include "cuda/tma_sm90.h"
#include "cuda/wgmma_sm90.h"
#include "flash_attn/varlen_schedule.cuh"

namespace attnkit::flash_attn {

// The producer warps that copy fp8 code chunks (ConvertFill, through PagedKVTileLoader's
// by-groups pattern: one block-table read per 16-key group a thread touches): all of them where a
// group's rows split evenly over their threads, else the most whole warps that do. The others
// only arrive on the full barriers (an arrival without copies lands at once).
template <int kRows, int kChunksPerRow, int kThreads>
constexpr int cp_async_copy_threads() {
  for (int t = kThreads; t >= 32; t -= 32) {
    const int rows_per_step = t / kChunksPerRow;
    if (t % kChunksPerRow == 0 && (kRows * kChunksPerRow) % t == 0 && (rows_per_step >= 16 || 16 % rows_per_step == 0))
      return t;
  }
  return 0;
}

// ConvertFill's copy side: the loader of rows of kRowBytes (16-byte chunks) through the page
// map, the pages of the next tile read ahead, the offsets of the tile in flight, and which
// producer threads copy. (The 16-bit CpAsyncFill below copies by group columns instead: one page
// per thread and tile; moving the fp8 fill onto that pattern is open.)
template <class Tr, class PageMap_, int kRowBytes>
struct HopperLoaderFill {
  using PageMap = PageMap_;
  static constexpr int kCopyThreads = cp_async_copy_threads<Tr::kBlockN, kRowBytes / 16, Tr::kProducerThreads>();
  static_assert(kCopyThreads > 0, "a head dim whose rows split over whole producer warps");
  using Loader =
      cuda::PagedKVTileLoader<Tr::kBlockN, kRowBytes, cuda::Swizzle128Tile<Tr::kBlockN>, kCopyThreads, PageMap>;
  static constexpr bool kAllCopy = kCopyThreads == Tr::kProducerThreads;
  using Pipe = cuda::Pipeline<Tr::kStages>;
  using Pos = typename Pipe::State;
  static constexpr uint32_t kFullArrivals = Tr::kProducerThreads;
  static constexpr int kProducerRegs = Tr::kProducerRegs, kConsumerRegs = Tr::kConsumerRegs;

  Loader loader;
  typename Loader::Pages pages;  // tile t + 1's, once k(t) ran
  typename Loader::Offsets prev{};  // tile t's, for v(t): K and V share strides (launch rule)
  int first_key, n, ptid;

  __device__ __forceinline__ HopperLoaderFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid_)
      : loader(kv_loader_for<Loader>(p, w)), first_key(w.first_key), n(n_), ptid(ptid_) {
    if (copies()) pages = loader.pages(first_key, ptid);
  }
  __device__ __forceinline__ static void prefetch_maps(const VarlenKernelParams&) {}
  __device__ __forceinline__ static void drain() {}
  __device__ __forceinline__ static void fix_tail_v(unsigned char*, int, int, int) {}  // (zero-filled)
  __device__ __forceinline__ int key(int t) const { return first_key + t * Tr::kBlockN; }
  // Whether this producer thread copies chunks (a constant where all do).
  __device__ __forceinline__ bool copies() const { return kAllCopy || ptid < kCopyThreads; }
  // K of tile t: its offsets from the pages read ahead; then tile t + 1's pages.
  __device__ __forceinline__ void take_offsets(int t) {
    prev = loader.offsets(loader.k, key(t), pages, ptid);
    if (t + 1 < n) pages = loader.pages(key(t + 1), ptid);  // (its latency hides under the next waits)
  }
  // The block-id guard over the item's n tiles (cuda/metadata_guard.cuh), this thread's share.
  __device__ __forceinline__ bool pages_fault(const VarlenKernelParams& p, int req) const {
    return cuda::pages_fault(loader.page_map, loader.block_size, first_key, key(n), loader.seq_len, req, p.errors, ptid,
                             Tr::kProducerThreads);
  }
};

// CpAsyncFill (16-bit rows): each copying producer thread owns one 16-key group of every tile
// (one page: block sizes are multiples of 16) and one chunk column of it (cuda::GroupColumns:
// rows phase, phase + P, ..., P = 2 at head dim 64, else 1). So a thread reads one block-table
// entry per tile, one tile ahead, and its copies step by the slot stride: per 16-byte copy a
// pointer add, a swizzle XOR with a constant and a bounds compare. A warp's copy instruction
// covers whole rows (16 threads a 256-byte row at head dim 128). K and V share the offsets
// (equal strides: the launch rule). Rows past seq_len and padding columns are zero-filled.
template <class Tr, class PageMap_>
struct HopperCpAsyncFill {
  using PageMap = PageMap_;
  using Pipe = cuda::Pipeline<Tr::kStages>;
  using Pos = typename Pipe::State;
  using Columns = cuda::GroupColumns<Tr::kBlockN, Tr::kHeadDim / 8, Tr::kProducerThreads>;
  static constexpr uint32_t kFullArrivals = Tr::kProducerThreads;
  static constexpr int kProducerRegs = Tr::kProducerRegs, kConsumerRegs = Tr::kConsumerRegs;

  const char* k_base;
  const char* v_base;
  PageMap pages;
  cuda::FastDivmod block_size;
  int32_t stride_block, stride_slot;
  int first_key, n, seq_len;
  int group, rows_left0;   // this thread's group; its rows left at tile 0 (0: a padding column)
  int32_t row_off;         // its phase's row and its column, in bytes from its group's first slot
  uint32_t dst0;           // where its first copy lands in a stage (Columns::at steps from there)
  int32_t blk_next = 0;    // its group's block id in the next tile to copy (read one tile ahead)
  int64_t src = 0;         // its first row in the tile being copied, bytes from a side's head base
  bool copying;

  __device__ __forceinline__ HopperCpAsyncFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid)
      : k_base(static_cast<const char*>(p.k_cache) + w.kv_head * p.k_stride_head),
        v_base(static_cast<const char*>(p.v_cache) + w.kv_head * p.v_stride_head),
        pages(page_map_for<PageMap>(p, w)), block_size(p.block_size), stride_block(p.k_stride_block),
        stride_slot(p.k_stride_slot), first_key(w.first_key), n(n_), seq_len(w.seq_len),
        copying(Columns::kThreads == Tr::kProducerThreads || ptid < Columns::kThreads) {
    const typename Columns::Column c = Columns::of(ptid);
    const bool in_row = c.column * 16 < p.kv_row_bytes;
    group = c.group;
    rows_left0 = in_row ? seq_len - first_key - Columns::row(c, 0) : 0;
    row_off = c.phase * stride_slot + (in_row ? c.column * 16 : 0);
    dst0 = Columns::first(c);
    if (copying) blk_next = page(0);
  }
  __device__ __forceinline__ static void prefetch_maps(const VarlenKernelParams&) {}
  __device__ __forceinline__ static void drain() {}
  __device__ __forceinline__ static void fix_tail_v(unsigned char*, int, int, int) {}  // (zero-filled)
  // K of tile t: its group's offset from the block read ahead; then tile t + 1's block.
  __device__ __forceinline__ void k(int t, uint32_t dst, const Pipe& pipe, const Pos& at) {
    if (copying) {
      const int key = group_key(t);
      src = static_cast<int64_t>(pages.readable(blk_next)) * stride_block +
            ((key - block_size.div(key) * block_size.divisor) * stride_slot + row_off);
      if (t + 1 < n) blk_next = page(t + 1);  // (its latency hides under the next waits)
      copy(k_base, t, dst);
    }
    pipe.commit_cp_async(at);
  }
  __device__ __forceinline__ void v(int t, uint32_t dst, const Pipe& pipe, const Pos& at) {
    if (copying) copy(v_base, t, dst);
    pipe.commit_cp_async(at);
  }
  // The block-id guard over the item's n tiles (cuda/metadata_guard.cuh), this thread's share.
  __device__ __forceinline__ bool pages_fault(const VarlenKernelParams& p, int req) const {
    return cuda::pages_fault(pages, block_size, first_key, first_key + n * Tr::kBlockN, seq_len, req, p.errors,
                             static_cast<int>(threadIdx.x % 128), 128);
  }

 private:
  // The first key of this thread's group in tile t, or key 0 (always backed by a block) past
  // seq_len (its rows are zero-filled).
  __device__ __forceinline__ int group_key(int t) const {
    const int key = first_key + t * Tr::kBlockN + 16 * group;
    return key < seq_len ? key : 0;
  }
  __device__ __forceinline__ int32_t page(int t) const { return pages.at(block_size.div(group_key(t))); }
  // This thread's rows of tile t from a side's head base into stage dst (1024-byte aligned).
  __device__ __forceinline__ void copy(const char* head_base, int t, uint32_t dst) const {
    const char* row = head_base + src;
    const int rows_left = rows_left0 - t * Tr::kBlockN;
#pragma unroll
    for (int i = 0; i < Columns::kRowsPerThread; ++i) {
      cuda::cp_async_16(Columns::at(dst + dst0, i), row, i * Columns::kPhases < rows_left);
      row += Columns::kPhases * stride_slot;
    }
  }
};

// ConvertFill (fp8 caches): the codes of a side (K or V tile) are copied by cp.async into the
// upper half of its own 16-bit stage, then converted to f16 (exact: cuda/fp8_dequant.h; the
// scales fold in elsewhere) in place by the thread that copied them, which then arrives on the
// full barrier. A call copies its side and converts the side before it (whose copies flew
// while this call's stage was acquired); drain() converts an item's last side. In place
// without a barrier: a thread owns code chunks p and P + p of its rows (P = head dim / 32, a
// row's codes are 2P chunks) and copies chunk P + p to 16-bit row chunk 2(P + p), chunk p to
// 2(P + p) + 1 (both in the row's upper half), so its outputs (row chunks 2p, 2p + 1 and
// 2(P + p), 2(P + p) + 1) overwrite only its own codes. Rows past seq_len and padding columns
// are copied as zeros.
template <class Tr, class PageMap_, cuda::Fp8Format kFmt>
struct HopperConvertFill : HopperLoaderFill<Tr, PageMap_, Tr::kHeadDim / 2> {
  static_assert(Tr::kFp8Cache && std::is_same_v<typename Tr::MmaElem, __half>, "fp8 codes become f16 stages");
  // The loader's rows are P chunks (head dim / 2 bytes): each thread's pair p is its chunk, chunk
  // P + p lies half a row of codes further.
  using Base = typename HopperConvertFill::HopperLoaderFill;
  using typename Base::Loader;
  using typename Base::Pipe;
  using typename Base::Pos;
  static constexpr int kPairs = Tr::kHeadDim / 32;  // P
  static_assert(Loader::kByGroups && Loader::kRowsPerIter % 8 == 0, "16-key groups, rows a swizzle period apart");

  int row0, pair, row_bytes;
  uint32_t pending = 0, pending_bar = 0;  // the side copied last: its stage, its full barrier

  __device__ __forceinline__ HopperConvertFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid_)
      : Base(p, w, n_, ptid_), row0(ptid_ / kPairs), pair(ptid_ % kPairs), row_bytes(p.kv_row_bytes) {
    this->loader.row_bytes = Tr::kHeadDim / 2;  // (every pair's offset; the real row bytes are checked per chunk)
  }
  __device__ __forceinline__ void k(int t, uint32_t dst, const Pipe& pipe, const Pos& at) {
    if (this->copies()) {
      this->take_offsets(t);
      copy(this->loader.k.head_base, this->key(t), dst);
    }
    next(dst, pipe.full(at));
  }
  __device__ __forceinline__ void v(int t, uint32_t dst, const Pipe& pipe, const Pos& at) {
    if (this->copies()) copy(this->loader.v.head_base, this->key(t), dst);
    next(dst, pipe.full(at));
  }
  // The item's last side: its copies landed, converted, arrived.
  __device__ __forceinline__ void drain() {
    cuda::cp_async_wait<0>();
    finish();
  }

 private:
  using L = cuda::Swizzle128Tile<Tr::kBlockN>;
  // This call's side is committed as one cp.async group; the one before it (all but the newest
  // group landed) is converted and arrives.
  __device__ __forceinline__ void next(uint32_t dst, uint32_t bar) {
    cuda::cp_async_commit();
    if (pending_bar != 0) {
      cuda::cp_async_wait<1>();
      finish();
    }
    pending = dst;
    pending_bar = bar;
  }
  // This thread's code chunks p and P + p of its rows of the tile at key0 -> the upper half of
  // the stage (row chunks 2(P + p) + 1 and 2(P + p)).
  __device__ __forceinline__ void copy(const char* head_base, int key0, uint32_t dst) const {
    const int rows_left = this->loader.seq_len - key0;
    const bool lo_in = pair * 16 < row_bytes, hi_in = (kPairs + pair) * 16 < row_bytes;  // (padding columns: zeros)
    const uint32_t slot = dst + L::offset(row0, 2 * (kPairs + pair));
#pragma unroll
    for (int i = 0; i < Loader::kIters; ++i) {
      const char* src = head_base + this->prev.g[i / Loader::kItersPerGroup] +
                        (i % Loader::kItersPerGroup) * (Loader::kRowsPerIter * this->prev.stride_slot);
      const bool row_in = row0 + i * Loader::kRowsPerIter < rows_left;
      const uint32_t at = slot + i * Loader::kRowsPerIter * L::kRowStride;
      cuda::cp_async_16(at, src + Tr::kHeadDim / 2, row_in && hi_in);
      cuda::cp_async_16(at ^ 16, src, row_in && lo_in);  // (row chunk 2(P + p) + 1: the swizzle flips bit 4 alike)
    }
  }
  // The pending side's codes (this thread's) -> f16 in place; then its arrival. The stores are
  // generic-proxy writes that wgmma reads through the async proxy (the consumers fence too).
  __device__ __forceinline__ void finish() const {
    if (this->copies()) {
      const uint32_t slot = pending + L::offset(row0, 2 * (kPairs + pair)), low = pending + L::offset(row0, 2 * pair);
#pragma unroll
      for (int i = 0; i < Loader::kIters; ++i) {
        const uint32_t step = i * Loader::kRowsPerIter * L::kRowStride;
        const uint4 hi = cuda::ld_shared_v4(slot + step), lo = cuda::ld_shared_v4((slot + step) ^ 16);
        store_f16(low + step, lo);
        store_f16(slot + step, hi);
      }
      cuda::fence_proxy_async_smem();
    }
    cuda::mbar_arrive(pending_bar);
  }
  // 16 codes -> 16 f16 values at row chunks c (this address) and c + 1 (c even: the address with
  // bit 4 flipped, as the swizzle XORs the chunk index).
  __device__ __forceinline__ static void store_f16(uint32_t at, uint4 c) {
    cuda::st_shared_v4(at, make_uint4(cuda::fp8x2_to_f16x2<kFmt>(c.x), cuda::fp8x2_to_f16x2<kFmt>(c.x >> 16),
                                      cuda::fp8x2_to_f16x2<kFmt>(c.y), cuda::fp8x2_to_f16x2<kFmt>(c.y >> 16)));
    cuda::st_shared_v4(at ^ 16, make_uint4(cuda::fp8x2_to_f16x2<kFmt>(c.z), cuda::fp8x2_to_f16x2<kFmt>(c.z >> 16),
                                           cuda::fp8x2_to_f16x2<kFmt>(c.w), cuda::fp8x2_to_f16x2<kFmt>(c.w >> 16)));
  }
};

template <class Tr, class PageMap_>
struct HopperTmaFill {
  using PageMap = PageMap_;
  static_assert(std::is_base_of_v<cuda::BlockTablePages, PageMap>, "TMA fills read a block-table row");
  using Pipe = cuda::Pipeline<Tr::kStages>;
  using Pos = typename Pipe::State;
  static constexpr uint32_t kFullArrivals = 1;  // lane 0's arrive.expect_tx; the bytes do the rest
  static constexpr int kProducerRegs = Tr::kProducerRegsTma, kConsumerRegs = Tr::kConsumerRegsTma;
  static constexpr int kSegments = Tr::kHeadDim / 64;  // 128-byte segments of a 16-bit row
  static constexpr int kGroups = Tr::kBlockN / 16;
  static constexpr int kBoxes = kGroups * kSegments;  // per tile and side, one lane each
  static constexpr uint32_t kBoxBytes = 16 * 128;
  static_assert(kBoxes <= 32, "one lane of warp 0 per box");

  const cuda::TmaDesc* k_map;
  const cuda::TmaDesc* v_map;
  PageMap pages;  // the request's block-table row
  cuda::FastDivmod block_size;
  int seq_len, kv_head, first_key, n;
  bool warp0, issuer;           // warp 0 of the producers; a lane of it that owns a box
  int group, segment;           // this lane's box of a tile
  int32_t page_prev = -1, page_cur = -1;  // its group's block in tile t (for v) and t + 1 (for k)

  __device__ __forceinline__ HopperTmaFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid)
      : k_map(&p.k_map), v_map(&p.v_map), pages(page_map_for<PageMap>(p, w)), block_size(p.block_size),
        seq_len(w.seq_len), kv_head(w.kv_head), first_key(w.first_key), n(n_), warp0(ptid < 32),
        issuer(ptid < kBoxes), group(ptid / kSegments), segment(ptid % kSegments) {
    if (issuer) page_cur = page(0);
  }
  // The descriptors' first fetch, off the first copies (one producer thread).
  __device__ __forceinline__ static void prefetch_maps(const VarlenKernelParams& p) {
    cuda::prefetch_tensor_map(&p.k_map);
    cuda::prefetch_tensor_map(&p.v_map);
  }
  __device__ __forceinline__ void k(int t, uint32_t dst, const Pipe& pipe, const Pos& at) {
    copy(k_map, page_cur, t, dst, pipe, at);
    page_prev = page_cur;
    if (issuer && t + 1 < n) page_cur = page(t + 1);
  }
  __device__ __forceinline__ void v(int t, uint32_t dst, const Pipe& pipe, const Pos& at) {
    copy(v_map, page_prev, t, dst, pipe, at);
  }
  __device__ __forceinline__ static void drain() {}
  // The block-id guard over the item's n tiles (cuda/metadata_guard.cuh), this thread's share.
  __device__ __forceinline__ bool pages_fault(const VarlenKernelParams& p, int req) const {
    return cuda::pages_fault(pages, block_size, first_key, first_key + n * Tr::kBlockN, seq_len, req, p.errors,
                             static_cast<int>(threadIdx.x % 128), 128);
  }
  // Rows [rows_left, next multiple of 16) of the item's last V tile: its block's slots past
  // seq_len, which a box brought in. By each consumer warpgroup (its 128 threads, wg_tid) before
  // its own P V reads the tile (zeros written twice are still zeros); then that warpgroup's
  // barrier (3 + wg) and the proxy fence make them visible to its wgmma.
  __device__ __forceinline__ static void fix_tail_v(unsigned char* v_tile, int rows_left, int wg, int wg_tid) {
    if (rows_left >= Tr::kBlockN || rows_left % 16 == 0) return;  // (uniform across the CTA)
    constexpr int kChunksPerRow = Tr::kHeadDim / 8;
    const int rows = 16 - rows_left % 16;
    for (int i = wg_tid; i < rows * kChunksPerRow; i += 128) {
      const int row = rows_left + i / kChunksPerRow;
      *reinterpret_cast<uint4*>(v_tile + cuda::Swizzle128Tile<Tr::kBlockN>::offset(row, i % kChunksPerRow)) =
          make_uint4(0, 0, 0, 0);
    }
    cuda::fence_proxy_async_smem();
    cuda::named_bar_sync(3 + wg, 128);
  }

 private:
  // This lane's group's block in tile t; -1 (no block: zeros) past seq_len; block 0 for an id
  // outside the cache (its item's rows are NaN: cuda/metadata_guard.cuh).
  __device__ __forceinline__ int32_t page(int t) const {
    const int key = first_key + t * Tr::kBlockN + 16 * group;
    return key < seq_len ? pages.readable(pages.at(block_size.div(key))) : -1;
  }
  __device__ __forceinline__ void copy(const cuda::TmaDesc* map, int32_t blk, int t, uint32_t dst, const Pipe& pipe,
                                       const Pos& at) const {
    if (!warp0) return;
    if (group == 0 && segment == 0) pipe.expect_bytes(at, kBoxes * kBoxBytes);  // (lane 0)
    __syncwarp();
    if (!issuer) return;
    const int key = first_key + t * Tr::kBlockN + 16 * group;
    const int slot = key - block_size.div(key) * block_size.divisor;
    cuda::tma_load_5d(dst + segment * (Tr::kBlockN * 128) + group * kBoxBytes, map, pipe.full(at), 0, slot, segment,
                      kv_head, blk);
  }
};

}  // namespace attnkit::flash_attn
