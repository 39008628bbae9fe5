// The hopper generation's varlen paged attention kernel (wgmma, sm_90a): one template,
// configured by HopperTraits, instantiated in hopper_hd*.cu. Same work items, masks and
// online softmax as the mma_sync kernel (varlen_kernel.cuh); what differs is the GEMMs (each
// warpgroup issues wgmma.mma_async on 64 rows x a tile of keys with Q / K / V read from swizzled
// shared memory by descriptor) and the epilogue (no parts to merge across warps: each warp holds
// whole rows; they leave through the item's Q buffer once its last S is done, or as a split
// item's fp32 partials, which the split combine kernel merges after the launch:
// hopper_q_buffer.cuh).
//
// Warp-specialised: a producer warpgroup copies Q (cp.async; fp8 caches: then rounds it to e4m3
// in its buffer) and the K/V tiles through the page map (cp.async; fp8 V codes transposed in
// their stage: hopper_fill.cuh) into
// two rings of stages, K and V apart,
// signalled by mbarriers; two consumer
// warpgroups of 64 rows (hopper_wide: three) take turns at the tensor cores, in a ring of named
// barriers (every ring of stages a cuda::Pipeline):
//
//   step j:  wait V_{j-1}, K_j; S_j = Q K_j^T; O += P_{j-1} V_{j-1}  (both async)
//            -> the next warpgroup's turn
//            S_j done: release K_j; mask, online softmax (P_j)
//            P V done: release V_{j-1}; rescale O
//   last:    O += P V of the last tile; epilogue: normalise, sink, write O and LSE
//
// Persistent where items are short (PersistentScheduler, varlen_schedule.cuh): one CTA per SM
// walks the list of work items; the producer loads the next item's tiles while the consumers
// finish the current one and write its output, and its Q too where the tile has two Q buffers
// (hopper_short). The producer alone walks the list: each item reaches the consumers in shared
// memory next to its Q buffer. Which tile, how many CTAs: the LaunchPlan (launch_plan.cpp).
#pragma once
#include <cuda_fp8.h>

#include <algorithm>
#include <type_traits>

#include "attnkit/detail/merge_rule.h"
#include "cuda/cp_async.h"
#include "cuda/cuda_check.h"
#include "cuda/ld_st.h"
#include "cuda/online_softmax.h"
#include "cuda/output_store.h"
#include "cuda/paged_kv_tile.h"
#include "cuda/pdl.h"
#include "cuda/pipeline_sm90.h"
#include "cuda/split_kv_combine.h"
#include "cuda/sync_sm90.h"
#include "cuda/tensor_map.h"
#include "cuda/tile_copy_layout.h"
#include "cuda/wgmma_sm90.h"
#include "flash_attn/hopper_fill.cuh"
#include "flash_attn/hopper_q_buffer.cuh"
#include "flash_attn/hopper_traits.h"
#include "flash_attn/launch_plan.h"
#include "flash_attn/varlen_epilogue.cuh"
#include "flash_attn/varlen_schedule.cuh"
#include "flash_attn/varlen_tile_softmax.cuh"

namespace attnkit::flash_attn {

// Fill: how the producer fills the K / V stages (hopper_fill.cuh: cp.async through any page map,
// 16-bit rows as they are or fp8 codes converted in their stage). items: where the work items come from
// (varlen_schedule.cuh HopperWalk: the launch's grid, or a FlashInfer-style plan where
// p.plan_items is set; one kernel serves both launches).
template <class Tr, class Fill>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    hopper_varlen_kernel(const __grid_constant__ VarlenKernelParams p, const HopperWalk<Tr::kBlockM, Tr::kBlockN, Tr::kPlanned> items) {
#if ATTNKIT_HAS_WGMMA
  using namespace attnkit::cuda;
  using M = typename Tr::MmaElem;  // the 16-bit GEMMs' inputs: the queries' type (16-bit caches)
  constexpr int kKS = Tr::kKStages, kVS = Tr::kVStages;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two rings, of kKS K tiles and of kVS V tiles, each stage with a "full" barrier
  // (the producer's copies landed: its threads' cp.async arrivals) and an "empty" one (the 256
  // consumer threads no longer read it). K and V are separate so that a K stage frees as soon as
  // S = Q K^T is done, while V is still needed for O += P V one step later. The rings run on
  // across the CTA's work items (their PipelineStates); so does the ring of Q buffers (one or two).
  constexpr int kQB = Tr::kQBuffers;
  using KPos = typename Pipeline<kKS>::State;
  using VPos = typename Pipeline<kVS>::State;
  __shared__ PipelineBarriers<kKS> k_bars;
  __shared__ PipelineBarriers<kVS> v_bars;
  __shared__ PipelineBarriers<kQB> q_bars;
  // The metadata guards' verdict on an item (cuda/metadata_guard.cuh), by the stage of its last V
  // tile: the producer writes it before its own arrival on that tile's full barrier, the
  // consumers read it after waiting for it (so the scan costs them no registers).
  __shared__ bool s_fault[kVS];
  // The work items travel with the Q buffers: the producer walks the schedule and writes each
  // item next to its Q buffer before that buffer's full barrier completes (producer thread 0's
  // own arrival), then one item with req = -1 after the last; the consumers read the item there
  // instead of walking the schedule themselves (its metadata loads and divisions stay off their
  // path between items).
  __shared__ WorkItem s_item[kQB];
  // fp8 caches: the factor of each consumer warpgroup's e4m3 Q rows per Q buffer, written by the
  // producer with them (detail::q_to_e4m3), and its scratch.
  constexpr int kQ8Groups = Tr::kFp8Cache ? Tr::kWarpGroups : 1;
  __shared__ float s_q_factor[kQB][kQ8Groups];
  __shared__ float s_q_red[4 * kQ8Groups];

  pdl_wait();  // everything below may read what the previous kernel wrote (metadata, q, cache)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned char* smem = smem_raw + ((Tr::kAlign - (smem_addr(smem_raw) & (Tr::kAlign - 1))) & (Tr::kAlign - 1));
  const uint32_t s_base = smem_addr(smem);
  auto s_q = [&](int buffer) { return s_base + Tr::kQOffset + buffer * Tr::kQBytes; };
  const Pipeline<kKS> k_pipe(k_bars);
  const Pipeline<kVS> v_pipe(v_bars);
  const Pipeline<kQB> q_pipe(q_bars);
  auto k_stage = [&](const KPos& at) { return s_base + at.stage * Tr::kKTileBytes; };
  auto v_stage = [&](const VPos& at) { return s_base + Tr::kVOffset + at.stage * Tr::kVTileBytes; };
  auto tile_key = [](const WorkItem& w, int t) { return w.first_key + t * Tr::kBlockN; };

  if (tid == 0) {
    k_pipe.init(Fill::kFullArrivals, Tr::kConsumerThreads);
    v_pipe.init(Fill::kFullArrivals + (kDeviceGuards ? 1 : 0), Tr::kConsumerThreads);  // (+ the guard's: below)
    q_pipe.init(Tr::kProducerThreads + 1, Tr::kConsumerThreads);  // (+ thread 0's, with the item)
    fence_mbarrier_init();  // (the async proxy's cp.async arrivals complete on them)
  }
  __syncthreads();  // the last CTA-wide barrier: producer and consumers part here
  pdl_launch_dependents();  // the next kernel's CTAs may take SM slots as this grid frees them


  if (tid >= Tr::kConsumerThreads) {
    // Producer: per item, its Q (before K of tile 0 with two Q buffers, after it with one), then
    // V of tile t - 1 and K of tile t: each into its stage once the consumers
    // released the tile a ring's depth before it. The producer never waits for its own copies: the full
    // barriers complete when they land. Block-table entries are read one tile ahead (the fill).
    regs_dec<Fill::kProducerRegs>();
    const int ptid = tid - Tr::kConsumerThreads;
    KPos k_at;  // the next K tile's stage
    VPos v_at;  // the next V tile's (one tile behind)
    typename Pipeline<kQB>::State q_at;
    // The next Q buffer: the item (thread 0, then its arrival) and, with tiles, its Q rows. With
    // fp8 caches their copies are a cp.async group of their own, and the producer's arrivals
    // wait for their e4m3 copy (detail::q_to_e4m3, after the item's first K copies).
    typename Pipeline<kQB>::State q_posted;
    auto post_item = [&](const WorkItem& item, bool load) {
      q_pipe.acquire(q_at);  // the Q of kQB items back is no longer read, nor its item
      if (ptid == 0) {
        s_item[q_at.stage] = item;
        mbar_arrive(q_pipe.full(q_at));
      }
      if (load) detail::load_q_rows<Tr>(p, item, s_q(q_at.stage), ptid);
      if (Tr::kFp8Cache && load) cp_async_commit();
      else q_pipe.commit_cp_async(q_at);
      q_posted = q_at;
      q_at.advance();
    };
    WorkItem w;
    for (int64_t r = 0; items.next(p, r, w); ++r) {
      const int n = w.tile_end - w.tile_begin;
      if (n == 0) {  // nothing to load: the consumers write the empty result
        post_item(w, false);
        continue;
      }
      Fill fill(p, w, n, ptid);
      // V of tile t; after the last one's copies, the guards' verdict on the item (its metadata,
      // and every page it loaded: a block outside the cache) into s_fault, released by producer
      // thread 0's arrival on that tile's full barrier (before any other tile's: at once).
      auto load_v = [&](int t) {
        fill.acquire(v_pipe, v_at);
        fill.v(t, v_stage(v_at), v_pipe, v_at);
        if constexpr (kDeviceGuards) {
          if (t == n - 1) {
            const bool fault = named_bar_or(Tr::kProducerBar, Tr::kProducerThreads, w.fault || fill.pages_fault(p, w.req));
            if (ptid == 0) s_fault[v_at.stage] = fault;
          }
          if (ptid == 0) mbar_arrive(v_pipe.full(v_at));
        }
        v_at.advance();
      };
      // With two Q buffers the item's Q first: its buffer was freed an item ago, while the K
      // stage may wait for the current item's steps. With one, K of tile 0 first: the buffer
      // frees only after the current item's epilogue.
      auto load_k = [&](int t) {
        fill.acquire(k_pipe, k_at);
        fill.k(t, k_stage(k_at), k_pipe, k_at);
        k_at.advance();
      };
      if constexpr (kQB > 1) post_item(w, true);
      load_k(0);
      if constexpr (kQB == 1) post_item(w, true);
      // fp8 caches: the item's Q to e4m3 in its buffer once its copies landed (with two Q
      // buffers, while K of tile 0, the newest group, may still be on its way), then the
      // producer's arrivals. The consumers find Q ready: no work of theirs before the first S.
      if constexpr (Tr::kFp8Cache) {
        cp_async_wait<(kQB > 1 ? 1 : 0)>();
        detail::q_to_e4m3<Tr>(s_q(q_posted.stage), s_q_red, s_q_factor[q_posted.stage], ptid);
        mbar_arrive(q_pipe.full(q_posted));
      }
      for (int t = 1; t < n; ++t) {  // (the item is posted: its fields need not stay in registers)
        load_v(t - 1);
        load_k(t);
      }
      load_v(n - 1);
      fill.drain();
    }
    WorkItem end{};  // (a fresh item: the walk's last one need not stay live through the loop)
    end.req = -1;  // the end of the walk
    post_item(end, false);
    cp_async_wait<0>();
    return;
  }
  regs_inc<Fill::kConsumerRegs>();

  // Consumers: two or three warpgroups of 64 rows take turns at the tensor cores, in order
  // (named barriers Tr::turn_bar), across items too. Step j of a warpgroup issues S_j = Q K_j^T
  // and then O += P_{j-1} V_{j-1}, hands the tensor cores to the next warpgroup, and runs the
  // softmax of S_j while its P V still runs; O is rescaled once that P V is done. A warpgroup
  // whose rows are all padding computes on zero rows (no branch around wgmma) and writes nothing.
  const int wg = warp / 4;
  const int warp_row0 = warp * 16;
  constexpr int kWG = Tr::kWarpGroups, kTurnThreads = 2 * 128;  // (a turn: one warpgroup waits, the one before arrives)
  const int my_turn = Tr::turn_bar(wg), next_turn = Tr::turn_bar((wg + 1) % kWG);
  // The softmax scale; with fp8 caches times the item's K dequant scale over its Q factor (set
  // per item below). fp8 caches: P times 2^8 (RowSoftmax::p_log2), rounded to e4m3.
  ScoreMod mod{p.scale, p.softcap, p.alibi_slopes != nullptr};
  float unit = mod.unit();
  RowSoftmax softmax;
  FragC o[Tr::kOFrags];
  constexpr int kPFrags = Tr::kFp8Cache ? Tr::kBlockN / 32 : Tr::kSFrags / 2;  // A fragments of P: k32 / k16 steps
  constexpr float kPLog2 = Tr::kFp8Cache ? 8.f : 0.f;
  FragA pa[kPFrags];
  KPos at;  // the stage of tile j's K
  VPos prev_at = VPos::before_first();  // of tile j - 1's V (advanced after each step)
  typename Pipeline<kQB>::State q_at;
  WorkItem w;
  // This warpgroup's 64 rows of the current item's Q buffer (a constant with one buffer).
  // (The consumers sit at their register limit: computed per step, ptxas 13.0 spilled 80 bytes.)
  const uint32_t s_q_group0 = s_q(0) + wg * 64 * 128;
  auto s_q_group = [&] {
    if constexpr (kQB == 1) return s_q_group0;
    else return s_q_group0 + q_at.stage * Tr::kQBytes;
  };

  // O += P V in column ranges of kPvCols (128, the widest wgmma wrapper: two swizzle regions of V;
  // 64 where 128 does not divide the head dim; head dim 96: then one of 32, the lower half of
  // V's second region), each over the tile's k16 steps of keys; with fp8 caches over its k32
  // steps, Vt's lines (head dims) of kBlockN codes K-major (32 bytes a step).
  auto pv_cols = [&]<int kCols>(const VPos& v_at, int col0) {
    auto& o_cols = *reinterpret_cast<FragC(*)[kCols / 8]>(&o[col0 / 8]);
    if constexpr (Tr::kFp8Cache) {
      const uint32_t vt = v_stage(v_at) + col0 * Tr::kBlockN;
      const uint64_t v_desc = Tr::kBlockN == 128 ? smem_desc_sw128(vt, 16, 1024) : smem_desc_sw64(vt, 512);
#pragma unroll
      for (int ks = 0; ks < kPFrags; ++ks)
        WgmmaRSFp8<Fill::kE5m2, kCols>::run(o_cols, pa[ks], smem_desc_advance(v_desc, ks * 32), true);
    } else {
      const uint64_t v_desc = smem_desc_sw128(v_stage(v_at), Tr::kBlockN * 128, 1024);
#pragma unroll
      for (int kk = 0; kk < kPFrags; ++kk)
        WgmmaRS<M, kCols>::template run<1>(
            o_cols, pa[kk], smem_desc_advance(v_desc, (col0 / 64) * (Tr::kBlockN * 128) + kk * 16 * 128), true);
    }
  };
  auto issue_pv = [&](const VPos& v_at) {
    constexpr int kCols = Tr::kPvCols, kFull = Tr::kHeadDim / kCols;
#pragma unroll
    for (int c = 0; c < kFull; ++c) pv_cols.template operator()<kCols>(v_at, c * kCols);
    if constexpr (Tr::kPvTail > 0) pv_cols.template operator()<Tr::kPvTail>(v_at, kFull * kCols);
    wgmma_commit();
  };
  // S = Q K^T: one wgmma of N = kBlockN per k16 step of 16-bit Q and K (128-byte-swizzled
  // regions of 64 dims, 32 bytes a step), or with fp8 caches per k32 step of their e4m3 Q (in
  // the warpgroup's lines of its Q buffer: 64-byte-swizzled atoms of 8 rows 1024 bytes apart,
  // Tr::q8_offset) and fp8 K (64-byte-swizzled regions), 32 bytes a step.
  auto issue_s = [&](FragC(&s)[Tr::kSFrags], uint32_t k_tile) {
    if constexpr (Tr::kFp8Cache) {
      const uint64_t q_desc = smem_desc_sw64(s_q_group(), 1024), k_desc = smem_desc_sw64(k_tile, 512);
#pragma unroll
      for (int ks = 0; ks < Tr::kHeadDim / 32; ++ks) {
        const uint32_t step_bytes = (ks % 2) * 32;
        WgmmaSSFp8<Fill::kE5m2, Tr::kBlockN>::run(s, smem_desc_advance(q_desc, Tr::q8_offset(ks / 2) + step_bytes),
                                                  smem_desc_advance(k_desc, (ks / 2) * (Tr::kBlockN * 64) + step_bytes),
                                                  ks > 0);
      }
    } else {
      const uint64_t q_desc = smem_desc_sw128(s_q_group(), 16, 1024), k_desc = smem_desc_sw128(k_tile, 16, 1024);
#pragma unroll
      for (int ks = 0; ks < Tr::kKSteps; ++ks) {
        const uint32_t step_bytes = (ks % 4) * 32;  // (16 head dims of a 64-column region)
        WgmmaSS<M, Tr::kBlockN>::run(s, smem_desc_advance(q_desc, (ks / 4) * (Tr::kBlockM * 128) + step_bytes),
                                     smem_desc_advance(k_desc, (ks / 4) * (Tr::kBlockN * 128) + step_bytes), ks > 0);
      }
    }
  };
  auto step = [&](int it, auto with_pv) {
    constexpr bool kPV = decltype(with_pv)::value;
    // V_{j-1} and K_j (the order they are loaded in) before any wgmma: a wait loop between
    // wgmmas in flight makes ptxas serialise them. The fence: cp.async wrote the tiles
    // (generic proxy), wgmma reads them (async proxy).
    if constexpr (kPV) v_pipe.wait(prev_at);
    k_pipe.wait(at);
    fence_proxy_async_smem();
    named_bar_sync(my_turn, kTurnThreads);
    FragC s[Tr::kSFrags];
    wgmma_fence();
    issue_s(s, k_stage(at));
    wgmma_commit();
    if constexpr (kPV) issue_pv(prev_at);
    named_bar_arrive(next_turn, kTurnThreads);
    if constexpr (kPV) {
      wgmma_wait<1>();  // S_j done; P V may still run
    } else {
      wgmma_wait<0>();
    }
    wgmma_hold(s);
    // K_j leaves its stage once S_j is final: at once, or after a speculative softmax, which may
    // compute S_j again.
    constexpr bool kSpeculate = Tr::kSpeculativeExp && kPV;
    if constexpr (!kSpeculate) k_pipe.release(at);

    const int tile_key0 = tile_key(w, it);
    const bool whole_tile_visible = tile_key0 >= w.full_lo && tile_key0 + Tr::kBlockN <= w.full_hi;
    float rescale[2];
    // (per-head ALiBi slopes only: per-request ones run on the mma_sync kernels, launch_plan.cpp)
    if constexpr (kSpeculate) {
      softmax_scores_speculative<cuda::RowsOnM, Tr::kMaxSlackLog2>(
          s, softmax, mod, unit, whole_tile_visible, p, w, warp_row0, tile_key0, lane, rescale,
          [&](bool fits) { return !named_bar_or(Tr::group_bar(wg), 128, !fits); },
          [&](FragC(&again)[Tr::kSFrags]) {  // (also waits for the P V in flight: a rare tile)
            wgmma_fence();
            issue_s(again, k_stage(at));
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_hold(again);
          });
      k_pipe.release(at);
    } else {
      softmax_scores<cuda::RowsOnM, Tr::kMaxSlackLog2>(
          s, softmax, mod, unit, whole_tile_visible, p, w, warp_row0, tile_key0, lane, rescale, false);
    }
    // O's rescale waits for the P V first, inside its branch: ptxas hoists a wait to the top of
    // its block, and there the softmax would no longer run under the P V.
    rescale_output(o, rescale, [&] {
      if constexpr (kPV) {
        wgmma_wait<0>();
        wgmma_hold(o);
        wgmma_hold(pa);  // P_{j-1} is read by the P V just waited for: its registers stay until here
      }
    });
    if constexpr (kPV) v_pipe.release(prev_at);
    prev_at.advance();
    at.advance();
#pragma unroll
    for (int kk = 0; kk < kPFrags; ++kk) {
      if constexpr (Tr::kFp8Cache) pa[kk] = c_quad_to_a_e4m3(s[4 * kk], s[4 * kk + 1], s[4 * kk + 2], s[4 * kk + 3]);
      else pa[kk] = c_pair_to_a<M>(s[2 * kk], s[2 * kk + 1]);
    }
  };

  if (wg == kWG - 1) named_bar_arrive(Tr::turn_bar(0), kTurnThreads);  // warpgroup 0 goes first
  for (;;) {
    softmax.init(kPLog2);
#pragma unroll
    for (int f = 0; f < Tr::kOFrags; ++f) o[f] = FragC{};
    q_pipe.wait(q_at);  // the next item and its Q rows
    w = s_item[q_at.stage];
    if (w.req < 0) break;  // (the end of the walk)
    const int n = w.tile_end - w.tile_begin;
    bool fault = w.fault;  // (an item with tiles: the producer's verdict, s_fault)
    if constexpr (Tr::kFp8Cache) {
      mod.scale = p.scale * detail::cache_scale<Tr>(p.k_scale, p.k_scale_stride, w.kv_head);
      unit = mod.unit();
    }
    if (n > 0) {
      if constexpr (Tr::kFp8Cache) {
        mod.scale /= s_q_factor[q_at.stage][wg];  // (Q's e4m3 codes: q times it)
        unit = mod.unit();
      }
      step(0, std::false_type{});
      for (int it = 1; it < n; ++it) step(it, std::true_type{});
      v_pipe.wait(prev_at);
      if constexpr (kDeviceGuards) fault = s_fault[prev_at.stage];
      fence_proxy_async_smem();
      wgmma_fence();
      issue_pv(prev_at);
      wgmma_wait<0>();
      wgmma_hold(o);
      wgmma_hold(pa);
      v_pipe.release(prev_at);
    }
    // (a split item's fields are read from its copy in shared memory: kept in registers through
    // the loop, they made ptxas 13.0 spill the consumers)
    const WorkItem& item = s_item[q_at.stage];
    const bool split = item.num_chunks > 1;  // (SplitPartials::split: a grid item's chunks are p.num_splits)
    if (warp_row0 >= w.rows) {
    } else if (split) {
      detail::split_epilogue<Tr>(p, item, o, softmax, unit, fault, warp_row0, lane);
    } else {
      detail::staged_epilogue<Tr>(p, w, o, softmax, unit, fault, warp_row0, lane, s_q(q_at.stage));
    }
    q_pipe.release(q_at);  // the item's output rows have left its Q buffer
    q_at.advance();
  }
  // The last warpgroup handed warpgroup 0 one more turn than warpgroup 0 took: take it, so no
  // arrival is left pending on its barrier.
  if (wg == 0) named_bar_sync(Tr::turn_bar(0), kTurnThreads);
#else
  __trap();  // launched on a device or build without sm_90a code: the host must not get here
#endif
}

// The plan's fill (hopper_fill.cuh), as f.template operator()<Fill>(): an fp8 cache's codes are
// converted on their way in (in p's format), 16-bit rows are copied by cp.async.
template <class Tr, class F>
void with_fill(const VarlenKernelParams& p, const LaunchPlan& plan, const char* where, F&& f) {
  if constexpr (Tr::kFp8Cache) {
    ATTNKIT_REQUIRE(plan.config.fill == KvFill::convert, where, "fill", static_cast<int>(plan.config.fill),
                    "must be the convert fill: fp8 codes are converted on their way into the stages");
    if (p.fp8_format == static_cast<int>(cuda::Fp8Format::e5m2))
      f.template operator()<HopperConvertFill<Tr, cuda::Fp8Format::e5m2>>();
    else
      f.template operator()<HopperConvertFill<Tr, cuda::Fp8Format::e4m3>>();
  } else {
    ATTNKIT_REQUIRE(plan.config.fill == KvFill::cp_async, where, "fill", static_cast<int>(plan.config.fill),
                    "must be the cp.async fill for 16-bit caches");
    f.template operator()<HopperCpAsyncFill<Tr>>();
  }
}

// Calls f.template operator()<kTile>() for the plan's hopper tile (hopper_wide only where
// kWide: planned launches never take it, and their kernels are not instantiated for it).
template <int kHeadDim, CacheKind kCache, bool kWide, class F>
void with_hopper_tile(const LaunchPlan& plan, const char* where, F&& f) {
  if constexpr (tile_instantiated(TileId::hopper_short, kHeadDim, kCache)) {
    if (plan.tile == TileId::hopper_short) return f.template operator()<TileId::hopper_short>();
  }
  if constexpr (kWide && tile_instantiated(TileId::hopper_wide, kHeadDim, kCache)) {
    if (plan.tile == TileId::hopper_wide) return f.template operator()<TileId::hopper_wide>();
  }
  if (plan.tile == TileId::hopper) f.template operator()<TileId::hopper>();
  else fail(where, "tile", plan.config.name, "is not a hopper tile of this launch");
}

// The output's rows as a TMA map where the plan stores them so (LaunchPlan::tma_output, only
// where the GQA group divides 16): boxes of a warp's 16 packed rows, the group's heads x 16 /
// group tokens (a warp's first row is a token's first head: items start at multiples of the
// tile's rows, and a plan's tile_q is the hopper tile's, launch_plan.cpp); without a map (a
// geometry the encoder refuses) the consumers copy the rows.
inline VarlenKernelParams with_output_map(const VarlenKernelParams& p, const LaunchPlan& plan, int elem_bytes) {
  VarlenKernelParams q = p;
  q.o_map_ok = false;
  if (!plan.tma_output) return q;
  cuda::RowsGeometry g;
  g.base = q.out;
  g.row_bytes = q.head_size * elem_bytes;
  g.heads = q.num_heads;
  g.tokens = q.num_tokens;
  g.stride_head = q.out_stride_head * elem_bytes;
  g.stride_token = q.out_stride_token * elem_bytes;
  g.box_heads = q.group.divisor;
  g.box_tokens = 16 / q.group.divisor;
  q.o_map_ok = cuda::encode_rows_map(g, q.o_map, nullptr);
  return q;
}

template <class Elem, int kHeadDim, CacheKind kCache>
void launch_hopper(const VarlenKernelParams& p_in, const LaunchPlan& plan, cudaStream_t stream) {
  const char* where = "flash_attn varlen attention (hopper)";
  const VarlenKernelParams p = with_output_map(p_in, plan, sizeof(Elem));
  auto with_tile = [&]<TileId kTile>() {
    using Tr = HopperTraits<Elem, kHeadDim, kTile, kCache>;
    auto launch = [&]<class Fill>() {
      dim3 grid;
      if (!varlen_grid(p, plan, Tr::kSmemBytes, where, grid)) return;
      // (the walk's item indices are 32-bit; the CTAs, at most the items, one grid dimension)
      ATTNKIT_REQUIRE(plan.grid_ctas <= 0x7fffffff, where, "work items", plan.grid_ctas, "must be < 2^31");
      HopperWalk<Tr::kBlockM, Tr::kBlockN, Tr::kPlanned> items{};
      items.grid = {cuda::FastDivmod(static_cast<int>(grid.x)), cuda::FastDivmod(static_cast<int>(grid.y)),
                    cuda::FastDivmod(p.num_splits), static_cast<int>(plan.grid_ctas)};
      auto kernel = hopper_varlen_kernel<Tr, Fill>;
      ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
      cuda::launch_kernel(kernel, dim3(static_cast<unsigned>(plan.ctas)), dim3(Tr::kThreads), Tr::kSmemBytes, stream,
                          plan.pdl, dim3(1, 1, 1), p, items);
    };
    with_fill<Tr>(p, plan, where, launch);
  };
  with_hopper_tile<kHeadDim, kCache, /*kWide=*/true>(plan, where, with_tile);
  // A split launch wrote every row's partials (the split epilogue): the split combine merges
  // them into the output and LSE, the sink in, after the kernel (its rows past the batch's last
  // token, cu_seqlens_q[num_reqs], are batch padding without partials).
  if (p.num_splits > 1) {
    cuda::CombineTarget target;
    target.out = p.out;
    target.out_dtype = std::is_same_v<Elem, __half> ? DType::f16 : DType::bf16;
    target.out_stride_token = p.out_stride_token;
    target.out_stride_head = p.out_stride_head;
    target.lse = p.lse;
    target.lse_stride_head = p.lse_stride_head;
    target.lse_stride_token = p.lse_stride_token;
    target.sinks = p.sinks;
    target.sinks_stride = p.sinks_stride;
    target.valid_tokens = p.cu_seqlens_q + p.num_reqs;
    cuda::launch_split_kv_combine(p.partials, target, stream);
  }
}

// A planned launch (FlashInfer-style prefill part) on the plan's hopper tile (hopper, or
// hopper_short with two Q buffers): the walk over the plan's item slots (grid_items: the plan's
// count, or its capacity for graph-safe launches: slots past the count end the walk) x KV heads, by at most plan.ctas CTAs where
// the plan is persistent, else one CTA per slot; the page table as the page map (the fill as
// with_fill says).
template <class Elem, int kHeadDim, CacheKind kCache>
void launch_hopper_planned(const VarlenKernelParams& p_in, const LaunchPlan& plan, int64_t grid_items,
                           cudaStream_t stream) {
  const char* where = "flashinfer planned launch (hopper)";
  const VarlenKernelParams p = with_output_map(p_in, plan, sizeof(Elem));
  const int64_t entries = grid_items * p.num_kv_heads;
  ATTNKIT_REQUIRE(grid_items > 0 && entries <= 0x7fffffff, where, "plan item capacity x num_kv_heads", entries,
                  "must be in [1, 2^31) (one grid dimension)");
  const int64_t ctas = plan.persistent ? std::min(entries, plan.ctas) : entries;
  auto with_tile = [&]<TileId kTile>() {
    using Tr = HopperTraits<Elem, kHeadDim, kTile, kCache>;
    ATTNKIT_REQUIRE(p.plan_tile_q >= 1 && p.plan_tile_q <= Tr::kBlockM, where, "plan tile_q", p.plan_tile_q,
                    "must be in [1, " + std::to_string(Tr::kBlockM) + "]");
    with_fill<Tr>(p, plan, where, [&]<class Fill>() {
      HopperWalk<Tr::kBlockM, Tr::kBlockN, Tr::kPlanned> items{};
      static_assert(Tr::kPlanned, "a tile of planned launches");
      items.plan = {static_cast<int>(grid_items)};
      auto kernel = hopper_varlen_kernel<Tr, Fill>;
      ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
      cuda::launch_kernel(kernel, dim3(static_cast<unsigned>(ctas)), dim3(Tr::kThreads), Tr::kSmemBytes, stream,
                          plan.pdl, dim3(1, 1, 1), p, items);
    });
  };
  with_hopper_tile<kHeadDim, kCache, /*kWide=*/false>(plan, where, with_tile);
}

}  // namespace attnkit::flash_attn

// The varlen launcher only (head dims without planned launches: kPlannedHeadDims), or both.
#define ATTNKIT_HOPPER_INSTANTIATE_VARLEN(ELEM, HEAD_DIM, CACHE) \
  template void launch_hopper<ELEM, HEAD_DIM, CACHE>(const VarlenKernelParams&, const LaunchPlan&, cudaStream_t);
#define ATTNKIT_HOPPER_INSTANTIATE(ELEM, HEAD_DIM, CACHE)                                                       \
  ATTNKIT_HOPPER_INSTANTIATE_VARLEN(ELEM, HEAD_DIM, CACHE)                                                      \
  template void launch_hopper_planned<ELEM, HEAD_DIM, CACHE>(const VarlenKernelParams&, const LaunchPlan&, int64_t, \
                                                             cudaStream_t);
