// The tile configurations of the FlashAttention-style kernels, named once. Host code (the launch
// decision, the split rule, the tests, the bench) and the kernel traits (varlen_traits.h,
// hopper_traits.h) read the same values from here; no other file defines a tile size or a CTA
// count per SM. docs/architecture.md section 9 says what each field means for the kernels.
#pragma once
#include <cstdint>
#include <string>

#include "flash_attn/generation.h"

namespace attnkit::flash_attn {

enum class TileId : uint8_t {
  prefill,                      // mma_sync, 128 packed rows (prefill-shaped launches)
  decode,                       // mma_sync, 16 rows, warps along the keys, cp.async fills
  decode_tma,                   // ... TMA stage fills (sm90)
  decode_two_stage,             // ... 16-bit caches, 2 TMA stages, 3 CTAs per SM
  decode_transposed,            // mma_sync fp8 decode, keys on the MMA's M (<= 8 packed rows)
  decode_transposed_two_stage,  // ... with 2 stages
  hopper,                       // wgmma, warp-specialised, one Q buffer
  hopper_short,                 // ... two Q buffers (persistent launches of short items)
  hopper_wide,                  // ... 192 rows, three consumer warpgroups (long items at head dim 64)
};
inline constexpr TileId kAllTiles[] = {TileId::prefill,           TileId::decode,
                                       TileId::decode_tma,        TileId::decode_two_stage,
                                       TileId::decode_transposed, TileId::decode_transposed_two_stage,
                                       TileId::hopper,            TileId::hopper_short,
                                       TileId::hopper_wide};

enum class KvFill : uint8_t {
  cp_async,  // 16-byte cp.async copies by every (producer) thread, through the block table
  tma,       // TMA boxes of a 16-key page group's whole rows (sm90 decode tiles)
  convert,   // hopper, fp8 caches: codes by cp.async; K as they are, V transposed in its stage (both GEMMs fp8)
  // (hopper, 16-bit caches: cp_async; DECISIONS.md, Hopper K/V by TMA at 128-byte rows)
};

// What a cache row holds, as the kernels see it: 16-bit values (the model's dtype), fp8 codes
// (e4m3 / e5m2, one byte each), or NVFP4 (e2m1 codes packed two per byte, one e4m3 scale per 16
// values in a separate region of the block: docs/architecture.md section 2).
enum class CacheKind : uint8_t { b16, fp8, nvfp4 };
// The 8- and 4-bit caches: the MMAs run in f16 (the hopper kernel's S = Q K^T on fp8 caches in
// e4m3: hopper_traits.h) and the global scales fold into the softmax scale (K) and the epilogue (V).
constexpr bool quantized(CacheKind c) { return c != CacheKind::b16; }
const char* cache_kind_name(CacheKind c);

struct TileConfig {
  const char* name = "";
  Generation generation = Generation::mma_sync;
  int rows = 0;            // packed query rows (token x GQA head) of a work item
  int m_frags = 1;         // mma_sync: m16 row fragments per warp
  int warps_m = 1;         // mma_sync: warps along the rows (hopper: consumer warpgroups)
  int warps_n = 1;         // mma_sync: warps along a tile's keys (independent softmax states)
  int keys = 0;            // keys per K/V tile
  int stages = 0;          // K/V tiles in flight (hopper: depth of the V ring; the K ring: k_stages)
  int ctas_per_sm = 1;     // the occupancy the tile is compiled for (__launch_bounds__)
  KvFill fill = KvFill::cp_async;
  bool transposed = false;  // S^T = K Q^T: keys on the MMA's M, <= kTransposedMaxRows rows on N
  int q_buffers = 1;        // hopper: Q tiles in shared memory
  // mma_sync: CTAs per work item, each computing 1 / o_slices of the output columns (and all
  // of S: the fp32 output of a whole head of 512 would not fit in registers).
  int o_slices = 1;
  int k_stages = 0;  // hopper: depth of the K ring (<= stages)
};

inline constexpr int kDecodeTileRows = 16;     // packed rows up to which a launch takes a decode tile
inline constexpr int kTransposedMaxRows = 8;   // packed rows the transposed tile serves

// The head dims the mma_sync kernels are compiled for (varlen_hd*.cu: the sizes real models
// use); every other head size runs on the next larger one (kernel_head_dim).
inline constexpr int kMmaSyncHeadDims[] = {64, 80, 96, 128, 192, 256, 512};
inline constexpr int kMaxHeadSize = 512;
inline constexpr int kMaxDecodeTileDim = 256;  // the 16-row decode tiles' largest head dim

// Whether a tile of the cache kind exists at head dim d: fp8 fragments come in 32-dim groups and
// pairs of k16 steps; NVFP4 fragments in 64-dim groups (varlen_traits.h, cuda/fp4_dequant.h).
constexpr bool cache_head_dim(int d, CacheKind c) {
  return c == CacheKind::b16 ? true : c == CacheKind::fp8 ? d % 32 == 0 : d % 64 == 0;
}

// The head dims of the planned (FlashInfer-style) launches (launch_planned, instantiated in
// varlen_hd{64,128,256}_*.cu).
inline constexpr int kPlannedHeadDims[] = {64, 128, 256};
constexpr bool planned_head_dim(int d) {
  for (int x : kPlannedHeadDims)
    if (x == d) return true;
  return false;
}

// The runtime head sizes a cache kind allows: 16-bit rows are copied in 16-byte chunks (multiples
// of 8), fp8 rows too (multiples of 16); NVFP4 rows (head_size / 2 bytes) and their scale rows
// (head_size / 16 bytes, copied in 4-byte chunks) need multiples of 64.
constexpr int head_size_multiple(CacheKind c) { return c == CacheKind::b16 ? 8 : c == CacheKind::fp8 ? 16 : 64; }

// The compiled head dim that serves a runtime head size (0: none does). The runtime size is
// rounded up to the smallest compiled dim the cache kind has: Q / K / V loads zero-fill the
// padding columns, the output stores the real ones only, and the softmax scale is the real
// size's (docs/architecture.md section 9). Head sizes are multiples of 8 (16-byte rows of a
// 16-bit cache); an fp8 cache needs multiples of 16 (its rows are copied in 16-byte chunks).
// The hopper tiles pad further where an mma_sync dim lies between theirs (tile_head_dim, below).
// Planned launches (planned = true) take the next of kPlannedHeadDims.
constexpr int kernel_head_dim(int head_size, CacheKind cache, bool planned = false) {
  if (head_size <= 0 || head_size % head_size_multiple(cache) != 0) return 0;
  if (planned) {
    for (int d : kPlannedHeadDims)
      if (d >= head_size && cache_head_dim(d, cache)) return d;
    return 0;
  }
  if (cache == CacheKind::nvfp4) return 0;
  for (int d : kMmaSyncHeadDims)
    if (d >= head_size && cache_head_dim(d, cache)) return d;
  return 0;
}

// The rule kernel_head_dim applies, in words, for errors and the selector (launch_plan.cpp).
std::string head_size_rule(CacheKind cache, bool planned = false);

// Bytes of one K or V row in the cache (NVFP4: the packed codes; its scales are in their own rows).
constexpr int kv_row_bytes(int head_dim, CacheKind cache) {
  return cache == CacheKind::b16 ? 2 * head_dim : cache == CacheKind::fp8 ? head_dim : head_dim / 2;
}
// Bytes of one row of NVFP4 block scales (one e4m3 byte per 16 values; 0 for other caches).
constexpr int kv_scale_row_bytes(int head_dim, CacheKind cache) { return cache == CacheKind::nvfp4 ? head_dim / 16 : 0; }
// TMA boxes copy rows of whole 128-byte segments, up to 512 bytes (cuda/tensor_map.h); NVFP4
// tiles fill by cp.async (their scale rows are a second region).
constexpr bool tma_rows(int head_dim, CacheKind cache) {
  return head_dim > 0 && cache != CacheKind::nvfp4 && kv_row_bytes(head_dim, cache) % 128 == 0 &&
         kv_row_bytes(head_dim, cache) <= 512;
}

// The hopper tiles' shared memory (hopper_traits.h lays it out). A V stage holds `keys` 16-bit
// rows, or with an fp8 cache the codes staged and their transpose (O += P V runs on the fp8
// wgmma, which reads V K-major), the same bytes; a K stage holds 16-bit rows, or with an fp8
// cache the raw codes, one byte each (S = Q K^T runs on the fp8 wgmma, Q quantised to e4m3 in
// its own buffer: hopper_traits.h).
// Tiles are laid out in whole regions of 64 columns (head dims): at head dim 96 the second
// region's upper half is never written nor read (hopper_region_dims).
constexpr int kHopperSmemBytes = 227 * 1024 - 1024;  // the sm90 opt-in, less 1 KB of alignment slack
constexpr int hopper_region_dims(int head_dim) { return (head_dim + 63) / 64 * 64; }
constexpr int hopper_k_stage_bytes(int head_dim, int keys, CacheKind cache) {
  return keys * hopper_region_dims(head_dim) * (cache == CacheKind::fp8 ? 1 : 2);
}
constexpr int hopper_v_stage_bytes(int head_dim, int keys) { return keys * hopper_region_dims(head_dim) * 2; }
// The q_buffers 16-bit Q tiles of `rows` rows (with an fp8 cache each also holds its e4m3 copy).
constexpr int hopper_q_bytes(int head_dim, int rows, int q_buffers) {
  return q_buffers * rows * hopper_region_dims(head_dim) * 2;
}
// The rings' depths (hopper_rings): both take as many (K, V) stage pairs as the shared memory
// holds next to the Q bytes, at most 4: 4 / 3 / 3 / 2 at head dims 64 / 128 / 192 / 256 (96: as 128) with one
// 16-bit Q buffer, 4 / 2 / 2 / 1 with two. One ring then takes what is left, up to 4: one stage
// more at 192 / 256 with one Q buffer and at 128 / 192 with two. That is the V ring (a V stage is held one step longer than a K one, from its load to the
// P V after the S that freed K; both are loaded together), but with fp8 caches the K ring, whose
// stages are half a V stage (fp8: K 4 / 4 / 4 / 4, V 4 / 4 / 4 / 3 with one Q buffer, K 4 / 4 / 4 /
// 2, V 4 / 3 / 3 / 2 with two; an fp8 V
// stage is transposed one call late, after the next side's stage is acquired: hopper_fill.cuh,
// DECISIONS.md: Hopper: a deeper V ring).
constexpr int hopper_ring_depth(int bytes_left, int stage_bytes) {
  if (stage_bytes <= 0) return 0;
  const int stages = bytes_left / stage_bytes;
  return stages < 4 ? stages : 4;
}
struct HopperRings {
  int k, v;  // stages of the K ring and of the V ring
};
constexpr HopperRings hopper_rings(int head_dim, int rows, int keys, int q_buffers, CacheKind cache) {
  const int k = hopper_k_stage_bytes(head_dim, keys, cache), v = hopper_v_stage_bytes(head_dim, keys);
  const int left = kHopperSmemBytes - hopper_q_bytes(head_dim, rows, q_buffers);
  const int both = hopper_ring_depth(left, k + v);
  if (cache == CacheKind::fp8) return {hopper_ring_depth(left - both * v, k), both};
  return {both, hopper_ring_depth(left - both * k, v)};
}

constexpr TileConfig tile_config(TileId id, int head_dim, CacheKind cache) {
  const bool fp8_cache = quantized(cache);  // (8- and 4-bit stages are the smaller ones)
  TileConfig t;
  switch (id) {
    case TileId::prefill:
      // <= 128: 4 warps x 32 rows (each K/V fragment feeds two row fragments), 2 CTAs per SM;
      // 192 / 256: 8 warps x 16 rows (the fp32 output of 32 rows would not fit in registers);
      // 512: 4 warps x 16 rows, tiles of 32 keys (shared memory), two CTAs per work item
      // computing 256 output columns each (every launch at 512 takes this tile, decodes too).
      t = head_dim <= 128   ? TileConfig{"prefill", Generation::mma_sync, 128, 2, 4, 1, 64, 2, 2}
          : head_dim <= 256 ? TileConfig{"prefill", Generation::mma_sync, 128, 1, 8, 1, 64, 2, 1}
                            : TileConfig{"prefill", Generation::mma_sync, 64, 1, 4, 1, 32, 2, 1};
      if (head_dim > 256) t.o_slices = 2;
      break;
    case TileId::decode:
    case TileId::decode_tma:
      // 16 rows, 4 warps along the keys: all four warps work on one KV stream. fp8 and NVFP4
      // tiles are half the bytes or less: 3 CTAs per SM at head sizes <= 128 (DECISIONS.md: fp8
      // decode: 3 CTAs per SM; NVFP4 decode: 3 CTAs per SM).
      t = {"decode", Generation::mma_sync, 16, 1, 1, 4, 64, 3, (fp8_cache && head_dim <= 128) ? 3 : 2};
      if (id == TileId::decode_tma) {
        t.name = "decode_tma";
        t.fill = KvFill::tma;
      }
      break;
    case TileId::decode_two_stage:
      t = {"decode_two_stage", Generation::mma_sync, 16, 1, 1, 4, 64, 2, 3, KvFill::tma};
      break;
    case TileId::decode_transposed:
    case TileId::decode_transposed_two_stage:
      t = {"decode_transposed", Generation::mma_sync, 16, 1, 1, 4, 64, 3, 4, KvFill::tma, true};
      if (id == TileId::decode_transposed_two_stage) {
        t.name = "decode_transposed_two_stage";
        t.stages = 2;
      }
      break;
    case TileId::hopper:
    case TileId::hopper_short:
    case TileId::hopper_wide:
      // 128 keys up to head dim 128; 64 above (the consumers' registers: O is 96 / 128 fp32 per
      // thread at 192 / 256, S and P of 64 keys another 48). Two consumer warpgroups of 64 rows;
      // hopper_wide has three (192 rows, head dim 64 only: each warpgroup's softmax then runs
      // under the two others' GEMMs, where at 64 one tile's GEMMs are too short to hide it; its
      // consumers get 160 registers: DECISIONS.md, Hopper: three consumer warpgroups at head
      // dim 64). The K and V rings take as many stages as the sm90 opt-in shared memory holds
      // next to the Q buffers (hopper_rings).
      t = {"hopper", Generation::hopper, 128, 4, 2, 1, head_dim <= 128 ? 128 : 64, 0, 1, KvFill::cp_async, false, 1};
      if (id == TileId::hopper_short) {
        t.name = "hopper_short";
        t.q_buffers = 2;
      }
      if (id == TileId::hopper_wide) {
        t.name = "hopper_wide";
        t.rows = 192;
        t.warps_m = 3;
      }
      if (cache == CacheKind::fp8) t.fill = KvFill::convert;  // (raw K codes; V transposed)
      {
        const HopperRings rings = hopper_rings(head_dim, t.rows, t.keys, t.q_buffers, cache);
        t.k_stages = rings.k;
        t.stages = rings.v;
      }
      break;
  }
  return t;
}

// The head dims of the hopper tiles: whole 128-byte segments of 16-bit values (wgmma's swizzled
// regions of 64 columns) up to 256, fp8 caches too (their K codes in 64-byte-swizzled regions of
// 64 columns, V's transposed); and with 16-bit caches 96, a region and a half: its GEMMs stop at
// column 96 (S = Q K^T in six k16 steps, O += P V on columns 0-63 and 64-95), a quarter fewer
// tensor-core cycles than the same rows padded to 128 (DECISIONS.md: Hopper: head dim 96 in a
// region and a half).
constexpr bool hopper_head_dim(int head_dim, CacheKind cache) {
  if (cache == CacheKind::nvfp4 || head_dim < 64 || head_dim > 256) return false;
  return head_dim % 64 == 0 || (head_dim == 96 && cache == CacheKind::b16);
}

// Whether the build instantiates tile `id` for (head_dim, cache kind): the launch decision only
// picks instantiated tiles, and the instantiation files compile exactly these.
// NVFP4 caches have the cp.async decode tile only (planned launches).
constexpr bool tile_instantiated(TileId id, int head_dim, CacheKind cache) {
  if (!cache_head_dim(head_dim, cache)) return false;
  if (cache == CacheKind::nvfp4) return id == TileId::decode && head_dim <= kMaxDecodeTileDim;
  switch (id) {
    case TileId::prefill:
      return true;
    case TileId::decode:
      return head_dim <= kMaxDecodeTileDim;
    case TileId::decode_tma:
      return head_dim <= kMaxDecodeTileDim && tma_rows(head_dim, cache);
    case TileId::decode_two_stage:
      return cache == CacheKind::b16 && head_dim <= 128 && tma_rows(head_dim, cache);
    case TileId::decode_transposed:
    case TileId::decode_transposed_two_stage:
      return cache == CacheKind::fp8 && head_dim == 128;
    case TileId::hopper_wide:
      if (head_dim != 64) return false;
      [[fallthrough]];
    case TileId::hopper:
    case TileId::hopper_short:
      // The hopper head dims (hopper_head_dim) where both rings get two stages (not
      // hopper_short at 256 with 16-bit caches: K would get one).
      if (!hopper_head_dim(head_dim, cache)) return false;
      {
        const TileConfig t = tile_config(id, head_dim, cache);
        return t.k_stages >= 2 && t.stages >= 2;
      }
  }
  return false;
}

// The hopper kernels' head dims (hopper_hd*.cu; tile_instantiated says which tiles each has).
inline constexpr int kHopperHeadDims[] = {64, 96, 128, 192, 256};
constexpr bool is_hopper_tile(TileId id) {
  return id == TileId::hopper || id == TileId::hopper_short || id == TileId::hopper_wide;
}

// The compiled head dim tile `id` runs a runtime head size on (0: none). The mma_sync tiles and
// planned launches: kernel_head_dim. The hopper tiles: the smallest hopper dim of the cache kind
// at least as large, zero-padded the same way, also where an mma_sync dim lies between (72 ..
// 96 run on hopper 96, fp8 caches on hopper 128, not on mma_sync 80 / 96: the hopper kernel
// padded outruns the mma_sync prefill tile there; DECISIONS.md: Head sizes: hopper tiles pad to
// their next dim). So one launch's head dim is its tile's: a decode-shaped launch of head size
// 80 runs the decode tile at 80, a prefill-shaped one the hopper kernel at 96.
constexpr int tile_head_dim(TileId id, int head_size, CacheKind cache, bool planned = false) {
  const int d = kernel_head_dim(head_size, cache, planned);
  if (d == 0 || planned || !is_hopper_tile(id)) return d;
  for (int h : kHopperHeadDims)
    if (h >= head_size && hopper_head_dim(h, cache)) return h;
  return 0;
}

// Shared memory per CTA of an mma_sync tile (VarlenTraits::kSmemBytes asserts it is its own):
// Q, then `stages` K + V stages (16-bit rows at a pitch of head_dim + 8 elements; TMA stages
// dense, with 1 KB of alignment slack; fp8 / NVFP4 rows padded by 16 bytes, NVFP4 scale rows after
// each side's tile), or the epilogue's fp32 O, row statistics and weights, whichever is larger.
constexpr int tile_smem_bytes(const TileConfig& t, int head_dim, CacheKind cache) {
  const int pitch = head_dim + 8, row = kv_row_bytes(head_dim, cache);
  const bool tma = t.fill == KvFill::tma;
  const int stage_pitch = tma ? row : quantized(cache) ? row + 16 : 2 * pitch;
  const int stage_tile = t.keys * stage_pitch + t.keys * kv_scale_row_bytes(head_dim, cache);
  const int main = t.rows * pitch * 2 + t.stages * 2 * stage_tile + (tma ? 1024 : 0);
  const int o_pitch = head_dim / t.o_slices + 8;
  const int epi = t.warps_n * t.rows * o_pitch * 4 + t.warps_n * t.rows * 8 + t.rows * t.warps_n * 4;
  return main > epi ? main : epi;
}

// Empty when the mma_sync tiles a launch of (head dim, cache kind) may take on a device of
// compute capability cc (the prefill tile; the cp.async decode tile up to its largest dim, as
// on every device, its TMA variants on sm90, which has the most shared memory) fit the device's
// shared memory per block (cuda_archs.h smem_per_block_optin), else which one does not, in words.
std::string tile_smem_refusal(int head_dim, CacheKind cache, int cc);

}  // namespace attnkit::flash_attn
