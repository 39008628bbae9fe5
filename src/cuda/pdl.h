// Programmatic dependent launch (sm90+). A kernel launched with the programmatic stream
// serialization attribute may start while the kernel before it in the stream (or CUDA graph)
// is still finishing; it must call pdl_wait() before touching any memory an earlier kernel may
// write or read. pdl_launch_dependents() tells the hardware that the kernel after this one may
// be scheduled now (its CTAs fill slots this grid frees and wait in their own pdl_wait()).
// Both are no-ops below sm90 and in kernels launched without the attribute.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "cuda/cuda_check.h"

namespace attnkit::cuda {

// Blocks until the grids this one depends on have completed and their writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next grid in the stream launch once every CTA of this grid has called it (or exited).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::);
#endif
}

// This CTA's linear index in its grid (x fastest): the order the hardware dispatches CTAs in.
__device__ __forceinline__ uint64_t linear_block_index() {
  return blockIdx.x + static_cast<uint64_t>(gridDim.x) * (blockIdx.y + static_cast<uint64_t>(gridDim.y) * blockIdx.z);
}

// Launches `kernel` with the programmatic stream serialization attribute when `pdl` is set,
// else as a plain launch. The caller decides `pdl` from the device (sm90+ only).
// A cluster shape other than 1 x 1 x 1 launches the grid as thread-block clusters (sm90).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   dim3 cluster, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n++].val.clusterDim.z = cluster.z;
  }
  config.attrs = n > 0 ? attr : nullptr;
  config.numAttrs = n;
  ATTNKIT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace attnkit::cuda
