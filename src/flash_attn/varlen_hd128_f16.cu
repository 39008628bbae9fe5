// Varlen attention kernels for head size 128, f16 queries: 16-bit and fp8 caches; the same kernels
// serve the FlashInfer-style planned launches (launch_planned), which also read NVFP4 caches.
#include "flash_attn/varlen_launcher.cuh"

namespace attnkit::flash_attn {
ATTNKIT_VARLEN_INSTANTIATE(__half, 128, b16)
ATTNKIT_VARLEN_INSTANTIATE(__half, 128, fp8)
ATTNKIT_PLANNED_INSTANTIATE(__half, 128, b16)
ATTNKIT_PLANNED_INSTANTIATE(__half, 128, fp8)
ATTNKIT_PLANNED_INSTANTIATE(__half, 128, nvfp4)
}  // namespace attnkit::flash_attn
