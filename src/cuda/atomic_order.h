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

}  // namespace attnkit::cuda
