// The hopper generation's varlen paged attention kernel (wgmma, sm_90a): one template,
// configured by HopperTraits, instantiated in hopper_hd*.cu. Same work items, masks and
// online softmax as the mma_sync kernel (varlen_kernel.cuh); what differs is the GEMMs (each
// warpgroup issues wgmma.mma_async on 64 rows x 128 keys with Q / K / V read from swizzled
// shared memory by descriptor) and the epilogue (straight from registers: without split
// partials there is nothing to merge across warps).
//
//   start the Q tile and K/V tiles 0 .. kStages-2
//   for each K/V tile of the work item:
//     wait for it; start the tile kStages-1 ahead
//     S = Q K^T      (wgmma m64n128k16, A = Q and B = K by descriptor)
//     mask, online softmax, rescale O (varlen_tile_softmax.cuh)
//     O += P V       (wgmma m64nDk16, A = P registers, B = V by descriptor, transposed)
//   epilogue: normalise, sink, write O and LSE straight from registers
#pragma once
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

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) hopper_varlen_kernel(const VarlenKernelParams p) {
#if ATTNKIT_HAS_WGMMA
  using namespace attnkit::cuda;
  using T = typename Tr::Elem;
  constexpr int kS = Tr::kStages;
  using Loader = PagedKVTileLoader<Tr::kBlockN, 2 * Tr::kHeadDim, Swizzle128Tile<Tr::kBlockN>, Tr::kProducerThreads>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // full[s]: the producer's threads arrive once the tile in stage s (and Q, with tile 0) landed;
  // empty[s]: the 256 consumer threads arrive once they no longer read stage s.
  __shared__ __align__(8) uint64_t bars[2 * kS];

  pdl_wait();  // everything below may read what the previous kernel wrote (metadata, q, cache)
  WorkItem w;
  if (!schedule_work<Tr::kBlockM, Tr::kBlockN>(p, w)) return;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned char* smem = smem_raw + ((Tr::kAlign - (smem_addr(smem_raw) & (Tr::kAlign - 1))) & (Tr::kAlign - 1));
  const uint32_t s_base = smem_addr(smem);
  const uint32_t s_q = s_base + Tr::kQOffset;
  const uint32_t full0 = smem_addr(&bars[0]), empty0 = smem_addr(&bars[kS]);
  auto full = [&](int stage) { return full0 + 8 * stage; };
  auto empty = [&](int stage) { return empty0 + 8 * stage; };
  auto stage_k = [&](int tile) { return s_base + (tile % kS) * Tr::kStageBytes; };
  const int n_tiles = w.tile_end - w.tile_begin;
  auto tile_key = [&](int i) { return (w.tile_begin + i) * Tr::kBlockN; };

  if (tid == 0) {
    for (int i = 0; i < kS; ++i) {
      mbar_init(full(i), Tr::kProducerThreads);
      mbar_init(empty(i), Tr::kConsumerThreads);
    }
  }
  __syncthreads();  // the last CTA-wide barrier: producer and consumers part here
  pdl_launch_dependents();  // the next kernel's CTAs may take SM slots as this grid frees them

  if (tid >= Tr::kConsumerThreads) {
    // Producer: Q with tile 0, then tile t into stage t % kS once the consumers released the
    // tile kS before it; a tile is announced once this thread's copies of it completed
    // (cp.async.wait_group), made visible to the async proxy that wgmma reads through.
    regs_dec<Tr::kProducerRegs>();
    const int ptid = tid - Tr::kConsumerThreads;
    const Loader loader = kv_loader_for<Loader>(p, w);
    auto announce = [&](int tile) {
      fence_proxy_async_smem();
      mbar_arrive(full(tile % kS));
    };
    // Tile t - 1 is announced right after tile t is issued, so before the producer blocks on
    // empty(t % kS) (released at the consumers' step t - kS + 1, which needs tile t - kS + 1)
    // every tile up to t - 2 is announced: no cycle for kS >= 3.
    static_assert(kS >= 3, "the producer announces one tile behind");
    for (int t = 0; t < n_tiles; ++t) {
      if (t >= kS) mbar_wait(empty(t % kS), ((t / kS) - 1) & 1);
      if (t == 0) detail::load_q_tile<Tr, Swizzle128Tile<Tr::kBlockM>, Tr::kProducerThreads>(p, w, s_q, ptid);
      loader.load(tile_key(t), stage_k(t), stage_k(t) + Tr::kTileBytes, ptid);
      cp_async_commit();
      if (t >= 1) {
        cp_async_wait<1>();
        announce(t - 1);
      }
    }
    if (n_tiles > 0) {
      cp_async_wait<0>();
      announce(n_tiles - 1);
    }
    return;
  }
  regs_inc<Tr::kConsumerRegs>();

  // Consumers: two warpgroups of 64 rows take turns at the tensor cores (named barriers 1, 2):
  // a warpgroup issues O += P V of the previous tile and S = Q K^T of this one back to back,
  // then runs its softmax while the other warpgroup's GEMMs run. A warpgroup whose rows are
  // all padding computes on zero rows (no branch around wgmma) and writes nothing.
  const int wg = warp / 4;
  const int warp_row0 = warp * 16;
  const bool warp_active = warp_row0 < w.rows;
  const uint32_t s_q_group = s_q + wg * 64 * 128;
  const int my_turn = 1 + wg, their_turn = 2 - wg;
  const ScoreMod mod{p.scale, p.softcap, p.alibi_slopes != nullptr};
  const float unit = mod.unit();
  RowSoftmax softmax;
  softmax.init();
  FragC o[Tr::kOFrags];
  FragA pa[Tr::kSFrags / 2];

  auto issue_pv = [&](int tile) {
    const uint32_t s_v = stage_k(tile) + Tr::kTileBytes;
#pragma unroll
    for (int kk = 0; kk < Tr::kSFrags / 2; ++kk)
      WgmmaRS<T, Tr::kHeadDim>::template run<1>(o, pa[kk], smem_desc_sw128(s_v + kk * 16 * 128, Tr::kBlockN * 128, 1024),
                                                true);
  };
  auto step = [&](int it, auto with_pv) {
    mbar_wait(full(it % kS), (it / kS) & 1);
    named_bar_sync(my_turn, Tr::kConsumerThreads);
    FragC s[Tr::kSFrags];
    wgmma_fence();
    if constexpr (decltype(with_pv)::value) issue_pv(it - 1);
    const uint32_t s_k = stage_k(it);
#pragma unroll
    for (int ks = 0; ks < Tr::kKSteps; ++ks) {
      const uint32_t a = s_q_group + (ks / 4) * (Tr::kBlockM * 128) + (ks % 4) * 32;
      const uint32_t b = s_k + (ks / 4) * (Tr::kBlockN * 128) + (ks % 4) * 32;
      WgmmaSS<T, Tr::kBlockN>::run(s, smem_desc_sw128(a, 16, 1024), smem_desc_sw128(b, 16, 1024), ks > 0);
    }
    wgmma_commit();
    // The other warpgroup's turn (warpgroup 1 gives none after its last tile: nobody waits).
    if (wg == 0 || it + 1 < n_tiles) named_bar_arrive(their_turn, Tr::kConsumerThreads);
    wgmma_wait<0>();
    wgmma_hold(s);
    wgmma_hold(o);
    if constexpr (decltype(with_pv)::value) mbar_arrive(empty((it - 1) % kS));  // tile it-1 fully read

    const int tile_key0 = tile_key(it);
    const bool whole_tile_visible = tile_key0 >= w.full_lo && tile_key0 + Tr::kBlockN <= w.full_hi;
    softmax_tile(s, o, softmax, mod, unit, whole_tile_visible, p, w, warp_row0, tile_key0, lane);
#pragma unroll
    for (int kk = 0; kk < Tr::kSFrags / 2; ++kk) pa[kk] = c_pair_to_a<T>(s[2 * kk], s[2 * kk + 1]);
  };

  if (n_tiles > 0) {
    if (wg == 1) named_bar_arrive(1, Tr::kConsumerThreads);  // warpgroup 0 goes first
    step(0, std::false_type{});
    for (int it = 1; it < n_tiles; ++it) step(it, std::true_type{});
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold(o);
    mbar_arrive(empty((n_tiles - 1) % kS));
  }
  if (warp_active) detail::register_epilogue<Tr>(p, w, o, softmax, unit, warp_row0, lane);
#else
  __trap();  // launched on a device or build without sm_90a code: the host must not get here
#endif
}

template <class Tr>
void launch_hopper(const VarlenKernelParams& p, const VarlenLaunchShape& shape, cudaStream_t stream) {
  const char* where = "flash_attn varlen attention (hopper)";
  ATTNKIT_REQUIRE(p.num_splits == 1, where, "num_splits", p.num_splits,
                  "must be 1 (split launches run the mma_sync kernels)");
  dim3 grid;
  if (!varlen_grid(p, shape, Tr::kBlockM, Tr::kSmemBytes, where, grid)) return;
  auto kernel = hopper_varlen_kernel<Tr>;
  ATTNKIT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  cuda::launch_kernel(kernel, grid, dim3(Tr::kThreads), Tr::kSmemBytes, stream, shape.enable_pdl, p);
}

}  // namespace attnkit::flash_attn

#define ATTNKIT_HOPPER_INSTANTIATE(ELEM, HEAD_DIM)                                                  \
  template void launch_hopper<HopperTraits<ELEM, HEAD_DIM>>(const VarlenKernelParams&, const VarlenLaunchShape&, \
                                                            cudaStream_t);
