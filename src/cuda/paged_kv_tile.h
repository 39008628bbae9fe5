// Loading tiles of consecutive keys of one KV head from a paged cache into shared memory with
// cp.async, resolving each key's page through the request's block-table row. Tiles may cross
// page boundaries (any block size works, including ones smaller than the tile); keys at or past
// seq_len are zero-filled and their block-table entries are never read.
#pragma once
#include <cstdint>

#include "cuda/cp_async.h"
#include "cuda/fast_divmod.h"

namespace attnkit::cuda {

// One side (K or V) of the cache as the loader sees it: base already offset to the KV head,
// 32-bit byte strides (the host checks that a block and a slot offset fit).
struct PagedSideBytes {
  const char* head_base;
  int32_t stride_block, stride_slot;
};

// kRows keys x kRowBytes bytes per key, copied by kThreads threads in 16-byte chunks into a
// shared tile with a pitch of kPitchBytes. K and V of the same keys are loaded together: the
// page lookup is shared. All block-table reads of a tile are issued before the first copy so
// their latencies overlap.
template <int kRows, int kRowBytes, int kPitchBytes, int kThreads>
struct PagedKVTileLoader {
  static_assert(kRowBytes % 16 == 0, "rows must be whole 16-byte chunks");
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr int kIters = (kChunks + kThreads - 1) / kThreads;

  PagedSideBytes k, v;
  const int32_t* block_row;  // this request's block-table row
  FastDivmod block_size;
  int seq_len;

  // Keys [first_key, first_key + kRows) -> k_tile / v_tile (shared addresses). Needs
  // seq_len > 0; keys >= seq_len are zero-filled without reading their block-table entry.
  __device__ __forceinline__ void load(int first_key, uint32_t k_tile, uint32_t v_tile, int tid) const {
    int32_t blk[kIters], slot[kIters];
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads;
      const int key = first_key + idx / kChunksPerRow;
      const int kc = key < seq_len ? key : 0;  // a key that is always backed by a block
      const int page = block_size.div(kc);
      blk[i] = (kChunks % kThreads != 0 && idx >= kChunks) ? 0 : __ldg(block_row + page);
      slot[i] = kc - page * block_size.divisor;
    }
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
      const bool valid = first_key + row < seq_len;
      const int32_t in_block_k = slot[i] * k.stride_slot + chunk * 16;
      const int32_t in_block_v = slot[i] * v.stride_slot + chunk * 16;
      const char* ks = k.head_base + static_cast<int64_t>(blk[i]) * k.stride_block + in_block_k;
      const char* vs = v.head_base + static_cast<int64_t>(blk[i]) * v.stride_block + in_block_v;
      const uint32_t dst = static_cast<uint32_t>(row * kPitchBytes + chunk * 16);
      cp_async_16(k_tile + dst, ks, valid);
      cp_async_16(v_tile + dst, vs, valid);
    }
  }
};

}  // namespace attnkit::cuda
