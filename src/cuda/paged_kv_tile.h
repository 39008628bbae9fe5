// Loading tiles of consecutive keys of one KV head from a paged cache into shared memory with
// cp.async, resolving each key's page through the request's block-table row. Tiles may cross
// page boundaries (any block size works, including ones smaller than the tile); keys at or past
// seq_len are zero-filled and their block-table entries are never read.
#pragma once
#include <cstdint>

#include "cuda/cp_async.h"

namespace attnkit::cuda {

// One side (K or V) of the cache as the loader sees it: byte strides, base already offset to
// the KV head.
struct PagedSideBytes {
  const char* head_base;
  int64_t stride_block, stride_slot;
};

// kRows keys x kRowBytes bytes per key, copied by kThreads threads in 16-byte chunks into a
// shared tile with a pitch of kPitchBytes. K and V of the same keys are loaded together: the
// page lookup is shared.
template <int kRows, int kRowBytes, int kPitchBytes, int kThreads>
struct PagedKVTileLoader {
  static_assert(kRowBytes % 16 == 0, "rows must be whole 16-byte chunks");
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kChunks = kRows * kChunksPerRow;
  static constexpr int kIters = (kChunks + kThreads - 1) / kThreads;

  PagedSideBytes k, v;
  const int32_t* block_row;  // this request's block-table row
  int block_size;
  int seq_len;

  // Keys [first_key, first_key + kRows) -> k_tile / v_tile (shared addresses).
  __device__ __forceinline__ void load(int first_key, uint32_t k_tile, uint32_t v_tile, int tid) const {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int idx = tid + i * kThreads;
      if (kChunks % kThreads != 0 && idx >= kChunks) break;
      const int row = idx / kChunksPerRow, chunk = idx % kChunksPerRow;
      const int key = first_key + row;
      const bool valid = key < seq_len;
      const char* ks = k.head_base;
      const char* vs = v.head_base;
      if (valid) {
        const int64_t blk = block_row[key / block_size];
        const int64_t slot = key % block_size;
        ks += blk * k.stride_block + slot * k.stride_slot + chunk * 16;
        vs += blk * v.stride_block + slot * v.stride_slot + chunk * 16;
      }
      const uint32_t dst = static_cast<uint32_t>(row * kPitchBytes + chunk * 16);
      cp_async_16(k_tile + dst, ks, valid);
      cp_async_16(v_tile + dst, vs, valid);
    }
  }
};

}  // namespace attnkit::cuda
