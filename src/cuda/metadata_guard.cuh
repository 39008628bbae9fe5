// Device-side guards of the attention kernels (the trust boundary with the engine's metadata):
// what a kernel does with metadata it cannot have been meant to get. The rules, one place each:
//
//   block ids      a page map entry outside [0, num_blocks) reads inside the cache (cp.async
//                  loaders: block 0 instead, paged_kv_tile.h holds(); TMA boxes: the map's
//                  bounds give zeros) and marks the work item (item_pages_fault: one pass over
//                  the item's ids, mma_sync kernels with the first tiles in flight, the hopper
//                  producer after the item's last V copies);
//   key counts     a request's seq_len < 0 or past its table row (block-table width, page-table
//                  row, contiguous rows) is clamped into it and marks the item;
//   query rows     cu_seqlens_q that decrease or run past the batch's tokens: the request's
//                  rows are clamped to the batch (none where its start is outside it); a query
//                  longer than the launch's max_seqlen_q: its rows past the grid are not
//                  computed (both recorded once per request);
//
// A marked item writes NaN to its output rows (the epilogue writes NaN values; a split part
// claims the largest finite LSE so the merge gives its NaN all the weight), and the first violation goes to the device error
// record (cuda/device_errors.h), which the host reads with attnkit::device_errors. Valid
// metadata takes none of the error paths: the cost is a compare per block id and per item.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/device_errors.h"
#include "cuda/fast_divmod.h"
#include "cuda/mma_sm80.h"
#include "cuda/paged_kv_tile.h"
#include "cuda/sync_sm90.h"

namespace attnkit::cuda {

// The guards are compiled in unless the build defines ATTNKIT_DEVICE_GUARDS=0 (CMake option
// ATTNKIT_DEVICE_GUARDS=OFF: the A/B of their cost; never for an engine).
#ifndef ATTNKIT_DEVICE_GUARDS
#define ATTNKIT_DEVICE_GUARDS 1
#endif
inline constexpr bool kDeviceGuards = ATTNKIT_DEVICE_GUARDS != 0;

// The OR of `pred` over the `count` threads of named barrier `id` (sm90 named barriers; id 0
// with the whole CTA is __syncthreads_or).
__device__ __forceinline__ bool named_bar_or(int id, int count, bool pred) {
  uint32_t r;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(r)
      : "r"(static_cast<uint32_t>(pred)), "r"(id), "r"(count)
      : "memory");
  return r != 0;
}

// The block-id guard of a work item: whether any page of keys [first_key, min(key_end,
// seq_len)) holds a block outside the cache (pages.holds), each such page recorded (the same ids
// the loaders read, so from L1 / L2). Threads tid of nthreads share the pages; the caller ORs
// the results over them. Contiguous K/V read no ids.
__device__ __forceinline__ bool pages_fault(const KvPages& pages, const FastDivmod& block_size, int first_key,
                                            int key_end, int seq_len, int req, DeviceErrorRecord* errors, int tid,
                                            int nthreads) {
  if constexpr (!kDeviceGuards) {
    return false;
  } else {
    if (pages.contiguous()) return false;
    const int k1 = min(key_end, seq_len);
    if (k1 <= first_key) return false;
    bool bad = false;
    for (int pg = block_size.div(first_key) + tid, last = block_size.div(k1 - 1); pg <= last; pg += nthreads) {
      const int32_t blk = pages.at(pg);
      if (!pages.holds(blk)) {
        bad = true;
        record_fault(errors, DeviceFault::block_id, req, blk);
      }
    }
    return bad;
  }
}

}  // namespace attnkit::cuda
