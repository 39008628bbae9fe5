// Programmatic dependent launch (sm90+). A kernel launched with the programmatic stream
// serialization attribute may start while the kernel before it in the stream (or CUDA graph)
// is still finishing; it must call pdl_wait() before touching any memory an earlier kernel may
// write or read. pdl_launch_dependents() tells the hardware that the kernel after this one may
// be scheduled now (its CTAs fill slots this grid frees and wait in their own pdl_wait()).
// Both are no-ops below sm90 and in kernels launched without the attribute.
#pragma once
#include <cuda_runtime.h>

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

// Launches `kernel` with the programmatic stream serialization attribute when `pdl` is set,
// else as a plain launch. The caller decides `pdl` from the device (sm90+ only).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool pdl,
                   Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl ? attr : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  ATTNKIT_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace attnkit::cuda
