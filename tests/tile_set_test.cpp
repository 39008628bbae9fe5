// The tile set (flash_attn/tile_set.h) on its own: every configuration's fields agree with each
// other and with the shared memory it may use, the hopper rings' depths. Host only.
#include <gtest/gtest.h>

#include <string>

#include "flash_attn/tile_set.h"

namespace attnkit::flash_attn {
namespace {

TEST(TileSet, ConfigurationsAreConsistent) {
  for (int hd : kMmaSyncHeadDims)
    for (CacheKind kind : {CacheKind::b16, CacheKind::fp8, CacheKind::nvfp4})
      for (TileId id : kAllTiles) {
        const TileConfig t = tile_config(id, hd, kind);
        const std::string ctx = std::string(t.name) + " hd " + std::to_string(hd) + " " + cache_kind_name(kind);
        EXPECT_GT(t.rows, 0) << ctx;
        EXPECT_EQ(t.keys % 16, 0) << ctx;
        if (tile_instantiated(id, hd, kind)) EXPECT_GE(t.stages, 2) << ctx;  // (hopper_short at 256 would have one)
        EXPECT_GE(t.ctas_per_sm, 1) << ctx;
        if (t.generation == Generation::mma_sync) {
          EXPECT_EQ(t.rows, 16 * t.m_frags * t.warps_m) << ctx;
          EXPECT_EQ(t.keys / t.warps_n % 16, 0) << ctx << ": each warp takes whole k16 steps of keys";
        }
        if (t.fill == KvFill::tma && tile_instantiated(id, hd, kind))
          EXPECT_TRUE(tma_rows(hd, kind)) << ctx << ": TMA tiles need rows of whole 128-byte segments";
        if (t.transposed) EXPECT_EQ(t.rows, kDecodeTileRows) << ctx;
      }
  // The values the kernels were tuned at (DECISIONS.md): one definition, read everywhere.
  EXPECT_EQ(tile_config(TileId::prefill, 128, CacheKind::b16).ctas_per_sm, 2);
  EXPECT_EQ(tile_config(TileId::prefill, 256, CacheKind::b16).ctas_per_sm, 1);
  EXPECT_EQ(tile_config(TileId::decode, 128, CacheKind::b16).ctas_per_sm, 2);
  EXPECT_EQ(tile_config(TileId::decode, 128, CacheKind::fp8).ctas_per_sm, 3);
  EXPECT_EQ(tile_config(TileId::decode, 256, CacheKind::fp8).ctas_per_sm, 2);
  EXPECT_EQ(tile_config(TileId::decode_two_stage, 128, CacheKind::b16).ctas_per_sm, 3);
  EXPECT_EQ(tile_config(TileId::decode_transposed, 128, CacheKind::fp8).ctas_per_sm, 4);
  EXPECT_EQ(tile_config(TileId::decode_transposed_two_stage, 128, CacheKind::fp8).stages, 2);
  EXPECT_EQ(tile_config(TileId::hopper_short, 128, CacheKind::b16).q_buffers, 2);
  EXPECT_EQ(tile_config(TileId::hopper, 256, CacheKind::b16).keys, 64);
  EXPECT_FALSE(tile_instantiated(TileId::hopper_short, 256, CacheKind::b16));
  // The rings' depth is what the opt-in shared memory holds next to the Q buffers: K as deep as
  // a V ring of its depth allows, V what is left (hopper_rings), at most 4.
  for (int hd : {64, 128, 192, 256})
    for (TileId id : {TileId::hopper, TileId::hopper_short, TileId::hopper_wide}) {
      const TileConfig t = tile_config(id, hd, CacheKind::b16);
      const int tile = t.keys * hd * 2, q = t.q_buffers * t.rows * hd * 2;
      const int bytes = q + (t.stages + t.k_stages) * tile + 1024;
      EXPECT_LE(bytes, 227 * 1024) << t.name << " hd " << hd;
      EXPECT_GE(t.stages, t.k_stages) << t.name << " hd " << hd;
      EXPECT_LE(t.stages, 4) << t.name << " hd " << hd;
      if (t.stages < 4) EXPECT_GT(bytes + tile, 227 * 1024) << t.name << " hd " << hd << ": one more V stage fits";
      if (t.k_stages < 4)
        EXPECT_GT(q + 2 * (t.k_stages + 1) * tile + 1024, 227 * 1024) << t.name << " hd " << hd << ": one more stage of both fits";
    }
  // The depths (K, V) by tile and head dim; fp8 caches (K stages of fp8 codes, half a V stage;
  // Q's e4m3 copy inside its buffer) keep the extra stages in K.
  struct Rings {
    TileId id;
    int hd;
    CacheKind cache;
    int k, v;
  };
  for (const Rings& r : {Rings{TileId::hopper, 64, CacheKind::b16, 4, 4}, Rings{TileId::hopper, 128, CacheKind::b16, 3, 3},
                         Rings{TileId::hopper_short, 128, CacheKind::b16, 2, 3},
                         Rings{TileId::hopper, 192, CacheKind::b16, 3, 4},
                         Rings{TileId::hopper_short, 192, CacheKind::b16, 2, 3},
                         Rings{TileId::hopper, 256, CacheKind::b16, 2, 3},
                         Rings{TileId::hopper, 128, CacheKind::fp8, 4, 4},
                         Rings{TileId::hopper_short, 128, CacheKind::fp8, 4, 3},
                         Rings{TileId::hopper, 192, CacheKind::fp8, 4, 4},
                         Rings{TileId::hopper_short, 192, CacheKind::fp8, 4, 3},
                         Rings{TileId::hopper, 256, CacheKind::fp8, 4, 3},
                         Rings{TileId::hopper_short, 256, CacheKind::fp8, 2, 2}}) {
    const TileConfig t = tile_config(r.id, r.hd, r.cache);
    EXPECT_EQ(t.k_stages, r.k) << t.name << " hd " << r.hd;
    EXPECT_EQ(t.stages, r.v) << t.name << " hd " << r.hd;
  }
  EXPECT_TRUE(tile_instantiated(TileId::hopper_short, 256, CacheKind::fp8));  // (two stages of both)
  for (int hd : {64, 128, 192, 256})  // fp8: the rings and the Q buffers fit
    for (TileId id : {TileId::hopper, TileId::hopper_short, TileId::hopper_wide}) {
      const TileConfig t = tile_config(id, hd, CacheKind::fp8);
      const int bytes = t.q_buffers * t.rows * hd * 2 + t.k_stages * t.keys * hd + t.stages * t.keys * hd * 2;
      EXPECT_LE(bytes + 1024, 227 * 1024) << t.name << " hd " << hd;
      EXPECT_GE(t.k_stages, t.stages) << t.name << " hd " << hd;
    }
  // Head dim 96: 16-bit caches only (a region and a half; fp8 tiles are laid out per 64 columns).
  EXPECT_TRUE(tile_instantiated(TileId::hopper, 96, CacheKind::b16));
  EXPECT_TRUE(tile_instantiated(TileId::hopper_short, 96, CacheKind::b16));
  EXPECT_FALSE(tile_instantiated(TileId::hopper, 96, CacheKind::fp8));
  EXPECT_FALSE(tile_instantiated(TileId::hopper_wide, 96, CacheKind::b16));
  EXPECT_FALSE(tile_instantiated(TileId::hopper, 80, CacheKind::b16));
  EXPECT_EQ(hopper_region_dims(96), 128);
  EXPECT_EQ(hopper_k_stage_bytes(96, 128, CacheKind::b16), hopper_k_stage_bytes(128, 128, CacheKind::b16));
  // Three consumer warpgroups of 64 rows at head dim 64 only, 16-bit and fp8 caches.
  EXPECT_EQ(tile_config(TileId::hopper_wide, 64, CacheKind::b16).rows, 192);
  EXPECT_EQ(tile_config(TileId::hopper_wide, 64, CacheKind::b16).warps_m, 3);
  EXPECT_EQ(tile_config(TileId::hopper_wide, 64, CacheKind::b16).stages, 4);
  EXPECT_EQ(tile_config(TileId::hopper_wide, 64, CacheKind::b16).k_stages, 4);
  EXPECT_TRUE(tile_instantiated(TileId::hopper_wide, 64, CacheKind::fp8));
  EXPECT_FALSE(tile_instantiated(TileId::hopper_wide, 128, CacheKind::b16));
  EXPECT_FALSE(tile_instantiated(TileId::hopper_wide, 64, CacheKind::nvfp4));
  EXPECT_TRUE(tile_instantiated(TileId::hopper, 128, CacheKind::fp8));  // (codes for the fp8 wgmma)
  EXPECT_GT(tile_config(TileId::hopper, 128, CacheKind::fp8).stages, tile_config(TileId::hopper, 128, CacheKind::b16).stages);
  EXPECT_FALSE(tile_instantiated(TileId::hopper, 96, CacheKind::fp8));
  EXPECT_FALSE(tile_instantiated(TileId::hopper, 128, CacheKind::nvfp4));
  EXPECT_FALSE(tile_instantiated(TileId::decode_transposed, 64, CacheKind::fp8));
  EXPECT_FALSE(tile_instantiated(TileId::decode_tma, 96, CacheKind::b16));  // 192-byte rows
}

}  // namespace
}  // namespace attnkit::flash_attn
