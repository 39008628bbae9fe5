// How the hopper kernel's producer fills its K and V stages (the tile's KvFill and the cache
// kind, launch_plan.cpp; hopper_kernel.cuh with_fill): two policies of one interface, so the
// producer loop (hopper_kernel.cuh) is the same for both.
//
//   Fill f(p, w, n, ptid);       all 128 producer threads, per work item of n tiles
//   f.acquire(pipe, at);         wait for stage `at` of a ring to be empty (ConvertFill: and
//                                converts V while it waits)
//   f.k(t, dst, pipe, at);       K of tile t -> stage dst, completing the full barrier `at`
//   f.v(t, dst, pipe, at);       V of tile t (called after k(t), before k(t + 1))
//   f.drain();                   after the item's last v: what the fill still owes (ConvertFill)
//   Fill::kFullArrivals          arrivals that complete a full barrier (its init count)
//   Fill::kProducerRegs, ...     the warpgroups' registers after setmaxnreg (hopper_traits.h)
//   f.pages_fault(p, req)        the block-id guard over the item's pages (metadata_guard.cuh)
//
// CpAsyncFill (16-bit rows): each producer thread copies 16-byte chunks of one 16-key group of
// every tile, one chunk column of it (all 128 threads but at head dim 192: 96), resolving the
// group's page once per tile through any page map (block table, page table, contiguous rows);
// rows past seq_len are zero-filled by the copies themselves (no TMA fill: src/flash_attn/
// DECISIONS.md, Hopper K/V by TMA at 128-byte rows). ConvertFill (fp8 caches): codes copied into
// their stage, K's as they are, V's transposed into the K-major layout the fp8 wgmma reads
// (below).
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
#include "cuda/tile_copy_layout.h"
#include "cuda/wgmma_sm90.h"
#include "flash_attn/varlen_schedule.cuh"

namespace attnkit::flash_attn {

// What both cp.async fills share: the group-column walk (cuda::GroupColumns over the tile's
// columns: 16-byte chunks for 16-bit rows, chunk pairs for fp8 codes). Each copying producer
// thread owns one 16-key group of every K/V tile (one page: block sizes are multiples of 16) and
// one column of it, rows phase, phase + P, ... So it reads one block-table entry per tile, one
// tile ahead, and computes one 64-bit offset (start_tile); K and V share it (equal strides: the
// launch rule). Its copies then step by the slot stride in global memory and by Columns::at in
// the stage. Rows past seq_len and padding columns are zero-filled by the copies.
template <class Tr, class Columns_>
struct HopperGroupFill {
  using Columns = Columns_;
  static constexpr uint32_t kFullArrivals = Tr::kProducerThreads;
  static constexpr int kProducerRegs = Tr::kProducerRegs, kConsumerRegs = Tr::kConsumerRegs;

  const char* k_base;
  const char* v_base;
  cuda::KvPages pages;
  cuda::FastDivmod block_size;
  int32_t stride_block, stride_slot;
  int first_key, n, seq_len;
  int group, rows_left0;   // this thread's group; its rows left at tile 0 (0: a padding column)
  int32_t row_off;         // its phase's row and its column, in bytes from its group's first slot
  int32_t blk_next = 0;    // its group's block id in the next tile to copy (read one tile ahead)
  int64_t src = 0;         // its first row in the tile being copied, bytes from a side's head base
  bool copying;

  // col: this thread's column (Columns::of); column_bytes: where the column starts in a cache
  // row (a padding column, past the row's bytes, copies zeros).
  __device__ __forceinline__ HopperGroupFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid,
                                             const typename Columns::Column& col, int column_bytes)
      : k_base(static_cast<const char*>(p.k_cache) + w.kv_head * p.k_stride_head),
        v_base(static_cast<const char*>(p.v_cache) + w.kv_head * p.v_stride_head),
        pages(page_map_for(p, w)), block_size(p.block_size), stride_block(p.k_stride_block),
        stride_slot(p.k_stride_slot), first_key(w.first_key), n(n_), seq_len(w.seq_len), group(col.group),
        copying(Columns::kThreads == Tr::kProducerThreads || ptid < Columns::kThreads) {
    const bool in_row = column_bytes < p.kv_row_bytes;
    rows_left0 = in_row ? seq_len - first_key - Columns::row(col, 0) : 0;
    row_off = col.phase * stride_slot + (in_row ? column_bytes : 0);
    if (copying) blk_next = page(0);
  }
  template <class Pipe>
  __device__ __forceinline__ static void acquire(const Pipe& pipe, const typename Pipe::State& at) { pipe.acquire(at); }
  // The block-id guard over the item's n tiles (cuda/metadata_guard.cuh), this thread's share.
  __device__ __forceinline__ bool pages_fault(const VarlenKernelParams& p, int req) const {
    return cuda::pages_fault(pages, block_size, first_key, first_key + n * Tr::kBlockN, seq_len, req, p.errors,
                             static_cast<int>(threadIdx.x % 128), 128);
  }

 protected:
  // K of tile t (a copying thread): its group's offset from the block read ahead; then tile t +
  // 1's block (its latency hides under the next waits).
  __device__ __forceinline__ void start_tile(int t) {
    const int key = group_key(t);
    src = static_cast<int64_t>(pages.readable(blk_next)) * stride_block +
          ((key - block_size.div(key) * block_size.divisor) * stride_slot + row_off);
    if (t + 1 < n) blk_next = page(t + 1);
  }
  // Its rows of tile t left before seq_len (row i of its column is in when i * P < this).
  __device__ __forceinline__ int rows_left(int t) const { return rows_left0 - t * Tr::kBlockN; }
  // copy(i, src, in) for each of its rows i of tile t: src the row's address from a side's head
  // base, in whether the row is before seq_len. Where every row is in and the rows' addresses
  // share their upper 32 bits (almost always: a page's rows lie within one block), `in` is
  // std::true_type and each address is one 32-bit add, so the copies need no bounds compare and
  // no 64-bit add (DECISIONS.md: Hopper: the cp.async fill copies by group columns).
  template <class Copy>
  __device__ __forceinline__ void each_row(const char* head_base, int t, Copy&& copy) const {
    constexpr int kRows = Columns::kRowsPerThread;
    const char* row = head_base + src;
    const int left = rows_left(t);
    const int32_t step = Columns::kPhases * stride_slot;
    const uint64_t first = reinterpret_cast<uint64_t>(row);
    const uint64_t last = first + static_cast<int64_t>(kRows - 1) * step;
    if (left >= kRows * Columns::kPhases && step >= 0 && (first >> 32) == (last >> 32)) {
      const uint64_t high = first & ~uint64_t{0xffffffffu};
      const uint32_t low = static_cast<uint32_t>(first);
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        copy(i, reinterpret_cast<const char*>(high | (low + static_cast<uint32_t>(i) * static_cast<uint32_t>(step))),
             std::true_type{});
    } else {
#pragma unroll
      for (int i = 0; i < kRows; ++i) copy(i, row + static_cast<int64_t>(i) * step, i * Columns::kPhases < left);
    }
  }

 private:
  // The first key of this thread's group in tile t, or key 0 (always backed by a block) past
  // seq_len (its rows are zero-filled).
  __device__ __forceinline__ int group_key(int t) const {
    const int key = first_key + t * Tr::kBlockN + 16 * group;
    return key < seq_len ? key : 0;
  }
  __device__ __forceinline__ int32_t page(int t) const { return pages.at(block_size.div(group_key(t))); }
};

// CpAsyncFill (16-bit rows): group columns of 16-byte chunks (P = 2 row phases at head dim 64,
// else 1; all 128 producer threads copy but at head dim 192: 96). Per 16-byte copy a 32-bit
// address add (each_row; else a 64-bit one and a bounds compare) and a swizzle XOR with a
// constant; a warp's copy instruction covers
// whole rows (16 threads a 256-byte row at head dim 128).
template <class Tr>
struct HopperCpAsyncFill
    : HopperGroupFill<Tr, cuda::GroupColumns<Tr::kBlockN, Tr::kHeadDim / 8, Tr::kProducerThreads>> {
  using Base = typename HopperCpAsyncFill::HopperGroupFill;
  using typename Base::Columns;
  uint32_t dst0;  // where its first copy lands in a stage (Columns::at steps from there)

  __device__ __forceinline__ HopperCpAsyncFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid)
      : HopperCpAsyncFill(p, w, n_, ptid, Columns::of(ptid)) {}
  __device__ __forceinline__ static void drain() {}
  template <class Pipe>
  __device__ __forceinline__ void k(int t, uint32_t dst, const Pipe& pipe, const typename Pipe::State& at) {
    if (this->copying) {
      this->start_tile(t);
      copy(this->k_base, t, dst);
    }
    pipe.commit_cp_async(at);
  }
  template <class Pipe>
  __device__ __forceinline__ void v(int t, uint32_t dst, const Pipe& pipe, const typename Pipe::State& at) {
    if (this->copying) copy(this->v_base, t, dst);
    pipe.commit_cp_async(at);
  }

 private:
  __device__ __forceinline__ HopperCpAsyncFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid,
                                               const typename Columns::Column& c)
      : Base(p, w, n_, ptid, c, c.column * 16), dst0(Columns::first(c)) {}
  // This thread's rows of tile t from a side's head base into stage dst (1024-byte aligned).
  __device__ __forceinline__ void copy(const char* head_base, int t, uint32_t dst) const {
    const uint32_t at0 = dst + dst0;
    this->each_row(head_base, t, [&](int i, const char* row, auto in) { cuda::cp_async_16(Columns::at(at0, i), row, in); });
  }
};

// ConvertFill (fp8 caches): each side's codes are copied by cp.async. K's stay codes, in the
// fp8 K stage (64-byte-swizzled regions, cuda::Swizzle64Tile: the fp8 wgmma reads them), and
// complete their full barrier as they land. V's land in the upper half of their stage (staged
// rows: cuda::Fp8VTranspose) and are transposed by the producer warpgroup into the stage's lower
// half, the Vt tile that O += P V reads K-major (head dims x keys, codes as they are: the scales
// fold in elsewhere); then each thread arrives on the full barrier. V of tile t is transposed in
// the call that copies K of tile t + 1 (whose copies then fly meanwhile), unless acquire() did
// it already because the stage was not free (rings of two stages); drain() transposes an item's
// last V. Each thread transposes codes other threads copied: after its own copies landed, the
// producer warpgroup's barrier (Tr::kProducerBar), which every producer thread reaches in the
// same order (the decisions to transpose are uniform across it). Copies: the group columns of
// chunk pairs (P = head dim / 32 of them, a row's codes being 2P chunks: the thread of pair p
// copies code chunks p and P + p), row phases 8 / 4 / 4 / 4 at head dims 64 / 128 / 192 / 256
// (96 threads copy at 192).
template <class Tr, cuda::Fp8Format kFmt>
struct HopperConvertFill
    : HopperGroupFill<Tr, cuda::GroupColumns<Tr::kBlockN, Tr::kHeadDim / 32, Tr::kProducerThreads>> {
  static_assert(Tr::kFp8Cache, "fp8 codes");
  using Base = typename HopperConvertFill::HopperGroupFill;
  using typename Base::Columns;
  static constexpr bool kE5m2 = kFmt == cuda::Fp8Format::e5m2;  // the codes, as the GEMMs read them
  static constexpr int kPairs = Tr::kHeadDim / 32;  // P
  using L8 = cuda::Swizzle64Tile<Tr::kBlockN>;   // K stages
  using X = cuda::Fp8VTranspose<Tr::kHeadDim, Tr::kBlockN>;  // V stages: Vt, then the staged rows
  static_assert(Tr::kVTileBytes == 2 * X::kStageBytes, "a V stage holds Vt and the staged codes");

  uint32_t stage0;        // V: its first row's code chunk p in the staged rows (from the stage)
  uint32_t k_lo0, k_hi0;  // K: its first row's code chunks p and P + p
  bool hi_in;             // code chunk P + p inside the row (else zeros)
  uint32_t pending = 0, pending_bar = 0;  // the V copied last: its stage, its full barrier

  __device__ __forceinline__ HopperConvertFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid)
      : HopperConvertFill(p, w, n_, ptid, Columns::of(ptid)) {}
  // K's codes as they are; then the V copied before them is transposed (its copies are the
  // older cp.async group).
  template <class Pipe>
  __device__ __forceinline__ void k(int t, uint32_t dst, const Pipe& pipe, const typename Pipe::State& at) {
    if (this->copying) {
      this->start_tile(t);
      copy_k(t, dst);
    }
    pipe.commit_cp_async(at);
    cuda::cp_async_commit();
    if (pending_bar != 0) {
      cuda::cp_async_wait<1>();
      finish();
    }
  }
  template <class Pipe>
  __device__ __forceinline__ void v(int t, uint32_t dst, const Pipe& pipe, const typename Pipe::State& at) {
    if (this->copying) copy_v(t, dst);
    cuda::cp_async_commit();
    pending = dst;
    pending_bar = pipe.full(at);
  }
  // Rings of two stages (the V ring at head dim 256 and of hopper_short at 192): V's transpose
  // must not wait for the next stage, which frees only once the consumers are done with the
  // tile before it: they would wait for every transpose. Deeper rings have a stage of slack,
  // and there the next K's copies go out first (DECISIONS.md: fp8 caches converted in their
  // stage).
  static constexpr bool kConvertWhileWaiting = (Tr::kKStages < Tr::kVStages ? Tr::kKStages : Tr::kVStages) <= 2;
  // The next side's stage. With kConvertWhileWaiting, where any producer thread finds it not
  // empty yet, the pending V is transposed first (waiting for its copies) and arrives.
  template <class Pipe>
  __device__ __forceinline__ void acquire(const Pipe& pipe, const typename Pipe::State& at) {
    if constexpr (kConvertWhileWaiting) {
      if (pending_bar != 0 && cuda::named_bar_or(Tr::kProducerBar, Tr::kProducerThreads, !pipe.can_acquire(at)))
        finish_now();
    }
    pipe.acquire(at);
  }
  // The item's last V: its copies landed, transposed, arrived.
  __device__ __forceinline__ void drain() {
    if (pending_bar != 0) finish_now();
  }

 private:
  __device__ __forceinline__ HopperConvertFill(const VarlenKernelParams& p, const WorkItem& w, int n_, int ptid,
                                               const typename Columns::Column& c)
      : Base(p, w, n_, ptid, c, c.column * 16),
        stage0(X::kStageBytes + X::stage_line(Columns::row(c, 0)) * Tr::kHeadDim + c.column * 16),
        k_lo0(L8::offset(Columns::row(c, 0), c.column)), k_hi0(L8::offset(Columns::row(c, 0), kPairs + c.column)),
        hi_in((kPairs + c.column) * 16 < p.kv_row_bytes) {}
  // This thread's code chunks p and P + p of its rows of tile t -> the fp8 K stage dst.
  __device__ __forceinline__ void copy_k(int t, uint32_t dst) const {
    this->each_row(this->k_base, t, [&](int i, const char* row, auto in) {
      cuda::cp_async_16(L8::step(dst + k_lo0, i * Columns::kPhases), row, in);
      cuda::cp_async_16(L8::step(dst + k_hi0, i * Columns::kPhases), row + Tr::kHeadDim / 2, in && hi_in);
    });
  }
  // ... of V -> the staged rows of stage dst (row steps are even: stage_line's swap of a row
  // pair commutes with them).
  __device__ __forceinline__ void copy_v(int t, uint32_t dst) const {
    this->each_row(this->v_base, t, [&](int i, const char* row, auto in) {
      const uint32_t at = dst + stage0 + i * Columns::kPhases * Tr::kHeadDim;
      cuda::cp_async_16(at, row, in);
      cuda::cp_async_16(at + Tr::kHeadDim / 2, row + Tr::kHeadDim / 2, in && hi_in);
    });
  }
  // The pending V, once this thread's copies landed: transposed, arrived; none pending after.
  __device__ __forceinline__ void finish_now() {
    cuda::cp_async_wait<0>();
    finish();
  }
  // Every producer thread's copies of the pending V landed (the barrier) -> its units of the
  // transpose (X: 16 keys x 4 head dims each); the stores are generic-proxy writes that wgmma
  // reads through the async proxy (the consumers fence too); then its arrival.
  __device__ __forceinline__ void finish() {
    cuda::named_bar_sync(Tr::kProducerBar, Tr::kProducerThreads);
    const int ptid = static_cast<int>(threadIdx.x) - Tr::kConsumerThreads;
    const uint32_t staged = pending + X::kStageBytes;
#pragma unroll 1
    for (int u = ptid; u < X::kUnits; u += Tr::kProducerThreads) {
      const int g = u / X::kQuads, q = u % X::kQuads;
      // Key 16g + j of the unit at staged line 16g + (j ^ (g & 1)) (X::stage_line).
      const uint32_t src = staged + 16 * g * Tr::kHeadDim + 4 * q;
      const uint32_t even = (g & 1) * Tr::kHeadDim, odd = Tr::kHeadDim - even;
      uint32_t w[16];  // word q of the group's 16 keys: head dims 4q .. 4q + 3
#pragma unroll
      for (int j = 0; j < 16; j += 2) {
        w[j] = cuda::ld_shared_u32(src + j * Tr::kHeadDim + even);
        w[j + 1] = cuda::ld_shared_u32(src + j * Tr::kHeadDim + odd);
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int d = X::dim_of(q, s), i = d & 3;
        const uint32_t sel = static_cast<uint32_t>(i | ((i + 4) << 4));  // byte i of two words
        uint32_t o[4];  // slots 4m .. 4m + 3 of Vt chunk g: keys 2m, 2m + 1, 2m + 8, 2m + 9
#pragma unroll
        for (int m = 0; m < 4; ++m)
          o[m] = __byte_perm(__byte_perm(w[2 * m], w[2 * m + 1], sel), __byte_perm(w[2 * m + 8], w[2 * m + 9], sel),
                             0x5410);
        cuda::st_shared_v4(pending + X::vt_offset(d, g), make_uint4(o[0], o[1], o[2], o[3]));
      }
    }
    cuda::fence_proxy_async_smem();
    cuda::mbar_arrive(pending_bar);
    pending_bar = 0;
  }
};

}  // namespace attnkit::flash_attn
