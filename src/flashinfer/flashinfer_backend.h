// The FlashInfer-style backend (docs/architecture.md section 6): what it serves, how its cache is shaped,
// and the accessor the registry lists.
#pragma once
#include <vector>

#include "attnkit/backend.h"

namespace attnkit {

const AttentionBackend& flashinfer_backend();

namespace flashinfer {

// Page sizes every configuration gets, and the large pages only the GQA kernels take.
inline constexpr int kSmallPageSizes[] = {16, 32, 64};
inline constexpr int kLargePageSizes[] = {128, 256, 512, 1024};
// Large pages are read by the Hopper GQA kernels (the group is packed into the query tile, so
// one page fetch serves group_size query heads); other configurations keep pages <= 64.
inline constexpr int kLargePageMinCC = 90;
// The selector prefers this backend for pages above this (AttentionBackend::preference).
inline constexpr int kPreferAbovePageSize = 256;
// Whether this build has the FlashInfer-style GPU kernels (the planned decode and prefill: a
// CUDA build). Without them check() refuses GPU configurations with that reason.
bool flashinfer_kernels_built();

// Every rule of the configuration itself that the backend breaks (capabilities, large pages
// need GQA on sm90+), without the GPU kernels' rules: what builders and impls require, so the
// host side works on any build. check() adds on GPUs: the kernels must be in this build with
// code for the device, and a 16-bit cache of the model dtype (fp8 and NVFP4 caches are
// dequantized in the kernel).
std::vector<std::string> configuration_refusals(const AttentionConfig& cfg);

// num_heads / num_kv_heads, or 0 when the head counts do not form whole groups.
int group_size(const AttentionConfig& cfg);
// The page sizes the kernels take for `cfg` (16, 32, 64, plus 128..1024 for GQA on sm90+).
std::vector<int> block_sizes_for(const AttentionConfig& cfg);
// Decode runs on tensor cores (query heads of a group packed into 16-row MMA tiles) when the
// model is GQA/MQA, on CUDA cores for MHA, where a 16-row tile would be 15/16 empty.
bool decode_uses_tensor_cores(int group_size);

}  // namespace flashinfer
}  // namespace attnkit
