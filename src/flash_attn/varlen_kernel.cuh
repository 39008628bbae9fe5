// The attention kernel skeleton of the mma_sync generation (sm80+):
// attention_kernel<Tile, Scheduler, KvSource, Epilogue>, instantiated by the launcher
// (varlen_launcher.cuh) in varlen_hd*.cu. Its body is the algorithm:
//
//   take a work item (Scheduler)
//   load its Q tile; start K/V tiles 0 .. kStages-2 (KvSource)
//   for each K/V tile of the item:
//     wait for it; start the tile kStages-1 ahead (KvSource)
//     S = Q K^T; score mod + mask; online softmax; O += P V   (TileMath of the Tile's layout)
//   epilogue: merge the warps' rows, normalise, sinks, write O and LSE or split partials
//             (Epilogue; the last split CTA of the item merges the splits)
//
// The policies: Tile = the VarlenTraits of a tile of tile_set.h (its fragment layout picks the
// TileMath of varlen_tile_math.cuh); Scheduler = GridScheduler (varlen_schedule.cuh: the grid's
// coordinates, or a FlashInfer-style plan's item); KvSource
// = cuda/kv_source.cuh (the block table by cp.async or by TMA); Epilogue = SplitKvEpilogue
// (varlen_epilogue.cuh). Tr's cache kind picks the fragment conversions of TileMath (16-bit,
// fp8: cuda/fp8_dequant.h, NVFP4: cuda/fp4_dequant.h). kFmt: the fp8 cache format, a template parameter so the loop converts
// with one instruction sequence (fp8_dequant.h); ignored for 16-bit caches.
//
// Programmatic dependent launch (cuda/pdl.h): the kernel waits for the kernels before it only
// at its start, and lets the next kernel launch as soon as its prologue loads are issued. The
// one thing before the wait is an L2 prefetch of the work item's first K/V tiles (reads of the
// metadata that may be stale, through L2 only and clamped; no data is kept), which keeps HBM
// busy while the previous kernel drains.
#pragma once
#include <type_traits>

#include "cuda/cp_async.h"
#include "cuda/cta_trace.h"
#include "cuda/kv_source.cuh"
#include "cuda/pdl.h"
#include "cuda/tma_sm90.h"
#include "flash_attn/varlen_epilogue.cuh"
#include "flash_attn/varlen_schedule.cuh"
#include "flash_attn/varlen_tile_math.cuh"
#include "flash_attn/varlen_traits.h"

namespace attnkit::flash_attn {

// The K/V source of a tile: its fill (tile_set.h) through the request's page map (the block
// table, a page table or contiguous rows: cuda/paged_kv_tile.h; TMA fills read block tables only).
template <class Tr>
using KvSourceOf = std::conditional_t<Tr::kTmaStages, cuda::TmaBlockTableSource<Tr>, cuda::CpAsyncPagedSource<Tr>>;

template <class Tr, class Scheduler, class Source, class Epilogue, cuda::Fp8Format kFmt>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm)
    attention_kernel(const __grid_constant__ VarlenKernelParams p) {
  using namespace attnkit::cuda;
  using T = typename Tr::Elem;
  using Math = detail::TileMath<Tr, kFmt, typename Source::Layout>;
  if constexpr (Tr::kTmaStages != 0 && !kTmaCode) {
    __trap();  // (a TMA tile in a pre-sm90 pass: launch_plan.cpp never launches it there)
    return;
  }
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ typename Source::Barriers bars;

  cta_trace_mark(p.cta_trace, kTraceEntry);
  Source::prefetch_maps(&p.k_map, &p.v_map);  // (parameters: valid before the wait)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (Scheduler::kGridItems)
    if (p.l2_prefetch && static_cast<int64_t>(linear_block_index()) < p.l2_prefetch_ctas)
      prefetch_first_tiles<Tr::kBlockM, Tr::kBlockN, typename CpAsyncPagedSource<Tr>::Loader,
                           Tr::kStages, Tr::kOSliceCols>(p, threadIdx.x);
#endif
  pdl_wait();  // everything below may read what the previous kernel wrote (metadata, q, cache)
  cta_trace_mark(p.cta_trace, kTraceReleased);
  WorkItem w;
  if (!Scheduler::take(p, w)) return;
  // (the metadata guards' verdict waits in shared memory: a register live across the main loop
  // spilled the register-bound prefill tiles more)
  __shared__ bool s_fault;
  if (threadIdx.x == 0) s_fault = w.fault;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp % Tr::kWarpsM, warp_n = warp / Tr::kWarpsM;
  const int warp_row0 = warp_m * Tr::kWarpRows, warp_key0 = warp_n * Tr::kWarpKeys;
  const bool warp_active = warp_row0 < w.rows;  // warps of padding rows only load and sync

  // Shared memory: the Q tile, then the K/V stages where the source wants them (TMA: 1024-byte
  // aligned for the swizzle; kTmaSlack reserves the round-up).
  const uint32_t s_q = smem_addr(smem);
  const uint32_t s_stages = Source::stages_at(s_q + Tr::kStagesOffset);
  Source kv(kv_source_args<Tr::kBlockN>(p, w, s_stages, smem + (s_stages - s_q)), bars, tid);
  kv.init();

  // Prologue: Q in its own cp.async group, then kStages - 1 K/V tiles.
  const int n_tiles = w.tile_end - w.tile_begin;
  load_q_tile<Tr>(p, w, s_q, tid);
  cp_async_commit();
  kv.start();
  pdl_launch_dependents();  // the next kernel's CTAs may take SM slots as this grid frees them
  // The block-id guard (cuda/metadata_guard.cuh) over the item's pages, with the first tiles'
  // copies in flight: its id reads go out with the loaders' and its barrier waits no longer than
  // the first tile does. A bad id marks the item (s_fault); the loaders read block 0 for it.
  if constexpr (kDeviceGuards) {
    if (__syncthreads_or(item_pages_fault(p, w, kv.tile_key(n_tiles), tid, Tr::kThreads)) &&
        tid == 0)
      s_fault = true;
  }

  // Q: waited for before the loop when it is read into registers or converted (fp8 caches with
  // a bf16 Q run the GEMMs in f16; the factor keeps the tile in f16 range).
  constexpr bool kConvertQ = Tr::kQuantCache && std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kQWaited = Tr::kQInRegs || kConvertQ;
  float q_factor = 1.f;
  if constexpr (kQWaited) {
    kv.wait_q();
    __syncthreads();
    if constexpr (kConvertQ) q_factor = detail::q_tile_to_f16<Tr>(smem, tid);
  }
  Math math(warp_row0, warp_key0, lane, Tr::kOSlices > 1 ? w.o_col0 : 0);
  if constexpr (Tr::kQInRegs) math.load_q(smem, s_q);
  const float k_scale = detail::cache_scale<Tr>(p.k_scale, p.k_scale_stride, w.kv_head);
  const ScoreMod mod{p.scale * k_scale / q_factor, p.softcap, p.alibi_slopes != nullptr};
  const float unit = mod.unit();

  for (int it = 0; it < n_tiles; ++it) {
    kv.template wait<!kQWaited>(it);
    __syncthreads();  // tile `it` visible to all; the stage of tile it-1 is free again
    if (it == 0) cta_trace_mark(p.cta_trace, kTraceFirstTile);
    kv.issue_ahead(it);
    if (!warp_active) continue;
    const int tile_key0 = kv.tile_key(it);
    const bool whole_tile_visible = tile_key0 >= w.full_lo && tile_key0 + Tr::kBlockN <= w.full_hi;
    math.step(smem, s_q, kv.k_stage(it), kv.v_stage(it), mod, unit, whole_tile_visible, p, w, tile_key0);
  }

  kv.drain();
  __syncthreads();
  // The metadata guards' verdict (cuda/metadata_guard.cuh): an item whose metadata broke a rule,
  // or whose pages hold a block outside the cache, writes NaN rows (the epilogue, w.fault).
  w.fault = kDeviceGuards && s_fault;
  cta_trace_mark(p.cta_trace, kTraceLoopDone);
  Epilogue::run(p, w, smem, math, unit, warp_active, warp_m, warp_n, tid);
  cta_trace_mark(p.cta_trace, kTraceEpilogue);
  Epilogue::finish(p, smem);
  cta_trace_mark(p.cta_trace, kTraceExit);
}

}  // namespace attnkit::flash_attn
