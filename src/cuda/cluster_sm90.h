// Thread-block clusters (sm90): the cluster barrier and reads of another CTA's shared memory
// (distributed shared memory). Used where the CTAs of one cluster hand results to each other
// without a round trip through global memory (the varlen kernel's split merge).
#pragma once
#include <cstdint>

namespace attnkit::cuda {

// Below sm90 these trap: callers take them only on launches the host made as clusters.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATTNKIT_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define ATTNKIT_SM90_ASM(...) __trap()
#endif

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r = 0;
  ATTNKIT_SM90_ASM("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster: release this CTA's earlier shared-memory writes,
// then wait until all CTAs arrived (and acquire theirs).
__device__ __forceinline__ void cluster_sync() {
  ATTNKIT_SM90_ASM("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The address of the same shared-memory location (a shared::cta address of this CTA) in the
// CTA of rank `rank`, as a shared::cluster address.
__device__ __forceinline__ uint32_t cluster_map(uint32_t smem_addr, uint32_t rank) {
  uint32_t r = 0;
  ATTNKIT_SM90_ASM("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr), "r"(rank));
  return r;
}

__device__ __forceinline__ float cluster_load_f32(uint32_t cluster_addr) {
  float v = 0.f;
  ATTNKIT_SM90_ASM("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr) : "memory");
  return v;
}

__device__ __forceinline__ float4 cluster_load_f32x4(uint32_t cluster_addr) {
  float4 v{};
  ATTNKIT_SM90_ASM("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(cluster_addr)
               : "memory");
  return v;
}

#undef ATTNKIT_SM90_ASM

}  // namespace attnkit::cuda
