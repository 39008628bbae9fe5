// Hopper-generation (wgmma) varlen kernel for head size 128, f16 queries and an fp8 cache (e4m3 /
// e5m2 codes read by the fp8 wgmma: K's as they are, V's transposed by the producer; hopper_fill.cuh).
#include "flash_attn/hopper_kernel.cuh"

namespace attnkit::flash_attn {
ATTNKIT_HOPPER_INSTANTIATE(__half, 128, CacheKind::fp8)
}  // namespace attnkit::flash_attn
