// A ring of kStages shared-memory stages guarded by mbarriers (sm90): a "full" barrier per
// stage (the producer's copies of the stage's tile landed) and, with kEmpty, an "empty" one (the
// consumers no longer read it). The vocabulary of every producer / consumer loop:
//
//   producer: acquire(s)  (wait until the stage is empty)  ->  copies  ->  commit(s)
//   consumer: wait(s)     (wait until the stage is full)   ->  reads   ->  release(s)
//
// A PipelineState is a position in the ring (stage, parity of this lap), advanced once per
// tile; PipelineState::of(i) is the position of tile i counted from 0. Acquiring an empty
// barrier with the parity of the lap before returns at once on the first lap (a fresh barrier
// counts its previous phase as complete), so no stage needs priming.
#pragma once
#include <cstdint>

#include "cuda/sync_sm90.h"
#include "cuda/tma_sm90.h"

namespace attnkit::cuda {

template <int kStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // The state whose advance() is stage 0 of the first lap (the last stage of lap -1).
  __device__ __forceinline__ static PipelineState before_first() {
    PipelineState s;
    s.stage = kStages - 1;
    s.phase = 1;
    return s;
  }
  __device__ __forceinline__ static PipelineState of(int i) {
    PipelineState s;
    s.stage = i % kStages;
    s.phase = static_cast<uint32_t>(i / kStages) & 1u;
    return s;
  }
};

// The barriers of one pipeline, in shared memory (the kernel declares them).
template <int kStages, bool kEmpty = true>
struct PipelineBarriers {
  uint64_t full[kStages];
  uint64_t empty[kEmpty ? kStages : 1];
};

template <int kStages, bool kEmpty = true>
struct Pipeline {
  using State = PipelineState<kStages>;
  uint32_t full0, empty0;  // shared addresses of the first full / empty barrier

  __device__ __forceinline__ explicit Pipeline(PipelineBarriers<kStages, kEmpty>& b)
      : full0(static_cast<uint32_t>(__cvta_generic_to_shared(&b.full[0]))),
        empty0(static_cast<uint32_t>(__cvta_generic_to_shared(&b.empty[0]))) {}

  // One thread, before anybody uses the pipeline (then a CTA barrier): each stage's full barrier
  // completes after full_arrivals arrivals (plus the bytes of any expect_tx), each empty one
  // after empty_arrivals.
  __device__ __forceinline__ void init(uint32_t full_arrivals, uint32_t empty_arrivals) const {
#pragma unroll
    for (int i = 0; i < kStages; ++i) {
      mbar_init(full0 + 8 * i, full_arrivals);
      if constexpr (kEmpty) mbar_init(empty0 + 8 * i, empty_arrivals);
    }
  }
  __device__ __forceinline__ uint32_t full(const State& s) const { return full0 + 8 * s.stage; }
  __device__ __forceinline__ uint32_t empty(const State& s) const { return empty0 + 8 * s.stage; }

  // Producer.
  __device__ __forceinline__ void acquire(const State& s) const {
    static_assert(kEmpty, "a pipeline without empty barriers frees its stages by other means");
    mbar_wait(empty(s), s.phase ^ 1u);
  }
  // Whether acquire(s) would return at once (the stage is empty).
  __device__ __forceinline__ bool can_acquire(const State& s) const {
    static_assert(kEmpty, "a pipeline without empty barriers frees its stages by other means");
    return mbar_test(empty(s), s.phase ^ 1u);
  }
  // The calling thread's cp.async copies so far count as its arrival once they land.
  __device__ __forceinline__ void commit_cp_async(const State& s) const { mbar_arrive_on_cp_async(full(s)); }
  // One arrival that also waits for `bytes` of asynchronous (TMA) copies onto the full barrier.
  __device__ __forceinline__ void expect_bytes(const State& s, uint32_t bytes) const {
    mbar_arrive_expect_tx(full(s), bytes);
  }

  // Consumer.
  __device__ __forceinline__ void wait(const State& s) const { mbar_wait(full(s), s.phase); }
  __device__ __forceinline__ void release(const State& s) const { mbar_arrive(empty(s)); }
};

}  // namespace attnkit::cuda
