// cp.async (sm80+): asynchronous 16-byte global -> shared copies, grouped into commit groups,
// and the multi-stage ring that names which shared-memory stage a tile lives in.
#pragma once
#include <cstdint>
#include <type_traits>

namespace attnkit::cuda {

// Copies 16 bytes, or writes 16 zero bytes when !valid (src is then not read; pass any
// in-bounds pointer). Bypasses L1 (.cg): tiles are consumed from shared memory once.
__device__ __forceinline__ void cp_async_16(uint32_t dst_smem, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src),
               "r"(src_bytes));
}

// Copies 16 bytes where the copy is known to be valid (the caller's std::true_type).
__device__ __forceinline__ void cp_async_16(uint32_t dst_smem, const void* src, std::true_type) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst_smem), "l"(src));
}

// The same for 4 or 8 bytes (.ca: the sizes .cg lacks; small rows such as NVFP4 block scales).
template <int kBytes>
__device__ __forceinline__ void cp_async_small(uint32_t dst_smem, const void* src, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8, "cp.async.ca copies 4, 8 or 16 bytes");
  const int src_bytes = valid ? kBytes : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst_smem), "l"(src), "n"(kBytes),
               "r"(src_bytes));
}
// Copies kBytes (4, 8 or 16) bytes, or zeros when !valid.
template <int kBytes>
__device__ __forceinline__ void cp_async_n(uint32_t dst_smem, const void* src, bool valid) {
  if constexpr (kBytes == 16) cp_async_16(dst_smem, src, valid);
  else cp_async_small<kBytes>(dst_smem, src, valid);
}

// Asks L2 to fetch `bytes` bytes (a multiple of 16) at a 16-byte aligned global address; no
// data reaches the SM and nothing waits for it (sm90+; a no-op below).
__device__ __forceinline__ void prefetch_l2_bulk(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A ring of kStages shared-memory stages. Tile i lives in stage i % kStages. The loop keeps
// kStages - 1 tiles in flight: one commit group per tile (possibly empty), so that
// "wait until tile i has landed" is always wait_group<kStages - 2>.
template <int kStages>
struct StageRing {
  static_assert(kStages >= 2, "a pipeline needs at least two stages");
  static constexpr int kInFlight = kStages - 1;
  __device__ __forceinline__ static int stage_of(int tile) { return tile % kStages; }
  // After this, the group of the oldest tile in flight has completed (in this thread).
  __device__ __forceinline__ static void wait_oldest() { cp_async_wait<kStages - 2>(); }
  __device__ __forceinline__ static void drain() { cp_async_wait<0>(); }
};

}  // namespace attnkit::cuda
