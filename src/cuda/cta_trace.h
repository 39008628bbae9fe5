// Per-CTA timestamps, for finding where a kernel's time goes between and around its main
// loops (attnkit_bench --decode-trace). With a trace buffer, thread 0 of each CTA writes the
// global timer (ns, one clock for all SMs) at fixed points of the kernel, plus its SM id and
// flags; without one (every production launch) each point is one uniform branch.
#pragma once
#include <cstdint>

#include "cuda/pdl.h"

namespace attnkit::cuda {

// Slots of one CTA's record (kCtaTraceSlots uint64 per CTA, CTA = linear block index).
enum CtaTracePoint : int {
  kTraceEntry = 0,       // kernel entry (before anything, also before the PDL wait)
  kTraceReleased = 1,    // after the PDL wait: the previous grid has completed
  kTraceFirstTile = 2,   // the first K/V tile is in shared memory
  kTraceLoopDone = 3,    // main loop and pipeline drained
  kTraceEpilogue = 4,    // output / partials written
  kTraceExit = 5,        // done (after the split merge, when this CTA did it)
  kTraceSm = 6,          // %smid
  kTraceFlags = 7,       // bit 0: this CTA merged its item's splits
};
inline constexpr int kCtaTraceSlots = 8;

#ifdef __CUDACC__
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t* cta_trace_record(uint64_t* trace) {
  return trace + linear_block_index() * kCtaTraceSlots;
}

// Stamps `point` (thread 0 only; nothing without a buffer).
__device__ __forceinline__ void cta_trace_mark(uint64_t* trace, int point) {
  if (trace == nullptr || threadIdx.x != 0) return;
  uint64_t* rec = cta_trace_record(trace);
  rec[point] = global_timer_ns();
  if (point == kTraceEntry) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    rec[kTraceSm] = sm;
    rec[kTraceFlags] = 0;
  }
}

__device__ __forceinline__ void cta_trace_flag(uint64_t* trace, uint64_t bits) {
  if (trace != nullptr && threadIdx.x == 0) cta_trace_record(trace)[kTraceFlags] |= bits;
}
#endif

}  // namespace attnkit::cuda
