// The FlashAttention-style backend's kernel generations and which one serves a configuration.
//
// Like FA2 / FA3, the backend has two generations of kernels:
//   mma_sync - mma.sync tensor-core kernels for sm80 and newer, the widest feature set
//              (FP8 caches dequantized in the kernel, every head size, split-KV);
//   hopper   - wgmma kernels, sm90 only (sm_90a code), for the hot shapes: head dims 64 / 128 /
//              192 / 256, 16-bit caches. Within it, launches the hopper kernel does not cover (decode-shaped
//              ones, split-KV) run the mma_sync kernels (varlen_launch.h).
// The hopper generation is preferred wherever it can serve and its kernels are in the build
// (hopper_generation_built()); otherwise the choice falls back to mma_sync and says so.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backend.h"

namespace attnkit::flash_attn {

enum class Generation { mma_sync, hopper };
std::string_view generation_name(Generation g);

// True when this library was built with sm_90a code, i.e. with the hopper kernels.
bool hopper_generation_built();

// Every generation, in order of preference (the first that can serve is chosen).
inline constexpr Generation kGenerationPreference[] = {Generation::hopper, Generation::mma_sync};

struct GenerationRefusal {
  Generation generation;
  std::vector<std::string> reasons;  // every rule that failed, one sentence each
};

struct GenerationChoice {
  std::optional<Generation> chosen;  // none when no generation can serve
  std::string why;                   // why the chosen one (or why none)
  std::vector<GenerationRefusal> refused;
  // "mma_sync generation: <why>. hopper generation refused: <reason>; <reason>"
  std::string describe() const;
};

// The rules of generation `g` that `cfg` breaks (empty: `g` can serve it). With
// kernels_built == false the generation is refused for that reason (after its other rules).
std::vector<std::string> generation_refusals(Generation g, const AttentionConfig& cfg,
                                             bool hopper_kernels_built = hopper_generation_built());

// The preferred generation that can serve `cfg`, and why every other one cannot.
GenerationChoice choose_generation(const AttentionConfig& cfg,
                                   bool hopper_kernels_built = hopper_generation_built());

}  // namespace attnkit::flash_attn
