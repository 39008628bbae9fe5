// Varlen attention kernels for head size 192, bf16 queries: 16-bit and fp8 caches.
#include "flash_attn/varlen_launcher.cuh"

namespace attnkit::flash_attn {
ATTNKIT_VARLEN_INSTANTIATE(__nv_bfloat16, 192, b16)
ATTNKIT_VARLEN_INSTANTIATE(__nv_bfloat16, 192, fp8)
}  // namespace attnkit::flash_attn
