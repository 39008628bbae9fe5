// Varlen attention kernels for head dim 512 (head sizes 264..512), bf16 queries: 16-bit and fp8
// caches; one tile (prefill, output-column slices: tile_set.h) serves every launch.
#include "flash_attn/varlen_launcher.cuh"

namespace attnkit::flash_attn {
ATTNKIT_VARLEN_INSTANTIATE(__nv_bfloat16, 512, b16)
ATTNKIT_VARLEN_INSTANTIATE(__nv_bfloat16, 512, fp8)
}  // namespace attnkit::flash_attn
