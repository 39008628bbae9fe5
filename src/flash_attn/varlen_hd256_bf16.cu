// Varlen attention kernels for head size 256, bf16 queries: 16-bit and fp8 caches; the same kernels
// serve the FlashInfer-style planned launches (launch_planned), which also read NVFP4 caches.
#include "flash_attn/varlen_launcher.cuh"

namespace attnkit::flash_attn {
ATTNKIT_VARLEN_INSTANTIATE(__nv_bfloat16, 256, b16)
ATTNKIT_VARLEN_INSTANTIATE(__nv_bfloat16, 256, fp8)
ATTNKIT_PLANNED_INSTANTIATE(__nv_bfloat16, 256, b16)
ATTNKIT_PLANNED_INSTANTIATE(__nv_bfloat16, 256, fp8)
ATTNKIT_PLANNED_INSTANTIATE(__nv_bfloat16, 256, nvfp4)
}  // namespace attnkit::flash_attn
