// The FlashInfer-style planned kernels (decode and prefill parts) for head dim 128 (head sizes rounded up to it:
// flash_attn/tile_set.h kPlannedHeadDims): bf16 / f16 queries, 16-bit, fp8 and NVFP4 caches. The
// kernel is the FlashAttention-style skeleton with the plan's policies (varlen_launcher.cuh
// launch_planned: PlanScheduler, the page table, the plan's partial rows).
#include "flash_attn/varlen_launcher.cuh"

namespace attnkit::flash_attn {
ATTNKIT_PLANNED_INSTANTIATE(__nv_bfloat16, 128, b16)
ATTNKIT_PLANNED_INSTANTIATE(__nv_bfloat16, 128, fp8)
ATTNKIT_PLANNED_INSTANTIATE(__half, 128, b16)
ATTNKIT_PLANNED_INSTANTIATE(__half, 128, fp8)
ATTNKIT_PLANNED_INSTANTIATE(__nv_bfloat16, 128, nvfp4)
ATTNKIT_PLANNED_INSTANTIATE(__half, 128, nvfp4)
}  // namespace attnkit::flash_attn
