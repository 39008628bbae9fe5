// Where byte `byte` of key row `row` of a K or V stage tile lives in shared memory (`at`), for the
// two ways the decode kernel fills its stages: cp.async into rows at a padded pitch
// (paged_kv_tile.h PitchedTile) or TMA into PagedSwizzle128 below. The fragment loaders
// (fp8_dequant.h, the 16-bit ldmatrix addressing below) take the layout as a template parameter.
#pragma once
#include <cstdint>

namespace attnkit::cuda {

// TMA fills (tensor_map.h): each 16-key group of rows is one box [segment][16 slots][128 bytes]
// with the 128-byte swizzle: the 16-byte chunk c of a 128-byte line is stored at c ^ (line % 8),
// and line = slot within the group, so the 8 rows of an ldmatrix phase again hit distinct
// banks. Tiles must start at a 1024-byte aligned address (the swizzle reads address bits 7-9).
template <int kRowBytes>
struct PagedSwizzle128 {
  static_assert(kRowBytes % 128 == 0, "rows must be whole 128-byte segments");
  static constexpr int kGroupBytes = 16 * kRowBytes;  // one TMA box
  __device__ __forceinline__ static uint32_t at(int row, int byte) {
    const int line = row & 15;
    return static_cast<uint32_t>((row >> 4) * kGroupBytes + (byte >> 7) * 2048 + line * 128 +
                                 ((((byte >> 4) & 7) ^ (line & 7)) << 4) + (byte & 15));
  }
};

// ldmatrix row addresses of a 16-bit [key][dim] tile in layout L (cf. mma_sm80.h's pitched
// versions): B operand of S = Q K^T for keys n0..n0+15, dims k0..k0+15 (non-transposed), and
// B operand of O = P V for keys k0..k0+15, dims n0..n0+15 (transposed).
template <class L>
__device__ __forceinline__ uint32_t bt_frag_addr_in(uint32_t tile, int n0, int k0, int lane) {
  return tile + L::at(n0 + (lane & 7) + ((lane >> 4) << 3), 2 * (k0 + (((lane >> 3) & 1) << 3)));
}
template <class L>
__device__ __forceinline__ uint32_t b_frag_addr_trans_in(uint32_t tile, int k0, int n0, int lane) {
  return tile + L::at(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), 2 * (n0 + ((lane >> 4) << 3)));
}

}  // namespace attnkit::cuda
