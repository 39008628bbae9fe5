// The group-column copy pattern of the hopper producer's cp.async fill (src/cuda/tile_copy_layout.h):
// at every hopper tile shape, the copying threads cover each (row, chunk) of a K/V tile exactly
// once, each copy's address (first address + Columns::at's XOR and step) is where the 128-byte
// swizzle puts that chunk, and the pattern's thread counts are the ones the kernel relies on.
// The fp8 convert fill walks the same pattern over chunk pairs: its f16 outputs cover every
// chunk of a tile once, at the addresses the swizzle says; its raw K codes cover every chunk of
// the 64-byte-swizzled fp8 K tile once.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cuda/tile_copy_layout.h"
#include "flash_attn/tile_set.h"

namespace {

using attnkit::cuda::GroupColumns;
using attnkit::cuda::Swizzle128Tile;
using attnkit::cuda::Swizzle64Tile;

// Each (row, chunk) of a tile hit exactly once: the count of those that are not, and the first.
std::string not_once(const std::vector<int>& hits, int rows, int chunks, const char* what, int& bad) {
  bad = 0;
  std::string first;
  for (int r = 0; r < rows; ++r)
    for (int ch = 0; ch < chunks; ++ch) {
      const int n = hits[static_cast<size_t>(r) * chunks + ch];
      if (n != 1 && bad++ == 0)
        first = "row " + std::to_string(r) + ", chunk " + std::to_string(ch) + " " + what + " " + std::to_string(n) + " times";
    }
  return first;
}

template <int kTileRows, int kChunksPerRow, int kMaxThreads>
void check_pattern(int expect_group_threads, int expect_phases) {
  using C = GroupColumns<kTileRows, kChunksPerRow, kMaxThreads>;
  const std::string shape = std::to_string(kTileRows) + " rows x " + std::to_string(kChunksPerRow) + " chunks";
  EXPECT_EQ(C::kGroupThreads, expect_group_threads) << shape;
  EXPECT_EQ(C::kPhases, expect_phases) << shape;
  EXPECT_LE(C::kThreads, kMaxThreads) << shape;
  EXPECT_EQ(C::kThreads % 32, 0) << shape << ": whole warps copy";
  std::vector<int> hits(static_cast<size_t>(kTileRows) * kChunksPerRow, 0);
  std::set<uint32_t> addresses;
  int wrong = 0;
  std::string first_wrong;
  for (int tid = 0; tid < C::kThreads; ++tid) {
    const auto c = C::of(tid);
    const uint32_t first = C::first(c);
    for (int i = 0; i < C::kRowsPerThread; ++i) {
      const int row = C::row(c, i);
      ASSERT_TRUE(row >= 0 && row < kTileRows && row / 16 == c.group)
          << shape << " tid " << tid << " copy " << i << ": row " << row << " outside its group " << c.group;
      ++hits[static_cast<size_t>(row) * kChunksPerRow + c.column];
      // The tile starts 1024-byte aligned in a stage; two such bases.
      for (uint32_t base : {0u, 5u * 1024u}) {
        const uint32_t got = C::at(base + first, i), want = base + Swizzle128Tile<kTileRows>::offset(row, c.column);
        if (got != want && wrong++ == 0)
          first_wrong = "tid " + std::to_string(tid) + " copy " + std::to_string(i) + " (row " + std::to_string(row) +
                        ", chunk " + std::to_string(c.column) + ", base " + std::to_string(base) + "): " +
                        std::to_string(got) + " instead of " + std::to_string(want);
      }
      addresses.insert(C::at(first, i));
    }
  }
  EXPECT_EQ(wrong, 0) << shape << ": wrong addresses, the first at " << first_wrong;
  int bad = 0;
  const std::string first_bad = not_once(hits, kTileRows, kChunksPerRow, "copied", bad);
  EXPECT_EQ(bad, 0) << shape << ": chunks not copied exactly once, the first: " << first_bad;
  EXPECT_EQ(addresses.size(), hits.size()) << shape << ": distinct destinations";
}

// The hopper tiles (flash_attn/tile_set.h), 16-bit and fp8 caches alike: 128 keys at head dims
// 64 / 128, 64 keys at 192 / 256; 128 producer threads.
constexpr bool hopper_keys(int head_dim, int keys) {
  using attnkit::flash_attn::CacheKind;
  using attnkit::flash_attn::TileId;
  using attnkit::flash_attn::tile_config;
  return tile_config(TileId::hopper, head_dim, CacheKind::b16).keys == keys &&
         tile_config(TileId::hopper, head_dim, CacheKind::fp8).keys == keys;
}
static_assert(hopper_keys(64, 128) && hopper_keys(128, 128) && hopper_keys(192, 64) && hopper_keys(256, 64));

// 16-bit rows: head dim / 8 chunks.
TEST(TileCopyLayout, GroupColumnsCoverEveryHopperTileOnce) {
  check_pattern<128, 8, 128>(16, 2);   // head dim 64
  check_pattern<128, 16, 128>(16, 1);  // 128
  check_pattern<64, 24, 128>(24, 1);   // 192: 96 threads copy
  check_pattern<64, 32, 128>(32, 1);   // 256
}

// Shapes the kernel does not use: the rule still yields a cover where it yields a pattern.
TEST(TileCopyLayout, GroupColumnsOtherShapes) {
  check_pattern<64, 8, 128>(32, 4);   // 64 keys x 8 chunks: 4 row phases
  check_pattern<128, 4, 128>(16, 4);  // 128 keys x 4 chunks
  check_pattern<32, 16, 64>(32, 2);   // 32 keys, 64 threads
}

// The fp8 convert fill (flash_attn/hopper_fill.cuh HopperConvertFill): columns are chunk pairs p
// (P = head dim / 32); the thread of pair p writes the f16 row chunks 2p, 2p + 1 (from code
// chunk p) and 2(P + p), 2(P + p) + 1 (code chunk P + p, converted in place), stepping from its
// first row's chunks 2(P + p) and 2p by Columns::at, the odd chunk by flipping bit 4.
template <int kTileRows, int kPairs, int kMaxThreads>
void check_pair_pattern(int expect_group_threads, int expect_phases) {
  using C = GroupColumns<kTileRows, kPairs, kMaxThreads>;
  using L = Swizzle128Tile<kTileRows>;
  constexpr int kChunks = 4 * kPairs;  // 16-bit row chunks
  const std::string shape = std::to_string(kTileRows) + " rows x " + std::to_string(kPairs) + " pairs";
  EXPECT_EQ(C::kGroupThreads, expect_group_threads) << shape;
  EXPECT_EQ(C::kPhases, expect_phases) << shape;
  EXPECT_EQ(C::kThreads % 32, 0) << shape << ": whole warps copy";
  std::vector<int> hits(static_cast<size_t>(kTileRows) * kChunks, 0);
  int wrong = 0;
  std::string first_wrong;
  for (int tid = 0; tid < C::kThreads; ++tid) {
    const auto c = C::of(tid);
    const uint32_t hi0 = L::offset(C::row(c, 0), 2 * (kPairs + c.column)), lo0 = L::offset(C::row(c, 0), 2 * c.column);
    for (int i = 0; i < C::kRowsPerThread; ++i) {
      const int row = C::row(c, i);
      ASSERT_TRUE(row >= 0 && row < kTileRows && row / 16 == c.group) << shape << " tid " << tid << " copy " << i;
      for (uint32_t base : {0u, 3u * 1024u}) {
        const uint32_t hi = C::at(base + hi0, i), lo = C::at(base + lo0, i);
        const int chunks[4] = {2 * (kPairs + c.column), 2 * (kPairs + c.column) + 1, 2 * c.column, 2 * c.column + 1};
        const uint32_t got[4] = {hi, hi ^ 16u, lo, lo ^ 16u};
        for (int k = 0; k < 4; ++k) {
          const uint32_t want = base + L::offset(row, chunks[k]);
          if (got[k] != want && wrong++ == 0)
            first_wrong = "tid " + std::to_string(tid) + " copy " + std::to_string(i) + " (row " + std::to_string(row) +
                          ", chunk " + std::to_string(chunks[k]) + ", base " + std::to_string(base) +
                          "): " + std::to_string(got[k]) + " instead of " + std::to_string(want);
          if (base == 0) ++hits[static_cast<size_t>(row) * kChunks + chunks[k]];
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << shape << ": wrong addresses, the first at " << first_wrong;
  int bad = 0;
  const std::string first_bad = not_once(hits, kTileRows, kChunks, "written", bad);
  EXPECT_EQ(bad, 0) << shape << ": f16 chunks not written exactly once, the first: " << first_bad;
}

// fp8 rows: head dim / 32 chunk pairs; 96 threads copy at head dim 192.
TEST(TileCopyLayout, ConvertPairsCoverEveryFp8HopperTileOnce) {
  check_pair_pattern<128, 2, 128>(16, 8);  // head dim 64
  check_pair_pattern<128, 4, 128>(16, 4);  // 128
  check_pair_pattern<64, 6, 128>(24, 4);   // 192: 96 threads copy
  check_pair_pattern<64, 8, 128>(32, 4);   // 256
}

// The fp8 K tile (Swizzle64Tile): a bijection of (row, 16-byte chunk) onto the tile's bytes in
// 16-byte units, every 512-byte atom holding 8 whole rows of one 64-column region.
template <int kRows, int kChunks>
void check_swizzle64() {
  std::set<uint32_t> seen;
  for (int r = 0; r < kRows; ++r)
    for (int ch = 0; ch < kChunks; ++ch) {
      const uint32_t at = Swizzle64Tile<kRows>::offset(r, ch);
      ASSERT_EQ(at % 16, 0u);
      ASSERT_LT(at, static_cast<uint32_t>(kRows * kChunks * 16)) << "row " << r << " chunk " << ch;
      ASSERT_EQ(at / 512, static_cast<uint32_t>((ch / 4) * (kRows / 8) + r / 8)) << "row " << r << " chunk " << ch;
      seen.insert(at);
    }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kRows * kChunks));
}

// The convert fill's raw K copies: the thread of pair p copies code chunks p and P + p of its
// rows into the fp8 K stage, stepping from its first row's addresses by Swizzle64Tile::step.
template <int kTileRows, int kPairs, int kMaxThreads>
void check_k_code_pattern() {
  using C = GroupColumns<kTileRows, kPairs, kMaxThreads>;
  using L = Swizzle64Tile<kTileRows>;
  constexpr int kChunks = 2 * kPairs;  // 16-byte code chunks of a row
  const std::string shape = std::to_string(kTileRows) + " rows x " + std::to_string(kPairs) + " pairs";
  std::vector<int> hits(static_cast<size_t>(kTileRows) * kChunks, 0);
  int wrong = 0;
  std::string first_wrong;
  for (int tid = 0; tid < C::kThreads; ++tid) {
    const auto c = C::of(tid);
    const int chunks[2] = {c.column, kPairs + c.column};
    for (int k = 0; k < 2; ++k) {
      const uint32_t first = L::offset(C::row(c, 0), chunks[k]);
      for (int i = 0; i < C::kRowsPerThread; ++i) {
        const int row = C::row(c, i);
        for (uint32_t base : {0u, 7u * 512u}) {
          const uint32_t got = L::step(base + first, i * C::kPhases), want = base + L::offset(row, chunks[k]);
          if (got != want && wrong++ == 0)
            first_wrong = "tid " + std::to_string(tid) + " copy " + std::to_string(i) + " (row " + std::to_string(row) +
                          ", chunk " + std::to_string(chunks[k]) + ", base " + std::to_string(base) +
                          "): " + std::to_string(got) + " instead of " + std::to_string(want);
        }
        ++hits[static_cast<size_t>(row) * kChunks + chunks[k]];
      }
    }
  }
  EXPECT_EQ(wrong, 0) << shape << ": wrong addresses, the first at " << first_wrong;
  int bad = 0;
  const std::string first_bad = not_once(hits, kTileRows, kChunks, "copied", bad);
  EXPECT_EQ(bad, 0) << shape << ": code chunks not copied exactly once, the first: " << first_bad;
}

TEST(TileCopyLayout, Fp8KTilesSwizzle64) {
  check_swizzle64<128, 4>();   // head dim 64
  check_swizzle64<128, 8>();   // 128
  check_swizzle64<64, 12>();   // 192
  check_swizzle64<64, 16>();   // 256
  check_k_code_pattern<128, 2, 128>();
  check_k_code_pattern<128, 4, 128>();
  check_k_code_pattern<64, 6, 128>();
  check_k_code_pattern<64, 8, 128>();
}

}  // namespace
