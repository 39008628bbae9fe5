// The group-column copy pattern of the hopper producer's cp.async fill (src/cuda/tile_copy_layout.h):
// at every hopper tile shape, the copying threads cover each (row, chunk) of a K/V tile exactly
// once, each copy's address (first address + Columns::at's XOR and step) is where the 128-byte
// swizzle puts that chunk, and the pattern's thread counts are the ones the kernel relies on.
// The fp8 convert fill walks the same pattern over chunk pairs: its V copies cover every chunk
// of the staged rows once, its raw K codes every chunk of the 64-byte-swizzled fp8 K tile once;
// its V transpose covers the staged words and the Vt tile once, without bank conflicts.
#include <gtest/gtest.h>

#include <algorithm>
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
// 64 / 128, 64 keys at 192 / 256, 128 at 96 (16-bit caches only); 128 producer threads.
constexpr bool hopper_keys(int head_dim, int keys) {
  using attnkit::flash_attn::CacheKind;
  using attnkit::flash_attn::TileId;
  using attnkit::flash_attn::tile_config;
  return tile_config(TileId::hopper, head_dim, CacheKind::b16).keys == keys &&
         tile_config(TileId::hopper, head_dim, CacheKind::fp8).keys == keys;
}
static_assert(hopper_keys(64, 128) && hopper_keys(128, 128) && hopper_keys(192, 64) && hopper_keys(256, 64));
static_assert(attnkit::flash_attn::tile_config(attnkit::flash_attn::TileId::hopper, 96,
                                               attnkit::flash_attn::CacheKind::b16).keys == 128);

// 16-bit rows: head dim / 8 chunks.
TEST(TileCopyLayout, GroupColumnsCoverEveryHopperTileOnce) {
  check_pattern<128, 8, 128>(16, 2);   // head dim 64
  check_pattern<128, 12, 128>(12, 1);  // 96 (16-bit caches): 96 threads copy
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
// (P = head dim / 32); the thread of pair p copies V's code chunks p and P + p of its rows into
// the staged rows (row-major, kHeadDim bytes a line, key k at line Fp8VTranspose::stage_line(k)),
// stepping from its first row's address by kPhases lines.
template <int kTileRows, int kPairs, int kMaxThreads>
void check_pair_pattern(int expect_group_threads, int expect_phases) {
  using C = GroupColumns<kTileRows, kPairs, kMaxThreads>;
  constexpr int kHeadDim = 32 * kPairs, kChunks = 2 * kPairs;  // 16-byte code chunks of a row
  using X = attnkit::cuda::Fp8VTranspose<kHeadDim, kTileRows>;
  const std::string shape = std::to_string(kTileRows) + " rows x " + std::to_string(kPairs) + " pairs";
  EXPECT_EQ(C::kGroupThreads, expect_group_threads) << shape;
  EXPECT_EQ(C::kPhases, expect_phases) << shape;
  EXPECT_EQ(C::kThreads % 32, 0) << shape << ": whole warps copy";
  std::vector<int> hits(static_cast<size_t>(kTileRows) * kChunks, 0);
  int wrong = 0;
  std::string first_wrong;
  for (int tid = 0; tid < C::kThreads; ++tid) {
    const auto c = C::of(tid);
    const uint32_t first = static_cast<uint32_t>(X::stage_line(C::row(c, 0)) * kHeadDim + c.column * 16);
    for (int i = 0; i < C::kRowsPerThread; ++i) {
      const int row = C::row(c, i);
      ASSERT_TRUE(row >= 0 && row < kTileRows && row / 16 == c.group) << shape << " tid " << tid << " copy " << i;
      const int chunks[2] = {c.column, kPairs + c.column};
      for (int k = 0; k < 2; ++k) {
        const uint32_t got = first + static_cast<uint32_t>(i * C::kPhases * kHeadDim + k * kHeadDim / 2);
        const uint32_t want = static_cast<uint32_t>(X::stage_line(row) * kHeadDim + chunks[k] * 16);
        if (got != want && wrong++ == 0)
          first_wrong = "tid " + std::to_string(tid) + " copy " + std::to_string(i) + " (row " + std::to_string(row) +
                        ", chunk " + std::to_string(chunks[k]) + "): " + std::to_string(got) + " instead of " +
                        std::to_string(want);
        ++hits[static_cast<size_t>(X::stage_line(row)) * kChunks + chunks[k]];
      }
    }
  }
  EXPECT_EQ(wrong, 0) << shape << ": wrong addresses, the first at " << first_wrong;
  int bad = 0;
  const std::string first_bad = not_once(hits, kTileRows, kChunks, "copied", bad);
  EXPECT_EQ(bad, 0) << shape << ": staged chunks not copied exactly once, the first: " << first_bad;
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

// The V transpose (cuda::Fp8VTranspose, run by HopperConvertFill::finish): slot order is the
// one that lets P's A fragment be packed from S's accumulator in place; the units cover every
// staged word and every Vt chunk once; the most distinct addresses of a warp's load (4 bytes)
// on one bank, and of a store's (16 bytes) 8-lane phase on one 16-byte bank slot, is 1.
template <int kHeadDim, int kKeys>
void check_v_transpose() {
  using X = attnkit::cuda::Fp8VTranspose<kHeadDim, kKeys>;
  const std::string shape = "head dim " + std::to_string(kHeadDim) + ", " + std::to_string(kKeys) + " keys";
  // Lane (g, t) of an accumulator holds keys 2t, 2t + 1 of each 8-key chunk; its A registers
  // 0 / 2 pack chunks 0, 1 / 2, 3 of a k32 step: slots 4t .. 4t + 3 (+ 16).
  for (int step = 0; step < kKeys / 32; ++step)
    for (int t = 0; t < 4; ++t)
      for (int half = 0; half < 2; ++half) {
        const int keys[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
        for (int i = 0; i < 4; ++i) {
          const int slot = 32 * step + 16 * half + 4 * t + i;
          EXPECT_EQ(X::slot_key(slot), 32 * step + 16 * half + keys[i]) << shape << ": slot " << slot;
        }
      }
  std::vector<int> read(static_cast<size_t>(kKeys) * X::kQuads, 0), written(static_cast<size_t>(kHeadDim) * X::kGroups, 0);
  std::set<uint32_t> vt_chunks;
  int worst_load = 0, worst_store = 0;
  std::string worst_load_at, worst_store_at;
  for (int u0 = 0; u0 < X::kUnits; u0 += 32) {  // a warp's 32 consecutive units
    const int lanes = std::min(32, X::kUnits - u0);
    for (int j = 0; j < 16; ++j) {  // load j: key 16g + j, word q
      std::vector<std::set<uint32_t>> bank(32);
      for (int l = 0; l < lanes; ++l) {
        const int u = u0 + l, g = u / X::kQuads, q = u % X::kQuads, key = 16 * g + j;
        const uint32_t at = static_cast<uint32_t>(X::stage_line(key) * kHeadDim + 4 * q);
        bank[at / 4 % 32].insert(at);
        ++read[static_cast<size_t>(key) * X::kQuads + q];
      }
      for (int b = 0; b < 32; ++b)
        if (static_cast<int>(bank[b].size()) > worst_load) {
          worst_load = static_cast<int>(bank[b].size());
          worst_load_at = "units " + std::to_string(u0) + "+, load " + std::to_string(j);
        }
    }
    for (int s = 0; s < 4; ++s)
      for (int ph = 0; ph < lanes; ph += 8) {  // store s, by 8-lane phases
        std::vector<std::set<uint32_t>> slot(8);
        for (int l = ph; l < std::min(ph + 8, lanes); ++l) {
          const int u = u0 + l, g = u / X::kQuads, q = u % X::kQuads, d = X::dim_of(q, s);
          ASSERT_TRUE(d / 4 == q) << shape;
          const uint32_t at = X::vt_offset(d, g);
          ASSERT_EQ(at % 16, 0u);
          ASSERT_LT(at, static_cast<uint32_t>(X::kStageBytes)) << shape << ": line " << d << ", chunk " << g;
          slot[at / 16 % 8].insert(at);
          vt_chunks.insert(at);
          ++written[static_cast<size_t>(d) * X::kGroups + g];
        }
        for (int b = 0; b < 8; ++b)
          if (static_cast<int>(slot[b].size()) > worst_store) {
            worst_store = static_cast<int>(slot[b].size());
            worst_store_at = "units " + std::to_string(u0) + "+, store " + std::to_string(s) + ", lanes " +
                             std::to_string(ph) + "+";
          }
      }
  }
  int bad = 0;
  std::string first_bad = not_once(read, kKeys, X::kQuads, "read", bad);
  EXPECT_EQ(bad, 0) << shape << ": staged words not read exactly once, the first: " << first_bad;
  first_bad = not_once(written, kHeadDim, X::kGroups, "written", bad);
  EXPECT_EQ(bad, 0) << shape << ": Vt chunks not written exactly once, the first: " << first_bad;
  EXPECT_EQ(vt_chunks.size(), static_cast<size_t>(kHeadDim * X::kGroups)) << shape << ": Vt chunks overlap";
  EXPECT_EQ(worst_load, 1) << shape << ": a load's bank conflict at " << worst_load_at;
  EXPECT_EQ(worst_store, 1) << shape << ": a store's bank conflict at " << worst_store_at;
}

TEST(TileCopyLayout, Fp8VTransposeCoversAndIsConflictFree) {
  check_v_transpose<64, 128>();
  check_v_transpose<128, 128>();
  check_v_transpose<192, 64>();
  check_v_transpose<256, 64>();
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
