// Host side of TMA (sm90): encoding the tensor map through which the decode kernel copies one
// KV head's 16-key page groups of a paged cache side (K or V) into shared memory.
#pragma once
#include <cstdint>
#include <string>

#include "cuda/tma_sm90.h"

namespace attnkit::cuda {

// One side of a paged cache as 5 dimensions (innermost first): 128-byte segment of a row,
// slot, segment index, KV head, block. A box is [128 bytes, 16 slots, all of a row's segments,
// 1 head, 1 block], written to shared memory as [segment][slot][128 bytes] with the 128-byte
// swizzle (the decode tiles: cuda/kv_smem_layout.h PagedSwizzle128). Strides in bytes.
// Coordinates outside the map (a block id < 0 or >= num_blocks) read as zeros.
struct PagedSideGeometry {
  const void* base = nullptr;
  int row_bytes = 0;  // head_size * element bytes; a multiple of 128
  int block_size = 0;
  int num_kv_heads = 0;
  int64_t num_blocks = 0;
  int64_t stride_block = 0, stride_slot = 0, stride_head = 0;
};

// Rows of a [tokens][heads][row bytes] tensor (the attention output) as 3 dimensions (innermost
// first): byte of a row, head, token. A box is [128 bytes, box_heads, box_tokens], read from
// shared memory as box_heads x box_tokens rows of 128 bytes (heads inner) with the 128-byte
// swizzle: one 64-column region of 16-bit rows (the hopper kernel's Q buffer layout). Bytes past
// row_bytes are not written (a padded head size's columns).
struct RowsGeometry {
  void* base = nullptr;
  int row_bytes = 0;
  int64_t heads = 0, tokens = 0;
  int64_t stride_head = 0, stride_token = 0;  // bytes
  int box_heads = 0, box_tokens = 0;
};
// The rule `g` breaks for a map (empty: it has one, if the driver has the encoder). Host only.
std::string rows_map_refusal(const RowsGeometry& g);
// Encodes `g` into `out`; false (the rule in *why) where it has no map.
bool encode_rows_map(const RowsGeometry& g, TmaDesc& out, std::string* why);

// The rule `g` breaks for a map (empty: it has one, if the driver has the encoder). Host only.
std::string paged_side_map_refusal(const PagedSideGeometry& g);

// Encodes `g` into `out`. Returns false (with the rule that failed in *why) when the geometry
// has no such map (row size, alignment, strides, a driver without the entry point); the caller
// then loads with cp.async.
bool encode_paged_side_map(const PagedSideGeometry& g, TmaDesc& out, std::string* why);

}  // namespace attnkit::cuda
