// Hopper-generation (wgmma) varlen kernel for head size 192, bf16 queries and cache.
#include "flash_attn/hopper_kernel.cuh"

namespace attnkit::flash_attn {
ATTNKIT_HOPPER_INSTANTIATE_VARLEN(__nv_bfloat16, 192, CacheKind::b16)
}  // namespace attnkit::flash_attn
