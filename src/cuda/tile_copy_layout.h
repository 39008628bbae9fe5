// Where the rows of a K/V (or Q) tile land in shared memory in the 128- and 64-byte-swizzled
// layouts that wgmma descriptors read (wgmma_sm90.h), and which rows and chunks of a K/V tile each producer
// thread copies in the group-column pattern (flash_attn/hopper_fill.cuh HopperCpAsyncFill).
// Host and device code: the CPU tests (tests/tile_copy_layout_test.cpp) check that the pattern
// covers every chunk of a tile once and that its per-copy address steps land where the swizzle
// says, at every hopper tile shape.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define ATTNKIT_LAYOUT_FN __host__ __device__ __forceinline__ static constexpr
#else
#define ATTNKIT_LAYOUT_FN static constexpr
#endif

namespace attnkit::cuda {

// 64-column chunks of a row are regions of kRows 128-byte lines; inside a line the 16-byte chunks
// are XOR-swizzled by row % 8. Tiles start 1024-byte aligned (the swizzle period).
template <int kRows>
struct Swizzle128Tile {
  static constexpr int kRowStride = 128;  // for steps of whole swizzle periods (8 rows)
  ATTNKIT_LAYOUT_FN uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 3) * (kRows * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
  }
};

// fp8 tiles (one byte per value) for the fp8 wgmma: 64-column chunks of a row are regions of
// kRows 64-byte lines; inside a line the four 16-byte chunks are XOR-swizzled by (row / 2) % 4
// (the 64-byte swizzle: atoms of 8 lines, 512 bytes). Tiles start 512-byte aligned.
template <int kRows>
struct Swizzle64Tile {
  ATTNKIT_LAYOUT_FN uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((chunk >> 2) * (kRows * 64) + row * 64 + (((chunk & 3) ^ ((row >> 1) & 3)) << 4));
  }
  // Where the row `rows` further lands, from a row's address `at0`, for steps that are whole
  // multiples of a power of two above the row's own phase bits (GroupColumns: rows phase +
  // i kPhases): the swizzle bits of the step XOR in without a carry, the row is a constant step.
  ATTNKIT_LAYOUT_FN uint32_t step(uint32_t at0, int rows) {
    return (at0 ^ static_cast<uint32_t>(((rows >> 1) & 3) << 4)) + static_cast<uint32_t>(rows * 64);
  }
};

// A tile of kTileRows keys (whole 16-key groups: one page each, as block sizes are multiples of
// 16) of kChunksPerRow 16-byte chunks per row, copied by at most kMaxThreads threads: each
// copying thread owns one group and one chunk column of it, rows phase, phase + kPhases, ...
// kGroupThreads (threads per group) is the most that fill whole warps and split a group into
// whole chunk columns and equal row phases: 16 at 128 keys x 8 or 16 chunks (head dims 64 /
// 128: 2 and 1 phases), 32 at 64 keys x 32 chunks (256), 24 at 64 keys x 24 chunks (192: three
// warps of four copy).
template <int kTileRows, int kChunksPerRow, int kMaxThreads>
struct GroupColumns {
  static constexpr int kGroups = kTileRows / 16;
  static_assert(kTileRows % 16 == 0, "tiles are whole 16-key groups");
  ATTNKIT_LAYOUT_FN int group_threads() {
    for (int t = kMaxThreads / kGroups; t >= 1; --t)
      if ((t * kGroups) % 32 == 0 && t % kChunksPerRow == 0 && 16 % (t / kChunksPerRow) == 0) return t;
    return 0;
  }
  static constexpr int kGroupThreads = group_threads();
  static_assert(kGroupThreads > 0, "a 16-key group's rows split over whole chunk columns and warps");
  static constexpr int kThreads = kGroupThreads * kGroups;  // the first kThreads threads copy
  static constexpr int kPhases = kGroupThreads / kChunksPerRow;
  static constexpr int kRowsPerThread = 16 / kPhases;  // copies per thread and tile
  static_assert((kPhases & (kPhases - 1)) == 0, "row phases below the swizzle period: a power of two");

  struct Column {
    int group, column, phase;
  };
  ATTNKIT_LAYOUT_FN Column of(int tid) {
    return {tid / kGroupThreads, tid % kGroupThreads % kChunksPerRow, tid % kGroupThreads / kChunksPerRow};
  }
  // The tile row of the thread's copy i.
  ATTNKIT_LAYOUT_FN int row(const Column& c, int i) { return 16 * c.group + c.phase + i * kPhases; }
  // Where its first copy lands in the swizzled tile (bytes from the tile).
  ATTNKIT_LAYOUT_FN uint32_t first(const Column& c) { return Swizzle128Tile<kTileRows>::offset(row(c, 0), c.column); }
  // Where copy i lands, from the first's address `at0` (tile aligned to 1024 bytes): row phase +
  // kPhases i has the row bits of the phase, which at0 holds, and (i kPhases) % 8 above them,
  // one XOR with a constant; the row itself is a constant step.
  ATTNKIT_LAYOUT_FN uint32_t at(uint32_t at0, int i) {
    return (at0 ^ static_cast<uint32_t>(((i * kPhases) & 7) << 4)) + static_cast<uint32_t>(i * kPhases * 128);
  }
};


// O += P V on fp8 codes (the hopper kernel on fp8 caches): the fp8 wgmma reads both operands
// K-major, so V's tile of kKeys keys x kHeadDim codes is transposed by the producer from a
// staging area into the "Vt" tile of kHeadDim lines of kKeys codes (the keys in slot order,
// below), which the wgmma reads as B (128-byte-swizzled lines at 128 keys, 64-byte ones at 64).
//
// Slot order: P, the A operand, comes from registers, made of S's accumulator without moving a
// value between lanes. An m64nNk32 fp8 A fragment gives lane (g, t) of a warp row g (and g + 8),
// k slots 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3; S's accumulator gives it keys 2t, 2t + 1 of
// each 8-key chunk. So slot 4t + i of a 16-slot half holds key 2t + (i & 1) + 8 (i >> 1) of
// the half's 16 keys (slot_key): a register packs S's chunks 2c and 2c + 1 (c_quad_to_a_e4m3),
// and Vt's column of that slot holds that key.
//
// The transposition unit: 16 keys (one 16-key group g) x 4 head dims (quad q) per thread, read
// as 16 4-byte words (word q of each key's staged row) and written as 4 16-byte Vt chunks
// (chunk g of lines 4q .. 4q + 3). Staging rows are kHeadDim bytes, key k at line stage_line(k):
// the odd groups' even and odd rows swapped, so that a warp reading two groups' rows (head dims
// 64 and 192) hits both halves of the banks. A warp's 8-lane phases store consecutive quads, and
// lane q stores its dims in rotated order (dim_of: step s, dim 4q + (s + q / 2) % 4), so that
// the 8 lines of a phase land on 8 distinct 16-byte bank slots in either swizzle.
template <int kHeadDim, int kKeys>
struct Fp8VTranspose {
  static_assert(kKeys == 128 || kKeys == 64, "Vt lines of 128 or 64 keys");
  static constexpr int kQuads = kHeadDim / 4, kGroups = kKeys / 16;
  static constexpr int kUnits = kGroups * kQuads;  // (group, quad) units of a tile
  static constexpr int kStageBytes = kHeadDim * kKeys;  // the staged codes; Vt the same
  ATTNKIT_LAYOUT_FN int slot_key(int slot) {
    const int i = slot & 3;
    return (slot & ~15) + 2 * ((slot & 15) >> 2) + (i & 1) + 8 * (i >> 1);
  }
  ATTNKIT_LAYOUT_FN int stage_line(int key) { return key ^ ((key >> 4) & 1); }
  ATTNKIT_LAYOUT_FN int dim_of(int quad, int s) { return 4 * quad + ((s + (quad >> 1)) & 3); }
  // Vt: line d (a head dim), 16-byte chunk g (slots 16g .. 16g + 15).
  ATTNKIT_LAYOUT_FN uint32_t vt_offset(int d, int g) {
    if constexpr (kKeys == 128) return Swizzle128Tile<kHeadDim>::offset(d, g);
    else return Swizzle64Tile<kHeadDim>::offset(d, g);
  }
};

}  // namespace attnkit::cuda
