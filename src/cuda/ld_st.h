// Loads and stores of shared memory by shared address (the form cp.async and wgmma descriptors
// use), for data that passes through registers on its way between two stages; a vector global
// store.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace attnkit::cuda {

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t src) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(src)
               : "memory");
  return v;
}

__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t src) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(src) : "memory");
  return v;
}

__device__ __forceinline__ void st_shared_v4(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// A 16-byte global store (dst 16-byte aligned). Through a uint4 pointer cast from a 2-byte
// element's, nvcc 13.0 split the store into four 4-byte ones.
__device__ __forceinline__ void st_global_v4(void* dst, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace attnkit::cuda
