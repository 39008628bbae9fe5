// The launcher of the mma_sync kernel skeleton: maps a LaunchPlan's tile (launch_plan.h) to its
// instantiation and launches it with the plan's switches. It decides nothing: every choice is
// choose_launch's. Explicitly instantiated per (dtype, head size, cache kind) in varlen_hd*.cu.
#pragma once
#include <iterator>
#include <string>
#include <utility>

#include "attnkit/error.h"
#include "cuda/cuda_check.h"
#include "cuda/device_props.h"
#include "cuda/pdl.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/varlen_kernel.cuh"

namespace attnkit::flash_attn {

// The skeleton's kernel of (Tr, Sched, Src, Epi) for the launch's fp8 format (a template
// parameter: cuda/fp8_dequant.h), with its shared memory opted in.
template <class Tr, class Sched, class Src, class Epi>
auto kernel_for(const VarlenKernelParams& p) {
  auto kernel = attention_kernel<Tr, Sched, Src, Epi, cuda::Fp8Format::e4m3>;
  if constexpr (Tr::kFp8Cache)
    if (p.fp8_format == static_cast<int>(cuda::Fp8Format::e5m2))
      kernel = attention_kernel<Tr, Sched, Src, Epi, cuda::Fp8Format::e5m2>;
  ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  return kernel;
}

// f.template operator()<id>() for every tile of tile_set.h (kAllTiles).
template <class F>
void for_each_tile(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f.template operator()<kAllTiles[I]>(), ...);
  }(std::make_index_sequence<std::size(kAllTiles)>{});
}

template <class Tr>
void launch_varlen(VarlenKernelParams p, const LaunchPlan& plan, cudaStream_t stream) {
  dim3 grid;
  if (!varlen_grid(p, plan, Tr::kSmemBytes, "flash_attn varlen attention", grid)) return;
  using Sched = GridScheduler<Tr::kBlockM, Tr::kBlockN, Tr::kOSliceCols>;
  using Epi = detail::SplitKvEpilogue<Tr>;
  const auto kernel = kernel_for<Tr, Sched, KvSourceOf<Tr>, Epi>(p);
  p.l2_prefetch = plan.l2_prefetch;
  p.l2_prefetch_ctas = plan.cta_slots;  // (the first wave only: CTAs are dispatched in linear order)
  p.kv_evict_first = plan.kv_evict_first;
  // (grid y = kv_head * num_splits + split: clusters of 1 x num_splits x 1 are one item's splits)
  p.cluster_merge = Tr::kClusterMerge && plan.cluster_merge;
  const dim3 cluster(1, p.cluster_merge ? static_cast<unsigned>(p.num_splits) : 1u, 1);
  cuda::launch_kernel(kernel, grid, dim3(Tr::kThreads), Tr::kSmemBytes, stream, plan.pdl, cluster, p);
}

// The plan's tile over the launch's pages: the block table, or (p.cu_seqlens_k set) contiguous
// rows, which only the cp.async tiles read (the plan never picks a TMA tile for them). One
// kernel per tile serves both (the page map is a runtime choice: cuda/paged_kv_tile.h KvPages).
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_mma_sync(const VarlenKernelParams& p, const LaunchPlan& plan, cudaStream_t stream) {
  bool launched = false;
  const bool contiguous = p.cu_seqlens_k != nullptr;
  auto try_tile = [&]<TileId kTile>() {
    constexpr TileConfig kCfg = tile_config(kTile, kHeadDim, kCache);
    if constexpr (tile_instantiated(kTile, kHeadDim, kCache) && kCfg.generation == Generation::mma_sync) {
      if (plan.tile == kTile && (!contiguous || kCfg.fill == KvFill::cp_async)) {
        launch_varlen<VarlenTraits<Elem, kHeadDim, kCache, kTile>>(p, plan, stream);
        launched = true;
      }
    }
  };
  for_each_tile(try_tile);
  ATTNKIT_REQUIRE(launched, "flash_attn varlen attention", "tile", plan.config.name,
                  "is not an mma_sync tile built for head size " + std::to_string(kHeadDim) +
                      " with a " + cache_kind_name(kCache) + " cache" + (contiguous ? " over contiguous K/V" : ""));
}

// A planned launch (FlashInfer-style): the plan's tile (a decode tile, or the prefill tile for a
// prefill part) over the page table, one CTA per planned item slot (grid_items: the plan's
// count, or its capacity for graph-safe launches: slots past the count exit) and KV head; split tiles write the plan's partial
// rows (merged by the caller after the launch).
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_planned(VarlenKernelParams p, const LaunchPlan& plan, int64_t grid_items, cudaStream_t stream) {
  const char* where = "flashinfer planned launch";
  const int64_t ctas = grid_items * p.num_kv_heads;  // (PlanScheduler: item-major, KV heads inner)
  ATTNKIT_REQUIRE(grid_items > 0 && ctas <= 0x7fffffff, where, "plan item capacity x num_kv_heads", ctas,
                  "must be in [1, 2^31) (one grid dimension)");
  bool launched = false;
  auto try_tile = [&]<TileId kTile>() {
    constexpr TileConfig kCfg = tile_config(kTile, kHeadDim, kCache);
    if constexpr (tile_instantiated(kTile, kHeadDim, kCache) && kCfg.generation == Generation::mma_sync &&
                  kCfg.o_slices == 1) {
      if (plan.tile != kTile) return;
      using Tr = VarlenTraits<Elem, kHeadDim, kCache, kTile>;
      // (the varlen launch's kernel: GridScheduler and SplitPartials take the plan's items and
      // partial rows where p.plan_items is set)
      using Sched = GridScheduler<Tr::kBlockM, Tr::kBlockN, Tr::kOSliceCols>;
      using Epi = detail::SplitKvEpilogue<Tr>;
      using Src = KvSourceOf<Tr>;
      // (an item has min(tile_q, its packed rows) rows; the transposed tile is chosen only where
      // every request has at most kMaxRows)
      ATTNKIT_REQUIRE(p.plan_tile_q >= 1 && p.plan_tile_q <= Tr::kBlockM, where, "plan tile_q", p.plan_tile_q,
                      "must be in [1, " + std::to_string(Tr::kBlockM) + "] for the " + kCfg.name + " tile");
      const cuda::DeviceProps& dev = cuda::current_device_props();
      ATTNKIT_REQUIRE(static_cast<size_t>(Tr::kSmemBytes) <= dev.smem_per_block_optin, where, "shared memory per block",
                      Tr::kSmemBytes, "must fit the device's opt-in limit");
      const auto kernel = kernel_for<Tr, Sched, Src, Epi>(p);
      p.l2_prefetch = false;
      p.kv_evict_first = plan.kv_evict_first;
      p.cluster_merge = false;
      cuda::launch_kernel(kernel, dim3(static_cast<unsigned>(ctas)), dim3(Tr::kThreads), Tr::kSmemBytes, stream,
                          plan.pdl, dim3(1, 1, 1), p);
      launched = true;
    }
  };
  for_each_tile(try_tile);
  ATTNKIT_REQUIRE(launched, where, "tile", plan.config.name,
                  "is not a planned tile built for head dim " + std::to_string(kHeadDim) + " with a " +
                      cache_kind_name(kCache) + " cache");
}

}  // namespace attnkit::flash_attn

#define ATTNKIT_PLANNED_INSTANTIATE(ELEM, HEAD_DIM, CACHE)                                                  \
  template void launch_planned<ELEM, HEAD_DIM, CacheKind::CACHE>(VarlenKernelParams, const LaunchPlan&, int64_t, \
                                                                 cudaStream_t);

// Explicit instantiation of every mma_sync tile of one (dtype, head size, cache kind).
#define ATTNKIT_VARLEN_INSTANTIATE(ELEM, HEAD_DIM, CACHE)                                                  \
  template void launch_mma_sync<ELEM, HEAD_DIM, CacheKind::CACHE>(const VarlenKernelParams&, const LaunchPlan&, \
                                                                  cudaStream_t);
