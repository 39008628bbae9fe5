// The launcher of the mma_sync kernel skeleton: maps a LaunchPlan's tile (launch_plan.h) to its
// instantiation and launches it with the plan's switches. It decides nothing: every choice is
// choose_launch's. Explicitly instantiated per (dtype, head size, cache kind) in varlen_hd*.cu.
#pragma once
#include <string>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device_props.h"
#include "cuda/pdl.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/varlen_kernel.cuh"

namespace attnkit::flash_attn {

template <class Tr, class PageMap>
void launch_varlen(VarlenKernelParams p, const LaunchPlan& plan, cudaStream_t stream) {
  dim3 grid;
  if (!varlen_grid(p, plan, Tr::kSmemBytes, "flash_attn varlen attention", grid)) return;
  using Sched = GridScheduler<Tr::kBlockM, Tr::kBlockN, Tr::kOSliceCols>;
  using Epi = detail::SplitKvEpilogue<Tr>;
  using Src = KvSourceOf<Tr, PageMap>;
  auto kernel = attention_kernel<Tr, Sched, Src, Epi, cuda::Fp8Format::e4m3>;
  if constexpr (Tr::kFp8Cache)
    if (p.fp8_format == static_cast<int>(cuda::Fp8Format::e5m2))
      kernel = attention_kernel<Tr, Sched, Src, Epi, cuda::Fp8Format::e5m2>;
  ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  p.l2_prefetch = plan.l2_prefetch;
  p.l2_prefetch_ctas = plan.cta_slots;  // (the first wave only: CTAs are dispatched in linear order)
  p.kv_evict_first = plan.kv_evict_first;
  // (grid y = kv_head * num_splits + split: clusters of 1 x num_splits x 1 are one item's splits)
  p.cluster_merge = Tr::kClusterMerge && plan.cluster_merge;
  const dim3 cluster(1, p.cluster_merge ? static_cast<unsigned>(p.num_splits) : 1u, 1);
  cuda::launch_kernel(kernel, grid, dim3(Tr::kThreads), Tr::kSmemBytes, stream, plan.pdl, cluster, p);
}

// The plan's tile over the launch's pages: the block table, or (p.cu_seqlens_k set) contiguous
// rows, which only the cp.async tiles read (the plan never picks a TMA tile for them).
template <class Elem, int kHeadDim, bool kFp8Cache>
void launch_mma_sync(const VarlenKernelParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  bool launched = false;
  const bool contiguous = p.cu_seqlens_k != nullptr;
  auto try_tile = [&]<TileId kTile>() {
    constexpr TileConfig kCfg = tile_config(kTile, kHeadDim, kFp8Cache);
    if constexpr (tile_instantiated(kTile, kHeadDim, kFp8Cache) && kCfg.generation == Generation::mma_sync) {
      if (plan.tile == kTile && !contiguous) {
        launch_varlen<VarlenTraits<Elem, kHeadDim, kFp8Cache, kTile>, cuda::BlockTablePages>(p, plan, stream);
        launched = true;
      }
      if constexpr (kCfg.fill == KvFill::cp_async) {
        if (plan.tile == kTile && contiguous) {
          launch_varlen<VarlenTraits<Elem, kHeadDim, kFp8Cache, kTile>, cuda::ContiguousPages>(p, plan, stream);
          launched = true;
        }
      }
    }
  };
  try_tile.template operator()<TileId::prefill>();
  try_tile.template operator()<TileId::decode>();
  try_tile.template operator()<TileId::decode_tma>();
  try_tile.template operator()<TileId::decode_two_stage>();
  try_tile.template operator()<TileId::decode_transposed>();
  try_tile.template operator()<TileId::decode_transposed_two_stage>();
  ATTNKIT_REQUIRE(launched, "flash_attn varlen attention", "tile", plan.config.name,
                  "is not an mma_sync tile built for head size " + std::to_string(kHeadDim) +
                      (kFp8Cache ? " with an fp8 cache" : "") + (contiguous ? " over contiguous K/V" : ""));
}

}  // namespace attnkit::flash_attn

// Explicit instantiation of every mma_sync tile of one (dtype, head size, cache kind).
#define ATTNKIT_VARLEN_INSTANTIATE(ELEM, HEAD_DIM, FP8)                                                    \
  template void launch_mma_sync<ELEM, HEAD_DIM, FP8>(const VarlenKernelParams&, const LaunchPlan&, cudaStream_t);
