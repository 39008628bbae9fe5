// The hopper kernel's Q buffer, in and out (hopper_kernel.cuh): the producer's copy of an
// item's Q rows into it (and with fp8 caches their e4m3 codes, in place), and the consumers'
// epilogues: an unsplit item's output rows leave through the Q buffer once its last S is done,
// a split item's rows as fp32 partials.
#pragma once
#include <cuda_fp8.h>

#include <cfloat>
#include <type_traits>

#include "attnkit/detail/merge_rule.h"
#include "cuda/cp_async.h"
#include "cuda/fp8_dequant.h"
#include "cuda/ld_st.h"
#include "cuda/online_softmax.h"
#include "cuda/output_store.h"
#include "cuda/sync_sm90.h"
#include "cuda/tma_sm90.h"
#include "cuda/tile_copy_layout.h"
#include "cuda/wgmma_sm90.h"
#include "flash_attn/hopper_traits.h"
#include "flash_attn/varlen_epilogue.cuh"
#include "flash_attn/varlen_schedule.cuh"

namespace attnkit::flash_attn {

namespace detail {

// The epilogue's per-row work: the factor of each of this thread's two rows (g, g + 8 of its
// warp's 16: normalisation, sink weight, V's dequant scale) and their LSE, written by one thread
// per row: to the output's LSE, or for a split item (split) to its partial LSE, with no sink
// (the merge folds it in once).
// An item the metadata guards refused (fault) gets NaN factors: NaN rows whatever O holds; its
// partial LSE claims the largest finite value, so that the merge gives it all the weight and its
// NaN reaches the output (as the mma_sync epilogue's).
template <class Tr>
__device__ __forceinline__ void finish_rows(const VarlenKernelParams& p, const WorkItem& w,
                                            const cuda::RowSoftmax& softmax, float unit, bool fault, bool split,
                                            int warp_row0, int lane, float (&f)[2]) {
  float max_log2[2], sum[2];
  softmax.finish(unit, max_log2, sum);
  const float v_scale = cache_scale<Tr>(p.v_scale, p.v_scale_stride, w.kv_head);  // (fp8 caches; else 1)
  const bool sink = !split && p.sinks != nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = warp_row0 + (lane >> 2) + 8 * r;
    const float mx[1] = {max_log2[r]}, sm[1] = {sum[r]};
    float wt[1];
    float lse = cuda::combine_row_parts<1>(mx, sm, wt);
    float sink_weight = 1.f;
    const bool lse_row = m < w.rows && (lane & 3) == 0 && (split || p.lse != nullptr);
    if (sink || lse_row) {
      const PackedRow row = packed_row(p, w, w.m0 + m);
      if (sink) {  // a part with LSE = sink logit and no value
        float w_sink;
        lse = merge_weights(lse, p.sinks[row.head * p.sinks_stride], &sink_weight, &w_sink);
      }
      if (lse_row && split) *SplitPartials::lse(p, w, m, row.token, row.head) = fault ? FLT_MAX : lse;
      else if (lse_row) p.lse[row.head * p.lse_stride_head + row.token * p.lse_stride_token] = lse;
    }
    f[r] = fault ? __int_as_float(0x7fffffff) : wt[0] * sink_weight * v_scale;
  }
}

// Output rows through shared memory: the warp's 16 rows of the item's Q buffer (s_q_buf: its
// base), free once the item's last S is done, take the rows by stmatrix in the buffer's
// swizzled layout (conflict-free). With an output map (p.o_map: LaunchPlan::tma_output) and all 16
// rows the request's, lane 0 stores each 64-column region by one TMA box (the rows are whole
// tokens' GQA groups) and waits until the TMA has read them (the buffer is then free). Else
// whole rows leave as 16-byte loads and coalesced 16-byte global stores (two 256-byte rows per
// warp instruction at head dim 128), not the 4-byte scattered stores of the accumulator layout;
// lane j < 16 finds row j's address once, the copy takes it by shuffle.
template <class Tr>
__device__ __forceinline__ void staged_epilogue(const VarlenKernelParams& p, const WorkItem& w,
                                                const cuda::FragC (&o)[Tr::kOFrags], const cuda::RowSoftmax& softmax,
                                                float unit, bool fault, int warp_row0, int lane, uint32_t s_q_buf) {
  using T = typename Tr::Elem;
  using L = cuda::Swizzle128Tile<Tr::kBlockM>;
  float f[2];
  finish_rows<Tr>(p, w, softmax, unit, fault, /*split=*/false, warp_row0, lane, f);
  // 16 columns of the warp's 16 rows per stmatrix: matrices (rows 0-7, 8-15) x (chunks dn,
  // dn + 1); lane i addresses row i % 8 + 8 ((i / 8) % 2) of chunk dn + i / 16.
  const int st_row = warp_row0 + (lane & 7) + 8 * ((lane >> 3) & 1), st_chunk = lane >> 4;
  static_assert(Tr::kOFrags % 2 == 0, "pairs of 8-column chunks");
#pragma unroll
  for (int dn = 0; dn < Tr::kOFrags; dn += 2) {
    const uint32_t r[4] = {cuda::pack2<T>(o[dn].c[0] * f[0], o[dn].c[1] * f[0]),
                           cuda::pack2<T>(o[dn].c[2] * f[1], o[dn].c[3] * f[1]),
                           cuda::pack2<T>(o[dn + 1].c[0] * f[0], o[dn + 1].c[1] * f[0]),
                           cuda::pack2<T>(o[dn + 1].c[2] * f[1], o[dn + 1].c[3] * f[1])};
    cuda::stmatrix_x4(s_q_buf + L::offset(st_row, dn + st_chunk), r);
  }
  if (p.o_map_ok && warp_row0 + 16 <= w.rows) {
    cuda::fence_proxy_async_smem();  // (each lane's stmatrix writes, read by the TMA)
    __syncwarp();
    if (lane == 0) {
      const int head0 = w.kv_head * p.group.divisor, token0 = w.q_start + p.group.div(w.m0 + warp_row0);
#pragma unroll
      for (int r = 0; r < (Tr::kHeadDim + 63) / 64; ++r)
        if (r * 64 < p.head_size) cuda::tma_store_3d(&p.o_map, s_q_buf + r * (Tr::kBlockM * 128) + warp_row0 * 128, r * 128, head0, token0);
      cuda::bulk_commit_group();
      cuda::bulk_wait_group_read<0>();
    }
    __syncwarp();
    return;
  }
  long long row_addr = 0;  // (0: a padding row)
  if (warp_row0 + (lane & 15) < w.rows) {
    const PackedRow row = packed_row(p, w, w.m0 + warp_row0 + (lane & 15));
    row_addr = reinterpret_cast<long long>(static_cast<T*>(p.out) + row.token * p.out_stride_token +
                                           row.head * p.out_stride_head);
  }
  __syncwarp();
  constexpr int kChunks = Tr::kHeadDim / 8;  // 16-byte chunks of a row
  static_assert(16 * kChunks % 32 == 0, "whole warp iterations (the shuffles)");
#pragma unroll 4
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int m = i / kChunks, c = i % kChunks;
    T* const dst = reinterpret_cast<T*>(__shfl_sync(0xffffffffu, row_addr, m));
    if (dst == nullptr || c * 8 >= p.head_size) continue;
    cuda::st_global_v4(dst + c * 8, cuda::ld_shared_v4(s_q_buf + L::offset(warp_row0 + m, c)));
  }
}

// A split item's epilogue (SplitPartials::split: a launch of num_splits > 1, or a planned item
// of a tile the plan splits into chunks): the warp's rows leave as fp32 partials (normalised
// within the split, V's dequant scale in, no sink: the merge folds it in), float2 stores straight
// from the accumulators (a quad's four lanes write 8 adjacent columns). A merge kernel folds the
// splits after the launch (launch_hopper: the split combine; a planned launch: the plan merge):
// merged here, by the last split to finish as the mma_sync epilogue does, ptxas 13.0 spilled the
// consumers (hd128 bf16, 100-260 bytes).
template <class Tr>
__device__ __forceinline__ void split_epilogue(const VarlenKernelParams& p, const WorkItem& w,
                                               const cuda::FragC (&o)[Tr::kOFrags], const cuda::RowSoftmax& softmax,
                                               float unit, bool fault, int warp_row0, int lane) {
  float f[2];
  finish_rows<Tr>(p, w, softmax, unit, fault, /*split=*/true, warp_row0, lane, f);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int m = warp_row0 + (lane >> 2) + 8 * r;
    if (m >= w.rows) continue;
    const PackedRow row = packed_row(p, w, w.m0 + m);
    float* const dst = SplitPartials::o(p, w, m, row.token, row.head) + 2 * (lane & 3);
#pragma unroll
    for (int dn = 0; dn < Tr::kOFrags; ++dn)
      if (dn * 8 < p.head_size)
        *reinterpret_cast<float2*>(dst + dn * 8) = make_float2(o[dn].c[2 * r] * f[r], o[dn].c[2 * r + 1] * f[r]);
  }
}

// The item's Q rows -> the Q buffer at sq (zero rows past w.rows, zero columns past the head
// size), by the producer's 128 threads: warp v copies rows v, v + 4, ..., whole rows per warp
// instruction; lane j finds the global address of the warp's rows j (and j + 32) once and the
// copies take it by shuffle (no packed-row division per 16-byte chunk).
template <class Tr>
__device__ __forceinline__ void load_q_rows(const VarlenKernelParams& p, const WorkItem& w, uint32_t sq, int ptid) {
  using T = typename Tr::Elem;
  using L = cuda::Swizzle128Tile<Tr::kBlockM>;
  static_assert(Tr::kProducerThreads == 128, "four producer warps");
  constexpr int kChunks = Tr::kHeadDim / 8, kRows = Tr::kBlockM / 4, kAddrs = (kRows + 31) / 32;
  static_assert(kRows * kChunks % 32 == 0 && kAddrs <= 2, "whole warp iterations (the shuffles)");
  const T* q = static_cast<const T*>(p.q);
  const int v = ptid >> 5, lane = ptid & 31;
  long long addr[kAddrs];  // (0: a padding row)
#pragma unroll
  for (int k = 0; k < kAddrs; ++k) {
    const int m = v + 4 * (lane + 32 * k);
    addr[k] = 0;
    if (lane + 32 * k < kRows && m < w.rows) {
      const PackedRow row = packed_row(p, w, w.m0 + m);
      addr[k] = reinterpret_cast<long long>(q + row.token * p.q_stride_token + row.head * p.q_stride_head);
    }
  }
#pragma unroll 4
  for (int i = lane; i < kRows * kChunks; i += 32) {
    const int rr = i / kChunks, c = i % kChunks;
    long long a = __shfl_sync(0xffffffffu, addr[0], rr % 32);
    if constexpr (kAddrs > 1) {
      const long long b = __shfl_sync(0xffffffffu, addr[1], rr % 32);
      if (rr >= 32) a = b;
    }
    const bool valid = a != 0 && c * 8 < p.head_size;
    cuda::cp_async_16(sq + L::offset(v + 4 * rr, c), valid ? reinterpret_cast<const T*>(a) + c * 8 : q, valid);
  }
}

// fp8 caches: the item's Q rows, landed in its Q buffer at sq (every producer thread waited for
// its own copies), -> e4m3 codes of Q times a power-of-two factor per consumer warpgroup that
// takes its 64 rows' largest |q| into [128, 256) (below e4m3's 448; values keep 3 mantissa bits
// down to 2^-13 of that largest), in place: warpgroup g's codes go into the upper half of its
// own lines of the buffer (Tr::q8_offset), which no other warpgroup reads and its epilogue
// overwrites only after its last S. By the producer's 128 threads (ptid): the largest |q| per
// warpgroup (s_red: 4 floats per warpgroup of scratch), then the regions last to first, each
// read and converted before the barrier that lets its codes overwrite a region already read
// (region r's codes land in region (regions + r) / 2 >= r). The factors -> factors[g]; the codes
// fenced for wgmma. Code chunk c (16 codes) of a row is the row's 16-bit chunks 2c and 2c + 1.
template <class Tr>
__device__ __forceinline__ void q_to_e4m3(uint32_t sq, float* s_red, float* factors, int ptid) {
  using T = typename Tr::Elem;
  using L = cuda::Swizzle128Tile<Tr::kBlockM>;
  constexpr int kWG = Tr::kWarpGroups, kChunks = Tr::kHeadDim / 8;  // 16-bit chunks of a row
  static_assert(Tr::kProducerThreads == 128, "two code chunks of each warpgroup's rows per thread and region");
  auto to_f2 = [](uint32_t x) {
    if constexpr (std::is_same_v<T, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&x));
    else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  };
  cuda::named_bar_sync(Tr::kProducerBar, Tr::kProducerThreads);  // every thread's Q copies landed
#pragma unroll
  for (int g = 0; g < kWG; ++g) {
    float mx = 0.f;
#pragma unroll 2
    for (int i = ptid; i < 64 * kChunks; i += 128) {
      const uint4 v = cuda::ld_shared_v4(sq + L::offset(64 * g + i / kChunks, i % kChunks));
      for (uint32_t x : {v.x, v.y, v.z, v.w}) {
        const float2 f = to_f2(x);
        mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((ptid & 31) == 0) s_red[4 * g + ptid / 32] = mx;
  }
  cuda::named_bar_sync(Tr::kProducerBar, Tr::kProducerThreads);
  float factor[kWG];
#pragma unroll
  for (int g = 0; g < kWG; ++g) {
    factor[g] = cuda::pow2_range_factor(fmaxf(fmaxf(s_red[4 * g], s_red[4 * g + 1]), fmaxf(s_red[4 * g + 2], s_red[4 * g + 3])), 8);
    if (ptid == 0) factors[g] = factor[g];
  }
  const int c = ptid & 3;  // this thread's code chunk of rows ptid / 4 and 32 + ptid / 4 of each warpgroup
#pragma unroll 1
  for (int r = Tr::kHeadDim / 64 - 1; r >= 0; --r) {
    uint4 codes[2 * kWG];
#pragma unroll
    for (int k = 0; k < 2 * kWG; ++k) {
      const int g = k / 2, m = (ptid >> 2) + 32 * (k % 2);
      const float fg = factor[g];
      uint32_t out[4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 v = cuda::ld_shared_v4(sq + L::offset(64 * g + m, 8 * r + 2 * c + half));
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const float2 a = to_f2(w[2 * j]), b = to_f2(w[2 * j + 1]);
          const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a.x * fg, a.y * fg), __NV_SATFINITE, __NV_E4M3);
          const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(b.x * fg, b.y * fg), __NV_SATFINITE, __NV_E4M3);
          out[2 * half + j] = lo | (hi << 16);
        }
      }
      codes[k] = make_uint4(out[0], out[1], out[2], out[3]);
    }
    cuda::named_bar_sync(Tr::kProducerBar, Tr::kProducerThreads);  // region r read by all: its codes may land
#pragma unroll
    for (int k = 0; k < 2 * kWG; ++k) {
      const int g = k / 2, m = (ptid >> 2) + 32 * (k % 2);
      cuda::st_shared_v4(sq + g * 64 * 128 + Tr::q8_offset(r) + Tr::q8_chunk(m, c), codes[k]);
    }
  }
  cuda::fence_proxy_async_smem();  // (generic writes, read by wgmma)
}

}  // namespace detail

}  // namespace attnkit::flash_attn
