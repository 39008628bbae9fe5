// Ordered global atomics (PTX memory model) for cross-CTA hand-offs inside one kernel.
#pragma once
#include <cstdint>

namespace attnkit::cuda {

// atomicAdd with acquire-release semantics at GPU scope. After a __syncthreads(), one thread's
// call releases the whole CTA's earlier writes (release is cumulative over the barrier) and, on
// return, acquires the writes released by the earlier arrivals: the pattern of a "last CTA
// merges" hand-off with one round trip to L2 instead of a fence per thread plus the atomic.
__device__ __forceinline__ unsigned int atomic_add_acq_rel_gpu(unsigned int* addr, unsigned int v) {
  unsigned int old;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(addr), "r"(v) : "memory");
  return old;
}

// Relaxed (strong, unordered) atomicAdd at GPU scope: the issuing thread does not wait for it
// until it reads the result, so its round trip can overlap other work.
__device__ __forceinline__ unsigned int atomic_add_relaxed_gpu(unsigned int* addr, unsigned int v) {
  unsigned int old;
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(addr), "r"(v) : "memory");
  return old;
}

// Releasing add without a result: after a __syncthreads(), publishes the whole CTA's writes.
__device__ __forceinline__ void red_add_release_gpu(unsigned int* addr, unsigned int v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned int load_relaxed_gpu(const unsigned int* addr) {
  unsigned int v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void store_relaxed_gpu(unsigned int* addr, unsigned int v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(addr), "r"(v) : "memory");
}

// After strong reads that observed released writes (relaxed atomics / loads above): makes those
// writes visible to this thread's later reads (the PTX "acquire pattern"), and, after a
// __syncthreads(), to the CTA's.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

}  // namespace attnkit::cuda
