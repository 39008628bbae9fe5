// The FlashAttention-style backend's kernel generations and which one serves a configuration.
//
// Like FA2 / FA3, the backend has two generations of kernels:
//   mma_sync - mma.sync tensor-core kernels for sm80 and newer, the widest feature set
//              (FP8 caches dequantized in the kernel, sinks, ALiBi, softcap, windows, non-causal);
//   hopper   - wgmma + TMA + warp specialization, sm90 only, for the hot shapes: head sizes
//              64/128/256, 16-bit caches, no ALiBi (FA3 has no ALiBi either).
// The hopper generation is preferred wherever it can serve; until its kernels ship
// (kHopperKernelsBuilt) the choice falls back to mma_sync and says so.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnkit/backend.h"

namespace attnkit::flash_attn {

enum class Generation { mma_sync, hopper };
std::string_view generation_name(Generation g);

// This release compiles only the mma_sync generation's kernels.
inline constexpr bool kHopperKernelsBuilt = false;

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
                                             bool hopper_kernels_built = kHopperKernelsBuilt);

// The preferred generation that can serve `cfg`, and why every other one cannot.
GenerationChoice choose_generation(const AttentionConfig& cfg,
                                   bool hopper_kernels_built = kHopperKernelsBuilt);

}  // namespace attnkit::flash_attn
