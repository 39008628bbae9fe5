// The kernel traits of the mma_sync generation: a tile of tile_set.h (rows, warps, keys,
// stages, CTAs per SM, fill, layout) for one (dtype, head size, cache kind), with every size the
// kernel derives from it (fragments, shared-memory layout, epilogue scratch). The launcher
// (varlen_launcher.cuh) is explicitly instantiated per head size in varlen_hd*.cu.
//
// A CTA serves one work item: (request, KV head, tile of kBlockM packed query rows, split).
// Packed row m of a request is (query token m / group, query head kv_head * group + m % group),
// so the query heads that share a KV head share every K/V tile the CTA loads (GQA packing).
// Each warp owns kMFrags m16 row fragments (kWarpsM warps along M) and 1/kWarpsN of each K/V
// tile's keys; warps along N hold independent softmax states merged in the epilogue.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "flash_attn/launch_plan.h"
#include "flash_attn/tile_set.h"
#include "flash_attn/varlen_params.h"

namespace attnkit::flash_attn {

constexpr int max_c(int a, int b) { return a > b ? a : b; }

template <class Elem_, int kHeadDim_, CacheKind kCache_, TileId kTile_>
struct VarlenTraits {
  static constexpr TileId kTile = kTile_;
  static constexpr TileConfig kConfig = tile_config(kTile_, kHeadDim_, kCache_);
  static_assert(kConfig.generation == Generation::mma_sync, "an mma_sync tile");
  static_assert(tile_instantiated(kTile_, kHeadDim_, kCache_), "a tile the launch decision may pick");
  using Elem = Elem_;  // __nv_bfloat16 or __half: q and out
  static constexpr CacheKind kCache = kCache_;
  static constexpr bool kFp8Cache = kCache_ == CacheKind::fp8;    // fp8 fragments (cuda/fp8_dequant.h)
  static constexpr bool kFp4Cache = kCache_ == CacheKind::nvfp4;  // NVFP4 fragments (cuda/fp4_dequant.h)
  static constexpr bool kQuantCache = quantized(kCache_);
  // The MMA operand type: fp8 and NVFP4 caches run both GEMMs in f16 (every fp8 value, and every
  // e2m1 code times its e4m3 block scale, is exact in f16; P gains precision; a bf16 Q is
  // rescaled by a power of two into f16 range first).
  using MmaElem = std::conditional_t<kQuantCache, __half, Elem_>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kMFrags = kConfig.m_frags;  // m16 row fragments per warp
  static constexpr int kWarpsM = kConfig.warps_m, kWarpsN = kConfig.warps_n;
  static constexpr int kWarpRows = 16 * kMFrags;
  static constexpr int kBlockM = kWarpRows * kWarpsM;
  static_assert(kBlockM == kConfig.rows, "rows = 16 x fragments x warps along M");
  static constexpr int kMinBlocksPerSm = kConfig.ctas_per_sm;
  static constexpr int kBlockN = kConfig.keys;
  static constexpr int kStages = kConfig.stages;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;

  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys per warp per tile
  static constexpr int kSFrags = kWarpKeys / 8;        // n8 fragments of a warp's S tile
  // Output columns: a CTA computes kODim of them, from column o_col0 of its work item
  // (WorkItem; o_slices CTAs per item: tile_set.h), and all of S.
  static constexpr int kOSlices = kConfig.o_slices;
  static constexpr int kODim = kHeadDim / kOSlices;
  static constexpr int kOSliceCols = kOSlices > 1 ? kODim : 0;  // (the schedulers' slice width; 0: none)
  static constexpr int kOFrags = kODim / 8;            // n8 fragments of a warp's O tile
  static constexpr int kKSteps = kHeadDim / 16;        // k16 steps of S = Q K^T
  // One row fragment of Q stays in registers; more (or larger heads) are re-read from smem.
  static constexpr bool kQInRegs = kMFrags == 1 && kHeadDim <= 128;
  // The transposed decode tile (fp8 caches, <= 8 packed rows; varlen_decode_transposed.cuh):
  // S^T = K Q^T with a warp's 16 keys on the MMA's M and the rows on N, O^T = V^T P^T with the
  // head dimension on M. Half the MMAs, exp2 and output registers of the 16-row tile.
  static constexpr bool kTransposed = kConfig.transposed;
  static constexpr int kMaxRows = kTransposed ? kTransposedMaxRows : kBlockM;  // packed rows a work item may have
  static constexpr int kAccSFrags = kTransposed ? kWarpKeys / 16 : kSFrags;  // C fragments of S (S^T)
  static constexpr int kAccOFrags = kTransposed ? kODim / 16 : kOFrags;   // C fragments of O (O^T)

  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 512, "head dims are multiples of 16, <= 512");
  static_assert(kODim <= 256 && kHeadDim % kOSlices == 0 && (kOSlices == 1 || !kTransposed),
                "an output slice of at most 256 columns");
  static_assert(kWarpKeys % 16 == 0, "each warp needs whole k16 steps of keys");
  static_assert(!kFp8Cache || (kHeadDim % 32 == 0 && kKSteps % 2 == 0),
                "fp8 fragments come in 32-dim groups and pairs of k16 steps");
  static_assert(!kFp4Cache || (kHeadDim % 64 == 0 && !kTransposed && kOSlices == 1 && kConfig.fill == KvFill::cp_async),
                "NVFP4 fragments come in 64-dim groups, on the cp.async decode tile");
  static_assert(!kTransposed || (kFp8Cache && kMFrags == 1 && kWarpsM == 1 && kQInRegs),
                "the transposed tile is the fp8 decode tile with Q in registers");

  // Shared memory. 16-bit tiles have a pitch of kHeadDim + 8 elements (16 bytes of padding:
  // the 8 rows of an ldmatrix phase hit distinct banks); fp8 tiles are padded by 16 bytes.
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kKvRowBytes = kv_row_bytes(kHeadDim, kCache);  // in the cache
  static constexpr int kScaleRowBytes = kv_scale_row_bytes(kHeadDim, kCache);  // NVFP4 block scales
  // Stages filled by TMA (decode, sm90; varlen_kernel.cuh) are dense: rows of kKvRowBytes in
  // the 128-byte-swizzled layout of cuda/kv_smem_layout.h, whose tiles start 1024-byte aligned
  // (the kernel rounds the stage base up: 1 KB of slack).
  static constexpr bool kTmaStages = kConfig.fill == KvFill::tma;
  // NVFP4 stages: each side's tile of packed rows is followed by its tile of scale rows (dense).
  static constexpr int kStagePitchBytes = kTmaStages ? kKvRowBytes : kQuantCache ? kKvRowBytes + 16 : 2 * kPitch;
  static constexpr int kQBytes = kBlockM * kPitch * 2;
  static constexpr int kStageDataBytes = kBlockN * kStagePitchBytes;  // the rows of one side
  static constexpr int kStageScaleBytes = kBlockN * kScaleRowBytes;   // ... its block scales
  static constexpr int kStageTileBytes = kStageDataBytes + kStageScaleBytes;  // K or V of one stage
  static constexpr int kStageBytes = 2 * kStageTileBytes;
  static constexpr int kStagesOffset = kQBytes;
  static constexpr int kTmaSlack = kTmaStages ? 1024 : 0;
  static_assert(!kTmaStages || (kKvRowBytes % 128 == 0 && kKvRowBytes <= 512 && kBlockN % 16 == 0 &&
                                kStageTileBytes % 1024 == 0),
                "TMA stages need rows of whole 128-byte segments (up to 512) and 1024-byte tiles");
  static constexpr int kMainBytes = kStagesOffset + kStages * kStageBytes + kTmaSlack;
  // Epilogue (reuses everything): per-warp-column fp32 O, per-row softmax stats and weights.
  static constexpr int kOPitch = kODim + 8;
  static constexpr int kEpiOBytes = kWarpsN * kBlockM * kOPitch * 4;
  static constexpr int kEpiStatBytes = kWarpsN * kBlockM * 8;
  static constexpr int kEpiWeightBytes = kBlockM * kWarpsN * 4;
  static constexpr int kEpiBytes = kEpiOBytes + kEpiStatBytes + kEpiWeightBytes;
  static constexpr int kSmemBytes = max_c(kMainBytes, kEpiBytes);
  static_assert(kSmemBytes == tile_smem_bytes(kConfig, kHeadDim, kCache), "tile_set.h's count is the traits'");
  // Split merge inside a thread-block cluster (decode tiles, sm90): each split CTA leaves its
  // normalised partial rows (fp32) and their LSEs here, past the epilogue's scratch, for rank 0
  // to read through distributed shared memory.
  static constexpr int kClusterPartOffset = kEpiBytes;
  static constexpr int kClusterPartBytes = kBlockM * kODim * 4 + kBlockM * 4;
  static constexpr bool kClusterMerge =
      kOSlices == 1 && kBlockM <= 16 && kClusterPartOffset + kClusterPartBytes <= kSmemBytes;
};

// Launches tile plan.tile of the kernel for (Elem, kHeadDim, kCache: 16-bit or fp8) (varlen_launcher.cuh,
// instantiated in varlen_hd*.cu). Throws Error on launch failure, when the device lacks the
// shared memory, or for a tile this configuration does not instantiate.
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_mma_sync(const VarlenKernelParams& p, const LaunchPlan& plan, cudaStream_t stream);

// The planned (FlashInfer-style) decode of (Elem, kHeadDim, kCache) for plan.tile
// (varlen_launcher.cuh, instantiated in varlen_hd{64,128,256}_*.cu for kPlannedHeadDims: the
// varlen launches' kernels, which take the plan's items where p.plan_items is set).
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_planned(VarlenKernelParams p, const LaunchPlan& plan, int64_t grid_items, cudaStream_t stream);

}  // namespace attnkit::flash_attn
