// Tensor memory accelerator (sm90) vocabulary: an opaque tensor-map descriptor the host encodes
// (cuda/tensor_map.h), tile copies global -> shared that complete on an mbarrier's transaction
// count, and the fences around them. Thin PTX wrappers; the device functions compile to
// nothing below sm90 (their callers only run there).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace attnkit::cuda {

// Whether the code being compiled has TMA: the sm90+ device passes and the host pass. Kernels
// whose stages fill by TMA have no body in the other device passes (their launch decision takes
// them on sm90 code only), which keeps those passes from compiling code that never runs.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr bool kTmaCode = false;
#else
inline constexpr bool kTmaCode = true;
#endif

// A CUtensorMap's 128 bytes, kept opaque so that host headers need not include <cuda.h>. It
// must live in kernel parameter space (a __grid_constant__ parameter) or global memory.
struct alignas(64) TmaDesc {
  unsigned char bytes[128];
};

// Makes the mbarrier initialisations of this thread visible to the async proxy (TMA).
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Fetches a tensor map into the TMA unit's descriptor cache ahead of its first copy.
__device__ __forceinline__ void prefetch_tensor_map(const TmaDesc* desc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(desc)) : "memory");
#endif
}

// One arrival that also expects `bytes` more bytes of transactions in the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// An L2 cache policy for data read once per kernel (K/V tiles of a decode): evicted first, so
// what later kernels read again (metadata, block tables, Q) stays in L2.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// The box of `desc` at coordinates c0..c4 (innermost first) -> shared memory at dst (aligned
// as the descriptor's swizzle needs); its bytes count against bar's transaction count.
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const TmaDesc* desc, uint32_t bar, int c0, int c1, int c2,
                                           int c3, int c4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6, %7}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
#endif
}

// Shared memory at src (aligned as the descriptor's swizzle needs) -> the box of `desc` at
// coordinates c0..c2 (innermost first), in this thread's bulk async-group (bulk_commit_group).
// The source's generic-proxy writes must be fenced first (fence.proxy.async.shared::cta).
__device__ __forceinline__ void tma_store_3d(const TmaDesc* desc, uint32_t src, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(desc)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#endif
}
__device__ __forceinline__ void bulk_commit_group() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's bulk groups still read their shared-memory sources.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
#endif
}

// tma_load_5d under an L2 cache policy (l2_policy_evict_first). (A policy made by
// createpolicy ... evict_normal is not what a copy without one gets: DECISIONS.md, Evict-first
// K/V for split launches.)
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const TmaDesc* desc, uint32_t bar, int c0, int c1, int c2,
                                           int c3, int c4, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%3, %4, %5, %6, %7}], [%2], %8;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "l"(policy)
      : "memory");
#endif
}

}  // namespace attnkit::cuda
