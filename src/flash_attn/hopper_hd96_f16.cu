// Hopper-generation (wgmma) varlen kernel for head size 96, f16 queries and cache (tiles of
// 128 columns, GEMMs over the first 96: hopper_traits.h kRegionDims).
#include "flash_attn/hopper_kernel.cuh"

namespace attnkit::flash_attn {
ATTNKIT_HOPPER_INSTANTIATE_VARLEN(__half, 96, CacheKind::b16)
}  // namespace attnkit::flash_attn
