// 16-byte loads and stores where the data passes through registers: a global load of read-only
// data (the non-coherent path, not kept in L1: each chunk is read once) and a store to a shared
// address (the form cp.async and wgmma descriptors use).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace attnkit::cuda {

__device__ __forceinline__ uint4 ld_global_nc_v4(const void* src) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src));
  return v;
}

__device__ __forceinline__ void st_shared_v4(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace attnkit::cuda
