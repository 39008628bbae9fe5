// Tile configurations of the varlen attention kernel family (mma.sync generation) and the
// declaration of its launcher, explicitly instantiated per head size in varlen_hd*.cu.
//
// A CTA serves one work item: (request, KV head, tile of kBlockM packed query rows, split).
// Packed row m of a request is (query token m / group, query head kv_head * group + m % group),
// so the query heads that share a KV head share every K/V tile the CTA loads (GQA packing).
// Each warp owns kMFrags m16 row fragments (kWarpsM warps along M) and 1/kWarpsN of each K/V
// tile's keys; warps along N hold independent softmax states merged in the epilogue.
//  * Prefill, head size <= 128: 4 warps x 32 rows = 128 rows, 64-key tiles (every K/V
//    fragment read from shared memory feeds two row fragments), two CTAs per SM.
//  * Prefill, head size 192 / 256: 8 warps x 16 rows (the fp32 output of 32 rows would not
//    fit in registers).
//  * Decode (packed rows <= 16, e.g. one token x its GQA group): 16 rows, 4 warps along N,
//    so all four warps' tensor cores and load slots work on one KV stream.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "flash_attn/varlen_params.h"

namespace attnkit::flash_attn {

constexpr int ceil_div_c(int a, int b) { return (a + b - 1) / b; }
constexpr int max_c(int a, int b) { return a > b ? a : b; }

template <class Elem_, int kHeadDim_, bool kFp8Cache_, int kMFrags_, int kWarpsM_, int kWarpsN_,
          int kBlockN_, int kStages_, int kMinBlocksPerSm_, bool kTmaStages_ = false, bool kTransposed_ = false>
struct VarlenTraits {
  using Elem = Elem_;  // __nv_bfloat16 or __half: q and out
  // The MMA operand type: fp8 caches run both GEMMs in f16 (every fp8 value is exact in f16,
  // P gains precision; a bf16 Q is rescaled by a power of two into f16 range first).
  using MmaElem = std::conditional_t<kFp8Cache_, __half, Elem_>;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kFp8Cache = kFp8Cache_;
  static constexpr int kMFrags = kMFrags_;  // m16 row fragments per warp
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_;
  static constexpr int kWarpRows = 16 * kMFrags;
  static constexpr int kBlockM = kWarpRows * kWarpsM;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;

  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys per warp per tile
  static constexpr int kSFrags = kWarpKeys / 8;        // n8 fragments of a warp's S tile
  static constexpr int kOFrags = kHeadDim / 8;         // n8 fragments of a warp's O tile
  static constexpr int kKSteps = kHeadDim / 16;        // k16 steps of S = Q K^T
  // One row fragment of Q stays in registers; more (or larger heads) are re-read from smem.
  static constexpr bool kQInRegs = kMFrags == 1 && kHeadDim <= 128;
  // The transposed decode tile (fp8 caches, <= 8 packed rows; varlen_decode_transposed.cuh):
  // S^T = K Q^T with a warp's 16 keys on the MMA's M and the rows on N, O^T = V^T P^T with the
  // head dimension on M. Half the MMAs, exp2 and output registers of the 16-row tile.
  static constexpr bool kTransposed = kTransposed_;
  static constexpr int kMaxRows = kTransposed ? 8 : kBlockM;  // packed rows a work item may have
  static constexpr int kAccSFrags = kTransposed ? kWarpKeys / 16 : kSFrags;  // C fragments of S (S^T)
  static constexpr int kAccOFrags = kTransposed ? kHeadDim / 16 : kOFrags;   // C fragments of O (O^T)

  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head size must be a multiple of 16, <= 256");
  static_assert(kWarpKeys % 16 == 0, "each warp needs whole k16 steps of keys");
  static_assert(!kFp8Cache || (kHeadDim % 32 == 0 && kKSteps % 2 == 0),
                "fp8 fragments come in 32-dim groups and pairs of k16 steps");
  static_assert(!kTransposed || (kFp8Cache && kMFrags == 1 && kWarpsM == 1 && kQInRegs),
                "the transposed tile is the fp8 decode tile with Q in registers");

  // Shared memory. 16-bit tiles have a pitch of kHeadDim + 8 elements (16 bytes of padding:
  // the 8 rows of an ldmatrix phase hit distinct banks); fp8 tiles are padded by 16 bytes.
  static constexpr int kPitch = kHeadDim + 8;
  static constexpr int kKvRowBytes = kFp8Cache ? kHeadDim : 2 * kHeadDim;  // in the cache
  // Stages filled by TMA (decode, sm90; varlen_kernel.cuh) are dense: rows of kKvRowBytes in
  // the 128-byte-swizzled layout of cuda/kv_smem_layout.h, whose tiles start 1024-byte aligned
  // (the kernel rounds the stage base up: 1 KB of slack).
  static constexpr bool kTmaStages = kTmaStages_;
  static constexpr int kStagePitchBytes = kTmaStages ? kKvRowBytes : kFp8Cache ? kHeadDim + 16 : 2 * kPitch;
  static constexpr int kQBytes = kBlockM * kPitch * 2;
  static constexpr int kStageTileBytes = kBlockN * kStagePitchBytes;  // K or V of one stage
  static constexpr int kStageBytes = 2 * kStageTileBytes;
  static constexpr int kStagesOffset = kQBytes;
  static constexpr int kTmaSlack = kTmaStages ? 1024 : 0;
  static_assert(!kTmaStages || (kKvRowBytes % 128 == 0 && kKvRowBytes <= 512 && kBlockN % 16 == 0 &&
                                kStageTileBytes % 1024 == 0),
                "TMA stages need rows of whole 128-byte segments (up to 512) and 1024-byte tiles");
  static constexpr int kMainBytes = kStagesOffset + kStages * kStageBytes + kTmaSlack;
  // Epilogue (reuses everything): per-warp-column fp32 O, per-row softmax stats and weights.
  static constexpr int kOPitch = kHeadDim + 8;
  static constexpr int kEpiOBytes = kWarpsN * kBlockM * kOPitch * 4;
  static constexpr int kEpiStatBytes = kWarpsN * kBlockM * 8;
  static constexpr int kEpiWeightBytes = kBlockM * kWarpsN * 4;
  static constexpr int kEpiBytes = kEpiOBytes + kEpiStatBytes + kEpiWeightBytes;
  // Split merge inside a thread-block cluster (decode tiles, sm90): each split CTA leaves its
  // normalised partial rows (fp32) and their LSEs here, past the epilogue's scratch, for rank 0
  // to read through distributed shared memory.
  static constexpr int kClusterPartOffset = kEpiBytes;
  static constexpr int kClusterPartBytes = kBlockM * kHeadDim * 4 + kBlockM * 4;
  static constexpr int kSmemBytes = max_c(kMainBytes, kEpiBytes);
  static constexpr bool kClusterMerge = kBlockM <= 16 && kClusterPartOffset + kClusterPartBytes <= kSmemBytes;
};

template <class Elem, int kHeadDim, bool kFp8Cache>
using PrefillTraits = std::conditional_t<(kHeadDim <= 128),
                                         VarlenTraits<Elem, kHeadDim, kFp8Cache, 2, 4, 1, 64, 2, 2>,
                                         VarlenTraits<Elem, kHeadDim, kFp8Cache, 1, 8, 1, 64, 2, 1>>;

// fp8 tiles are half the bytes: for head sizes <= 128 three CTAs fit per SM and hide more of
// each tile's latency (H200, batch 64 x 8k keys: 319-331 us against 324-349 us at 2 CTAs/SM;
// 128-key tiles measured the same within run-to-run noise, 311-342 us).
// Tried and dropped (commit 22ef71a, DISABLED_VarlenTiming.DecodeVariants, H200): one
// cp.async.bulk per K/V row (256 / 128 bytes in the NHD cache) completing on per-stage
// mbarriers, instead of 16-byte cp.async: bf16 b128 x 4k 532 vs 523 us, fp8 438 vs 320 us
// (small bulk copies queue on the SM's copy engine); 1 CTA per SM with 6 stages: b64 x 8k
// 678 vs 525 us (the per-tile MMA / softmax chain needs two CTAs to overlap).
template <class Elem, int kHeadDim, bool kFp8Cache>
using DecodeTraits =
    VarlenTraits<Elem, kHeadDim, kFp8Cache, 1, 1, 4, 64, 3, ((kFp8Cache && kHeadDim <= 128) ? 3 : 2)>;

// Decode with TMA stage fills (sm90, rows of whole 128-byte segments): the same tiles in dense
// stages.
template <class Elem, int kHeadDim, bool kFp8Cache>
constexpr bool kDecodeTmaRows = (kHeadDim * (kFp8Cache ? 1 : 2)) % 128 == 0 && kHeadDim * (kFp8Cache ? 1 : 2) <= 512;
template <class Elem, int kHeadDim, bool kFp8Cache>
using DecodeTmaTraits =
    VarlenTraits<Elem, kHeadDim, kFp8Cache, 1, 1, 4, 64, 3, ((kFp8Cache && kHeadDim <= 128) ? 3 : 2), true>;

// 16-bit caches, head size <= 128, grids of one to two CTAs per SM (sm90): TMA stages, 2 of
// them, in a CTA that fits 3 per SM (70.9 KB of shared memory at head size 128, 168 registers,
// no spills). Same-run A/B against the 3-stage cp.async tile at 2 CTAs per SM (H200, bf16, 2
// splits, bench decode-ab): 16 x 4k 86 vs 84% of read BW, 16 x 32k 95 vs 91% in one run, 84 vs
// 83% and 92 vs 91% in the next (bf40166); 1 x 32k (256 CTAs) 64 vs 63%. The split count stays
// that of 2 CTAs per SM (3 splits on it: 84 / 93%). A grid of more than 2 per SM keeps the
// 3-stage tile (batch 64 x 4k unsplit on it: 84 vs 90%), and so does one of at most 1 per SM
// (1 x 4k, 64 CTAs: 24 vs 25%).
template <class Elem, int kHeadDim>
using DecodeTwoStageTraits = VarlenTraits<Elem, kHeadDim, false, 1, 1, 4, 64, 2, 3, true>;

// The transposed decode tile (fp8 caches, head size <= 128, <= 8 packed rows, sm90 TMA stages):
// with half the registers of O it fits 4 CTAs per SM under the 128-register cap without spills,
// where the 16-row fp8 tile spilled 124 bytes.
template <class Elem, int kHeadDim>
using DecodeTransposedTraits = VarlenTraits<Elem, kHeadDim, true, 1, 1, 4, 64, 3, 4, true, true>;
// ... with 2 stages, for grids of more than 3 CTAs per SM (launch_decode). H200, bench
// decode-ab in turns with 3 stages (tenth session): 512 CTAs on 528 slots fp8 64 x 4k +3.5%,
// 16 x 4k at 4 splits +1.5% and 16 x 32k at 4 splits +2.3% against 3 stages at 3 splits (the
// split rule's count before); in grids of at most 3 per SM 3 stages win (16 x 4k at 3 splits
// -3.7% with 2, 1 x 32k -4.5%; 4 stages at 3 per SM lost as well, 16 x 32k 79 vs 84% of read BW).
template <class Elem, int kHeadDim>
using DecodeTransposedTwoStageTraits = VarlenTraits<Elem, kHeadDim, true, 1, 1, 4, 64, 2, 4, true, true>;

// Launches the kernel of configuration Tr (defined in varlen_kernel.cuh, instantiated in
// varlen_hd*.cu). Throws Error on launch failure or when the device lacks the shared memory.
template <class Tr>
void launch_varlen(const VarlenKernelParams& p, const VarlenLaunchShape& shape, cudaStream_t stream);

// Decode tiles (sm90, where the cache's tensor maps encode; VarlenLaunchShape::kv_fill and
// transposed_decode can refuse TMA / the transposed tile): DecodeTransposedTraits for fp8 with
// <= 8 packed rows at head size 128 (DecodeTransposedTwoStageTraits in grids of more than 3
// CTAs per SM; VarlenLaunchShape::transposed_stages forces either), DecodeTwoStageTraits for
// 16-bit caches in grids of one to two CTAs per SM, DecodeTmaTraits for fp8 grids of more than
// one wave (or kv_fill tma), else DecodeTraits (cp.async).
template <class Elem, int kHeadDim, bool kFp8Cache>
void launch_decode(const VarlenKernelParams& p, const VarlenLaunchShape& shape, cudaStream_t stream);

}  // namespace attnkit::flash_attn
