// Synchronisation vocabulary of warp-specialised kernels (sm90): shared-memory mbarriers
// (producer -> consumer "tile full" and consumer -> producer "stage empty" signals) and named
// barriers (two consumer warpgroups taking turns at the tensor cores).
#pragma once
#include <cstdint>

namespace attnkit::cuda {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival of the calling thread (release: its earlier writes are visible to the waiter).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}

// One arrival of the calling thread that the hardware makes once all of this thread's earlier
// cp.async copies have landed (the thread does not wait; the barrier's count includes it).
__device__ __forceinline__ void mbar_arrive_on_cp_async(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Whether the mbarrier's phase of that parity has completed, without waiting.
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}

// Waits until the phase with parity `parity` of the barrier has completed (sm90: try_wait, which
// suspends the thread for a while; sm80: test_wait, polled).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
#else
    done = mbar_test(bar, parity);
#endif
  } while (!done);
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads: sync waits for all,
// arrive only counts the calling thread in.
__device__ __forceinline__ void named_bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Moves registers between the warpgroups of a warp-specialised CTA (every warp of the calling
// warpgroup executes it): dec gives registers back, inc waits for them.
template <int kRegs>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace attnkit::cuda
