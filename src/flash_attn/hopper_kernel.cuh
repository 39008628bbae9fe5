// The hopper generation's varlen paged attention kernel (wgmma, sm_90a): one template,
// configured by HopperTraits, instantiated in hopper_hd*.cu. Same work items, masks and
// online softmax as the mma_sync kernel (varlen_kernel.cuh); what differs is the GEMMs (each
// warpgroup issues wgmma.mma_async on 64 rows x 128 keys with Q / K / V read from swizzled
// shared memory by descriptor) and the epilogue (straight from registers: without split
// partials there is nothing to merge across warps).
//
// Warp-specialised: a producer warpgroup copies Q and the K/V tiles through the block table
// (cp.async into two rings of stages, K and V apart, signalled by mbarriers); two consumer
// warpgroups of 64 rows take turns at the tensor cores:
//
//   step j:  wait V_{j-1}, K_j; S_j = Q K_j^T; O += P_{j-1} V_{j-1}  (both async)
//            -> the other warpgroup's turn
//            S_j done: release K_j; mask, online softmax (P_j)
//            P V done: release V_{j-1}; rescale O
//   last:    O += P V of the last tile; epilogue: normalise, sink, write O and LSE
//
// Persistent where items are short: one CTA per SM walks the list of work items; the producer loads the
// next item's tiles while the consumers finish the current one and write its output, and its Q
// too where the configuration has two Q buffers (HopperShortItemTraits, items up to 1k keys).
#pragma once
#include <algorithm>
#include <type_traits>

#include "attnkit/detail/merge_rule.h"
#include "cuda/pdl.h"
#include "cuda/sync_sm90.h"
#include "cuda/wgmma_sm90.h"
#include "flash_attn/hopper_traits.h"
#include "flash_attn/varlen_kernel.cuh"

namespace attnkit::flash_attn {

namespace detail {

// Output rows straight from the accumulator: the two rows (g, g + 8) this thread holds of
// its warp's 16, normalised, with the sink folded in; LSE from one thread per row.
template <class Tr>
__device__ __forceinline__ void register_epilogue(const VarlenKernelParams& p, const WorkItem& w,
                                                  const cuda::FragC (&o)[Tr::kOFrags],
                                                  const cuda::RowSoftmax& softmax, float unit, int warp_row0,
                                                  int lane) {
  using T = typename Tr::Elem;
  float max_log2[2], sum[2];
  softmax.finish(unit, max_log2, sum);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = warp_row0 + (lane >> 2) + 8 * r;
    if (m >= w.rows) continue;
    const float mx[1] = {max_log2[r]}, sm[1] = {sum[r]};
    float wt[1];
    float lse = cuda::combine_row_parts<1>(mx, sm, wt);
    const int gm = w.m0 + m;
    const int64_t token = w.q_start + gm / p.group;
    const int head = w.kv_head * p.group + gm % p.group;
    float sink_weight = 1.f;
    if (p.sinks != nullptr) {  // a part with LSE = sink logit and no value
      float w_sink;
      lse = merge_weights(lse, p.sinks[head * p.sinks_stride], &sink_weight, &w_sink);
    }
    const float f = wt[0] * sink_weight;
    T* dst = static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head + 2 * (lane & 3);
#pragma unroll
    for (int dn = 0; dn < Tr::kOFrags; ++dn)
      *reinterpret_cast<uint32_t*>(dst + dn * 8) = cuda::pack2<T>(o[dn].c[2 * r] * f, o[dn].c[2 * r + 1] * f);
    if ((lane & 3) == 0 && p.lse != nullptr) p.lse[head * p.lse_stride_head + token * p.lse_stride_token] = lse;
  }
}

}  // namespace detail

// The work items of a persistent launch: index i of nx * ny * nz in the order of the
// one-CTA-per-item grid (varlen_schedule.cuh: x = row tile fastest, then KV head, then request),
// so the CTAs running at one time share a KV head's tiles in L2 (row tiles outermost measured
// the same at 512 x 32: 197 vs 206 TFLOP/s). Row tiles are taken in reverse, so under a causal
// mask each (request, head) starts with its longest items, and CTAs striding over the list by
// the grid size get mixed lengths.
struct HopperItems {
  int nx, ny, nz;
  int64_t total;
  // Item i (false: no rows there, e.g. past its request's row tiles).
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool at(const VarlenKernelParams& p, int64_t i, WorkItem& w) const {
    const int64_t yz = i / nx;
    return schedule_work<kBlockM, kBlockN>(p, static_cast<int>(i - yz * nx), static_cast<int>(yz % ny),
                                           static_cast<int>(yz / ny), w);
  }
};

// A position in a ring of kStages stages: the stage and the parity of this lap. Kept as running
// state (no division by kStages per tile). Waiting on an "empty" barrier with the parity of
// the lap before (phase ^ 1) returns at once on the first lap: a fresh barrier counts its
// previous phase as complete.
template <int kStages>
struct RingPos {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) hopper_varlen_kernel(const VarlenKernelParams p,
                                                                        const HopperItems items) {
#if ATTNKIT_HAS_WGMMA
  using namespace attnkit::cuda;
  using T = typename Tr::Elem;
  constexpr int kS = Tr::kStages;
  using Loader = PagedKVTileLoader<Tr::kBlockN, 2 * Tr::kHeadDim, Swizzle128Tile<Tr::kBlockN>, Tr::kProducerThreads>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Two rings of kS stages, one of K tiles and one of V tiles, each stage with a "full" barrier
  // (the 128 producer threads' copies landed: cp.async arrivals) and an "empty" one (the 256
  // consumer threads no longer read it). K and V are separate so that a K stage frees as soon as
  // S = Q K^T is done, while V is still needed for O += P V one step later. The rings run on
  // across the CTA's work items (RingPos); so does the ring of Q buffers (one or two), each
  // with its own full / empty pair.
  constexpr int kQB = Tr::kQBuffers;
  __shared__ __align__(8) uint64_t bars[4 * kS + 2 * kQB];

  pdl_wait();  // everything below may read what the previous kernel wrote (metadata, q, cache)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned char* smem = smem_raw + ((Tr::kAlign - (smem_addr(smem_raw) & (Tr::kAlign - 1))) & (Tr::kAlign - 1));
  const uint32_t s_base = smem_addr(smem);
  auto s_q = [&](int buffer) { return s_base + Tr::kQOffset + buffer * Tr::kQBytes; };
  enum Ring { kFullK, kFullV, kEmptyK, kEmptyV };
  const uint32_t bars0 = smem_addr(&bars[0]);
  auto q_full = [&](int buffer) { return bars0 + 8 * (4 * kS + buffer); };
  auto q_empty = [&](int buffer) { return bars0 + 8 * (4 * kS + kQB + buffer); };
  using Pos = RingPos<kS>;
  auto bar = [&](Ring r, int stage) { return bars0 + 8 * (r * kS + stage); };
  auto k_stage = [&](const Pos& at) { return s_base + at.stage * Tr::kTileBytes; };
  auto v_stage = [&](const Pos& at) { return s_base + (kS + at.stage) * Tr::kTileBytes; };
  auto tile_key = [](const WorkItem& w, int t) { return (w.tile_begin + t) * Tr::kBlockN; };

  if (tid == 0) {
    for (int i = 0; i < kS; ++i) {
      mbar_init(bar(kFullK, i), Tr::kProducerThreads);
      mbar_init(bar(kFullV, i), Tr::kProducerThreads);
      mbar_init(bar(kEmptyK, i), Tr::kConsumerThreads);
      mbar_init(bar(kEmptyV, i), Tr::kConsumerThreads);
    }
    for (int i = 0; i < kQB; ++i) {
      mbar_init(q_full(i), Tr::kProducerThreads);
      mbar_init(q_empty(i), Tr::kConsumerThreads);
    }
  }
  __syncthreads();  // the last CTA-wide barrier: producer and consumers part here
  pdl_launch_dependents();  // the next kernel's CTAs may take SM slots as this grid frees them

  // Both roles walk the same items and count the same tiles. Round r gives CTA b item
  // r * G + b (G CTAs), counted from the other end in odd rounds (r * G + G - 1 - b): a CTA that
  // drew one of the longer items of a stretch draws one of the shorter ones next. (Plain
  // striding by G gave every CTA the same row tile of each request when the row-tile count
  // divides G: causal work then piles up on a quarter of the CTAs, e.g. 4 row tiles, 132 SMs.)
  auto next_item = [&](int64_t& r, WorkItem& w) {
    const int64_t G = gridDim.x, b = blockIdx.x;
    for (; r * G < items.total; ++r) {
      const int64_t i = r * G + ((r & 1) ? G - 1 - b : b);
      if (i < items.total && items.template at<Tr::kBlockM, Tr::kBlockN>(p, i, w)) return true;
    }
    return false;
  };

  if (tid >= Tr::kConsumerThreads) {
    // Producer: per item, V of tile t - 1, then K of tile t (with Q after K of tile 0, once the
    // consumers are done with the previous item's Q): each into its stage once the consumers
    // released the tile kS before it. The producer never waits for its own copies: the full
    // barriers complete when they land. K and V have the same strides here (the dispatcher's
    // rule), so V reuses the page offsets computed for K a step earlier; block-table entries
    // are read one tile ahead.
    regs_dec<Tr::kProducerRegs>();
    const int ptid = tid - Tr::kConsumerThreads;
    Pos k_at, v_at;  // the next K tile's stage; the next V tile's (one tile behind)
    RingPos<kQB> q_at;
    WorkItem w;
    for (int64_t r = 0; next_item(r, w); ++r) {
      const int n = w.tile_end - w.tile_begin;
      if (n == 0) continue;  // nothing to load: the consumers write the empty result
      const Loader loader = kv_loader_for<Loader>(p, w);
      typename Loader::Offsets prev{};
      typename Loader::Pages pages = loader.pages(tile_key(w, 0), ptid);
      auto load_v = [&](int t) {
        mbar_wait(bar(kEmptyV, v_at.stage), v_at.phase ^ 1);
        loader.copy_side(loader.v.head_base, prev, tile_key(w, t), v_stage(v_at), ptid);
        mbar_arrive_on_cp_async(bar(kFullV, v_at.stage));
        v_at.advance();
      };
      for (int t = 0; t < n; ++t) {
        if (t >= 1) load_v(t - 1);
        prev = loader.offsets(loader.k, tile_key(w, t), pages, ptid);
        if (t + 1 < n) pages = loader.pages(tile_key(w, t + 1), ptid);
        mbar_wait(bar(kEmptyK, k_at.stage), k_at.phase ^ 1);
        loader.copy_side(loader.k.head_base, prev, tile_key(w, t), k_stage(k_at), ptid);
        mbar_arrive_on_cp_async(bar(kFullK, k_at.stage));
        k_at.advance();
        if (t == 0) {
          mbar_wait(q_empty(q_at.stage), q_at.phase ^ 1);  // the Q of kQB items back is no longer read
          detail::load_q_tile<Tr, Swizzle128Tile<Tr::kBlockM>, Tr::kProducerThreads>(p, w, s_q(q_at.stage), ptid);
          mbar_arrive_on_cp_async(q_full(q_at.stage));
          q_at.advance();
        }
      }
      load_v(n - 1);
    }
    cp_async_wait<0>();
    return;
  }
  regs_inc<Tr::kConsumerRegs>();

  // Consumers: two warpgroups of 64 rows take turns at the tensor cores (named barriers 1, 2),
  // across items too. Step j of a warpgroup issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1},
  // hands the tensor cores to the other warpgroup, and runs the softmax of S_j while its P V
  // still runs; O is rescaled once that P V is done. A warpgroup whose rows are all padding
  // computes on zero rows (no branch around wgmma) and writes nothing.
  const int wg = warp / 4;
  const int warp_row0 = warp * 16;
  const int my_turn = 1 + wg, their_turn = 2 - wg;
  const ScoreMod mod{p.scale, p.softcap, p.alibi_slopes != nullptr};
  const float unit = mod.unit();
  RowSoftmax softmax;
  FragC o[Tr::kOFrags];
  FragA pa[Tr::kSFrags / 2];
  Pos at, prev_at;  // the stages of tile j (K) and of tile j - 1 (V): K and V rings move together
  RingPos<kQB> q_at;
  WorkItem w;
  // This warpgroup's 64 rows of the current item's Q buffer (a constant with one buffer).
  // (The consumers sit at their register limit: computed per step, ptxas 13.0 spilled 80 bytes.)
  const uint32_t s_q_group0 = s_q(0) + wg * 64 * 128;
  auto s_q_group = [&] {
    if constexpr (kQB == 1) return s_q_group0;
    else return s_q_group0 + q_at.stage * Tr::kQBytes;
  };

  auto issue_pv = [&](const Pos& v_at) {
    const uint32_t s_v = v_stage(v_at);
#pragma unroll
    for (int kk = 0; kk < Tr::kSFrags / 2; ++kk)
      WgmmaRS<T, Tr::kHeadDim>::template run<1>(o, pa[kk], smem_desc_sw128(s_v + kk * 16 * 128, Tr::kBlockN * 128, 1024),
                                                true);
    wgmma_commit();
  };
  auto step = [&](int it, auto with_pv) {
    constexpr bool kPV = decltype(with_pv)::value;
    // V_{j-1} and K_j (the order they are loaded in) before any wgmma: a wait loop between
    // wgmmas in flight makes ptxas serialise them. The fence: cp.async wrote the tiles
    // (generic proxy), wgmma reads them (async proxy).
    if constexpr (kPV) mbar_wait(bar(kFullV, prev_at.stage), prev_at.phase);
    mbar_wait(bar(kFullK, at.stage), at.phase);
    fence_proxy_async_smem();
    named_bar_sync(my_turn, Tr::kConsumerThreads);
    FragC s[Tr::kSFrags];
    wgmma_fence();
    const uint32_t s_k = k_stage(at);
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      const uint32_t a = s_q_group() + (ks / 4) * (Tr::kBlockM * 128) + (ks % 4) * 32;
      const uint32_t b = s_k + (ks / 4) * (Tr::kBlockN * 128) + (ks % 4) * 32;
      WgmmaSS<T, Tr::kBlockN>::run(s, smem_desc_sw128(a, 16, 1024), smem_desc_sw128(b, 16, 1024), ks > 0);
    }
    wgmma_commit();
    if constexpr (kPV) issue_pv(prev_at);
    named_bar_arrive(their_turn, Tr::kConsumerThreads);
    if constexpr (kPV) {
      wgmma_wait<1>();  // S_j done; P V may still run
    } else {
      wgmma_wait<0>();
    }
    wgmma_hold(s);
    mbar_arrive(bar(kEmptyK, at.stage));

    const int tile_key0 = tile_key(w, it);
    const bool whole_tile_visible = tile_key0 >= w.full_lo && tile_key0 + Tr::kBlockN <= w.full_hi;
    float rescale[2];
    softmax_scores(s, softmax, mod, unit, whole_tile_visible, p, w, warp_row0, tile_key0, lane, rescale);
    if constexpr (kPV) {
      wgmma_wait<0>();
      wgmma_hold(o);
      wgmma_hold(pa);  // P_{j-1} is read by the P V just waited for: its registers stay until here
      mbar_arrive(bar(kEmptyV, prev_at.stage));
    }
    prev_at = at;
    at.advance();
    rescale_output(o, rescale);
#pragma unroll
    for (int kk = 0; kk < Tr::kSFrags / 2; ++kk) pa[kk] = c_pair_to_a<T>(s[2 * kk], s[2 * kk + 1]);
  };

  if (wg == 1) named_bar_arrive(1, Tr::kConsumerThreads);  // warpgroup 0 goes first
  for (int64_t r = 0; next_item(r, w); ++r) {
    const int n = w.tile_end - w.tile_begin;
    softmax.init();
#pragma unroll
    for (int f = 0; f < Tr::kOFrags; ++f) o[f] = FragC{};
    if (n > 0) {
      mbar_wait(q_full(q_at.stage), q_at.phase);
      step(0, std::false_type{});
      for (int it = 1; it < n; ++it) step(it, std::true_type{});
      mbar_arrive(q_empty(q_at.stage));  // every S of the item is done: the producer may reuse it
      q_at.advance();
      mbar_wait(bar(kFullV, prev_at.stage), prev_at.phase);
      fence_proxy_async_smem();
      wgmma_fence();
      issue_pv(prev_at);
      wgmma_wait<0>();
      wgmma_hold(o);
      wgmma_hold(pa);
      mbar_arrive(bar(kEmptyV, prev_at.stage));
    }
    if (warp_row0 < w.rows) detail::register_epilogue<Tr>(p, w, o, softmax, unit, warp_row0, lane);
  }
  // Warpgroup 1 handed warpgroup 0 one more turn than warpgroup 0 took: take it, so no arrival
  // is left pending on barrier 1.
  if (wg == 0) named_bar_sync(1, Tr::kConsumerThreads);
#else
  __trap();  // launched on a device or build without sm_90a code: the host must not get here
#endif
}

namespace detail {

template <class Tr>
void launch_hopper_config(const VarlenKernelParams& p, const HopperItems& items, int64_t ctas, bool pdl,
                          cudaStream_t stream) {
  auto kernel = hopper_varlen_kernel<Tr>;
  ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  cuda::launch_kernel(kernel, dim3(static_cast<unsigned>(ctas)), dim3(Tr::kThreads), Tr::kSmemBytes, stream, pdl, dim3(1, 1, 1),
                      p, items);
}

}  // namespace detail

template <class Elem, int kHeadDim>
void launch_hopper(const VarlenKernelParams& p, const VarlenLaunchShape& shape, cudaStream_t stream) {
  using Long = HopperTraits<Elem, kHeadDim>;
  using Short = HopperShortItemTraits<Elem, kHeadDim>;
  const char* where = "flash_attn varlen attention (hopper)";
  ATTNKIT_REQUIRE(p.num_splits == 1, where, "num_splits", p.num_splits,
                  "must be 1 (split launches run the mma_sync kernels)");
  dim3 grid;
  if (!varlen_grid(p, shape, Long::kBlockM, std::max(Long::kSmemBytes, Short::kSmemBytes), where, grid)) return;
  // Short items (keys <= kPersistentMaxKeys): one CTA per SM loops over them, so one item's
  // epilogue and the next one's first loads overlap. Long ones: one CTA per item, which the
  // hardware hands out as SMs free up, where a static share per CTA leaves the slowest CTA
  // behind. H200, head size 128, causal, 16k tokens, TFLOP/s persistent vs one CTA per item
  // in the same run (bench section prefill-grid, 333f3bf), 32 / 8 heads: 512 x 32 200 vs 163,
  // 1k x 16 293 vs 254, 2k x 8 385 vs 349, 4k x 4 451 vs 418, 8k x 2 467 vs 460, 16k x 1 466 vs
  // 472; 32 / 32 heads: within 5% either way at every length (per item ahead up to 2k).
  // Persistent launches of items up to kDoubleQMaxKeys keys take two Q buffers
  // (HopperShortItemTraits): there the wait for each item's Q is a visible share of the item.
  constexpr int kPersistentMaxKeys = 4096, kDoubleQMaxKeys = 1024;
  const HopperItems items{static_cast<int>(grid.x), static_cast<int>(grid.y), static_cast<int>(grid.z),
                          static_cast<int64_t>(grid.x) * grid.y * grid.z};
  int64_t ctas = items.total;
  if (shape.max_ctas > 0) {
    ctas = std::min<int64_t>(ctas, shape.max_ctas);
  } else if (shape.max_seq_len <= kPersistentMaxKeys) {
    ctas = std::min<int64_t>(ctas, cuda::current_device_props().sm_count);
  }
  ATTNKIT_REQUIRE(ctas <= 0x7fffffff, where, "work items", ctas, "must fit one grid dimension");
  const bool two_q = shape.q_buffers > 0 ? shape.q_buffers == 2 : (ctas < items.total && shape.max_seq_len <= kDoubleQMaxKeys);
  if (two_q) {
    detail::launch_hopper_config<Short>(p, items, ctas, shape.enable_pdl, stream);
  } else {
    detail::launch_hopper_config<Long>(p, items, ctas, shape.enable_pdl, stream);
  }
}

}  // namespace attnkit::flash_attn

#define ATTNKIT_HOPPER_INSTANTIATE(ELEM, HEAD_DIM)                                                  \
  template void launch_hopper<ELEM, HEAD_DIM>(const VarlenKernelParams&, const VarlenLaunchShape&, cudaStream_t);
