// Varlen attention kernels for head dim 80 (Phi-2, StableLM; head sizes 72 and 80), f16 queries:
// 16-bit caches (fp8 tiles need head dims of whole 32-dim groups: fp8 caches take dim 96).
#include "flash_attn/varlen_launcher.cuh"

namespace attnkit::flash_attn {
ATTNKIT_VARLEN_INSTANTIATE(__half, 80, b16)
}  // namespace attnkit::flash_attn
