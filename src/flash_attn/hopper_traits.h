// Tile configuration of the hopper generation's varlen kernel (wgmma, sm_90a) and the
// declaration of its launcher, explicitly instantiated in hopper_hd*.cu.
//
// A CTA serves the same work item as the mma_sync kernels (varlen_schedule.cuh): 128 packed
// query rows of one request and KV head (hopper_wide: 192), all K/V tiles of one split. Two
// consumer warpgroups (hopper_wide: three) own 64 rows each; every warp of a warpgroup holds 16
// rows, the layout the mma_sync epilogue and softmax already use. Q and the K/V tiles
// arrive by cp.async or TMA (K/V through the page map) in 128-byte-swizzled shared memory that
// wgmma reads by descriptor (fp8 K codes and the e4m3 Q copy: 64-byte-swizzled); P stays in
// registers (the A operand of O = P V); with fp8 caches the producer rounds Q to e4m3 in its
// buffer (q8_offset).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/tile_copy_layout.h"
#include "flash_attn/varlen_params.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/tile_set.h"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn {

// kTile_ (tile_set.h: hopper, hopper_short, hopper_wide): its stages are the depth of the K
// ring and of the V ring; its Q buffers the Q tiles in shared memory (2: a persistent CTA loads the next item's
// Q while it still computes on the current one). kCache_: 16-bit caches, or fp8 ones: then both
// GEMMs run on the fp8 wgmma, S = Q K^T on K's codes as they are in the cache with Q quantised
// to e4m3 by the producer (a power-of-two scale per consumer warpgroup), O += P V on V's codes, which
// the producer transposes into a K-major Vt tile, with P rounded to e4m3 (times 2^8:
// cuda::RowSoftmax::p_log2) in slot order (cuda::Fp8VTranspose): docs/architecture.md section
// 9; the dequant scales fold into the softmax scale (K, over Q's scale) and the epilogue (V,
// over P's).
template <class Elem_, int kHeadDim_, TileId kTile_, CacheKind kCache_ = CacheKind::b16>
struct HopperTraits {
  static constexpr TileConfig kConfig = tile_config(kTile_, kHeadDim_, kCache_);
  static_assert(kConfig.generation == Generation::hopper && tile_instantiated(kTile_, kHeadDim_, kCache_),
                "a hopper tile");
  static constexpr CacheKind kCache = kCache_;
  static constexpr bool kFp8Cache = kCache == CacheKind::fp8, kFp4Cache = false, kQuantCache = kFp8Cache;
  using Elem = Elem_;
  using MmaElem = Elem_;  // the 16-bit GEMMs' inputs (16-bit caches)
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarpGroups = kConfig.warps_m;  // consumers: 64 rows each (2; hopper_wide 3)
  static constexpr int kConsumerThreads = 128 * kWarpGroups;
  static constexpr int kProducerThreads = 128;  // the third warpgroup loads Q and K / V
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // Registers per thread after setmaxnreg. The CTA's pool is what it launched with: 168 per
  // thread (65536 / 384, rounded down to 8) x 384, with three consumer warpgroups 128 x 512; a
  // split that asks for more blocks the consumers' setmaxnreg.inc forever (static_assert below).
  // Three consumer warpgroups (head dim 64: O 32 fp32, S 64, P 32): 3 x 160 + 32 = 512, with
  // either fill; ptxas 13.0 keeps a few loop-invariant values of the consumers in local memory
  // (about 20 spill stores per kernel, mostly per item), and at 152 reports serialised wgmmas.
  // Two, 16-bit caches: 2 x 224 + 56 at every head dim (the group-column producer fits 56
  // without spills; head dim 256's O alone is 128 fp32 per thread and spills at 216).
  // fp8 caches: P is half the registers (e4m3), and the producer transposes V through
  // registers (16 words a unit: hopper_fill.cuh): 2 x 208 + 88 up to head dim 192, 2 x 216 + 72
  // at 256, 3 x 152 + 56 (ptxas 13.0 still reports spill stores of 172 bytes at head dim 64's
  // wide tile and 12-56 at 256; none at 128 / 192). Measured: DECISIONS.md, Hopper register split.
  static constexpr int kProducerRegs = kWarpGroups == 3 ? (kFp8Cache ? 56 : 32) : !kFp8Cache ? 56 : kHeadDim <= 192 ? 88 : 72,
                       kConsumerRegs = kWarpGroups == 3 ? (kFp8Cache ? 152 : 160) : !kFp8Cache ? 224 : kHeadDim <= 192 ? 208 : 216;
  // Named barriers (0 is __syncthreads): 1 .. kWarpGroups the consumers' turns at the tensor
  // cores (warpgroup g waits on turn_bar(g), then hands the turn to g + 1), one per consumer
  // warpgroup of its own 128 threads, then the producer warpgroup's.
  static constexpr int turn_bar(int wg) { return 1 + wg; }
  static constexpr int group_bar(int wg) { return 1 + kWarpGroups + wg; }
  static constexpr int kProducerBar = 1 + 2 * kWarpGroups;
  static_assert(kProducerBar < 16, "16 named barriers");
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static_assert(kWarpGroups * kConsumerRegs + kProducerRegs <= (kWarpGroups + 1) * kLaunchRegs,
                "setmaxnreg: the warpgroups' registers must fit the CTA's pool at launch");
  static constexpr int kBlockM = 64 * kWarpGroups;
  static_assert(kBlockM == kConfig.rows, "64 rows per consumer warpgroup");
  static constexpr int kBlockN = kConfig.keys;
  // Whether planned launches run this tile (its kernel then walks a plan's items too: HopperWalk).
  static constexpr bool kPlanned = planned_head_dim(kHeadDim) && kTile_ != TileId::hopper_wide;
  static constexpr int kSFrags = kBlockN / 8;
  static constexpr int kOFrags = kHeadDim / 8;
  static constexpr int kKSteps = kHeadDim / 16;
  // S = Q K^T is one wgmma of N = kBlockN per k16 step; O += P V runs in column ranges of kPvCols
  // and a last one of kPvTail (head dim 96: 64 + 32; wgmma wrappers exist for N = 32, 64 and
  // 128: wgmma_sm90.h).
  static constexpr int kPvCols = kHeadDim % 128 == 0 ? 128 : 64;
  static constexpr int kPvTail = kHeadDim % kPvCols;
  // The running row maxima stay while a tile's scores exceed them by at most 2^8 after exp2
  // (RowSoftmax::step: the quad's shuffles and the rescale leave the softmax's path in most
  // tiles). fp8 P is e4m3 times 2^8 already (448 at most): exact maxima there.
  static constexpr int kMaxSlackLog2 = kFp8Cache ? 0 : 8;
  // Every tile of an item after its first takes its exponentials at the stored maxima before
  // any maximum of the tile (softmax_scores_speculative: no tree of maxima on the softmax's
  // path); the rare tile whose P would exceed 2^kMaxSlackLog2 computes S again. fp8 P has no
  // such headroom (e4m3 x 2^8); 64-key tiles lose more (the group's barrier, K held through the
  // softmax) than their shorter tree costs (DECISIONS.md: Hopper: speculative exponentials).
  static constexpr bool kSpeculativeExp = kMaxSlackLog2 > 0 && kBlockN == 128;
  static_assert((kBlockN == 64 || kBlockN == 128) && (kPvTail == 0 || (kPvTail == 32 && !kFp8Cache)),
                "wgmma wrappers exist for N = 64 and 128 (16-bit P V also 32)");
  // Shared-memory tiles are whole regions of 64 columns (tile_set.h hopper_region_dims): at head
  // dim 96 the second region's columns 96-127 are neither copied nor read.
  static constexpr int kRegionDims = hopper_region_dims(kHeadDim);

  // Shared memory (from a 1024-byte aligned base): a ring of kKStages K tiles, a ring of
  // kVStages V tiles, each 16-bit tile kRegionDims / 64 regions of kBlockN 128-byte lines, then the
  // Q buffers in the same swizzled layout (kBlockM lines per region; warpgroup g reads lines
  // 64g .. 64g+63). fp8 caches: a K tile is kHeadDim / 64 regions of kBlockN 64-byte lines
  // (cuda::Swizzle64Tile), Q's e4m3 copy lives in its own Q buffer (q8_offset); a V stage is the Vt tile
  // (kHeadDim lines of kBlockN codes) and then the staged codes the producer transposes into it
  // (cuda::Fp8VTranspose), the same bytes as a 16-bit V tile.
  // Q is the A operand of S = Q K^T from shared memory: with Q in registers (the RS form),
  // ptxas 13.0 reused Q's registers for P inside the loop (seen in the SASS), which broke
  // every work item of more than one K/V tile.
  static constexpr int kKTileBytes = hopper_k_stage_bytes(kHeadDim, kBlockN, kCache);
  static constexpr int kVTileBytes = hopper_v_stage_bytes(kHeadDim, kBlockN);
  static constexpr int kKStages = kConfig.k_stages, kVStages = kConfig.stages;  // (tile_set.h)
  static constexpr int kQBuffers = kConfig.q_buffers;
  static constexpr int kQBytes = hopper_q_bytes(kHeadDim, kBlockM, 1);
  static constexpr int kVOffset = kKStages * kKTileBytes;
  static constexpr int kQOffset = kVOffset + kVStages * kVTileBytes;
  // fp8 caches: warpgroup g's e4m3 Q rows in its own lines of the Q buffer (64 lines from 64 g
  // of each 64-dim region, 8 KB), in the upper half of them: region r of its codes (64 rows of
  // 64, the 64-byte swizzle: atoms of 8 rows, 512 bytes) in 16-bit region h = kHeadDim / 64 + r,
  // its atoms 1024 bytes apart from 512 (h % 2) on. So each warp's 16 code rows stay in its own
  // 16 lines, which only its epilogue writes, after the warpgroup's last S (as with 16-bit Q);
  // q8_chunk: code chunk c of row m from the region's start.
  static constexpr uint32_t q8_offset(int r) {
    const int h = kHeadDim / 64 + r;
    return static_cast<uint32_t>((h / 2) * (kBlockM * 128) + (h % 2) * 512);
  }
  static constexpr uint32_t q8_chunk(int m, int c) { return (m / 8) * 1024 + cuda::Swizzle64Tile<8>::offset(m % 8, c); }
  static constexpr int kAlign = 1024;  // swizzle atoms
  static constexpr int kSmemBytes = kQOffset + hopper_q_bytes(kHeadDim, kBlockM, kQBuffers) + kAlign;
  static_assert(kVOffset % kAlign == 0 && kQOffset % kAlign == 0 && kQBytes % kAlign == 0,
                "tiles start at whole swizzle atoms");
  static_assert(kSmemBytes <= kHopperSmemBytes + kAlign, "K/V rings and Q buffers must fit the opt-in shared memory");
};

// Launches the hopper kernel for (Elem, kHeadDim, cache kind) with the plan's tile (hopper /
// hopper_short), grid and CTA count (hopper_kernel.cuh); fp8 caches in p's format. The plan
// only picks it on an sm90 device of a build with sm_90a code.
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_hopper(const VarlenKernelParams& p, const LaunchPlan& plan, cudaStream_t stream);
// The same kernel over a planned part (FlashInfer-style): the plan's items (capacity
// grid_items) x KV heads walked by plan.ctas CTAs where the plan is persistent, else one CTA
// per entry (HopperWalk's PlanWalk); the page table as the page map.
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_hopper_planned(const VarlenKernelParams& p, const LaunchPlan& plan, int64_t grid_items,
                           cudaStream_t stream);

}  // namespace attnkit::flash_attn
